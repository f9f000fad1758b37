//! Hostile input and hostile configuration against the real `agentd` binary (issue 15, item
//! 10): numeric keys past any sensible bound, grant patterns that would reach operator-only
//! ops, a command that repeats a member, two credentials on one request, webhook hosts
//! written so that registration and delivery would read them differently, and a push config
//! without a URL. Each refusal is asserted with its exact HTTP status, JSON-RPC code and
//! error details; the same cases run in memory in `core/tests/hostile_input.rs`.

mod common;

use common::*;
use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";
const U64_MAX: &str = "18446744073709551615";

/// Runs each listed `fn name(driver: &str)` as `smol_driver::name` and `std_driver::name`.
macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {
        mod smol_driver {
            $( #[test] fn $name() { super::$name("smol") } )*
        }
        mod std_driver {
            $( #[test] fn $name() { super::$name("std") } )*
        }
    };
}

both_drivers!(
    a_command_that_repeats_a_member_is_refused_and_nothing_runs,
    two_authorization_headers_are_400_and_close,
    a_refusal_decided_in_the_runtime_names_the_part_that_carried_the_command,
);

/// The `error.data` detail of this `@type` (`ErrorInfo`, `BadRequest`), if any.
fn detail<'a>(doc: &'a Value, kind: &str) -> Option<&'a Value> {
    doc["error"]["data"].as_array().and_then(|d| {
        d.iter()
            .find(|d| d["@type"] == format!("type.googleapis.com/google.rpc.{kind}"))
    })
}

/// Asserts a JSON-RPC refusal at HTTP 200 that keeps the connection: its code, its
/// `ErrorInfo.reason` (`None`: no ErrorInfo at all), and the field its `BadRequest` names.
fn assert_refusal(r: &Response, code: i64, reason: Option<&str>, field: &str) -> Value {
    assert_json_200(r, field);
    assert!(!r.says_close(), "a JSON-RPC refusal keeps the connection");
    let doc = r.json();
    assert_eq!(doc["error"]["code"].as_i64(), Some(code), "{doc}");
    assert!(doc.get("result").is_none(), "{doc}");
    assert_eq!(
        detail(&doc, "ErrorInfo").map(|i| i["reason"].as_str().unwrap_or("")),
        reason,
        "{doc}"
    );
    let bad = detail(&doc, "BadRequest").unwrap_or_else(|| panic!("no BadRequest in {doc}"));
    assert_eq!(bad["fieldViolations"][0]["field"], field, "{doc}");
    doc
}

// ---------------------------------------------------------------------------------------
// 1. Numeric keys out of range
// ---------------------------------------------------------------------------------------

/// A value past a key's range stops start-up with an error naming the key, its range and
/// the value: no huge allocation, no deadline that wraps or panics.
#[test]
fn out_of_range_values_stop_start_up_naming_the_key() {
    let cases = [
        Setup {
            sections: "[a2a.events]\nenabled = true\nring = 1000000000000\n".into(),
            ..Setup::default()
        },
        Setup {
            limits: format!("idle_timeout_ms = {U64_MAX}"),
            ..Setup::default()
        },
        Setup {
            limits: format!("request_timeout_ms = {U64_MAX}"),
            ..Setup::default()
        },
        Setup {
            limits: "max_body_bytes = 4194305".into(),
            ..Setup::default()
        },
        Setup {
            sections: format!(
                "[[workflows]]\nname = \"w\"\n[[workflows.steps]]\nid = \"a\"\nkind = \"signal\"\nsignal = \"go\"\ntimeout_ms = {U64_MAX}\n"
            ),
            ..Setup::default()
        },
        Setup {
            sections: format!("[a2a.push]\nenabled = true\nbackoff_ms = {U64_MAX}\n"),
            ..Setup::default()
        },
    ];
    let said = [
        "a2a.events.ring: must be from 1 to 65536, not 1000000000000".to_owned(),
        format!("limits.idle_timeout_ms: must be from 1 to 86400000, not {U64_MAX}"),
        format!("limits.request_timeout_ms: must be from 1 to 86400000, not {U64_MAX}"),
        "limits.max_body_bytes: must be from 1 to 4194304, not 4194305".to_owned(),
        format!("workflow \"w\" step \"a\": timeout_ms: must be from 1 to 86400000, not {U64_MAX}"),
        format!("a2a.push.backoff_ms: must be from 0 to 30000, not {U64_MAX}"),
    ];
    for (setup, needle) in cases.iter().zip(said) {
        let err = Daemon::try_launch_setup("smol", setup, |_| {})
            .err()
            .unwrap_or_else(|| panic!("started with {setup:?}"));
        assert!(err.message.contains(&needle), "{needle}: {}", err.message);
        assert!(
            !err.message.contains("panicked"),
            "a load error, not a panic: {}",
            err.message
        );
        let _ = std::fs::remove_dir_all(&err.dir);
    }
}

