//! `/metrics`, `/healthz` and `/readyz` in memory: who may read the metrics, what moves them,
//! the latency from the driver's `now`, the host's sources, and readiness through a drain
//! and a store that cannot write.

mod support;

use std::sync::Arc;

use agentd_core::auth::{AuthConfig, BearerRule, Peer, Principal, Role};
use agentd_core::metrics::{Histogram, Kind, MetricsSource, MetricsWriter};
use serde_json::json;
use support::*;

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").into_bytes()
}

/// The value of the sample `series` (name and labels exactly as written), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn scrape(h: &mut Harness) -> String {
    let mut c = h.conn_peer(1, Peer::Unix { uid: 0 });
    let r = one(&c.feed(h, &get("/metrics", "")));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    String::from_utf8(r.body).unwrap()
}

#[test]
fn requests_are_counted_by_method_and_outcome_with_their_latency() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let r = one(&c.feed(&mut h, &call("GetTask", 1, json!({"id": "nope"}))));
    assert_rpc_error(&r, -32001, Some("TASK_NOT_FOUND"));
    let r = one(&c.feed(&mut h, &call("ListTasks", 2, json!({}))));
    assert_eq!(r.status, 200);
    // A request whose body arrives 40 ms after its head: its latency is 40 ms.
    let req = call("ListTasks", 3, json!({}));
    let split = req.len() - 5;
    assert!(c.feed(&mut h, &req[..split]).is_empty());
    h.advance(40);
    assert_eq!(one(&c.feed(&mut h, &req[split..])).status, 200);
    let r = one(&c.feed(&mut h, &get("/nowhere", "")));
    assert_eq!(r.status, 404);
    let r = one(&c.feed(&mut h, &get("/.well-known/agent-card.json", "")));
    assert_eq!(r.status, 200);

    let text = scrape(&mut h);
    let v = |s: &str| sample(&text, s).unwrap_or_else(|| panic!("{s} in\n{text}"));
    assert_eq!(
        v(r#"agentd_requests_total{method="GetTask",code="-32001",reason="TASK_NOT_FOUND"}"#),
        1.0
    );
    assert_eq!(
        v(r#"agentd_requests_total{method="ListTasks",code="ok"}"#),
        2.0
    );
    assert_eq!(
        v(r#"agentd_requests_total{method="other",code="404"}"#),
        1.0
    );
    assert_eq!(v(r#"agentd_requests_total{method="card",code="ok"}"#), 1.0);
    let b = |le: &str| {
        v(&format!(
            r#"agentd_request_duration_seconds_bucket{{method="ListTasks",le="{le}"}}"#
        ))
    };
    assert_eq!(b("0.025"), 1.0, "the first ListTasks took 0 ms");
    assert_eq!(b("0.05"), 2.0, "the second 40 ms");
    assert_eq!(b("+Inf"), 2.0);
    assert_eq!(
        v(r#"agentd_request_duration_seconds_sum{method="ListTasks"}"#),
        0.04
    );
    assert_eq!(
        v(r#"agentd_request_duration_seconds_count{method="ListTasks"}"#),
        2.0
    );
    assert_eq!(
        v("agentd_connections_open"),
        2.0,
        "this one and the scraper"
    );
    assert_eq!(v(r#"agentd_tasks{state="working"}"#), 0.0);
    assert_eq!(v("agentd_draining"), 0.0);
    assert_eq!(v("agentd_store_degraded"), 0.0);

    // A task moves the task gauge; the scrape itself is counted.
    let mut c2 = h.conn();
    c2.feed(
        &mut h,
        &call(
            "SendMessage",
            4,
            json!({"message": text_message("hi", "m1"), "configuration": {"returnImmediately": true}}),
        ),
    );
    h.turn();
    let text = scrape(&mut h);
    assert_eq!(
        sample(&text, r#"agentd_tasks{state="submitted"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"agentd_requests_total{method="metrics",code="ok"}"#
        ),
        Some(1.0),
        "{text}"
    );
    drop(c);
    let text = scrape(&mut h);
    assert_eq!(
        sample(&text, "agentd_connections_open"),
        Some(2.0),
        "{text}"
    );
}

#[test]
fn streams_are_counted_open_until_they_end() {
    let mut h = Harness::with(|c| c.events_enabled = true);
    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m1"), "configuration": {"returnImmediately": true}}),
        ),
    );
    let task = h.turn();
    let out = c.feed(&mut h, &call("SubscribeToTask", 2, json!({"id": task})));
    assert!(String::from_utf8_lossy(&out).contains("text/event-stream"));
    let text = scrape(&mut h);
    assert_eq!(sample(&text, "agentd_streams_open"), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &text,
            r#"agentd_requests_total{method="SubscribeToTask",code="ok"}"#
        ),
        Some(1.0),
        "{text}"
    );
    let mut feed = h.conn();
    feed.feed(
        &mut h,
        &call_ext(
            "agentd.events/SubscribeToEvents",
            3,
            json!({}),
            &["https://agentd.dev/a2a/ext/events"],
        ),
    );
    let text = scrape(&mut h);
    assert_eq!(sample(&text, "agentd_streams_open"), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, "agentd_feed_subscribers"),
        Some(1.0),
        "{text}"
    );
    c.conn.close(&mut h.inst);
    drop(c);
    let text = scrape(&mut h);
    assert_eq!(sample(&text, "agentd_streams_open"), Some(1.0), "{text}");
}

fn secured() -> Harness {
    Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            bearers: vec![BearerRule {
                digest: AuthConfig::digest("alice-token"),
                principal: Principal::new("user:alice", Role::User, vec![]),
            }],
            any: None,
            cert_rules: Vec::new(),
        };
    })
}

#[test]
fn only_the_operator_reads_the_metrics_and_anyone_probes_health() {
    let mut h = secured();
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = one(&c.feed(&mut h, &get("/metrics", "")));
    assert_eq!(r.status, 401, "no credential");
    assert!(r.header("www-authenticate").is_some());
    let r = one(&c.feed(
        &mut h,
        &get("/metrics", "Authorization: Bearer alice-token\r\n"),
    ));
    assert_eq!(r.status, 403, "a user is not the operator");
    let r = one(&c.feed(&mut h, &get("/metrics", "Authorization: Bearer wrong\r\n")));
    assert_eq!(r.status, 401);
    let r = one(&c.feed(
        &mut h,
        &get("/metrics", "Authorization: Bearer op-token\r\n"),
    ));
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).unwrap();
    assert_eq!(
        sample(
            &text,
            r#"agentd_requests_total{method="metrics",code="-31401",reason="UNAUTHENTICATED"}"#
        )
        .or_else(|| sample(
            &text,
            r#"agentd_requests_total{method="metrics",code="401"}"#
        )),
        Some(2.0),
        "{text}"
    );
    // A browser is never the implicit operator, even on loopback with no bearer.
    let mut open = Harness::new();
    let mut c = open.conn();
    let r = one(&c.feed(
        &mut open,
        &get("/metrics", "Origin: https://evil.example\r\n"),
    ));
    assert_eq!(r.status, 401);
    let r = one(&c.feed(&mut open, &get("/metrics", "")));
    assert_eq!(r.status, 200, "the implicit operator on loopback");

    for path in ["/healthz", "/readyz"] {
        let r = one(&c.feed(&mut h, &get(path, "")));
        assert_eq!(r.status, 200, "{path} takes no credential");
        assert_eq!(r.header("cache-control"), Some("no-store"));
    }
    let out = c.feed(&mut h, b"HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    let out = String::from_utf8(out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(
        out.ends_with("\r\n\r\n"),
        "a HEAD answer has no body: {out}"
    );
    let r = one(&c.feed(
        &mut h,
        b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    ));
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}

