//! Who may call, in memory: 401 with the challenge, bearer principals and ownership, the
//! card's security posture, and the extended card narrowed per caller.

mod support;

use agentd_core::auth::{AuthConfig, BearerRule, Peer, Principal, Role};
use agentd_core::ext::command::DeclaredCommand;
use serde_json::{json, Value};
use support::*;

const COMMAND: &str = "https://agentd.dev/a2a/ext/command";

fn secured(any: bool) -> Harness {
    let mut h = Harness::with(|c| {
        c.events_enabled = true;
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            bearers: vec![
                BearerRule {
                    digest: AuthConfig::digest("peer-token"),
                    principal: Principal::new(
                        "agent:peer-a",
                        Role::Agent,
                        vec!["review.change".into()],
                    ),
                },
                BearerRule {
                    digest: AuthConfig::digest("alice-token"),
                    principal: Principal::new("user:alice", Role::User, vec![]),
                },
            ],
            any: any.then(|| Principal::new("user:guest", Role::User, vec![])),
            cert_rules: Vec::new(),
        };
    });
    h.inst
        .register_command(DeclaredCommand {
            op: "review.change".into(),
            workflow: "review".into(),
            schema: json!({"type":"object","required":["change"],"properties":{"change":{"type":"string"}}}),
            roles: vec![Role::Agent],
        })
        .unwrap();
    h
}

fn with_token(mut req: Vec<u8>, token: &str) -> Vec<u8> {
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    let header = format!("Authorization: Bearer {token}\r\n");
    req.splice(at..at, header.into_bytes());
    req
}

#[test]
fn missing_and_bad_credentials_answer_401_with_the_challenge() {
    let mut h = secured(false);
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = one(&c.feed(&mut h, &call("GetTask", 1, json!({"id": "x"}))));
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer realm="agentd""#)
    );
    let j = r.json();
    assert_eq!(j["error"]["code"], -31401);
    assert_eq!(j["id"], Value::Null, "refused before the body is read");
    let r = one(&c.feed(
        &mut h,
        &with_token(call("GetTask", 1, json!({"id": "x"})), "wrong"),
    ));
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer realm="agentd", error="invalid_token""#)
    );
    // The card is public.
    let card = one(&c.feed(&mut h, CARD_GET));
    assert_eq!(card.status, 200);
    assert_eq!(h.inst.task_count(), 0);
}

#[test]
fn a_browser_request_is_never_the_implicit_operator() {
    let mut h = Harness::with(|c| {
        c.cors =
            agentd_core::http::cors::CorsPolicy::from_list(&["http://localhost:3000"]).unwrap();
    });
    let mut c = h.conn_peer(0, Peer::Tcp);
    // A listed origin passes the origin gate, but admission is not trust.
    let mut req = call("ListTasks", 1, json!({}));
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(at..at, b"Origin: http://localhost:3000\r\n".to_vec());
    let r = one(&c.feed(&mut h, &req));
    assert_eq!(r.status, 401);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("browser"));
    // Without Origin the same local caller is the operator.
    assert_eq!(
        one(&c.feed(&mut h, &call("ListTasks", 2, json!({})))).status,
        200
    );
}

#[test]
fn each_principal_sees_only_its_own_tasks() {
    let mut h = secured(false);
    let mut alice = h.conn_peer(0, Peer::Tcp);
    let send = call(
        "SendMessage",
        1,
        json!({"message": text_message("x","m"), "configuration":{"returnImmediately":true}}),
    );
    let r = one(&alice.feed(&mut h, &with_token(send.clone(), "alice-token")));
    let id = r.json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    h.take_effects();
    let mut peer = h.conn_peer(0, Peer::Tcp);
    for (method, params) in [
        ("GetTask", json!({"id": id})),
        ("CancelTask", json!({"id": id})),
        ("SubscribeToTask", json!({"id": id})),
    ] {
        let r = one(&peer.feed(&mut h, &with_token(call(method, 2, params), "peer-token")));
        assert_rpc_error(&r, -32001, Some("TASK_NOT_FOUND"));
    }
    let list = one(&peer.feed(
        &mut h,
        &with_token(call("ListTasks", 3, json!({})), "peer-token"),
    ))
    .json();
    assert_eq!(list["result"]["totalSize"], 0);
    let mut op = h.conn_peer(0, Peer::Tcp);
    let list = one(&op.feed(
        &mut h,
        &with_token(call("ListTasks", 4, json!({})), "op-token"),
    ))
    .json();
    assert_eq!(list["result"]["totalSize"], 1, "the operator sees all");
    let r = one(&alice.feed(
        &mut h,
        &with_token(call("GetTask", 5, json!({"id": id})), "alice-token"),
    ));
    assert_eq!(r.json()["result"]["id"], id.as_str());
}