// ---------------------------------------------------------------------------------------
// 2. Grants that would reach operator-only ops
// ---------------------------------------------------------------------------------------

fn guest_rule(grants: &str) -> String {
    format!("[[a2a.principals]]\nid = \"guest\"\nrole = \"user\"\ngrants = {grants}\nmatch = {{ any = true }}\n")
}

fn command(op: &str) -> Vec<u8> {
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"role": "ROLE_USER", "messageId": format!("m-{op}"), "extensions": [COMMAND_URI],
                    "parts": [{"data": {"agentd": {"op": op}}}]}}});
    post(
        &[RPC_HEADERS[0], RPC_HEADERS[1], &ext],
        body.to_string().as_bytes(),
    )
}

/// `admin.*`, `auth.*` and `debug.*` for a non-operator rule stop start-up, naming the rule
/// and the ops; `*` loads and never reaches an operator-only op.
#[test]
fn grant_patterns_that_reach_operator_only_ops_stop_start_up() {
    for (grants, needle) in [
        (
            r#"["admin.*"]"#,
            "a2a.principals[0].grants: \"admin.*\" (rule \"guest\") would grant the operator-only ops admin.drain, admin.pause, admin.resume, admin.cancel, admin.set to role user",
        ),
        (
            r#"["auth.*"]"#,
            "would grant the operator-only ops auth.device.pending, auth.device.approve, auth.device.deny, auth.sessions, auth.sessions.revoke to role user",
        ),
        (
            r#"["workflow.*", "debug.*"]"#,
            "\"debug.*\" (rule \"guest\") would grant the operator-only op debug.events to role user",
        ),
    ] {
        let setup = Setup {
            sections: guest_rule(grants),
            ..Setup::default()
        };
        let err = Daemon::try_launch_setup("smol", &setup, |_| {})
            .err()
            .unwrap_or_else(|| panic!("started with grants = {grants}"));
        assert!(err.message.contains(needle), "{grants}: {}", err.message);
        let _ = std::fs::remove_dir_all(&err.dir);
    }
    // `*` is every op the role may be granted: `status` runs, `config` is 403.
    let d = Daemon::start_setup(
        "smol",
        &Setup {
            sections: guest_rule(r#"["*"]"#),
            ..Setup::default()
        },
    );
    let r = d.connect_tcp().request(&command("status"));
    assert_json_200(&r, "status");
    assert!(r.json().get("error").is_none(), "{}", r.json());
    let r = d.connect_tcp().request(&command("config"));
    assert_eq!(r.status, 403, "{:?}", r.body_text());
    let doc = r.json();
    assert_eq!(doc["error"]["code"], -31403, "{doc}");
    assert_eq!(
        detail(&doc, "ErrorInfo").map(|i| i["reason"].clone()),
        Some(json!("PERMISSION_DENIED")),
        "{doc}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. A command that repeats a member
// ---------------------------------------------------------------------------------------

fn a_command_that_repeats_a_member_is_refused_and_nothing_runs(driver: &str) {
    let d = Daemon::start(driver);
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let headers = [RPC_HEADERS[0], RPC_HEADERS[1], ext.as_str()];
    for (data, field) in [
        // The last would win in a JSON value: `config`, which the operator may run.
        (
            r#"{"agentd":{"op":"status","op":"config"}}"#,
            "message.parts[0].data.agentd.op",
        ),
        (
            r#"{"agentd":{"op":"admin.set","path":"agent.approval","value":"auto","value":"deny"}}"#,
            "message.parts[0].data.agentd.value",
        ),
        (
            r#"{"agentd":{"op":"workflow.run","workflow":"x","inputs":{"a":[{"b":1,"b":2}]}}}"#,
            "message.parts[0].data.agentd.inputs.a[0].b",
        ),
        (
            r#"{"agentd":{"op":"status"},"agentd":{"op":"config"}}"#,
            "message.parts[0].data.agentd",
        ),
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{{"message":{{"role":"ROLE_USER","messageId":"m","extensions":["{COMMAND_URI}"],"parts":[{{"data":{data}}}]}}}}}}"#
        );
        // Both listeners: the unix peer and the loopback TCP caller are the operator here.
        for via in Via::ALL {
            let mut c = d.connect(via);
            let r = c.request(&post(&headers, body.as_bytes()));
            let doc = assert_refusal(&r, -32602, None, field);
            let message = doc["error"]["message"].as_str().unwrap_or("");
            assert!(message.contains("duplicate member"), "{message}");
            // The connection goes on: the same command without the repeat runs.
            let r = c.request(&command("status"));
            assert_json_200(&r, "status");
            assert!(r.json().get("error").is_none(), "{}", r.json());
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. Two credentials on one request
// ---------------------------------------------------------------------------------------

fn two_authorization_headers_are_400_and_close(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            a2a: "bearer = \"{{secret:E2E_HOSTILE_OP}}\"".into(),
            env: vec![("E2E_HOSTILE_OP".into(), "op-token".into())],
            ..Setup::default()
        },
    );
    let body = rpc_body("1", "GetTask", &json!({"id": "nope"}));
    for (first, second) in [
        ("Bearer op-token", "Bearer wrong"),
        ("Bearer wrong", "Bearer op-token"),
        ("Bearer op-token", "Bearer op-token"),
    ] {
        let a = format!("Authorization: {first}");
        let b = format!("authorization: {second}");
        let mut c = d.connect_tcp();
        let r = c.request(&post(&[RPC_HEADERS[0], &a, RPC_HEADERS[1], &b], &body));
        assert_eq!(r.status, 400, "{first} + {second}: {}", r.body_text());
        assert!(r.says_close(), "{first} + {second}: {:?}", r.headers);
        assert!(
            r.body_text().contains("more than one Authorization"),
            "{}",
            r.body_text()
        );
        c.expect_eof("the connection after two Authorization headers");
    }
    // One credential is resolved as ever.
    let a = "Authorization: Bearer op-token";
    let r = d
        .connect_tcp()
        .request(&post(&[RPC_HEADERS[0], RPC_HEADERS[1], a], &body));
    assert_json_200(&r, "GetTask with one credential");
    assert_eq!(r.json()["error"]["code"], -32001, "{}", r.json());
}

// ---------------------------------------------------------------------------------------
// 5 and 6. Webhook URLs
// ---------------------------------------------------------------------------------------

fn push_daemon() -> Daemon {
    Daemon::start_setup(
        "smol",
        &Setup {
            sections: "[a2a.push]\nenabled = true\n".into(),
            ..Setup::default()
        },
    )
}

fn new_task(d: &Daemon) -> String {
    let params = json!({"message": {"role": "ROLE_USER", "messageId": "m-task", "parts": [{"text": "x"}]},
                        "configuration": {"returnImmediately": true}});
    let r = d
        .connect_tcp()
        .request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
        .json();
    r["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {r}"))
        .to_owned()
}

