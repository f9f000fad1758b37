//! The limiters of §7.5 in memory, on the fake clock: the failure limiter per source (burst
//! 20, one forgiven every 3 s, IPv6 /64 keying, 4096 sources least-recently-seen evicted,
//! what counts and what is never refused) and the per-principal rate (429 with Retry-After,
//! operators exempt, nothing reaches the runtime).

mod support;

use std::net::IpAddr;

use agentd_core::auth::{AuthConfig, BearerRule, Peer, Principal, Role};
use agentd_core::limits::Rate;
use agentd_core::sessions::DeviceGrantConfig;
use agentd_core::tls::{CertMatch, CertRule, ClientIdentity};
use serde_json::{json, Value};
use support::*;

const COMMAND: &str = "https://agentd.dev/a2a/ext/command";

fn rate(s: &str) -> Option<Rate> {
    Some(Rate::parse(s).unwrap())
}

fn secured() -> Harness {
    Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            bearers: vec![
                BearerRule {
                    digest: AuthConfig::digest("alice-token"),
                    principal: Principal::new("user:alice", Role::User, vec![])
                        .with_rate(rate("2/60s")),
                },
                BearerRule {
                    digest: AuthConfig::digest("bob-token"),
                    principal: Principal::new("user:bob", Role::User, vec![])
                        .with_rate(rate("2/60s")),
                },
                BearerRule {
                    digest: AuthConfig::digest("carl-token"),
                    principal: Principal::new("user:carl", Role::User, vec![]),
                },
                BearerRule {
                    digest: AuthConfig::digest("op2-token"),
                    principal: Principal::operator().with_rate(rate("1/60s")),
                },
            ],
            any: None,
            cert_rules: Vec::new(),
        };
        c.cors =
            agentd_core::http::cors::CorsPolicy::from_list(&["http://localhost:3000"]).unwrap();
    })
}

fn from(h: &Harness, ip: &str) -> Client {
    let mut c = h.conn_peer(0, Peer::Tcp);
    c.conn.set_source(ip.parse::<IpAddr>().unwrap());
    c
}

fn with_header(mut req: Vec<u8>, header: &str) -> Vec<u8> {
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(at..at, format!("{header}\r\n").into_bytes());
    req
}

fn with_token(req: Vec<u8>, token: &str) -> Vec<u8> {
    with_header(req, &format!("Authorization: Bearer {token}"))
}

fn list(token: Option<&str>) -> Vec<u8> {
    let req = call("ListTasks", 1, json!({}));
    match token {
        Some(t) => with_token(req, t),
        None => req,
    }
}

fn status(c: &mut Client, h: &mut Harness, req: &[u8]) -> u16 {
    one(&c.feed(h, req)).status
}

/// Asserts a rate-limit refusal and returns its Retry-After seconds.
fn assert_limited(r: &Resp) -> u32 {
    assert_eq!(r.status, 429, "{:?}", String::from_utf8_lossy(&r.body));
    let secs: u32 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    let j = r.json();
    assert_eq!(j["error"]["code"], -32603, "{j}");
    let info = &j["error"]["data"][0];
    assert_eq!(info["reason"], "RATE_LIMITED", "{j}");
    assert_eq!(info["domain"], "agentd.dev");
    assert_eq!(info["metadata"]["retryAfterSeconds"], secs.to_string());
    assert!(secs >= 1);
    secs
}

fn fail_n(h: &mut Harness, ip: &str, n: usize) {
    let mut c = from(h, ip);
    for i in 0..n {
        assert_eq!(status(&mut c, h, &list(Some("wrong"))), 401, "failure {i}");
    }
}

