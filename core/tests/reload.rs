//! A reload (SIGHUP) swaps rules, posture, CORS origins and introspection in one step:
//! existing connections resolve their next request under the new value.

mod support;

use agentd_core::auth::{AuthConfig, BearerRule, Peer, Principal, Role};
use agentd_core::http::cors::CorsPolicy;
use agentd_core::Reloadable;
use serde_json::{json, Value};
use support::*;

fn with_header(mut req: Vec<u8>, header: &str) -> Vec<u8> {
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(at..at, format!("{header}\r\n").into_bytes());
    req
}

fn list(id: u64, token: Option<&str>) -> Vec<u8> {
    let req = call("ListTasks", id, json!({}));
    match token {
        Some(t) => with_header(req, &format!("Authorization: Bearer {t}")),
        None => req,
    }
}

fn rule(token: &str, id: &str) -> AuthConfig {
    AuthConfig {
        bearers: vec![BearerRule {
            digest: AuthConfig::digest(token),
            principal: Principal::new(format!("user:{id}"), Role::User, vec![]),
        }],
        ..AuthConfig::default()
    }
}

fn reloadable(auth: AuthConfig, origins: &[&str], introspection: bool) -> Reloadable {
    Reloadable {
        auth,
        cors: CorsPolicy::from_list(origins).unwrap(),
        introspection_enabled: introspection,
        config_document: json!({"reloaded": true}),
    }
}

fn card_schemes(h: &mut Harness, c: &mut Client) -> Value {
    one(&c.feed(h, CARD_GET)).json()["securitySchemes"].clone()
}

#[test]
fn the_first_rule_ends_the_implicit_operator_at_once() {
    let mut h = Harness::new();
    let mut c = h.conn_peer(0, Peer::Tcp);
    assert_eq!(one(&c.feed(&mut h, &list(1, None))).status, 200);
    assert_eq!(card_schemes(&mut h, &mut c), Value::Null);

    let changed = h
        .inst
        .reload(reloadable(rule("alice-1", "alice"), &[], false));
    assert_eq!(changed, vec!["a2a.principals"]);
    // The same connection: its next request is resolved under the new rules.
    assert_eq!(one(&c.feed(&mut h, &list(2, None))).status, 401);
    assert_eq!(one(&c.feed(&mut h, &list(3, Some("alice-1")))).status, 200);
    assert!(
        card_schemes(&mut h, &mut c)["bearer"].is_object(),
        "the card follows the rules"
    );
    assert_eq!(h.inst.config().config_document, json!({"reloaded": true}));
}

#[test]
fn an_old_bearer_stops_and_a_new_one_works() {
    let mut h = Harness::with(|c| c.auth = rule("alice-1", "alice"));
    let mut c = h.conn_peer(0, Peer::Tcp);
    assert_eq!(one(&c.feed(&mut h, &list(1, Some("alice-1")))).status, 200);
    assert_eq!(one(&c.feed(&mut h, &list(2, Some("alice-2")))).status, 401);

    let changed = h
        .inst
        .reload(reloadable(rule("alice-2", "alice"), &[], false));
    assert_eq!(changed, vec!["a2a.principals"]);
    assert_eq!(one(&c.feed(&mut h, &list(3, Some("alice-1")))).status, 401);
    assert_eq!(one(&c.feed(&mut h, &list(4, Some("alice-2")))).status, 200);

    // The same value again changes nothing.
    let changed = h
        .inst
        .reload(reloadable(rule("alice-2", "alice"), &[], false));
    assert!(changed.is_empty(), "{changed:?}");
}

#[test]
fn cors_origins_and_introspection_change_together() {
    let mut h = Harness::with(|c| c.auth = rule("alice-1", "alice"));
    let mut c = h.conn_peer(0, Peer::Tcp);
    let browser = |id| with_header(list(id, Some("alice-1")), "Origin: http://localhost:3000");
    let r = one(&c.feed(&mut h, &browser(1)));
    assert_eq!(r.status, 403, "an unlisted origin is refused");
    assert!(!h.inst.config().introspection_enabled);

    let changed = h.inst.reload(reloadable(
        rule("alice-1", "alice"),
        &["http://localhost:3000"],
        true,
    ));
    assert_eq!(
        changed,
        vec!["a2a.cors.origins", "a2a.introspection.enabled"]
    );
    // The refused connection was closed: a new one is admitted under the new origins.
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = one(&c.feed(&mut h, &browser(2)));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    assert!(h.inst.config().introspection_enabled);

    // Refused (with its connection closed) once the origin is no longer listed.
    let changed = h
        .inst
        .reload(reloadable(rule("alice-1", "alice"), &[], false));
    assert_eq!(
        changed,
        vec!["a2a.cors.origins", "a2a.introspection.enabled"]
    );
    assert!(!h.inst.config().introspection_enabled);
    assert_eq!(one(&c.feed(&mut h, &browser(3))).status, 403);
}