/// Every spelling of a private or loopback address is refused at registration (without
/// `allow_private`), naming `url`: the host is read as delivery would resolve it.
#[test]
fn webhook_hosts_that_normalize_to_private_addresses_are_refused() {
    let d = push_daemon();
    let task = new_task(&d);
    for url in [
        "https://0/",
        "https://127.1/",
        "https://0x7f000001/",
        "https://0177.0.0.1/",
        "https://127.0.0.1./",
        "https://localhost./",
        "https://169.254.43518/latest/meta-data",
        "https://[::ffff:a9fe:a9fe]/",
        "https://[fe80::a9fe]/",
    ] {
        let params = json!({"taskId": task, "url": url});
        let r = d.connect_tcp().request(&post(
            &RPC_HEADERS,
            &rpc_body("2", "CreateTaskPushNotificationConfig", &params),
        ));
        let doc = assert_refusal(&r, -32602, None, "url");
        let message = doc["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.starts_with("invalid params: url: push url refused: ")
                && message.contains("allow_private"),
            "{url}: {message}"
        );
    }
    // A bracketed IPv6 address is an address, not a host and a bad port.
    let params = json!({"taskId": task, "url": "https://[2001:db8::a9fe/"});
    let r = d.connect_tcp().request(&post(
        &RPC_HEADERS,
        &rpc_body("2", "CreateTaskPushNotificationConfig", &params),
    ));
    let doc = assert_refusal(&r, -32602, None, "url");
    assert!(
        doc["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unclosed [") && !m.contains("bad port")),
        "{doc}"
    );
    // Inline on a send, under its configuration path, before any task exists.
    let params = json!({"message": {"role": "ROLE_USER", "messageId": "m-inline", "parts": [{"text": "x"}]},
                        "configuration": {"taskPushNotificationConfig": {"url": "https://0x7f000001/"}}});
    let r = d
        .connect_tcp()
        .request(&post(&RPC_HEADERS, &rpc_body("3", "SendMessage", &params)));
    assert_refusal(
        &r,
        -32602,
        None,
        "configuration.taskPushNotificationConfig.url",
    );
}

