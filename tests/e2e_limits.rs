//! The limiters of §7.5 on the real binary, both drivers, over real sockets: failed bearers
//! from one address get 401 until the failure limiter refuses them 429 with Retry-After,
//! and a principal's `quotas.rate` refuses its third request without running it.

mod common;

use common::{post, rpc_body, Daemon, Setup, Via};
use serde_json::{json, Value};

fn setup() -> Setup {
    Setup {
        a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
        sections: "[[a2a.principals]]\nid = \"slow\"\nrole = \"user\"\nmatch = { bearer_ref = \"{{secret:E2E_SLOW}}\" }\nquotas = { rate = \"2/60s\" }\n".into(),
        env: vec![
            ("E2E_OP".into(), "op-token".into()),
            ("E2E_SLOW".into(), "slow-token".into()),
        ],
        ..Setup::default()
    }
}

fn call(
    d: &Daemon,
    via: Via,
    token: &str,
    id: &str,
    method: &str,
    params: Value,
) -> common::Response {
    let auth = format!("Authorization: Bearer {token}");
    let headers = [
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        auth.as_str(),
    ];
    d.connect(via)
        .request(&post(&headers, &rpc_body(id, method, &params)))
}

/// Asserts a 429 RATE_LIMITED answer and returns its Retry-After seconds.
fn assert_limited(r: &common::Response, what: &str) -> u64 {
    assert_eq!(r.status, 429, "{what}: {}", r.body_text());
    let secs: u64 = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("{what}: no Retry-After"))
        .parse()
        .unwrap();
    let j = r.json();
    assert_eq!(j["error"]["code"], -32603, "{what}: {j}");
    assert_eq!(
        j["error"]["data"][0]["reason"], "RATE_LIMITED",
        "{what}: {j}"
    );
    assert_eq!(
        j["error"]["data"][0]["metadata"]["retryAfterSeconds"],
        secs.to_string(),
        "{what}: {j}"
    );
    secs
}

fn failure_limit(driver: &str) {
    let d = Daemon::start_setup(driver, &setup());
    for i in 0..20 {
        let r = call(
            &d,
            Via::Tcp,
            &format!("guess-{i}"),
            "1",
            "ListTasks",
            json!({}),
        );
        assert_eq!(r.status, 401, "{driver}: failure {i}");
    }
    let r = call(&d, Via::Tcp, "guess-20", "1", "ListTasks", json!({}));
    let secs = assert_limited(&r, driver);
    assert!((1..=3).contains(&secs), "{driver}: {secs}");
    // The source is limited, not the credential: the right one is refused unread too.
    assert_limited(
        &call(&d, Via::Tcp, "op-token", "1", "ListTasks", json!({})),
        driver,
    );
    // The unix socket's peer is the operator by the kernel's word: never limited.
    let r = call(&d, Via::Unix, "guess-21", "1", "ListTasks", json!({}));
    assert_eq!(r.status, 200, "{driver}: {}", r.body_text());
}

fn principal_rate(driver: &str) {
    let d = Daemon::start_setup(driver, &setup());
    let send = |id: &str| {
        let params = json!({"message": {"role":"ROLE_USER","messageId":format!("m-{id}"),"parts":[{"text":"hi"}]}, "configuration": {"returnImmediately": true}});
        call(&d, Via::Tcp, "slow-token", id, "SendMessage", params)
    };
    let mut ids = Vec::new();
    for id in ["1", "2"] {
        let r = send(id);
        assert_eq!(r.status, 200, "{driver}: {}", r.body_text());
        ids.push(
            r.json()["result"]["task"]["id"]
                .as_str()
                .expect("a task")
                .to_owned(),
        );
    }
    let r = send("3");
    let secs = assert_limited(&r, driver);
    assert!(
        (29..=30).contains(&secs),
        "{driver}: one token every 30 s, got {secs}"
    );
    // Refused after the envelope was read: its id is echoed (rpc_body writes it raw).
    assert_eq!(r.json()["id"], 3, "{driver}");
    // The refused request was not run: the operator sees only the two tasks.
    let listed = call(&d, Via::Tcp, "op-token", "9", "ListTasks", json!({})).json();
    let tasks = listed["result"]["tasks"].as_array().expect("tasks").clone();
    let mut seen: Vec<String> = tasks
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids, "{driver}: {listed}");
    // Operators are exempt.
    for i in 0..5 {
        let r = call(&d, Via::Tcp, "op-token", "9", "ListTasks", json!({}));
        assert_eq!(r.status, 200, "{driver}: operator call {i}");
    }
}

#[test]
fn failed_bearers_are_limited_per_source_smol() {
    failure_limit("smol");
}

#[test]
fn failed_bearers_are_limited_per_source_std() {
    failure_limit("std");
}

#[test]
fn a_principal_rate_refuses_without_running_smol() {
    principal_rate("smol");
}

#[test]
fn a_principal_rate_refuses_without_running_std() {
    principal_rate("std");
}
