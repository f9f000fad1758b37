//! Configuration reload on SIGHUP, on the real binary, both drivers: a rewritten file swaps
//! the bearer rules, CORS origins and approval and announces them with one `config` feed event; a
//! broken file changes nothing; a restart-only key is reported, not applied, and the
//! daemon keeps serving.

mod common;

use std::time::{Duration, Instant};

use common::{post, rpc_body, Daemon, Setup, Via};
use serde_json::{json, Value};

const EVENTS: &str = "A2A-Extensions: https://agentd.dev/a2a/ext/events";
const ORIGIN: &str = "http://localhost:3000";

fn setup() -> Setup {
    Setup {
        sections: "[a2a.events]\nenabled = true\nstream_deadline_ms = 400\n\
                   [[a2a.principals]]\nid = \"alice\"\nrole = \"user\"\n\
                   match = { bearer_ref = \"{{secret:E2E_OLD}}\" }\n"
            .into(),
        env: vec![
            ("E2E_OLD".into(), "old-token".into()),
            ("E2E_NEW".into(), "new-token".into()),
        ],
        ..Setup::default()
    }
}

/// `ListTasks` over TCP with a bearer and more header lines.
fn list(d: &Daemon, token: &str, extra: &[&str]) -> common::Response {
    let auth = format!("Authorization: Bearer {token}");
    let mut headers = vec![
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        auth.as_str(),
    ];
    headers.extend_from_slice(extra);
    d.connect(Via::Tcp)
        .request(&post(&headers, &rpc_body("1", "ListTasks", &json!({}))))
}

/// The `config` events of the feed, read over the unix socket (the operator) from the start.
fn config_events(d: &Daemon) -> Vec<Value> {
    let mut headers = common::RPC_HEADERS.to_vec();
    headers.push(EVENTS);
    let r = d.connect(Via::Unix).request(&post(
        &headers,
        &rpc_body(
            "1",
            "agentd.events/SubscribeToEvents",
            &json!({"fromSeq": 0}),
        ),
    ));
    r.sse_events()
        .iter()
        .filter(|f| f["result"]["event"]["kind"] == "config")
        .map(|f| f["result"]["event"]["data"].clone())
        .collect()
}

fn config_path(d: &Daemon) -> std::path::PathBuf {
    d.dir().join("agentd.toml")
}

fn eventually(what: &str, d: &Daemon, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{} never happened; stderr:\n{}",
            what,
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn swaps_rules_and_origins(driver: &str) {
    let mut d = Daemon::start_setup(driver, &setup());
    assert_eq!(list(&d, "old-token", &[]).status, 200, "{driver}");
    assert_eq!(list(&d, "new-token", &[]).status, 401, "{driver}");
    let origin = format!("Origin: {ORIGIN}");
    assert_eq!(list(&d, "old-token", &[&origin]).status, 403, "{driver}");

    let text = std::fs::read_to_string(config_path(&d)).unwrap();
    let text = text.replace("E2E_OLD", "E2E_NEW")
        + &format!("\n[a2a.cors]\norigins = [\"{ORIGIN}\"]\n[agent]\napproval = \"deny\"\n");
    std::fs::write(config_path(&d), text).unwrap();
    d.signal("HUP");

    eventually("the new token working", &d, || {
        list(&d, "new-token", &[]).status == 200
    });
    assert_eq!(list(&d, "old-token", &[]).status, 401, "{driver}");
    let r = list(&d, "new-token", &[&origin]);
    assert_eq!(r.status, 200, "{driver}");
    assert_eq!(r.header("access-control-allow-origin"), Some(ORIGIN));
    let events = config_events(&d);
    assert_eq!(
        events,
        vec![json!({
            "paths": ["a2a.principals", "a2a.cors.origins", "agent.approval"],
            "source": "reload"
        })],
        "{driver}"
    );
    assert!(d.stderr().contains("configuration reloaded"), "{driver}");

    // The same file again: nothing changed, nothing announced.
    d.signal("HUP");
    eventually("the second reload", &d, || {
        d.stderr().contains("no reloadable key changed")
    });
    assert_eq!(config_events(&d).len(), 1, "{driver}");
    d.assert_alive();
}

fn keeps_serving_through_bad_files(driver: &str) {
    let mut d = Daemon::start_setup(driver, &setup());
    let good = std::fs::read_to_string(config_path(&d)).unwrap();

    // A file that does not parse: the running configuration stays.
    std::fs::write(
        config_path(&d),
        good.replace("E2E_OLD", "E2E_NEW") + "\n[a2a\n",
    )
    .unwrap();
    d.signal("HUP");
    eventually("the refusal logged", &d, || {
        d.stderr().contains("reload refused")
    });
    let log = d.stderr();
    let line = log.lines().find(|l| l.contains("reload refused")).unwrap();
    assert!(
        line.contains("agentd.toml") && line.contains("line"),
        "{driver}: names the file and line: {line}"
    );
    d.assert_alive();
    assert_eq!(list(&d, "old-token", &[]).status, 200, "{driver}");
    assert_eq!(list(&d, "new-token", &[]).status, 401, "{driver}");

    // A file that parses but does not validate: the same.
    std::fs::write(
        config_path(&d),
        good.replace("role = \"user\"", "role = \"boss\""),
    )
    .unwrap();
    d.signal("HUP");
    eventually("the second refusal logged", &d, || {
        d.stderr().matches("reload refused").count() == 2
    });
    assert_eq!(list(&d, "old-token", &[]).status, 200, "{driver}");

    // A restart-only key changed beside a reloadable one: only the reloadable one applies.
    std::fs::write(
        config_path(&d),
        good.replace("E2E_OLD", "E2E_NEW")
            .replace("stream_deadline_ms = 400", "stream_deadline_ms = 500"),
    )
    .unwrap();
    d.signal("HUP");
    eventually("the new token working", &d, || {
        list(&d, "new-token", &[]).status == 200
    });
    let log = d.stderr();
    let warn = log
        .lines()
        .find(|l| l.contains("need a restart"))
        .expect("a restart warning");
    assert!(
        warn.contains("a2a.events.stream_deadline_ms") && !warn.contains("a2a.principals"),
        "{driver}: {warn}"
    );
    assert_eq!(
        config_events(&d),
        vec![json!({"paths": ["a2a.principals"], "source": "reload"})],
        "{driver}: the feed (restart-only) is still served"
    );
    d.assert_alive();
}

#[test]
fn sighup_swaps_rules_and_origins_smol() {
    swaps_rules_and_origins("smol");
}

#[test]
fn sighup_swaps_rules_and_origins_std() {
    swaps_rules_and_origins("std");
}

#[test]
fn sighup_keeps_serving_through_bad_files_smol() {
    keeps_serving_through_bad_files("smol");
}

#[test]
fn sighup_keeps_serving_through_bad_files_std() {
    keeps_serving_through_bad_files("std");
}