#[test]
fn a_push_config_without_a_url_says_the_url_is_required() {
    let d = push_daemon();
    let task = new_task(&d);
    let params = json!({"taskId": task});
    let r = d.connect_tcp().request(&post(
        &RPC_HEADERS,
        &rpc_body("2", "CreateTaskPushNotificationConfig", &params),
    ));
    let doc = assert_refusal(&r, -32602, None, "url");
    let message = doc["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("invalid params: url: is required"),
        "{message}"
    );
}

/// Issue 15, item 11: a refusal the runtime decides (here: no such workflow) names the field
/// with the index of the part that carried the command, as the listener's refusals do: the
/// envelope rides in the second part, so `message.parts[1].data.agentd.workflow`.
fn a_refusal_decided_in_the_runtime_names_the_part_that_carried_the_command(driver: &str) {
    let d = Daemon::start(driver);
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"role": "ROLE_USER", "messageId": "run-nope", "extensions": [COMMAND_URI],
                    "parts": [{"text": "please run it"},
                              {"data": {"agentd": {"op": "workflow.run", "workflow": "nope"}}}]}}});
    let r = d.connect(Via::Unix).request(&post(
        &[RPC_HEADERS[0], RPC_HEADERS[1], &ext],
        body.to_string().as_bytes(),
    ));
    let doc = assert_refusal(
        &r,
        -32602,
        Some("INVALID_COMMAND_ARGS"),
        "message.parts[1].data.agentd.workflow",
    );
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no workflow named \"nope\""),
        "{doc}"
    );
}