#[test]
fn the_card_declares_the_scheme_it_enforces() {
    let mut h = secured(false);
    let mut c = h.conn_peer(0, Peer::Tcp);
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    assert_eq!(card["capabilities"]["extendedAgentCard"], true);
    assert_eq!(
        card["securitySchemes"],
        json!({"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}})
    );
    assert_eq!(
        card["securityRequirements"],
        json!([{"schemes": {"bearer": {"list": []}}}])
    );
    // The unix listener: no scheme, no extended card.
    let mut u = h.conn_on(1);
    let card = one(&u.feed(&mut h, CARD_GET)).json();
    assert_eq!(card["capabilities"]["extendedAgentCard"], false);
    assert!(card.get("securitySchemes").is_none());
    let r = one(&u.feed(&mut h, &call("GetExtendedAgentCard", 1, json!({}))));
    assert_rpc_error(&r, -32004, Some("UNSUPPORTED_OPERATION"));
    // An any rule adds the empty alternative.
    let mut h = secured(true);
    let mut c = h.conn_peer(0, Peer::Tcp);
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    assert_eq!(card["securityRequirements"][1], json!({"schemes": {}}));
    // ... but a caller it admits is not named by a declared scheme: 401 for the extended card.
    let r = one(&c.feed(&mut h, &call("GetExtendedAgentCard", 1, json!({}))));
    assert_eq!(r.status, 401);
}

fn extended(h: &mut Harness, token: &str) -> Value {
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = one(&c.feed(
        h,
        &with_token(call("GetExtendedAgentCard", 1, json!({})), token),
    ));
    assert_eq!(r.status, 200);
    r.json()["result"].clone()
}

#[test]
fn the_extended_card_narrows_to_the_caller() {
    let mut h = secured(false);
    // The host's workflows: `review` (started by the declared command, agents only) and
    // `deploy`, which declares no command and users may run through `workflow.run`.
    let entry = |name: &str, role: Role| agentd_core::view::WorkflowEntry {
        name: name.into(),
        doc: json!({ "name": name }),
        roles: vec![role],
    };
    h.inst.set_workflows(vec![
        entry("review", Role::Agent),
        entry("deploy", Role::User),
    ]);
    // The overview's example: role agent with a grant for one declared command.
    let card = extended(&mut h, "peer-token");
    let command = &card["capabilities"]["extensions"][0];
    assert_eq!(command["uri"], COMMAND);
    assert_eq!(
        command["params"]["ops"],
        json!([{"op":"status","reply":"message"},{"op":"workflow.run","reply":"task"},{"op":"workflow.status","reply":"message"}])
    );
    assert_eq!(
        command["params"]["commands"],
        json!([{"op":"review.change","workflow":"review","schema":{"type":"object","required":["change"],"properties":{"change":{"type":"string"}}}}])
    );
    assert!(
        command["params"].get("settable").is_none(),
        "only for a caller that may run admin.set"
    );
    let events = &card["capabilities"]["extensions"][1];
    assert_eq!(events["params"]["ring"], 1024);
    let kinds: Vec<&str> = events["params"]["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"task") && kinds.contains(&"lifecycle") && !kinds.contains(&"step"),
        "{kinds:?}"
    );
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(skills, ["conversation", "workflow:review"]);

    // A user without the grant: the user defaults, no declared commands, no workflow skill.
    let card = extended(&mut h, "alice-token");
    let ops: Vec<&str> = card["capabilities"]["extensions"][0]["params"]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops,
        [
            "status",
            "workflow.run",
            "workflow.status",
            "workflow.cancel",
            "subagent.send",
            "subagent.status",
            "plan.get"
        ]
    );
    assert!(card["capabilities"]["extensions"][0]["params"]
        .get("commands")
        .is_none());
    // Yet it may run `deploy` with workflow.run, as `status` shows it: the card says so.
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(skills, ["conversation", "workflow:deploy"]);

    // The operator: every served op, settable, every kind (audit only with introspection).
    let card = extended(&mut h, "op-token");
    let params = &card["capabilities"]["extensions"][0]["params"];
    let ops: Vec<&str> = params["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert!(
        ops.contains(&"admin.drain") && ops.contains(&"auth.sessions") && ops.contains(&"config")
    );
    assert!(
        !ops.contains(&"conversation.get"),
        "introspection is off: not served"
    );
    assert!(
        !ops.contains(&"auth.device.pending"),
        "the device grant is off: not served"
    );
    assert_eq!(
        params["settable"],
        json!(["agent.approval", "a2a.introspection.enabled"])
    );
    let kinds = card["capabilities"]["extensions"][1]["params"]["kinds"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        kinds, 17,
        "every kind but audit, while introspection is off"
    );
}

fn with_header(mut req: Vec<u8>, header: &str) -> Vec<u8> {
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(at..at, format!("{header}\r\n").into_bytes());
    req
}

#[test]
fn cors_serves_listed_origins_only() {
    let auth = secured(false).config.auth.clone();
    let mut h = Harness::with(|c| {
        c.auth = auth;
        c.cors =
            agentd_core::http::cors::CorsPolicy::from_list(&["http://localhost:3000"]).unwrap();
    });
    let mut c = h.conn_peer(0, Peer::Tcp);
    // A listed origin: the answer names it and exposes the echo and the challenge.
    let req = with_header(
        with_token(
            call_ext(
                "ListTasks",
                1,
                json!({}),
                &["https://agentd.dev/a2a/ext/task-annotations"],
            ),
            "op-token",
        ),
        "Origin: http://localhost:3000",
    );
    let r = one(&c.feed(&mut h, &req));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    assert_eq!(
        r.header("access-control-expose-headers"),
        Some("a2a-extensions, retry-after, www-authenticate")
    );
    assert!(r.header("a2a-extensions").is_some());
    // Even a 401 carries them, so the page can read the challenge.
    let req = with_header(
        call("ListTasks", 2, json!({})),
        "Origin: http://localhost:3000",
    );
    let r = one(&c.feed(&mut h, &req));
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    // The preflight.
    let pre = b"OPTIONS / HTTP/1.1\r\nHost: x\r\nOrigin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: a2a-extensions, a2a-version, authorization, content-type\r\nAccess-Control-Request-Private-Network: true\r\n\r\n";
    let r = one(&c.feed(&mut h, pre));
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    let allowed = r.header("access-control-allow-headers").unwrap();
    for needed in [
        "a2a-extensions",
        "a2a-version",
        "authorization",
        "content-type",
    ] {
        assert!(allowed.contains(needed), "{allowed}");
    }
    assert_eq!(
        r.header("access-control-allow-private-network"),
        Some("true")
    );
    // An unlisted origin: 403, no CORS headers, the body never read, nothing run.
    for origin in ["http://evil.example", "null", "http://localhost:3001"] {
        let mut c = h.conn_peer(0, Peer::Tcp);
        let req = with_header(
            with_token(
                call("SendMessage", 3, json!({"message": text_message("x","m")})),
                "op-token",
            ),
            &format!("Origin: {origin}"),
        );
        let r = one(&c.feed(&mut h, &req));
        assert_eq!(r.status, 403, "{origin}");
        assert!(r.body.is_empty());
        assert!(r.header("access-control-allow-origin").is_none());
        assert_eq!(r.header("vary"), Some("Origin"));
    }
    assert_eq!(h.inst.task_count(), 0);
    // The card is public to every origin.
    let r = one(&c.feed(&mut h, b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\n\r\n"));
    assert_eq!(
        (r.status, r.header("access-control-allow-origin")),
        (200, Some("*"))
    );
}