#[test]
fn twenty_failures_then_credentials_are_refused_429_until_one_is_forgiven() {
    let mut h = secured();
    fail_n(&mut h, "192.0.2.1", 20);
    let mut c = from(&h, "192.0.2.1");
    let r = one(&c.feed(&mut h, &list(Some("wrong"))));
    assert_eq!(assert_limited(&r), 3);
    assert_eq!(
        r.json()["id"],
        Value::Null,
        "refused before the body is read"
    );
    // Refused before it is checked: even the right credential.
    assert_limited(&one(&c.feed(&mut h, &list(Some("op-token")))));
    // Presenting nothing is never refused by the limiter.
    assert_eq!(status(&mut c, &mut h, &list(None)), 401);
    // Another address is its own source.
    let mut other = from(&h, "192.0.2.2");
    assert_eq!(status(&mut other, &mut h, &list(Some("op-token"))), 200);
    // One failure is forgiven every 3 s.
    h.advance(2_999);
    assert_eq!(
        assert_limited(&one(&c.feed(&mut h, &list(Some("op-token"))))),
        1
    );
    h.advance(1);
    assert_eq!(status(&mut c, &mut h, &list(Some("wrong"))), 401);
    assert_eq!(
        assert_limited(&one(&c.feed(&mut h, &list(Some("op-token"))))),
        3
    );
    h.advance(3_000);
    assert_eq!(status(&mut c, &mut h, &list(Some("op-token"))), 200);
    // A long quiet spell forgives everything, but never more than the burst.
    h.advance(60_000);
    fail_n(&mut h, "192.0.2.1", 20);
    assert_limited(&one(&c.feed(&mut h, &list(Some("wrong")))));
    h.advance(1_000_000);
    fail_n(&mut h, "192.0.2.1", 20);
    assert_limited(&one(&c.feed(&mut h, &list(Some("wrong")))));
    // Each refusal is counted for /metrics (read by the operator, on the unix socket).
    let mut op = h.conn_on(1);
    let text = one(&op.feed(&mut h, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")).body;
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains("\nagentd_limiter_refusals_total{limiter=\"source-failures\"} 6\n"),
        "{text}"
    );
}

#[test]
fn ipv6_sources_are_keyed_by_slash_64_and_mapped_ipv4_by_its_address() {
    let mut h = secured();
    fail_n(&mut h, "2001:db8:1:2::1", 20);
    let mut same = from(&h, "2001:db8:1:2:ffff:ffff:ffff:ffff");
    assert_limited(&one(&same.feed(&mut h, &list(Some("op-token")))));
    let mut next = from(&h, "2001:db8:1:3::1");
    assert_eq!(status(&mut next, &mut h, &list(Some("op-token"))), 200);

    fail_n(&mut h, "198.51.100.7", 20);
    let mut mapped = from(&h, "::ffff:198.51.100.7");
    assert_limited(&one(&mapped.feed(&mut h, &list(Some("op-token")))));
    let mut neighbour = from(&h, "198.51.100.8");
    assert_eq!(status(&mut neighbour, &mut h, &list(Some("op-token"))), 200);
}

#[test]
fn origin_refusals_missing_credentials_and_refused_callers_are_not_counted() {
    let mut h = secured();
    let mut c = from(&h, "192.0.2.9");
    for _ in 0..30 {
        let browser = with_header(list(Some("wrong")), "Origin: http://evil.example");
        assert_eq!(status(&mut c, &mut h, &browser), 403, "origin gate");
        c = from(&h, "192.0.2.9");
        assert_eq!(status(&mut c, &mut h, &list(None)), 401);
        // An authenticated caller refused: alice may not run an operator op.
        let op = with_token(
            call_ext(
                "SendMessage",
                1,
                json!({"message": {"role":"ROLE_USER","messageId":"m","extensions":[COMMAND],"parts":[{"data":{"agentd":{"op":"admin.drain"}}}]}}),
                &[COMMAND],
            ),
            "carl-token",
        );
        let r = one(&c.feed(&mut h, &op));
        assert_eq!(r.status, 403, "{:?}", String::from_utf8_lossy(&r.body));
        // And a rate refusal of an authenticated caller.
        let s = status(&mut c, &mut h, &list(Some("bob-token")));
        assert!(s == 200 || s == 429, "{s}");
    }
    assert!(h.inst.limits().failures.is_empty(), "nothing counted");
    // So the source still has its whole burst.
    fail_n(&mut h, "192.0.2.9", 20);
    assert_limited(&one(&c.feed(&mut h, &list(Some("wrong")))));
}

#[test]
fn no_role_counts_but_certificates_are_never_refused() {
    let mut h = Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            cert_rules: vec![CertRule {
                matcher: CertMatch::Sub("alice".into()),
                principal: Principal::new("user:alice", Role::User, vec![]),
            }],
            ..Default::default()
        };
    });
    let cert = |cn: &str| {
        Peer::Cert(ClientIdentity {
            cn: Some(cn.into()),
            sans: Vec::new(),
        })
    };
    let src: IpAddr = "203.0.113.5".parse().unwrap();
    let mut mallory = h.conn_peer(0, cert("mallory"));
    mallory.conn.set_source(src);
    for _ in 0..25 {
        assert_eq!(
            status(&mut mallory, &mut h, &list(None)),
            403,
            "NoRole, never 429"
        );
    }
    // The NoRole answers were counted: a bearer from that source is now refused unread.
    let mut c = from(&h, "203.0.113.5");
    assert_limited(&one(&c.feed(&mut h, &list(Some("op-token")))));
    // A certificate that names someone is served from the same source.
    let mut alice = h.conn_peer(0, cert("alice"));
    alice.conn.set_source(src);
    assert_eq!(status(&mut alice, &mut h, &list(None)), 200);
}

