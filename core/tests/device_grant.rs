//! The device authorization grant end to end in memory: a device asks for a code, the
//! operator approves it with auth.device.approve, the device polls for its session token and
//! calls as user:<name>; revoking the session ends its feed stream with goodbye "revoked"
//! and its token stops working.

mod support;

use agentd_core::auth::{AuthConfig, Peer};
use agentd_core::sessions::DeviceGrantConfig;
use serde_json::{json, Value};
use support::*;

const COMMAND: &str = "https://agentd.dev/a2a/ext/command";
const EVENTS: &str = "https://agentd.dev/a2a/ext/events";

fn harness(enabled: bool) -> Harness {
    Harness::with(|c| {
        c.events_enabled = true;
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op")),
            ..Default::default()
        };
        c.device_grant = DeviceGrantConfig {
            enabled,
            ..Default::default()
        };
    })
}

fn form(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn bearer(mut req: Vec<u8>, token: &str) -> Vec<u8> {
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(
        at..at,
        format!("Authorization: Bearer {token}\r\n").into_bytes(),
    );
    req
}

fn command(op: Value) -> Value {
    json!({"message": {"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND],"parts":[{"data":{"agentd": op}}]}})
}

fn op_call(h: &mut Harness, envelope: Value) -> Value {
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = one(&c.feed(
        h,
        &bearer(
            call_ext("SendMessage", 1, command(envelope), &[COMMAND]),
            "op",
        ),
    ));
    r.json()
}

#[test]
fn a_device_signs_in_acts_as_its_name_and_is_revoked() {
    let mut h = harness(true);
    let mut device = h.conn_peer(0, Peer::Tcp);
    let r = one(&device.feed(
        &mut h,
        &form("/oauth2/device_authorization", "client_id=laptop"),
    ));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let grant = r.json();
    let device_code = grant["device_code"].as_str().unwrap().to_owned();
    let user_code = grant["user_code"].as_str().unwrap().to_owned();
    assert_eq!(
        grant["verification_uri"],
        "http://127.0.0.1:8420/oauth2/device"
    );
    assert_eq!(grant["interval"], 5);
    assert_eq!(grant["expires_in"], 600);

    let poll = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code={device_code}&client_id=laptop");
    let r = one(&device.feed(&mut h, &form("/oauth2/token", &poll)));
    assert_eq!(
        (r.status, r.json()["error"].clone()),
        (400, json!("authorization_pending"))
    );

    // The operator sees the pending sign-in and approves it as alice.
    let pending = op_call(&mut h, json!({"op": "auth.device.pending"}));
    let items = &pending["result"]["message"]["parts"][0]["data"]["pending"];
    assert_eq!(items[0]["user_code"], user_code.as_str());
    assert_eq!(items[0]["client_id"], "laptop");
    let approved = op_call(
        &mut h,
        json!({"op": "auth.device.approve", "user_code": user_code, "as": "alice"}),
    );
    let task = &approved["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    let artifact = &task["artifacts"][0];
    assert_eq!(
        artifact["artifactId"],
        format!("{}.result", task["id"].as_str().unwrap())
    );
    assert_eq!(
        artifact["parts"][0]["data"]["approved"]["principal"],
        "user:alice"
    );
    assert_eq!(artifact["extensions"], json!([COMMAND]));

    h.advance(5_000);
    let r = one(&device.feed(&mut h, &form("/oauth2/token", &poll)));
    assert_eq!(r.status, 200);
    let issued = r.json();
    let token = issued["access_token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("agentd_at_"));
    assert_eq!(issued["token_type"], "Bearer");
    assert_eq!(issued["scope"], "user");

    // The session acts as user:alice: it owns what it creates.
    let mut alice = h.conn_peer(0, Peer::Tcp);
    let r = one(&alice.feed(&mut h, &bearer(call("SendMessage", 2, json!({"message": text_message("hi","m"), "configuration":{"returnImmediately":true}})), &token)));
    let task_id = r.json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    h.take_effects();
    let sessions = op_call(&mut h, json!({"op": "auth.sessions"}));
    let list = &sessions["result"]["message"]["parts"][0]["data"]["sessions"];
    assert_eq!(list[0]["principal"], "user:alice");
    assert_eq!(list[0]["kind"], "device");
    let sid = list[0]["sid"].as_str().unwrap().to_owned();
    // The session's extended card exists: it was named through a declared scheme.
    let card = one(&alice.feed(
        &mut h,
        &bearer(call("GetExtendedAgentCard", 3, json!({})), &token),
    ));
    assert_eq!(card.status, 200);

    // Its feed stream, then the revocation.
    let mut feed = h.conn_peer(0, Peer::Tcp);
    let out = feed.feed(
        &mut h,
        &bearer(
            call_ext(
                "agentd.events/SubscribeToEvents",
                7,
                json!({"fromSeq": 0}),
                &[EVENTS],
            ),
            &token,
        ),
    );
    let seen: Vec<Value> = first_head(&out).events();
    assert!(
        seen.iter()
            .any(|f| f["result"]["event"]["data"]["task"]["id"] == task_id.as_str()),
        "alice sees her task"
    );
    assert!(
        !seen.iter().any(|f| f["result"]["event"]["kind"] == "auth"),
        "auth events are the operator's"
    );
    let revoked = op_call(&mut h, json!({"op": "auth.sessions.revoke", "sid": sid}));
    assert_eq!(
        revoked["result"]["task"]["artifacts"][0]["parts"][0]["data"]["revoked"],
        1
    );
    let end = feed.poll(&mut h);
    let text = String::from_utf8_lossy(&end);
    assert!(text.contains(r#""goodbye":{"reason":"revoked""#), "{text}");
    assert!(
        !text.contains(r#""kind":"auth""#),
        "nothing past the revocation"
    );
    assert!(text.ends_with("0\r\n\r\n"));
    let r = one(&alice.feed(&mut h, &bearer(call("ListTasks", 4, json!({})), &token)));
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer realm="agentd", error="invalid_token""#)
    );
    // Revoking deletes nothing the principal owns.
    let list = op_call(&mut h, json!({"op": "auth.sessions"}));
    assert_eq!(
        list["result"]["message"]["parts"][0]["data"]["sessions"],
        json!([])
    );
    let mut op = h.conn_peer(0, Peer::Tcp);
    let r = one(&op.feed(
        &mut h,
        &bearer(call("GetTask", 5, json!({"id": task_id})), "op"),
    ));
    assert!(r.json()["result"]["id"].is_string());

    // The operator's feed saw the sign-in's life: pending, approved, revoked.
    let mut opfeed = h.conn_peer(0, Peer::Tcp);
    let frames = first_head(&opfeed.feed(
        &mut h,
        &bearer(
            call_ext(
                "agentd.events/SubscribeToEvents",
                8,
                json!({"fromSeq": 0}),
                &[EVENTS],
            ),
            "op",
        ),
    ))
    .events();
    let auth: Vec<&str> = frames
        .iter()
        .filter(|f| f["result"]["event"]["kind"] == "auth")
        .map(|f| f["result"]["event"]["data"]["event"].as_str().unwrap())
        .collect();
    assert_eq!(auth, ["pending", "approved", "revoked"]);
}

#[test]
fn refusals_and_denials() {
    let mut h = harness(true);
    let mut d = h.conn_peer(0, Peer::Tcp);
    for (path, body, code) in [
        ("/oauth2/device_authorization", "", "invalid_request"),
        ("/oauth2/device_authorization", "client_id=bad%20id", "invalid_request"),
        ("/oauth2/device_authorization", "client_id=a&client_id=b", "invalid_request"),
        ("/oauth2/device_authorization", "client_id=a&scope=operator", "invalid_scope"),
        ("/oauth2/token", "grant_type=password&device_code=x&client_id=a", "unsupported_grant_type"),
        ("/oauth2/token", "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code=nope&client_id=a", "invalid_grant"),
    ] {
        let r = one(&d.feed(&mut h, &form(path, body)));
        assert_eq!((r.status, r.json()["error"].clone()), (400, json!(code)), "{path} {body}");
    }
    let grant = one(&d.feed(
        &mut h,
        &form("/oauth2/device_authorization", "client_id=kiosk"),
    ))
    .json();
    let j = op_call(
        &mut h,
        json!({"op": "auth.device.approve", "user_code": "BCDF-GHJK", "as": "bob"}),
    );
    assert_eq!(j["error"]["data"][0]["reason"], "INVALID_COMMAND_ARGS");
    let j = op_call(
        &mut h,
        json!({"op": "auth.device.approve", "user_code": grant["user_code"], "as": "operator"}),
    );
    assert_eq!(
        j["error"]["data"][0]["reason"], "INVALID_COMMAND_ARGS",
        "a reserved name"
    );
    let denied = op_call(
        &mut h,
        json!({"op": "auth.device.deny", "user_code": grant["user_code"]}),
    );
    assert_eq!(
        denied["result"]["task"]["artifacts"][0]["parts"][0]["data"]["denied"],
        1
    );
    let poll = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code={}&client_id=kiosk", grant["device_code"].as_str().unwrap());
    let r = one(&d.feed(&mut h, &form("/oauth2/token", &poll)));
    assert_eq!(r.json()["error"], "access_denied");
    // A forged session token is refused, never treated as a configured bearer.
    let r = one(&d.feed(
        &mut h,
        &bearer(call("ListTasks", 1, json!({})), "agentd_at_0000"),
    ));
    assert_eq!(r.status, 401);
    // The metadata and the card.
    let meta = one(&d.feed(
        &mut h,
        b"GET /.well-known/oauth-authorization-server HTTP/1.1\r\nHost: x\r\n\r\n",
    ))
    .json();
    assert_eq!(meta["issuer"], "http://127.0.0.1:8420");
    assert_eq!(meta["token_endpoint"], "http://127.0.0.1:8420/oauth2/token");
    let card = one(&d.feed(&mut h, CARD_GET)).json();
    assert_eq!(
        card["securitySchemes"]["device_code"]["oauth2SecurityScheme"]["flows"]["deviceCode"]
            ["deviceAuthorizationUrl"],
        "http://127.0.0.1:8420/oauth2/device_authorization"
    );
    assert_eq!(
        card["securityRequirements"][1],
        json!({"schemes": {"device_code": {"list": []}}})
    );
    let r = one(&d.feed(&mut h, b"GET /oauth2/token HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));

    // Disabled: the endpoints do not exist, and the ops are not served.
    let mut off = harness(false);
    let mut c = off.conn_peer(0, Peer::Tcp);
    let r = one(&c.feed(
        &mut off,
        &form("/oauth2/device_authorization", "client_id=a"),
    ));
    assert_eq!(r.status, 404);
    let j = op_call(&mut off, json!({"op": "auth.device.pending"}));
    assert_eq!(j["error"]["data"][0]["reason"], "UNKNOWN_OP");
}

/// Signs a device in as `name`: the grant, the operator's approval, the token poll.
fn device_session(h: &mut Harness, name: &str) -> String {
    let mut device = h.conn_peer(0, Peer::Tcp);
    let grant =
        one(&device.feed(h, &form("/oauth2/device_authorization", "client_id=laptop"))).json();
    let device_code = grant["device_code"].as_str().unwrap().to_owned();
    let user_code = grant["user_code"].as_str().unwrap().to_owned();
    op_call(
        h,
        json!({"op": "auth.device.approve", "user_code": user_code, "as": name}),
    );
    h.advance(5_000);
    let poll = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code={device_code}&client_id=laptop");
    let r = one(&device.feed(h, &form("/oauth2/token", &poll)));
    r.json()["access_token"].as_str().unwrap().to_owned()
}

fn audit_events(h: &Harness) -> Vec<Value> {
    let ring = h.inst.feed().expect("the feed is on");
    ring.after(0)
        .filter(|e| e.kind == "audit")
        .map(|e| serde_json::from_str(e.data()).unwrap())
        .collect()
}

/// The core's own answers are audited while introspection is on: writes and refusals, with
/// the session's sid for a session caller; successful reads are not.
#[test]
fn core_answers_are_audited_with_the_session_id() {
    let mut h = harness(true);
    let token = device_session(&mut h, "alice");
    assert!(
        audit_events(&h).is_empty(),
        "nothing is audited while introspection is off"
    );
    let now = h.now;
    h.inst.set_introspection(true, "admin.set", now);

    let mut alice = h.conn_peer(0, Peer::Tcp);
    let send =
        json!({"message": text_message("hi","m1"), "configuration":{"returnImmediately":true}});
    let r = one(&alice.feed(&mut h, &bearer(call("SendMessage", 1, send), &token)));
    let task_id = r.json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    h.take_effects();
    // A successful read is not mirrored; a refused one is.
    one(&alice.feed(
        &mut h,
        &bearer(call("GetTask", 2, json!({"id": task_id})), &token),
    ));
    one(&alice.feed(
        &mut h,
        &bearer(call("GetTask", 3, json!({"id": "nope"})), &token),
    ));
    // A message-reply op read by the operator is not mirrored either.
    op_call(&mut h, json!({"op": "auth.sessions"}));

    let events = audit_events(&h);
    let sessions = op_call(&mut h, json!({"op": "auth.sessions"}));
    let sid = sessions["result"]["message"]["parts"][0]["data"]["sessions"][0]["sid"].clone();
    assert!(sid.as_str().is_some_and(|s| s.starts_with("ds_")), "{sid}");
    let summary: Vec<(Value, Value, Value, Value)> = events
        .iter()
        .map(|e| {
            (
                e["action"].clone(),
                e["target"].clone(),
                e["outcome"].clone(),
                e.get("sid").cloned().unwrap_or(Value::Null),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (json!("SendMessage"), Value::Null, json!("ok"), sid.clone()),
            (
                json!("GetTask"),
                json!("nope"),
                json!("refused -32001"),
                sid
            ),
        ],
        "{events:?}"
    );
    assert!(events
        .iter()
        .all(|e| e["principal"] == "user:alice" && e["role"] == "user"));
}

/// A connection from `addr`, as a TCP driver reports its peer.
fn from(h: &Harness, addr: &str) -> Client {
    let mut c = h.conn_peer(0, Peer::Tcp);
    c.conn.set_source(addr.parse().unwrap());
    c
}

fn ask_code(h: &mut Harness, c: &mut Client, client_id: &str) -> Resp {
    one(&c.feed(
        h,
        &form(
            "/oauth2/device_authorization",
            &format!("client_id={client_id}"),
        ),
    ))
}

/// §7.5: device authorization per source, a burst of 5 then one per 12 s; every address of
/// 127.0.0.0/8 (and its IPv4-mapped IPv6 form) is one source.
#[test]
fn device_authorization_is_rate_limited_per_source() {
    let mut h = harness(true);
    for (i, addr) in [
        "127.0.0.1",
        "127.0.0.2",
        "127.1.2.3",
        "::ffff:127.9.9.9",
        "127.0.0.5",
    ]
    .iter()
    .enumerate()
    {
        let mut c = from(&h, addr);
        let r = ask_code(&mut h, &mut c, &format!("d{i}"));
        // The fifth waits on the pending-code share (4 per source), not on the rate.
        if i < 4 {
            assert_eq!(r.status, 200, "{addr}");
        } else {
            assert_eq!(r.status, 429, "{addr}: four codes per source");
        }
    }
    let mut c = from(&h, "127.200.0.1");
    let r = ask_code(&mut h, &mut c, "d5");
    assert_eq!(r.status, 429, "the sixth request of the burst");
    assert_eq!(r.json()["error"], "slow_down");
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=12).contains(&wait), "{wait}");
    // Another source is not held up by it.
    let mut other = from(&h, "192.0.2.7");
    assert_eq!(ask_code(&mut h, &mut other, "x").status, 200);
}

/// At the global cap of 64 pending codes, a flood from a few networks displaces only itself:
/// a device from another network still gets a code.
#[test]
fn a_flood_of_pending_codes_never_locks_everyone_out() {
    let mut h = harness(true);
    // Four IPv6 /48s, each filling its 16 codes from four /64s (4 codes each): 64 in all.
    let mut n = 0;
    for net in 1..=4u16 {
        for sub in 1..=4u16 {
            // Four requests from one source: within its burst of five.
            for _ in 0..4 {
                let mut c = from(&h, &format!("2001:db8:{net}:{sub}::{}", n + 1));
                let r = ask_code(&mut h, &mut c, &format!("f{n}"));
                assert_eq!(r.status, 200, "flood code {n}");
                n += 1;
            }
        }
        // A fifth /64 of the same /48: the network holds its 16 already.
        let mut c = from(&h, &format!("2001:db8:{net}:99::1"));
        let r = ask_code(&mut h, &mut c, "extra");
        assert_eq!(r.status, 429, "sixteen per network");
    }
    let pending = op_call(&mut h, json!({"op": "auth.device.pending"}));
    let count = |v: &Value| {
        v["result"]["message"]["parts"][0]["data"]["pending"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(count(&pending), 64);
    // The global cap is reached; a device from elsewhere still gets its code.
    let mut legit = from(&h, "198.51.100.10");
    let r = ask_code(&mut h, &mut legit, "laptop");
    assert_eq!(r.status, 200, "{}", r.json());
    let pending = op_call(&mut h, json!({"op": "auth.device.pending"}));
    assert_eq!(count(&pending), 64, "one flood code made room");
}
