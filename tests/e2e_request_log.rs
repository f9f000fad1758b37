//! The request log on the real binary, both drivers: at `AGENTD_LOG=debug` one line per
//! request with its method, route, status, duration, principal and task; at `info` no
//! per-request line, but one line per request a limiter refused.

mod common;

use std::time::Duration;

use common::{get, post, rpc_body, rpc_request, Daemon, Setup, Via, CARD};
use serde_json::json;

/// The request log's lines (target `agentd::request`) in a daemon's stderr.
fn request_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(" agentd::request: "))
        .collect()
}

/// The value of `field=` in a log line (quotes removed).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=");
    let at = line.find(&key)? + key.len();
    let rest = &line[at..];
    if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.split('"').next();
    }
    rest.split(' ').next()
}

/// Stops the daemon the way an operator does and returns what it logged.
fn stop(mut d: Daemon) -> String {
    d.signal("TERM");
    assert!(
        d.wait_exit(Duration::from_secs(20)).is_some(),
        "{}: the daemon did not exit on TERM; stderr:\n{}",
        d.driver,
        d.stderr()
    );
    d.stderr()
}

fn debug_lines(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            env: vec![("AGENTD_LOG".into(), "debug".into())],
            ..Setup::default()
        },
    );
    let mut c = d.connect_tcp();
    assert_eq!(c.get_card().status, 200);
    assert_eq!(c.request(&get("/nope", &[])).status, 404);
    c.rpc_err("GetTask", json!({"id": "no-such-task"}), -32001);
    let mut params = common::text_message("m-1", "hi");
    params["configuration"] = json!({"returnImmediately": true});
    let task = c.rpc_ok("SendMessage", params)["task"]["id"]
        .as_str()
        .expect("a task")
        .to_owned();
    drop(c);
    let mut u = d.connect(Via::Unix);
    let r = u.request(&rpc_request("2", "ListTasks", &json!({})));
    assert_eq!(r.status, 200);
    drop(u);
    let stderr = stop(d);
    let lines = request_lines(&stderr);
    assert_eq!(
        lines.len(),
        5,
        "{driver}: one line per request, got:\n{}",
        lines.join("\n")
    );
    for l in &lines {
        assert!(l.contains(" DEBUG "), "{driver}: {l}");
        for name in [
            "method",
            "route",
            "status",
            "duration_ms",
            "principal",
            "task_id",
            "request_id",
            "trace_id",
        ] {
            assert!(field(l, name).is_some(), "{driver}: no {name} in {l}");
        }
        let ms: u64 = field(l, "duration_ms").unwrap().parse().unwrap();
        assert!(ms < 10_000, "{driver}: {l}");
    }
    let want = [
        (
            "-",
            "GET /.well-known/agent-card.json",
            "200",
            "-",
            "-",
            None,
        ),
        ("-", "GET /nope", "404", "-", "-", None),
        (
            "GetTask",
            "POST /",
            "200",
            "operator",
            "no-such-task",
            Some("-32001"),
        ),
        (
            "SendMessage",
            "POST /",
            "200",
            "operator",
            task.as_str(),
            None,
        ),
        ("ListTasks", "POST /", "200", "operator", "-", None),
    ];
    for (l, (method, route, status, principal, task, error)) in lines.iter().zip(want) {
        assert_eq!(field(l, "method"), Some(method), "{driver}: {l}");
        assert_eq!(field(l, "route"), Some(route), "{driver}: {l}");
        assert_eq!(field(l, "status"), Some(status), "{driver}: {l}");
        assert_eq!(field(l, "principal"), Some(principal), "{driver}: {l}");
        assert_eq!(field(l, "task_id"), Some(task), "{driver}: {l}");
        assert_eq!(field(l, "error"), error, "{driver}: {l}");
    }
}

fn limited_setup() -> Setup {
    Setup {
        a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
        sections: "[[a2a.principals]]\nid = \"slow\"\nrole = \"user\"\nmatch = { bearer_ref = \"{{secret:E2E_SLOW}}\" }\nquotas = { rate = \"2/60s\" }\n".into(),
        env: vec![
            ("E2E_OP".into(), "op-token".into()),
            ("E2E_SLOW".into(), "slow-token".into()),
            ("AGENTD_LOG".into(), "info".into()),
        ],
        ..Setup::default()
    }
}

fn call(d: &Daemon, token: &str) -> u16 {
    let auth = format!("Authorization: Bearer {token}");
    let headers = [
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        auth.as_str(),
    ];
    d.connect(Via::Tcp)
        .request(&post(&headers, &rpc_body("1", "ListTasks", &json!({}))))
        .status
}

fn info_refusals(driver: &str) {
    let d = Daemon::start_setup(driver, &limited_setup());
    assert_eq!(d.connect_tcp().request(&get(CARD, &[])).status, 200);
    assert_eq!(call(&d, "op-token"), 200);
    // The principal's rate: two, then one refusal.
    assert_eq!(call(&d, "slow-token"), 200);
    assert_eq!(call(&d, "slow-token"), 200);
    assert_eq!(call(&d, "slow-token"), 429);
    // The failure limiter: twenty failed bearers, then two refusals.
    for i in 0..20 {
        assert_eq!(
            call(&d, &format!("guess-{i}")),
            401,
            "{driver}: failure {i}"
        );
    }
    assert_eq!(call(&d, "guess-20"), 429);
    assert_eq!(call(&d, "op-token"), 429);
    let stderr = stop(d);
    let lines = request_lines(&stderr);
    // One line per source and limiter a minute: the second failure-limiter refusal from the
    // same source is held back (counted for the next line), and other requests log nothing.
    assert_eq!(
        lines.len(),
        2,
        "{driver}: one line per source and limiter, none for other requests, got:\n{}",
        lines.join("\n")
    );
    assert!(
        !stderr.contains(" DEBUG "),
        "{driver}: debug lines at info:\n{stderr}"
    );
    for l in &lines {
        assert!(l.contains(" INFO "), "{driver}: {l}");
        assert!(l.contains("request refused by a limiter"), "{driver}: {l}");
        assert_eq!(field(l, "status"), Some("429"), "{driver}: {l}");
        assert_eq!(field(l, "route"), Some("POST /"), "{driver}: {l}");
        assert_eq!(field(l, "source"), Some("127.0.0.0/8"), "{driver}: {l}");
    }
    let quota = lines[0];
    assert_eq!(field(quota, "limiter"), Some("principal-rate"), "{quota}");
    assert_eq!(field(quota, "principal"), Some("user:slow"), "{quota}");
    assert_eq!(field(quota, "method"), Some("ListTasks"), "{quota}");
    let secs: u32 = field(quota, "retry_after_s").unwrap().parse().unwrap();
    assert!((29..=30).contains(&secs), "{quota}");
    for l in &lines[1..] {
        assert_eq!(field(l, "limiter"), Some("source-failures"), "{l}");
        assert_eq!(
            field(l, "suppressed"),
            Some("0"),
            "the first of its minute: {l}"
        );
        assert_eq!(field(l, "principal"), Some("-"), "refused unresolved: {l}");
        let secs: u32 = field(l, "retry_after_s").unwrap().parse().unwrap();
        assert!((1..=3).contains(&secs), "{l}");
    }
}

#[test]
fn debug_logs_one_line_per_request_smol() {
    debug_lines("smol");
}

#[test]
fn debug_logs_one_line_per_request_std() {
    debug_lines("std");
}

#[test]
fn info_logs_only_limiter_refusals_smol() {
    info_refusals("smol");
}

#[test]
fn info_logs_only_limiter_refusals_std() {
    info_refusals("std");
}