#[test]
fn unix_peers_and_connections_without_an_address_are_not_limited() {
    let mut h = secured();
    let mut unix = h.conn_on(1);
    let mut bare = h.conn_peer(0, Peer::Tcp);
    for _ in 0..30 {
        assert_eq!(status(&mut bare, &mut h, &list(Some("wrong"))), 401);
        assert_eq!(status(&mut unix, &mut h, &list(Some("wrong"))), 200);
    }
    assert!(h.inst.limits().failures.is_empty());
}

#[test]
fn at_most_4096_sources_and_the_least_recently_seen_goes() {
    let mut h = secured();
    fail_n(&mut h, "10.255.0.1", 20);
    let ip = |i: usize| format!("10.{}.{}.1", i / 256, i % 256);
    for i in 0..4095 {
        fail_n(&mut h, &ip(i), 1);
    }
    assert_eq!(h.inst.limits().failures.len(), 4096);
    // Still remembered; being refused counts as being seen.
    let mut limited = from(&h, "10.255.0.1");
    assert_limited(&one(&limited.feed(&mut h, &list(Some("wrong")))));
    // A new source evicts the least recently seen (the first of the others), not it.
    fail_n(&mut h, &ip(5000), 1);
    assert_eq!(h.inst.limits().failures.len(), 4096);
    assert!(!h
        .inst
        .limits()
        .failures
        .remembers(agentd_core::limits::Source::of(ip(0).parse().unwrap())));
    assert_limited(&one(&limited.feed(&mut h, &list(Some("wrong")))));
    // 4096 newer sources push it out: it starts again with a full burst.
    for i in 6000..6000 + 4096 {
        fail_n(&mut h, &ip(i), 1);
    }
    assert_eq!(h.inst.limits().failures.len(), 4096);
    assert_eq!(status(&mut limited, &mut h, &list(Some("wrong"))), 401);
}

#[test]
fn a_principal_rate_refuses_429_and_nothing_reaches_the_runtime() {
    let mut h = secured();
    let mut alice = from(&h, "192.0.2.20");
    let send = |id: u64| {
        with_token(
            call(
                "SendMessage",
                id,
                json!({"message": text_message("hi", &format!("m{id}")), "configuration":{"returnImmediately":true}}),
            ),
            "alice-token",
        )
    };
    assert_eq!(status(&mut alice, &mut h, &send(1)), 200);
    assert_eq!(status(&mut alice, &mut h, &send(2)), 200);
    assert_eq!(h.take_effects().len(), 2);
    let tasks = h.inst.task_count();
    let r = one(&alice.feed(&mut h, &send(3)));
    assert_eq!(assert_limited(&r), 30);
    assert_eq!(
        r.json()["id"],
        3,
        "refused after the envelope: its id is echoed"
    );
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("2/60s"));
    assert_eq!(h.inst.task_count(), tasks, "no task created");
    assert!(h.take_effects().is_empty(), "nothing reaches the runtime");
    // Any method costs a token.
    assert_limited(&one(&alice.feed(&mut h, &list(Some("alice-token")))));
    // Its own bucket: bob is untouched; operators are exempt whatever their rule says.
    let mut bob = from(&h, "192.0.2.20");
    assert_eq!(status(&mut bob, &mut h, &list(Some("bob-token"))), 200);
    for _ in 0..10 {
        assert_eq!(status(&mut bob, &mut h, &list(Some("op-token"))), 200);
        assert_eq!(status(&mut bob, &mut h, &list(Some("op2-token"))), 200);
    }
    // Rate refusals are refusals of an authenticated caller: not counted as failures.
    assert!(h.inst.limits().failures.is_empty());
    // One token back every 30 s.
    h.advance(29_000);
    assert_eq!(assert_limited(&one(&alice.feed(&mut h, &send(4)))), 1);
    h.advance(1_000);
    assert_eq!(status(&mut alice, &mut h, &send(5)), 200);
    assert_limited(&one(&alice.feed(&mut h, &send(6))));
}