#[test]
fn readiness_follows_the_store_and_the_drain_and_health_does_not() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let probe = |h: &mut Harness, c: &mut Client, path: &str| {
        let r = one(&c.feed(h, &get(path, "")));
        (r.status, String::from_utf8(r.body).unwrap())
    };
    assert_eq!(probe(&mut h, &mut c, "/readyz"), (200, "ready\n".into()));
    h.inst.set_store_unavailable(Some("disk full".into()));
    assert_eq!(
        probe(&mut h, &mut c, "/readyz"),
        (503, "not ready: store unavailable\n".into())
    );
    assert_eq!(probe(&mut h, &mut c, "/healthz"), (200, "ok\n".into()));
    let text = scrape(&mut h);
    assert_eq!(sample(&text, "agentd_store_degraded"), Some(1.0));
    h.inst.set_store_unavailable(None);
    assert_eq!(probe(&mut h, &mut c, "/readyz").0, 200);
    let now = h.now;
    h.inst.set_draining("test", now);
    assert_eq!(
        probe(&mut h, &mut c, "/readyz"),
        (503, "not ready: draining\n".into())
    );
    assert_eq!(probe(&mut h, &mut c, "/healthz").0, 200);
    let text = scrape(&mut h);
    assert_eq!(sample(&text, "agentd_draining"), Some(1.0));
    assert_eq!(
        sample(
            &text,
            r#"agentd_requests_total{method="readyz",code="503"}"#
        ),
        Some(2.0),
        "{text}"
    );
}

struct Host(Histogram);

impl MetricsSource for Host {
    fn write(&self, w: &mut MetricsWriter) {
        w.family("agentd_test_seconds", Kind::Histogram, "a host's histogram");
        w.histogram("agentd_test_seconds", &[], &self.0);
    }
}

#[test]
fn a_hosts_sources_are_rendered_after_the_core() {
    let mut h = Harness::new();
    let host = Arc::new(Host(Histogram::new()));
    host.0.observe_us(300);
    h.inst.add_metrics_source(host.clone());
    let text = scrape(&mut h);
    assert_eq!(
        sample(&text, r#"agentd_test_seconds_bucket{le="0.0005"}"#),
        Some(1.0)
    );
    assert_eq!(sample(&text, "agentd_test_seconds_count"), Some(1.0));
    host.0.observe_us(3);
    let text = scrape(&mut h);
    assert_eq!(sample(&text, "agentd_test_seconds_count"), Some(2.0));
    assert!(text.find("agentd_requests_total") < text.find("agentd_test_seconds"));
}
