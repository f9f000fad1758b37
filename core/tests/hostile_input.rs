//! Hostile input against the core in memory (issue 15, item 10): a command that repeats a
//! member, two credentials on one request, webhook hosts written so that registration and
//! delivery would read them differently, and a push config without a URL. The same cases
//! run on the real binary in `tests/e2e_hostile_input.rs`.

mod support;

use agentd_core::auth::{AuthConfig, BearerRule, Principal, Role};
use agentd_core::ext::COMMAND_URI;
use agentd_core::push::PushPolicy;
use serde_json::{json, Value};
use support::*;

/// A SendMessage body whose one DataPart is `data`, written by hand: a `Value` cannot hold a
/// repeated member.
fn command_body(data: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"role":"ROLE_USER","messageId":"m","extensions":["{COMMAND_URI}"],"parts":[{{"data":{data}}}]}}}}}}"#
    )
}

fn bad_request_field(j: &Value) -> &str {
    j["error"]["data"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .find(|d| d["@type"] == "type.googleapis.com/google.rpc.BadRequest")
        })
        .and_then(|b| b["fieldViolations"][0]["field"].as_str())
        .unwrap_or_else(|| panic!("no BadRequest in {j}"))
}

#[test]
fn a_command_that_repeats_a_member_is_refused_and_nothing_runs() {
    let mut h = Harness::new();
    for (data, field) in [
        (
            r#"{"agentd":{"op":"status","op":"config"}}"#,
            "message.parts[0].data.agentd.op",
        ),
        (
            r#"{"agentd":{"op":"config","op":"status"}}"#,
            "message.parts[0].data.agentd.op",
        ),
        (
            r#"{"agentd":{"op":"workflow.run","workflow":"a","workflow":"b"}}"#,
            "message.parts[0].data.agentd.workflow",
        ),
        (
            r#"{"agentd":{"op":"workflow.run","workflow":"a","inputs":{"n":1,"n":2}}}"#,
            "message.parts[0].data.agentd.inputs.n",
        ),
        (
            r#"{"agentd":{"op":"status"},"agentd":{"op":"config"}}"#,
            "message.parts[0].data.agentd",
        ),
    ] {
        // Activated or not, the command is not well formed: refused before anything else.
        for lines in [&[COMMAND_URI][..], &[]] {
            let mut c = h.conn();
            let r = one(&c.feed(&mut h, &rpc_ext(&command_body(data), lines)));
            let j = assert_rpc_error(&r, -32602, None);
            assert_eq!(bad_request_field(&j), field, "{data}: {j}");
            assert!(
                j["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("duplicate member")),
                "{j}"
            );
            assert!(h.take_effects().is_empty(), "{data}: something ran");
        }
    }
    // The same command without the repeat runs.
    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        &rpc_ext(
            &command_body(r#"{"agentd":{"op":"status"}}"#),
            &[COMMAND_URI],
        ),
    ));
    assert_eq!(r.status, 200);
    assert!(r.json().get("error").is_none(), "{}", r.json());
}

/// A request carrying two `Authorization` headers is a framing refusal: 400 and the
/// connection closes, whichever of them would have resolved.
#[test]
fn two_authorization_headers_are_400_and_close() {
    let mut h = Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op")),
            bearers: vec![BearerRule {
                digest: AuthConfig::digest("user"),
                principal: Principal::new("user:u", Role::User, vec![]),
            }],
            any: None,
            cert_rules: Vec::new(),
        };
    });
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":text_message("hi","m"),"configuration":{"returnImmediately":true}}}).to_string();
    for (first, second) in [
        ("Bearer user", "Bearer op"),
        ("Bearer op", "Bearer user"),
        ("Bearer op", "Bearer op"),
        ("Bearer nobody", "Bearer op"),
    ] {
        for listener in [0, 1] {
            let mut c = h.conn_on(listener);
            let req = format!(
                "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: {first}\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nauthorization: {second}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let out = c.feed(&mut h, req.as_bytes());
            let r = first_head(&out);
            assert_eq!(r.status, 400, "{first} + {second}");
            assert_eq!(r.header("connection"), Some("close"), "{first} + {second}");
            assert!(c.conn.is_finished(), "{first} + {second}: still open");
            assert!(h.take_effects().is_empty(), "{first} + {second}: it ran");
        }
    }
    // One of them alone is served.
    let mut c = h.conn();
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer op\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = one(&c.feed(&mut h, req.as_bytes()));
    assert_eq!(r.status, 200);
    assert!(r.json()["result"]["task"]["id"].is_string(), "{}", r.json());
}

