//! A full disk on the real binary: the data directory is a small tmpfs, mounted in a mount
//! namespace of the daemon's own, and the test fills it through `/proc/<pid>/root`. A write
//! that cannot be made durable is refused with -32603 STORE_UNAVAILABLE (never acknowledged),
//! later changes are refused before they are made, reads go on, `status` says the store is
//! degraded and one log line says why; once space returns the store heals by itself (a fresh
//! snapshot of the state in memory) and takes changes again. A daemon started on a disk that
//! is still full serves what it recovered and heals the same way. Nothing acknowledged is
//! lost: a crash after the heal (the daemon frozen, its files copied, then SIGKILL) recovers
//! every acknowledged task.
//!
//! Needs `unshare` and `mount` (util-linux): as root it unshares the mount namespace; as
//! another user it maps itself to root in a user namespace first, as unprivileged users may.

mod common;

use std::path::Path;
use std::time::Duration;

use common::full_disk::{crash_and_copy, fill, inside, store_status, tmpfs_launcher, wait_healed};
use common::{get, post, rpc_body, Daemon, Response, Setup, TempDir, Via, RPC_HEADERS};
use serde_json::{json, Value};

fn setup(data: &Path, launcher: Vec<String>) -> Setup {
    Setup {
        store_dir: Some(data.to_path_buf()),
        launcher,
        ..Setup::default()
    }
}

/// A send whose records take more than a page: a full tmpfs may still have room left in
/// the last page of the journal, which a small record would fit into.
fn send(d: &Daemon, message_id: &str) -> Response {
    let params = json!({"message": {
        "role": "ROLE_USER", "messageId": message_id, "parts": [{"text": "x".repeat(16 << 10)}],
    }});
    d.connect(Via::Tcp)
        .request(&post(&RPC_HEADERS, &rpc_body("1", "SendMessage", &params)))
}

fn acknowledged(r: &Response) -> String {
    let v = r.json();
    v["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {v}"))
        .to_owned()
}

/// The refusal a change gets while the store cannot write.
fn assert_store_unavailable(r: &Response, what: &str) {
    assert_eq!(r.status, 200, "{what}: a JSON-RPC error at 200");
    assert_eq!(r.header("retry-after"), Some("5"), "{what}: Retry-After");
    let v = r.json();
    assert_eq!(v["error"]["code"], -32603, "{what}: {v}");
    assert_eq!(
        v["error"]["data"][0]["reason"], "STORE_UNAVAILABLE",
        "{what}: {v}"
    );
    assert!(v.get("result").is_none(), "{what}: nothing acknowledged");
}

/// `/healthz` or `/readyz`: the status and the body.
fn probe(d: &Daemon, path: &str) -> (u16, String) {
    let r = d.connect(Via::Tcp).request(&get(path, &[]));
    (r.status, r.body_text())
}

/// One sample of `/metrics` (read over the unix socket, as the operator).
fn metric(d: &Daemon, name: &str) -> String {
    let r = d.connect(Via::Unix).request(&get("/metrics", &[]));
    assert_eq!(r.status, 200);
    let text = r.body_text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .to_owned()
}

fn get_task(d: &Daemon, id: &str) -> Value {
    d.connect(Via::Tcp)
        .request(&post(
            &RPC_HEADERS,
            &rpc_body("1", "GetTask", &json!({"id": id})),
        ))
        .json()
}

