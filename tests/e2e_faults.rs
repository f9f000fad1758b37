//! Faults and hostile input on the real binary (issue 15): what a caller or an agent can do
//! never stops the daemon, and nothing it acknowledged is lost. Each case asserts the exact
//! outcome; the store's own damage and lock cases are in e2e_durable.

mod common;

use std::time::Duration;

use common::{post, rpc_body, Daemon, Setup, TempDir, DRIVERS, RPC_HEADERS};
use serde_json::{json, Value};

/// A data directory the test owns, so a restarted daemon reads the same store.
fn get_task(d: &Daemon, id: &str) -> Value {
    d.connect_tcp()
        .request(&post(
            &RPC_HEADERS,
            &rpc_body("1", "GetTask", &json!({"id": id, "historyLength": 0})),
        ))
        .json()
}

/// Blocking sends just under the body bound, all at once: one drain of the store then
/// holds more than one append may (16 MiB). That stopped the daemon; now every send is
/// answered, and every task it acknowledged is there after a crash.
#[test]
fn a_burst_of_large_sends_never_stops_the_daemon() {
    for driver in DRIVERS {
        let data = TempDir::unmade(&format!("burst-{driver}"));
        let setup = Setup {
            store_dir: Some(data.0.clone()),
            ..Setup::default()
        };
        let mut d = Daemon::start_setup(driver, &setup);
        let text = "y".repeat(1_900_000);
        let ids: Vec<String> = std::thread::scope(|s| {
            let sends: Vec<_> = (0..12)
                .map(|i| {
                    let (d, text) = (&d, &text);
                    s.spawn(move || {
                        let params = json!({"message": {"role": "ROLE_USER",
                            "messageId": format!("big-{i}"), "parts": [{"text": text}]}});
                        let mut c = d.connect_tcp();
                        c.stream
                            .set_read_timeout(Some(Duration::from_secs(60)))
                            .unwrap();
                        let r = c
                            .request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
                            .json();
                        r["result"]["task"]["id"]
                            .as_str()
                            .unwrap_or_else(|| panic!("{driver}: send {i}: {r}"))
                            .to_owned()
                    })
                })
                .collect();
            sends.into_iter().map(|h| h.join().unwrap()).collect()
        });
        d.assert_alive();
        // A crash right after: every acknowledged task reads back.
        d.kill();
        let d = Daemon::start_setup(driver, &setup);
        for id in &ids {
            let t = get_task(&d, id);
            assert_eq!(
                t["result"]["status"]["state"], "TASK_STATE_REJECTED",
                "{driver}: {id}: {t}"
            );
        }
    }
}