fn push_harness() -> (Harness, String) {
    let mut h = Harness::with(|c| {
        c.push = PushPolicy {
            enabled: true,
            allow_private: false,
        };
    });
    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m1"), "configuration": {"returnImmediately": true}}),
        ),
    ));
    let task = r.json()["result"]["task"]["id"]
        .as_str()
        .expect("a task")
        .to_owned();
    h.take_effects();
    (h, task)
}

#[test]
fn webhook_hosts_are_judged_as_delivery_would_resolve_them() {
    let (mut h, task) = push_harness();
    for url in [
        "https://0/",
        "https://127.1/",
        "https://0x7f000001/",
        "https://0177.0.0.1/",
        "https://127.0.0.1./",
        "https://localhost./",
        "https://169.254.43518/",
        "https://[::ffff:a9fe:a9fe]/",
        "https://[fe80::a9fe]/",
    ] {
        let mut c = h.conn();
        let r = one(&c.feed(
            &mut h,
            &call(
                "CreateTaskPushNotificationConfig",
                2,
                json!({"taskId": task, "url": url}),
            ),
        ));
        let j = assert_rpc_error(&r, -32602, None);
        assert_eq!(bad_request_field(&j), "url", "{url}: {j}");
        let message = j["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("push url refused") && message.contains("allow_private"),
            "{url}: {message}"
        );
    }
    // Inline, on a send, the same host is refused under its configuration path.
    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        &call(
            "SendMessage",
            3,
            json!({"message": text_message("hi", "m2"),
                   "configuration": {"taskPushNotificationConfig": {"url": "https://0x7f000001/"}}}),
        ),
    ));
    let j = assert_rpc_error(&r, -32602, None);
    assert_eq!(
        bad_request_field(&j),
        "configuration.taskPushNotificationConfig.url"
    );
    assert!(
        h.take_effects().is_empty(),
        "the refused send started a task"
    );
}

#[test]
fn a_push_config_without_a_url_says_the_url_is_required() {
    let (mut h, task) = push_harness();
    for params in [json!({"taskId": task}), json!({"taskId": task, "url": ""})] {
        let mut c = h.conn();
        let r = one(&c.feed(
            &mut h,
            &call("CreateTaskPushNotificationConfig", 2, params.clone()),
        ));
        let j = assert_rpc_error(&r, -32602, None);
        assert_eq!(bad_request_field(&j), "url", "{params}: {j}");
        let message = j["error"]["message"].as_str().unwrap();
        assert!(message.contains("url: is required"), "{message}");
        assert!(!message.contains("refused"), "{message}");
    }
}

/// The four push-config methods take the proto field names (`task_id`, `page_size`) as
/// ProtoJSON parsers do and the A2A TCK sends them.
#[test]
fn push_config_methods_take_snake_case_names() {
    let (mut h, task) = push_harness();
    let mut c = h.conn();
    let created = one(&c.feed(
        &mut h,
        &call(
            "CreateTaskPushNotificationConfig",
            2,
            json!({"task_id": task, "url": "https://hooks.example.com/a2a"}),
        ),
    ))
    .json();
    let id = created["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    assert_eq!(created["result"]["taskId"], task.as_str());
    let got = one(&c.feed(
        &mut h,
        &call(
            "GetTaskPushNotificationConfig",
            3,
            json!({"task_id": task, "id": id}),
        ),
    ))
    .json();
    assert_eq!(got["result"]["id"], id.as_str(), "{got}");
    let listed = one(&c.feed(
        &mut h,
        &call(
            "ListTaskPushNotificationConfigs",
            4,
            json!({"task_id": task, "page_size": 1}),
        ),
    ))
    .json();
    assert_eq!(
        listed["result"]["configs"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let deleted = one(&c.feed(
        &mut h,
        &call(
            "DeleteTaskPushNotificationConfig",
            5,
            json!({"task_id": task, "id": id}),
        ),
    ))
    .json();
    assert!(deleted.get("error").is_none(), "{deleted}");
}
