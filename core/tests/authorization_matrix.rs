//! The authorization matrix: every command op and every core method, called over TCP with a
//! bearer token as each role (the operator, an agent without grants, an agent granted `*`, a
//! user) and with no credential, against expectations written out from the spec's op table.

mod support;

use agentd_core::auth::{AuthConfig, BearerRule, Peer, Principal, Role};
use agentd_core::ext::command::table::OPS;
use agentd_core::ext::COMMAND_URI;
use serde_json::{json, Map, Value};
use support::*;

/// (op, user may, agent without grants may): the spec's floors and role defaults. An agent
/// granted `*` may run every op except the operator-floor ones.
const EXPECTED: &[(&str, bool, bool)] = &[
    ("status", true, true),
    ("config", false, false),
    ("workflow.run", true, true),
    ("workflow.status", true, true),
    ("workflow.cancel", true, false),
    ("workflow.signal", false, false),
    ("subagent.send", true, false),
    ("subagent.kill", false, false),
    ("subagent.status", true, false),
    ("plan.get", true, false),
    ("conversation.get", true, false),
    ("run.get", true, false),
    ("subagent.get", true, false),
    ("debug.events", false, false),
    ("admin.drain", false, false),
    ("admin.pause", false, false),
    ("admin.resume", false, false),
    ("admin.cancel", false, false),
    ("admin.set", false, false),
    ("auth.device.pending", false, false),
    ("auth.device.approve", false, false),
    ("auth.device.deny", false, false),
    ("auth.sessions", false, false),
    ("auth.sessions.revoke", false, false),
    ("_instance.result", false, false),
    ("_instance.emit", false, false),
];

const OPERATOR_FLOOR: &[&str] = &[
    "config",
    "debug.events",
    "_instance.result",
    "_instance.emit",
];

fn harness() -> Harness {
    let rule = |token: &str, p: Principal| BearerRule {
        digest: AuthConfig::digest(token),
        principal: p,
    };
    Harness::with(|c| {
        c.introspection_enabled = true;
        c.device_grant.enabled = true;
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op")),
            bearers: vec![
                rule("agent", Principal::new("agent:a", Role::Agent, vec![])),
                rule(
                    "agent-star",
                    Principal::new("agent:s", Role::Agent, vec!["*".into()]),
                ),
                rule("user", Principal::new("user:u", Role::User, vec![])),
            ],
            any: None,
            cert_rules: Vec::new(),
        };
    })
}

/// Arguments that satisfy an op's schema, made from the schema itself.
fn sample(schema: &Value) -> Value {
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        return e[0].clone();
    }
    if let Some(alternatives) = schema.get("oneOf").and_then(Value::as_array) {
        // The exactly-one-of ops: satisfy the first alternative only.
        let mut obj = Map::new();
        for name in alternatives[0]["required"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            obj.insert(name.into(), sample(&schema["properties"][name]));
        }
        return Value::Object(obj);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let mut obj = Map::new();
            for name in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = name.as_str().unwrap();
                obj.insert(name.into(), sample(&schema["properties"][name]));
            }
            Value::Object(obj)
        }
        Some("string") if schema.get("pattern").is_some() => json!("alice"),
        Some("string") => json!("x"),
        Some("integer") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        _ => json!(true),
    }
}

fn with_token(mut req: Vec<u8>, token: Option<&str>) -> Vec<u8> {
    if let Some(token) = token {
        let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
        req.splice(
            at..at,
            format!("Authorization: Bearer {token}\r\n").into_bytes(),
        );
    }
    req
}

#[derive(Debug, PartialEq)]
enum Answer {
    /// Ran: answered by the core, or handed to the host.
    Ran,
    Denied,
    Unauthenticated,
    Other(Value),
}