/// An agent whose output passes the task's artifact bound: the task fails saying which
/// bound, the daemon keeps serving, and the task (kept within the bound) survives a restart.
#[test]
fn an_agent_past_the_artifact_bound_fails_its_task_not_the_daemon() {
    let data = TempDir::unmade("artifacts");
    let setup = Setup {
        limits: "task_artifact_bytes = 2000000".into(),
        sections: format!(
            "[agent]\ncommand = [\"python3\", \"{}/tests/agents/big_artifacts.py\"]\n",
            env!("CARGO_MANIFEST_DIR")
        ),
        store_dir: Some(data.0.clone()),
        ..Setup::default()
    };
    let mut d = Daemon::start_setup("smol", &setup);
    // 20 artifacts of 900 KB: 18 MB, past the 2 MB bound (and past the store's append
    // limit, which stopped the daemon before the bound existed).
    let params = json!({"message": {"role": "ROLE_USER", "messageId": "big",
        "parts": [{"text": "20 900000"}]}});
    let mut c = d.connect_tcp();
    c.stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let r = c
        .request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
        .json();
    let task = &r["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{r}");
    let why = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert_eq!(
        why,
        "the task's artifacts would exceed limits.task_artifact_bytes (2000000 bytes)"
    );
    let id = task["id"].as_str().unwrap().to_owned();
    let artifacts = task["artifacts"].as_array().map_or(0, Vec::len);
    assert_eq!(
        artifacts, 2,
        "two 900 KB artifacts fit in 2 MB: {artifacts}"
    );
    d.assert_alive();
    // The agent can still answer other turns.
    let params = json!({"message": {"role": "ROLE_USER", "messageId": "small",
        "parts": [{"text": "1 10"}]}});
    let r = d
        .connect_tcp()
        .request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
        .json();
    assert_eq!(
        r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    d.kill();
    let d = Daemon::start_setup("smol", &setup);
    let t = get_task(&d, &id);
    assert_eq!(t["result"]["status"]["state"], "TASK_STATE_FAILED", "{t}");
}

/// Live tasks together are held to `limits.tasks_bytes` too: two tasks that stay live
/// (input-required) with 7 MB of artifacts each fill a 16 MiB budget; a third whose
/// artifacts find no room (nothing finished to drop) fails saying which bound, and the
/// other two keep everything they had.
#[test]
fn live_tasks_are_held_to_the_budget_for_all_tasks() {
    let setup = Setup {
        limits: "task_artifact_bytes = 8388608\ntasks_bytes = 16777216".into(),
        sections: format!(
            "[agent]\ncommand = [\"python3\", \"{}/tests/agents/big_artifacts.py\"]\n",
            env!("CARGO_MANIFEST_DIR")
        ),
        ..Setup::default()
    };
    let d = Daemon::start_setup("std", &setup);
    let turn = |i: usize| {
        let params = json!({"message": {"role": "ROLE_USER", "messageId": format!("live-{i}"),
            "parts": [{"text": "7 1000000 ask"}]}});
        let mut c = d.connect_tcp();
        c.stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        c.request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
            .json()["result"]["task"]
            .clone()
    };
    let mut live = Vec::new();
    for i in 0..2 {
        let t = turn(i);
        assert_eq!(
            t["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{}",
            t["status"]
        );
        assert_eq!(t["artifacts"].as_array().map_or(0, Vec::len), 7);
        live.push(t["id"].as_str().unwrap().to_owned());
    }
    let third = turn(2);
    assert_eq!(
        third["status"]["state"], "TASK_STATE_FAILED",
        "{}",
        third["status"]
    );
    assert_eq!(
        third["status"]["message"]["parts"][0]["text"],
        "the tasks held would exceed limits.tasks_bytes (16777216 bytes) and none of them is finished"
    );
    for id in &live {
        let t = &get_task(&d, id)["result"];
        assert_eq!(
            t["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
            "{}",
            t["status"]
        );
        assert_eq!(
            t["artifacts"].as_array().map_or(0, Vec::len),
            7,
            "{id} kept all"
        );
    }
}

/// The bound itself is checked at load: past what one store record may hold is an error
/// naming the key.
#[test]
fn the_artifact_bound_is_checked_at_load() {
    for bad in ["0", "8388609"] {
        let err = Daemon::try_launch("smol", &format!("task_artifact_bytes = {bad}"), |_| {})
            .err()
            .unwrap_or_else(|| panic!("task_artifact_bytes = {bad} was accepted"));
        assert!(
            err.message
                .contains("limits.task_artifact_bytes: must be from 1 to 8388608"),
            "{}",
            err.message
        );
        let _ = std::fs::remove_dir_all(&err.dir);
    }
}

/// The daemon's thread count, from /proc.
fn threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// Webhooks that accept and never answer: each delivery then waits out its attempt. One
/// thread per delivery made threads grow with the request rate (2,014 for 2,000 tasks);
/// deliveries now share a few workers.
#[test]
fn webhooks_that_never_answer_hold_a_few_workers_not_a_thread_each() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/hook",
        silent.local_addr().unwrap().port()
    );
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for s in silent.incoming().flatten() {
            keep.lock().unwrap().push(s);
        }
    });
    let setup = Setup {
        sections: "[a2a.push]\nenabled = true\nallow_private = true\nmax_attempts = 1\ntimeout_ms = 60000\n"
            .into(),
        ..Setup::default()
    };
    let d = Daemon::start_setup("smol", &setup);
    let before = threads(d.pid());
    for i in 0..300 {
        // No agent: each task is rejected at once, and its webhook is called.
        let params = json!({"message": {"role": "ROLE_USER", "messageId": format!("p-{i}"),
            "parts": [{"text": "hi"}]},
            "configuration": {"taskPushNotificationConfig": {"url": url}}});
        let r = d
            .connect_tcp()
            .request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
            .json();
        assert_eq!(
            r["result"]["task"]["status"]["state"], "TASK_STATE_REJECTED",
            "{r}"
        );
    }
    // Let the deliveries reach the receiver, then count.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while held.lock().unwrap().len() < 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let peak = threads(d.pid());
    assert!(
        peak <= before + 4 + 2,
        "threads went from {before} to {peak} for 300 pending deliveries"
    );
    assert_eq!(
        held.lock().unwrap().len(),
        4,
        "four workers, each on one delivery"
    );
}

/// Past the delivery queue, a delivery is given up at once and says why.
#[test]
fn a_full_delivery_queue_gives_deliveries_up_with_a_log_line() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/hook",
        silent.local_addr().unwrap().port()
    );
    let setup = Setup {
        sections: "[a2a.push]\nenabled = true\nallow_private = true\nmax_attempts = 1\n\
                   timeout_ms = 60000\nworkers = 1\nqueue = 1\n"
            .into(),
        ..Setup::default()
    };
    let d = Daemon::start_setup("smol", &setup);
    for i in 0..5 {
        let params = json!({"message": {"role": "ROLE_USER", "messageId": format!("q-{i}"),
            "parts": [{"text": "hi"}]},
            "configuration": {"taskPushNotificationConfig": {"url": url}}});
        d.connect_tcp()
            .request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
            .json();
    }
    // One delivery held by the worker, one waiting: the other three are given up (four,
    // if the second came before the worker took the first).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let given_up = d
            .stderr()
            .lines()
            .filter(|l| l.contains("a2a.push.failed") && l.contains("(a2a.push.queue)"))
            .count();
        if given_up >= 3 {
            assert!(given_up <= 4, "{}", d.stderr());
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", d.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(silent);
}
