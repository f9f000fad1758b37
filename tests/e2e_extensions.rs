//! The extensions on the real binary, on both drivers and both transports: the overview's
//! status-command curl example reproduced in its headers and shape, and the card's
//! declarations.

mod common;

use common::{Daemon, Via};
use serde_json::json;

const COMMAND: &str = "https://agentd.dev/a2a/ext/command";

/// The request of the overview's example, byte for byte as curl sends its body and headers.
fn seed_request(host: &str) -> Vec<u8> {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"m-1","extensions":["https://agentd.dev/a2a/ext/command"],"parts":[{"data":{"agentd":{"op":"status"}}}]}}}"#;
    format!(
        "POST / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: curl/8.0\r\nAccept: */*\r\ncontent-type: application/json\r\nA2A-Version: 1.0\r\nA2A-Extensions: https://agentd.dev/a2a/ext/command, https://example.com/not-ours\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The head as it came: status line and header lines, in order (names arrive lower-case).
fn raw_head(r: &common::Response) -> String {
    let mut head = format!("HTTP/1.1 {} {}\r\n", r.status, r.reason);
    for (name, value) in &r.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head
}

fn check_seed_example(driver: &str, via: Via) {
    let d = Daemon::start(driver);
    let mut c = d.connect(via);
    let r = c.request(&seed_request("127.0.0.1:8420"));
    assert_eq!(r.status, 200, "{driver} {via:?}");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("a2a-extensions"),
        Some(COMMAND),
        "the echo names exactly the command URI"
    );
    // The head starts exactly as the overview shows it.
    let head = raw_head(&r);
    assert!(
        head.starts_with("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\na2a-extensions: https://agentd.dev/a2a/ext/command\r\n"),
        "{head}"
    );
    let j = r.json();
    assert_eq!(j["id"], 1);
    assert_eq!(j["jsonrpc"], "2.0");
    let message = &j["result"]["message"];
    assert_eq!(message["extensions"], json!([COMMAND]));
    let data = &message["parts"][0]["data"];
    assert_eq!(data["instance"], "agentd");
    assert_eq!(data["draining"], false);
    // The body's members come in the order the overview prints them.
    let text = r.body_text();
    assert!(
        text.starts_with(r#"{"id":1,"jsonrpc":"2.0","result":{"message":{"#),
        "{text}"
    );
    assert!(
        text.find(r#""extensions""#) < text.find(r#""parts""#),
        "{text}"
    );
}

#[test]
fn seed_status_example_smol_tcp() {
    check_seed_example("smol", Via::Tcp);
}

#[test]
fn seed_status_example_std_tcp() {
    check_seed_example("std", Via::Tcp);
}

#[test]
fn seed_status_example_smol_unix() {
    check_seed_example("smol", Via::Unix);
}

#[test]
fn seed_status_example_std_unix() {
    check_seed_example("std", Via::Unix);
}

#[test]
fn refused_ops_run_nothing() {
    for driver in ["smol", "std"] {
        let d = Daemon::start(driver);
        let mut c = d.connect(Via::Tcp);
        // An unknown workflow, and the instance-tier subagent report this runtime does not
        // serve: each a typed refusal, no echo, no task.
        let cases = [
            (
                json!({"op":"workflow.run","workflow":"triage"}),
                -32602,
                "INVALID_COMMAND_ARGS",
            ),
            (
                json!({"op":"_instance.result","handle":"h"}),
                -32004,
                "OP_NOT_SERVED",
            ),
        ];
        for (envelope, code, reason) in cases {
            let body = json!({"jsonrpc":"2.0","id":2,"method":"SendMessage","params":{"message":{
                "role":"ROLE_USER","messageId":"m-2","extensions":[COMMAND],
                "parts":[{"data":{"agentd": envelope}}]}}})
            .to_string();
            let req = format!(
                "POST / HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nA2A-Version: 1.0\r\nA2A-Extensions: {COMMAND}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let r = c.request(req.as_bytes());
            let j = r.json();
            assert_eq!(j["error"]["code"], code, "{driver}: {j}");
            assert_eq!(j["error"]["data"][0]["reason"], reason, "{driver}: {j}");
            assert!(
                r.header("a2a-extensions").is_none(),
                "a refusal echoes nothing"
            );
        }
        let list = r#"{"jsonrpc":"2.0","id":3,"method":"ListTasks","params":{}}"#;
        let req = format!("POST / HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n{list}", list.len());
        assert_eq!(
            c.request(req.as_bytes()).json()["result"]["totalSize"],
            0,
            "{driver}: no task was created"
        );
    }
}