fn run_op(h: &mut Harness, op: &str, token: Option<&str>) -> Answer {
    let spec = OPS.iter().find(|s| s.op == op).unwrap();
    let mut envelope = sample(&(spec.args)());
    envelope["op"] = json!(op);
    let message = json!({"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],"parts":[{"data":{"agentd": envelope}}]});
    let mut c = h.conn_peer(0, Peer::Tcp);
    let out = c.feed(
        h,
        &with_token(
            call_ext(
                "SendMessage",
                1,
                json!({"message": message}),
                &[COMMAND_URI],
            ),
            token,
        ),
    );
    let effects = h.take_effects();
    if out.is_empty() {
        assert_eq!(effects.len(), 1, "{op}: handed to the host once");
        return Answer::Ran;
    }
    let r = one(&out);
    let j = r.json();
    match (r.status, j["error"]["code"].as_i64()) {
        (200, None) => Answer::Ran,
        // Authorized, then refused on its merits (auth.device.approve of an unknown code).
        (200, Some(-32602)) if j["error"]["data"][0]["reason"] == "INVALID_COMMAND_ARGS" => {
            Answer::Ran
        }
        (403, Some(-31403)) => {
            assert!(effects.is_empty(), "{op}: nothing refused runs");
            Answer::Denied
        }
        (401, Some(-31401)) => Answer::Unauthenticated,
        _ => Answer::Other(j),
    }
}

#[test]
fn every_op_as_every_role() {
    let mut h = harness();
    assert_eq!(EXPECTED.len(), OPS.len(), "every op has its expectation");
    for (op, user, agent) in EXPECTED {
        let expect = |may: bool| if may { Answer::Ran } else { Answer::Denied };
        assert_eq!(
            run_op(&mut h, op, Some("op")),
            Answer::Ran,
            "the operator may run {op}"
        );
        assert_eq!(
            run_op(&mut h, op, Some("user")),
            expect(*user),
            "user: {op}"
        );
        assert_eq!(
            run_op(&mut h, op, Some("agent")),
            expect(*agent),
            "agent without grants: {op}"
        );
        let star =
            !(OPERATOR_FLOOR.contains(op) || op.starts_with("admin.") || op.starts_with("auth."));
        assert_eq!(
            run_op(&mut h, op, Some("agent-star")),
            expect(star),
            "agent granted *: {op}"
        );
        assert_eq!(
            run_op(&mut h, op, None),
            Answer::Unauthenticated,
            "no credential: {op}"
        );
        assert_eq!(
            run_op(&mut h, op, Some("stolen")),
            Answer::Unauthenticated,
            "a bad credential: {op}"
        );
    }
    // The only tasks are the operator's own auth.device.deny and auth.sessions.revoke,
    // which the core completes itself; no refusal created one.
    assert_eq!(h.inst.task_count(), 2, "no refusal created a task");
}

#[test]
fn every_core_method_as_every_role() {
    let mut h = harness();
    let methods = [
        (
            "SendMessage",
            json!({"message": text_message("x",&fresh_id()), "configuration":{"returnImmediately":true}}),
            200,
        ),
        ("GetTask", json!({"id": "none"}), -32001),
        ("ListTasks", json!({}), 200),
        ("CancelTask", json!({"id": "none"}), -32001),
        ("SubscribeToTask", json!({"id": "none"}), -32001),
        (
            "CreateTaskPushNotificationConfig",
            json!({"taskId": "t", "url": "https://x"}),
            -32003,
        ),
        (
            "GetTaskPushNotificationConfig",
            json!({"taskId": "t", "id": "c"}),
            -32003,
        ),
        (
            "ListTaskPushNotificationConfigs",
            json!({"taskId": "t"}),
            -32003,
        ),
        (
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": "t", "id": "c"}),
            -32003,
        ),
        ("GetExtendedAgentCard", json!({}), 200),
    ];
    for token in ["op", "user", "agent", "agent-star"] {
        for (method, params, expect) in &methods {
            let mut c = h.conn_peer(0, Peer::Tcp);
            let r = one(&c.feed(
                &mut h,
                &with_token(call(method, 1, params.clone()), Some(token)),
            ));
            h.take_effects();
            let j = r.json();
            match expect {
                200 => assert!(j.get("result").is_some(), "{token} {method}: {j}"),
                code => assert_eq!(j["error"]["code"], *code, "{token} {method}"),
            }
        }
    }
    for (method, params, _) in &methods {
        for token in [None, Some("stolen")] {
            let mut c = h.conn_peer(0, Peer::Tcp);
            let r = one(&c.feed(&mut h, &with_token(call(method, 1, params.clone()), token)));
            assert_eq!(r.status, 401, "{method} with {token:?}");
        }
    }
}

/// A session token after its session was revoked: every op and every core method is 401.
#[test]
fn a_revoked_session_reaches_nothing() {
    let mut h = Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op")),
            ..AuthConfig::default()
        };
        c.device_grant = agentd_core::sessions::DeviceGrantConfig {
            enabled: true,
            ..Default::default()
        };
    });
    let form = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let mut d = h.conn_peer(0, Peer::Tcp);
    let grant = one(&d.feed(&mut h, &form("/oauth2/device_authorization", "client_id=x"))).json();
    assert_eq!(
        run_op_with(
            &mut h,
            json!({"op": "auth.device.approve", "user_code": grant["user_code"], "as": "carol"}),
            "op"
        ),
        Answer::Ran
    );
    let poll = format!(
        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code={}&client_id=x",
        grant["device_code"].as_str().unwrap()
    );
    let token = one(&d.feed(&mut h, &form("/oauth2/token", &poll))).json()["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        run_op(&mut h, "status", Some(&token)),
        Answer::Ran,
        "the live session works"
    );
    assert_eq!(
        run_op_with(
            &mut h,
            json!({"op": "auth.sessions.revoke", "all": true}),
            "op"
        ),
        Answer::Ran
    );
    for (op, ..) in EXPECTED {
        assert_eq!(
            run_op(&mut h, op, Some(&token)),
            Answer::Unauthenticated,
            "revoked session: {op}"
        );
    }
    for method in [
        "SendMessage",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "SubscribeToTask",
        "GetExtendedAgentCard",
        "CreateTaskPushNotificationConfig",
    ] {
        let mut c = h.conn_peer(0, Peer::Tcp);
        let r = one(&c.feed(
            &mut h,
            &with_token(call(method, 1, json!({})), Some(&token)),
        ));
        assert_eq!(r.status, 401, "revoked session: {method}");
    }
}

fn run_op_with(h: &mut Harness, envelope: Value, token: &str) -> Answer {
    let message = json!({"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],"parts":[{"data":{"agentd": envelope}}]});
    let mut c = h.conn_peer(0, Peer::Tcp);
    let out = c.feed(
        h,
        &with_token(
            call_ext(
                "SendMessage",
                1,
                json!({"message": message}),
                &[COMMAND_URI],
            ),
            Some(token),
        ),
    );
    h.take_effects();
    let r = one(&out);
    match (r.status, r.json()["error"]["code"].as_i64()) {
        (200, None) => Answer::Ran,
        (403, _) => Answer::Denied,
        (401, _) => Answer::Unauthenticated,
        _ => Answer::Other(r.json()),
    }
}