fn form(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Signs a device in as `name` and returns its session token.
fn device_session(h: &mut Harness, name: &str) -> String {
    let mut device = h.conn_peer(0, Peer::Tcp);
    let grant =
        one(&device.feed(h, &form("/oauth2/device_authorization", "client_id=laptop"))).json();
    let device_code = grant["device_code"].as_str().unwrap().to_owned();
    let user_code = grant["user_code"].as_str().unwrap().to_owned();
    let mut op = h.conn_peer(0, Peer::Tcp);
    let approve = with_token(
        call_ext(
            "SendMessage",
            1,
            json!({"message": {"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND],"parts":[{"data":{"agentd":{"op":"auth.device.approve","user_code":user_code,"as":name}}}]}}),
            &[COMMAND],
        ),
        "op-token",
    );
    assert_eq!(one(&op.feed(h, &approve)).status, 200);
    let poll = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code={device_code}&client_id=laptop");
    let r = one(&device.feed(h, &form("/oauth2/token", &poll)));
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    r.json()["access_token"].as_str().unwrap().to_owned()
}

#[test]
fn session_tokens_are_checked_even_over_the_limit_and_device_sessions_share_a_rate() {
    let mut h = Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            ..Default::default()
        };
        c.device_grant = DeviceGrantConfig {
            enabled: true,
            rate: rate("3/60s"),
            ..Default::default()
        };
    });
    let first = device_session(&mut h, "carol");
    let second = device_session(&mut h, "carol");
    fail_n(&mut h, "192.0.2.30", 20);
    let mut c = from(&h, "192.0.2.30");
    assert_limited(&one(&c.feed(&mut h, &list(Some("op-token")))));
    // A dead session token is still checked (401, and counted), never refused 429.
    let dead = format!("agentd_at_{}", "0".repeat(64));
    for _ in 0..5 {
        assert_eq!(status(&mut c, &mut h, &list(Some(&dead))), 401);
    }
    // A live one is served from the limited source, under the device-grant rate shared by
    // every session of the name.
    assert_eq!(status(&mut c, &mut h, &list(Some(&first))), 200);
    assert_eq!(status(&mut c, &mut h, &list(Some(&second))), 200);
    assert_eq!(status(&mut c, &mut h, &list(Some(&first))), 200);
    assert_eq!(
        assert_limited(&one(&c.feed(&mut h, &list(Some(&second))))),
        20
    );
}

/// Rotating loopback addresses (127.x.y.z, or their IPv4-mapped IPv6 form) is one source:
/// 1,000 wrong bearers from as many loopback addresses were never refused before.
#[test]
fn every_loopback_address_is_one_source() {
    let mut h = secured();
    for i in 0..20 {
        let addr = if i % 2 == 0 {
            format!("127.{}.{}.1", i / 256, i % 256 + 1)
        } else {
            format!("::ffff:127.0.{i}.9")
        };
        fail_n(&mut h, &addr, 1);
    }
    let mut next = from(&h, "127.99.99.99");
    assert_limited(&one(&next.feed(&mut h, &list(Some("wrong")))));
    // An address outside loopback is another source.
    let mut other = from(&h, "192.0.2.1");
    assert_eq!(status(&mut other, &mut h, &list(Some("wrong"))), 401);
}
