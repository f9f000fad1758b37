//! The client subcommands beyond the core methods, on the real binary against a real agentd
//! (a workflow started by its command, with a human gate; the events feed): `run` with its
//! arguments checked against the op's schema, `answer` for an input-required gate, `watch`
//! resuming the feed after a proxy cuts it (and saying when it had to resync), and `probe`
//! against agentd and against the official A2A Python SDK's server.

mod common;

use common::cli::*;
use common::{Daemon, Setup};
use serde_json::Value;

const TOKEN: &str = "ops-e2e-token";

/// A workflow started by its command (`release.start {tag}`), built by an exec step, then
/// stopped at a human gate whose schema asks for `approve` (and an optional `note`).
const WORKFLOWS: &str = r#"
[[workflows]]
name = "release"
description = "Build, ask a person, ship"

[[workflows.steps]]
id = "start"
kind = "a2a"
command = "release.start"
roles = ["user", "operator"]
schema = { type = "object", properties = { tag = { type = "string" }, replicas = { type = "integer" }, dry = { type = "boolean" } }, required = ["tag"], additionalProperties = false }

[[workflows.steps]]
id = "build"
kind = "exec"
program = "/bin/sh"
args = ["-c", "printf '{\"built\": \"%s\"}' \"$0\"", "{{inputs.tag}}"]

[[workflows.steps]]
id = "approve"
kind = "human"
prompt = "Ship {{steps.build.output.built}}?"
schema = { type = "object", properties = { approve = { type = "boolean", title = "Approve the release" }, note = { type = "string", description = "why" }, level = { enum = ["low", "high"], default = "low" } }, required = ["approve"], additionalProperties = false }

[[workflows.steps]]
id = "ship"
kind = "exec"
program = "/bin/sh"
args = ["-c", "printf '{\"shipped\": \"%s\", \"approved\": %s}' \"$0\" \"$1\"", "{{steps.build.output.built}}", "{{steps.approve.output.approve}}"]

[[workflows]]
name = "quick"
[[workflows.steps]]
id = "say"
kind = "exec"
program = "/bin/echo"
args = ["hi {{inputs.who}}"]
"#;

/// An agentd with the workflows, the events feed (a ring of `ring` events) and, with
/// `bearer`, an operator token (so a scheme is declared and the extended card is served).
fn ops_daemon(bearer: bool, ring: u32) -> Daemon {
    Daemon::start_setup(
        "smol",
        &Setup {
            sections: format!(
                "[agent]\ncommand = [\"python3\", \"{}\"]\n[a2a.events]\nenabled = true\nring = {ring}\n[a2a.introspection]\nenabled = true\n{WORKFLOWS}",
                script("examples/agents/echo_agent.py")
            ),
            a2a: if bearer {
                "bearer = \"{{secret:E2E_OPS_TOKEN}}\"".into()
            } else {
                String::new()
            },
            env: vec![("E2E_OPS_TOKEN".into(), TOKEN.into())],
            ..Setup::default()
        },
    )
}

/// `args` with `--bearer TOKEN` added.
fn with_token<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    v.extend(["--bearer", TOKEN]);
    v
}