#[test]
fn a_full_disk_refuses_changes_keeps_reads_and_heals() {
    let data = TempDir::new("data");
    let mut d = Daemon::start_setup(
        "smol",
        &setup(&data.0, tmpfs_launcher(&data.0, 1024, None, false)),
    );
    let mut acked: Vec<String> = (0..3)
        .map(|i| acknowledged(&send(&d, &format!("before-{i}"))))
        .collect();
    assert_eq!(probe(&d, "/readyz"), (200, "ready\n".into()));

    let filler = fill(&d, &data.0);
    // The change that meets the full disk: its answer waited for the write, which failed.
    let r = send(&d, "during-0");
    assert_store_unavailable(&r, "the send whose write failed");
    // Later changes are refused before anything is made.
    assert_store_unavailable(&send(&d, "during-1"), "a send while degraded");
    let cancel = d.connect(Via::Tcp).request(&post(
        &RPC_HEADERS,
        &rpc_body("1", "CancelTask", &json!({"id": acked[0]})),
    ));
    assert_eq!(
        cancel.json()["error"]["data"][0]["reason"],
        "STORE_UNAVAILABLE"
    );

    // Reads go on.
    for id in &acked {
        assert_eq!(get_task(&d, id)["result"]["id"], id.as_str());
    }
    let list = d
        .connect(Via::Tcp)
        .request(&post(&RPC_HEADERS, &rpc_body("1", "ListTasks", &json!({}))));
    assert!(list.json()["result"]["tasks"].as_array().unwrap().len() >= 3);
    assert_eq!(d.connect(Via::Tcp).get_card().status, 200);
    let s = store_status(&d);
    assert_eq!(s["state"], "degraded", "{s}");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{s}"
    );
    let log = d.stderr();
    assert_eq!(
        log.matches("store: cannot write").count(),
        1,
        "one log line says the store is degraded:\n{log}"
    );
    d.assert_alive();
    // A degraded store: not ready (a balancer sends its traffic elsewhere), still alive.
    assert_eq!(
        probe(&d, "/readyz"),
        (503, "not ready: store unavailable\n".into())
    );
    assert_eq!(probe(&d, "/healthz"), (200, "ok\n".into()));
    assert_eq!(metric(&d, "agentd_store_degraded"), "1");
    assert_eq!(metric(&d, "agentd_store_failed"), "1");

    // Space returns: the store heals by itself, no restart.
    std::fs::remove_file(&filler).unwrap();
    wait_healed(&d);
    assert_eq!(probe(&d, "/readyz"), (200, "ready\n".into()));
    assert_eq!(metric(&d, "agentd_store_degraded"), "0");
    assert_eq!(metric(&d, "agentd_store_heals_total"), "1");
    assert!(d.stderr().contains("store: healed"), "{}", d.stderr());
    acked.push(acknowledged(&send(&d, "after-0")));
    acked.push(acknowledged(&send(&d, "after-1")));

    // A crash now loses nothing acknowledged, before the failure or after the heal.
    let copy = TempDir::new("copy");
    crash_and_copy(&mut d, &data.0, &copy.0);
    drop(d);
    let d = Daemon::start_setup("std", &setup(&copy.0, Vec::new()));
    for id in &acked {
        assert_eq!(
            get_task(&d, id)["result"]["id"],
            id.as_str(),
            "{id} survived"
        );
    }
}

#[test]
fn a_daemon_started_on_a_full_disk_serves_reads_and_heals() {
    let first = TempDir::new("first");
    let mut d = Daemon::start_setup("smol", &setup(&first.0, Vec::new()));
    let acked: Vec<String> = (0..2)
        .map(|i| acknowledged(&send(&d, &format!("before-{i}"))))
        .collect();
    d.signal("TERM");
    assert!(d.wait_exit(Duration::from_secs(10)).is_some());
    drop(d);
    // As a rotation that crashed before writing the new segment's header leaves it: an
    // empty newest segment, whose header the next open must write.
    let newest = std::fs::read_dir(&first.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix("journal.")?.parse::<u64>().ok())
        .max()
        .expect("a journal segment");
    std::fs::write(first.0.join(format!("journal.{:020}", newest + 1)), b"").unwrap();

    let data = TempDir::new("full");
    let launcher = tmpfs_launcher(&data.0, 1024, Some(&first.0), true);
    let d = Daemon::start_setup("std", &setup(&data.0, launcher));
    for id in &acked {
        assert_eq!(get_task(&d, id)["result"]["id"], id.as_str());
    }
    let s = store_status(&d);
    assert_eq!(
        s["state"], "degraded",
        "the open could not write the header: {s}"
    );
    assert_store_unavailable(&send(&d, "during"), "a send on a disk full since the start");
    std::fs::remove_file(inside(&d, &data.0.join("filler"))).unwrap();
    wait_healed(&d);
    let id = acknowledged(&send(&d, "after"));
    assert_eq!(get_task(&d, &id)["result"]["id"], id.as_str());
}