/// The task id of a human `task` line.
fn task_id(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("task     "))
        .unwrap_or_else(|| panic!("no task line: {out}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn run_checks_arguments_against_the_schema_on_the_card() {
    let d = ops_daemon(true, 1024);
    let url = d.tcp_url();

    // A read op: its result for people, and as served.
    let out = ok(&with_token(&["run", &url, "status"]));
    assert!(
        out.contains("instance: ") && out.contains("counts:"),
        "{out}"
    );
    let served = ok_json(&with_token(&["run", &url, "status", "--json"]));
    assert!(
        served["message"]["parts"][0]["data"]["counts"].is_object(),
        "{served}"
    );

    // A built-in op's arguments, by its schema in the command extension: types, unknown
    // names and missing ones are usage errors naming the argument, and nothing is sent.
    let err = fails(
        &with_token(&["run", &url, "debug.events", "--arg", "limit=lots"]),
        2,
    );
    assert!(err.contains("limit takes an integer"), "{err}");
    let err = fails(
        &with_token(&["run", &url, "workflow.status", "--arg", "nope=1"]),
        2,
    );
    assert!(
        err.contains("argument nope") && err.contains("it takes run"),
        "{err}"
    );
    let err = fails(&with_token(&["run", &url, "workflow.run"]), 2);
    assert!(
        err.contains("argument workflow") && err.contains("needs it"),
        "{err}"
    );
    let err = fails(
        &with_token(&["run", &url, "workflow.run", "--args", "{\"workflow\": 5}"]),
        2,
    );
    assert!(
        err.contains("argument workflow") && err.contains("string"),
        "{err}"
    );
    fails(&with_token(&["run", &url, "status", "--args", "[1]"]), 2);

    // workflow.run with an object argument given as JSON: a work op, answered with its task.
    let out = ok(&with_token(&[
        "run",
        &url,
        "workflow.run",
        "--arg",
        "workflow=quick",
        "--arg",
        "inputs={\"who\": \"there\"}",
    ]));
    assert!(out.contains("state    completed"), "{out}");
    assert!(out.contains("hi there"), "{out}");

    // A workflow's command: its schema is on the extended card only. k=v words take the
    // schema's types (replicas an integer, dry a boolean), so the server accepts them.
    let err = fails(
        &with_token(&[
            "run",
            &url,
            "release.start",
            "--arg",
            "tag=v1",
            "--arg",
            "replicas=two",
        ]),
        2,
    );
    assert!(err.contains("replicas takes an integer"), "{err}");
    let err = fails(
        &with_token(&["run", &url, "release.start", "--arg", "tga=v1"]),
        2,
    );
    assert!(err.contains("argument tga"), "{err}");
    let out = ok(&with_token(&[
        "run",
        &url,
        "release.start",
        "--arg",
        "tag=v1",
        "--arg",
        "replicas=3",
        "--arg",
        "dry=false",
    ]));
    assert!(out.contains("state    input-required"), "{out}");
    assert!(
        out.contains("Ship v1?") && out.contains("agentd answer"),
        "{out}"
    );
    // An op the extended card does not list for this caller.
    let err = fails(&with_token(&["run", &url, "no.such.op"]), 2);
    assert!(err.contains("not an op this caller may run"), "{err}");
    // The server's own refusal still comes through (exit 1): cancel of an unknown run.
    let err = fails(
        &with_token(&["run", &url, "workflow.cancel", "--arg", "run=nope"]),
        1,
    );
    assert!(err.contains("error -3"), "{err}");
}

#[test]
fn run_without_an_extended_card_sends_a_workflow_command_unchecked() {
    // No scheme declared: the loopback caller is the operator and there is no extended
    // card, so a workflow's command is found on no card; the server checks it.
    let d = ops_daemon(false, 1024);
    let url = d.tcp_url();
    let out = cli(&["run", &url, "release.start", "--arg", "tag=v2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stderr(&out).contains("sending release.start unchecked"),
        "{}",
        text(&out)
    );
    assert!(stdout(&out).contains("input-required"), "{}", text(&out));
    let err = fails(&["run", &url, "release.start", "--arg", "tga=v2"], 1);
    assert!(err.contains("INVALID_COMMAND_ARGS"), "{err}");
    // Built-in ops are still checked by their schema.
    fails(&["run", &url, "debug.events", "--arg", "limit=-"], 2);
}

/// Starts a release run; the id of its task, waiting at the gate.
fn gated_task(url: &str) -> String {
    let out = ok(&with_token(&[
        "run",
        url,
        "release.start",
        "--arg",
        "tag=v7",
    ]));
    assert!(out.contains("input-required"), "{out}");
    task_id(&out)
}

#[test]
fn answer_takes_fields_checks_them_and_continues_the_task() {
    let d = ops_daemon(true, 1024);
    let url = d.tcp_url();
    let id = gated_task(&url);
    // Not a terminal, no answer given: a usage error, the gate stays open.
    let err = fails(&with_token(&["answer", &url, &id]), 2);
    assert!(err.contains("stdin is not a terminal"), "{err}");
    // Checked against the gate's askSchema before anything is sent, naming the field.
    let err = fails(
        &with_token(&["answer", &url, &id, "--field", "approve=perhaps"]),
        2,
    );
    assert!(err.contains("approve takes true or false"), "{err}");
    let err = fails(
        &with_token(&[
            "answer",
            &url,
            &id,
            "--field",
            "level=extreme",
            "--field",
            "approve=y",
        ]),
        2,
    );
    assert!(err.contains("level takes one of low, high"), "{err}");
    let err = fails(
        &with_token(&["answer", &url, &id, "--answer", "{\"note\": \"x\"}"]),
        2,
    );
    assert!(err.contains("approve") && err.contains("required"), "{err}");
    let err = fails(
        &with_token(&[
            "answer",
            &url,
            &id,
            "--answer",
            "{\"approve\": true, \"extra\": 1}",
        ]),
        2,
    );
    assert!(err.contains("extra"), "{err}");
    let err = fails(
        &with_token(&[
            "answer",
            &url,
            &id,
            "--answer",
            "{}",
            "--field",
            "approve=y",
        ]),
        2,
    );
    assert!(err.contains("not both"), "{err}");
    // The gate is still open after all of those.
    let t = ok_json(&with_token(&["get", &url, &id, "--json"]));
    assert_eq!(t["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{t}");

    let out = ok(&with_token(&[
        "answer",
        &url,
        &id,
        "--field",
        "approve=yes",
        "--field",
        "note=looks good",
    ]));
    assert!(out.contains("state    completed"), "{out}");
    assert!(
        out.contains("\"shipped\":\"v7\"") && out.contains("\"approved\":true"),
        "{out}"
    );
    // Answered: the task no longer waits.
    let err = fails(
        &with_token(&["answer", &url, &id, "--field", "approve=yes"]),
        2,
    );
    assert!(
        err.contains("not waiting for input: it is completed"),
        "{err}"
    );
    // An unknown task is the server's refusal.
    let err = fails(
        &with_token(&["answer", &url, "no-such-task", "--field", "approve=yes"]),
        1,
    );
    assert!(err.contains("-32001"), "{err}");

    // --answer JSON, with --json: the task as served.
    let id = gated_task(&url);
    let t = ok_json(&with_token(&[
        "answer",
        &url,
        &id,
        "--answer",
        "{\"approve\": false}",
        "--json",
    ]));
    assert_eq!(t["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{t}");
}

#[test]
fn answer_on_a_terminal_asks_field_by_field() {
    let d = ops_daemon(true, 1024);
    let url = d.tcp_url();
    let id = gated_task(&url);
    // `script` runs the client on a pseudo-terminal (util-linux), its stdin the typed lines:
    // a bad boolean first (asked again), a note, and the level left to its default.
    let command = format!(
        "{} answer {url} {id} --bearer {TOKEN}",
        env!("CARGO_BIN_EXE_agentd")
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    let mut stdin = child.stdin.take().unwrap();
    for typed in ["maybe\n", "y\n", "\n", "ship it\n"] {
        std::thread::sleep(std::time::Duration::from_millis(400));
        use std::io::Write;
        stdin.write_all(typed.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the client on a terminal did not end");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let all = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{all}");
    for needle in [
        "Ship v7?",
        "Approve the release * (approve) [y/n]:",
        "approve takes true or false",
        "level [low/high] default low:",
        "note - why",
        "state    completed",
    ] {
        assert!(all.contains(needle), "{needle:?} in {all}");
    }
    let t = ok_json(&with_token(&["get", &url, &id, "--json", "--history", "5"]));
    let answer = t["history"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "ROLE_USER")
        .map(|m| m["parts"][0]["data"].clone())
        .unwrap_or(Value::Null);
    assert_eq!(
        answer,
        serde_json::json!({"approve": true, "level": "low", "note": "ship it"}),
        "{t}"
    );
}

/// The seq numbers of watch's human lines, in order.
fn seqs(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// What the watch tests cut: the first events stream (`fromSeq` 0) once it carried a step
/// event; a request with another cursor resumes.
const CUT_FEED: Cut = Cut {
    method: "subscribetoevents",
    after: "\"kind\":\"step\"",
    resumes: |req| req.contains("\"fromseq\":") && !req.contains("\"fromseq\":0"),
};

#[test]
fn watch_resumes_from_the_last_seq_after_a_drop() {
    let d = ops_daemon(false, 1024);
    let url = d.tcp_url();
    let proxy = CuttingProxy::cutting(d.tcp, CUT_FEED);
    let mut live = Live::start(&["watch", &proxy.url()]);
    // A run that stops at its gate: task, run and step events; the proxy cuts the feed
    // once it carried the first step event, and the watcher reconnects.
    let out = ok(&["run", &url, "release.start", "--arg", "tag=w1"]);
    let id = task_id(&out);
    proxy.wait_cut();
    live.until("input-required");
    // Answered after the reconnect: the rest of the run arrives on the resumed stream.
    ok(&["answer", &url, &id, "--field", "approve=true"]);
    live.until(&format!("{id} completed"));
    let (out, err) = live.stop();
    assert!(
        proxy.resumed.load(std::sync::atomic::Ordering::SeqCst),
        "the second request asked for a cursor: {err}"
    );
    assert!(err.contains("reconnecting from seq"), "{err}");
    assert!(!err.contains("resync"), "nothing was missed: {err}");
    let s = seqs(&out);
    assert!(s.len() > 5, "{out}");
    assert!(
        s.windows(2).all(|w| w[0] < w[1]),
        "every event once, in order: {s:?}\n{out}"
    );
    for kind in ["task", "run", "step"] {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().nth(2) == Some(kind)),
            "{kind} events: {out}"
        );
    }
}

#[test]
fn watch_says_when_it_had_to_resync() {
    // A ring of 8 events; the watcher's reconnect is held back while the run makes more than
    // that, so the feed no longer holds its cursor.
    let d = ops_daemon(false, 8);
    let url = d.tcp_url();
    let proxy = CuttingProxy::cutting(d.tcp, CUT_FEED);
    proxy.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut live = Live::start(&["watch", &proxy.url(), "--json"]);
    ok(&[
        "run",
        &url,
        "workflow.run",
        "--arg",
        "workflow=quick",
        "--arg",
        "inputs={\"who\":\"a\"}",
    ]);
    proxy.wait_cut();
    for who in ["b", "c", "d"] {
        let inputs = format!("inputs={{\"who\":\"{who}\"}}");
        ok(&[
            "run",
            &url,
            "workflow.run",
            "--arg",
            "workflow=quick",
            "--arg",
            &inputs,
        ]);
    }
    proxy.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    live.until("\"resync\":true");
    live.until("hi d");
    let (_, err) = live.stop();
    assert!(err.contains("reconnecting from seq"), "{err}");
    assert!(err.contains("resync"), "said on stderr: {err}");
}

/// The checks of `probe --json` as (check, result).
fn probe_json(url: &str, code: i32) -> Vec<(String, String, String)> {
    let out = cli(&["probe", url, "--json"]);
    assert_eq!(out.status.code(), Some(code), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("probe --json is JSON");
    assert_eq!(v["passed"], code == 0, "{v}");
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["check"].as_str().unwrap().to_owned(),
                c["result"].as_str().unwrap().to_owned(),
                c["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Every check the probe makes of a streaming server.
const CHECKS: &[&str] = &[
    "card.served",
    "card.fields",
    "card.interfaces",
    "card.capabilities",
    "send.blocking",
    "get.task",
    "list.tasks",
    "list.artifacts-absent",
    "cancel.ended",
    "error.get-unknown-task",
    "error.cancel-unknown-task",
    "error.unknown-method",
    "error.params-no-parts",
    "error.params-page-size",
    "stream.send",
    "version.unsupported",
    "version.missing",
    "version.patch-ignored",
];

fn assert_all_pass(checks: &[(String, String, String)], who: &str) {
    let ids: Vec<&str> = checks.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(ids, CHECKS, "{who}");
    for (id, result, why) in checks {
        assert_eq!(result, "pass", "{who}: {id}: {why}");
    }
}

#[test]
fn probe_passes_agentd_and_fails_a_server_that_breaks_the_rules() {
    let d = ops_daemon(false, 1024);
    for url in [d.tcp_url(), d.unix_url()] {
        let table = ok(&["probe", &url]);
        assert!(table.starts_with("CHECK"), "{table}");
        assert!(table.contains("18 passed, 0 failed, 0 skipped"), "{table}");
        assert!(table.contains("-32001 TASK_NOT_FOUND"), "{table}");
        assert_all_pass(&probe_json(&url, 0), &url);
    }
    // With a bearer: the token goes with every call (the raw version checks too).
    let d = ops_daemon(true, 1024);
    let url = d.tcp_url();
    let out = cli(&["probe", &url, "--json", "--bearer", TOKEN]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Without the token every method is refused: the card passes, the methods fail.
    let checks = probe_json(&url, 1);
    assert!(
        checks.iter().any(|c| c.0 == "card.fields" && c.1 == "pass"),
        "{checks:?}"
    );
    let send = checks.iter().find(|c| c.0 == "send.blocking").unwrap();
    assert!(send.1 == "fail" && send.2.contains("-31401"), "{send:?}");

    // A server that answers every call with an empty result, and a card without its
    // version, skills or a 1.0 interface.
    let bad = Lax::start();
    let checks = probe_json(&bad.url(), 1);
    let result = |id: &str| {
        checks
            .iter()
            .find(|c| c.0 == id)
            .unwrap_or_else(|| panic!("{id} in {checks:?}"))
            .clone()
    };
    assert_eq!(result("card.served").1, "pass");
    let fields = result("card.fields");
    assert!(
        fields.1 == "fail" && fields.2.contains("version") && fields.2.contains("skills"),
        "{fields:?}"
    );
    let ifaces = result("card.interfaces");
    assert!(
        ifaces.1 == "fail" && ifaces.2.contains("not Major.Minor"),
        "{ifaces:?}"
    );
    assert_eq!(result("card.capabilities").1, "fail");
    assert_eq!(result("send.blocking").1, "fail");
    assert_eq!(result("get.task").1, "skip");
    assert_eq!(result("stream.send").1, "fail");
    for id in [
        "error.get-unknown-task",
        "error.unknown-method",
        "version.unsupported",
    ] {
        let c = result(id);
        assert!(c.1 == "fail" && c.2.contains("answered a result"), "{c:?}");
    }
    let table = cli(&["probe", &bad.url()]);
    assert_eq!(table.status.code(), Some(1), "{}", text(&table));
    assert!(stdout(&table).contains("fail"), "{}", text(&table));
    assert!(
        stderr(&table).contains("check(s) failed"),
        "{}",
        text(&table)
    );
}

#[test]
fn against_the_python_sdk_server() {
    let sdk = SdkServer::start();
    let url = sdk.url.as_str();
    // Every check passes against the official SDK's server.
    assert_all_pass(&probe_json(url, 0), "the Python SDK server");
    // It declares none of agentd's extensions: run and watch refuse before sending.
    let err = fails(&["run", url, "status"], 2);
    assert!(
        err.contains("does not declare agentd's command extension"),
        "{err}"
    );
    let err = fails(&["watch", url], 2);
    assert!(
        err.contains("does not declare agentd's events extension"),
        "{err}"
    );
}

/// An HTTP server that serves a broken card and answers every JSON-RPC call with an empty
/// result: what a careless server does. Stopped on drop.
struct Lax {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Lax {
    fn start() -> Lax {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok((mut c, _)) = l.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                let req = common::cli::read_request(&mut c, deadline).unwrap_or_default();
                let text = String::from_utf8_lossy(&req);
                let body = if text.starts_with("GET") {
                    serde_json::json!({
                        "name": "lax", "description": "breaks the rules",
                        "capabilities": {"streaming": true, "pushNotifications": "yes"},
                        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
                        "supportedInterfaces": [{"url": format!("http://127.0.0.1:{port}/"),
                            "protocolBinding": "JSONRPC", "protocolVersion": "1.0.0"}]
                    })
                    .to_string()
                } else {
                    let id = text
                        .split("\r\n\r\n")
                        .nth(1)
                        .and_then(|b| serde_json::from_str::<Value>(b).ok())
                        .map(|v| v["id"].clone())
                        .unwrap_or(Value::Null);
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string()
                };
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Lax {
            port,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Lax {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn help_lists_the_new_subcommands() {
    let help = ok(&["help"]);
    for sub in [
        "agentd run URL OP",
        "agentd answer URL TASK",
        "agentd watch URL",
        "agentd probe URL",
    ] {
        assert!(help.contains(sub), "{sub}: {help}");
    }
    for sub in ["run", "answer", "watch", "probe"] {
        let usage = ok(&[sub, "--help"]);
        assert!(
            usage.starts_with(&format!("Usage: agentd {sub} URL")),
            "{usage}"
        );
    }
    let err = fails(&["run", "http://127.0.0.1:1/"], 2);
    assert!(err.contains("missing OP"), "{err}");
    let err = fails(
        &[
            "answer",
            "http://127.0.0.1:1/",
            "t",
            "--field",
            "a=1",
            "--answer",
            "{}",
        ],
        2,
    );
    assert!(err.contains("not both"), "{err}");
    // Nothing listens there: a connection failure, exit 3.
    fails(&["probe", "http://127.0.0.1:1/"], 3);
    fails(&["watch", "http://127.0.0.1:1/"], 3);
}
