//! The fault audit (issue 15) on the real binary, for the cases the other suites do not run
//! there: a message to a task whose turn is running, the bounds on parts and on the tasks
//! held, slow readers of large ListTasks pages, loopback sources counted as one (wrong
//! bearers and device sign-ins from rotating 127.x.y.z addresses), and the push-config
//! methods' snake_case names. Each refusal is asserted with its HTTP status, JSON-RPC code
//! and reason; the same rules run in memory in `core/tests`.
//!
//! Elsewhere on the binary: bursts and agent output past the store's append
//! (`e2e_faults`), damaged journals and the lock (`e2e_durable`), a full disk
//! (`e2e_full_disk`), subagent and webhook bounds (`e2e_agents`, `e2e_faults`), the fd limit
//! (`e2e_fd_limit`), hostile configuration and input (`e2e_hostile_input`).

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{post, rpc_body, Client, Daemon, Response, Setup, Via, RPC_HEADERS};
use serde_json::{json, Value};

/// Runs each listed `fn name(driver: &str)` as `smol_driver::name` and `std_driver::name`.
macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {
        mod smol_driver {
            $( #[test] fn $name() { super::$name("smol") } )*
        }
        mod std_driver {
            $( #[test] fn $name() { super::$name("std") } )*
        }
    };
}

both_drivers!(
    a_message_to_a_working_task_is_refused_and_the_turn_goes_on,
    too_many_parts_are_refused_naming_the_bound,
    a_full_task_store_refuses_with_limit_reached,
    rotating_loopback_addresses_are_one_source,
    device_sign_ins_from_loopback_share_one_source,
    push_config_methods_take_snake_case_names,
    slow_readers_of_one_large_task_hold_the_output_bound_each,
);

fn rpc(d: &Daemon, method: &str, params: Value) -> Response {
    d.connect(Via::Tcp)
        .request(&post(&RPC_HEADERS, &rpc_body("1", method, &params)))
}

/// Asserts a JSON-RPC refusal: HTTP status, code, and `ErrorInfo.reason` (`None`: none).
fn assert_refused(r: &Response, status: u16, code: i64, reason: Option<&str>) -> Value {
    assert_eq!(r.status, status, "{}", r.body_text());
    let j = r.json();
    assert_eq!(j["error"]["code"], code, "{j}");
    assert!(j.get("result").is_none(), "{j}");
    let info = j["error"]["data"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["reason"].is_string()));
    assert_eq!(info.and_then(|i| i["reason"].as_str()), reason, "{j}");
    j
}

fn message(id: &str, parts: Value) -> Value {
    json!({"role": "ROLE_USER", "messageId": id, "parts": parts})
}

fn temp_path(name: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!(
        "agentd-audit-{name}-{}-{nanos:x}",
        std::process::id()
    ))
}

/// A daemon whose agent (`tests/agents/paced.py`) holds each turn until the test creates
/// the gate files its text names: a turn that runs as long as the test wants.
fn paced_daemon(driver: &str, limits: &str) -> Daemon {
    let agent = format!("{}/tests/agents/paced.py", env!("CARGO_MANIFEST_DIR"));
    Daemon::start_setup(
        driver,
        &Setup {
            limits: limits.into(),
            sections: format!("[agent]\ncommand = [\"python3\", \"{agent}\"]\n"),
            ..Setup::default()
        },
    )
}

/// Item 5: a message to a task whose turn is running would start a second turn beside the
/// first (the first's answer was lost). It is refused with -32004 naming the state, and the
/// first turn goes on to its end untouched.
fn a_message_to_a_working_task_is_refused_and_the_turn_goes_on(driver: &str) {
    let d = paced_daemon(driver, "");
    let gate = temp_path("gate");
    let gate_text = gate.display().to_string();
    let first = rpc(
        &d,
        "SendMessage",
        json!({"message": message("turn-1", json!([{"text": gate_text}])),
               "configuration": {"returnImmediately": true}}),
    )
    .json();
    let id = first["result"]["task"]["id"].as_str().unwrap().to_owned();
    d.wait_task_state(&id, "TASK_STATE_WORKING");

    let mut second = message("turn-2", json!([{"text": "and another thing"}]));
    second["taskId"] = json!(id);
    let r = rpc(&d, "SendMessage", json!({"message": second}));
    let j = assert_refused(&r, 200, -32004, Some("UNSUPPORTED_OPERATION"));
    let meta = &j["error"]["data"][0]["metadata"];
    assert_eq!(meta["taskId"], id.as_str(), "{j}");
    assert_eq!(meta["state"], "TASK_STATE_WORKING", "{j}");

    for step in [".1", ".2"] {
        std::fs::write(format!("{gate_text}{step}"), b"").unwrap();
    }
    let done = d.wait_task_state(&id, "TASK_STATE_COMPLETED");
    for step in [".1", ".2"] {
        let _ = std::fs::remove_file(format!("{gate_text}{step}"));
    }
    let artifacts: Vec<&str> = done["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        artifacts,
        ["part-1", "part-2", "part-3"],
        "the first turn ran whole"
    );
    let history = rpc(&d, "GetTask", json!({"id": id, "historyLength": 64})).json();
    let texts = history["result"]["history"].to_string();
    assert!(
        !texts.contains("and another thing"),
        "the refused message is nowhere"
    );
}

/// Item 6: a message past `limits.max_message_parts` is refused before anything is made,
/// naming the field and the bound.
fn too_many_parts_are_refused_naming_the_bound(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            limits: "max_message_parts = 8".into(),
            ..Setup::default()
        },
    );
    let parts: Vec<Value> = (0..9).map(|i| json!({"text": format!("{i}")})).collect();
    let r = rpc(
        &d,
        "SendMessage",
        json!({"message": message("parts", json!(parts))}),
    );
    let j = assert_refused(&r, 200, -32602, None);
    let violation = &j["error"]["data"][0]["fieldViolations"][0];
    assert_eq!(violation["field"], "message.parts", "{j}");
    assert!(
        violation["description"]
            .as_str()
            .unwrap()
            .contains("limits.max_message_parts"),
        "{j}"
    );
    let listed = rpc(&d, "ListTasks", json!({})).json();
    assert_eq!(listed["result"]["totalSize"], 0, "nothing was made");
}

/// Item 6: when every task held is unfinished, a new one is refused with LIMIT_REACHED,
/// naming the bound; the tasks held are untouched.
fn a_full_task_store_refuses_with_limit_reached(driver: &str) {
    let d = paced_daemon(driver, "max_tasks = 2");
    // Each turn waits on a gate file that never comes: two live tasks fill the store.
    let gate = temp_path("never").display().to_string();
    let mut held = Vec::new();
    for i in 0..2 {
        let r = rpc(
            &d,
            "SendMessage",
            json!({"message": message(&format!("live-{i}"), json!([{"text": gate}])),
                   "configuration": {"returnImmediately": true}}),
        );
        held.push(
            r.json()["result"]["task"]["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let r = rpc(
        &d,
        "SendMessage",
        json!({"message": message("one-more", json!([{"text": gate}]))}),
    );
    let j = assert_refused(&r, 200, -32603, Some("LIMIT_REACHED"));
    let meta = &j["error"]["data"][0]["metadata"];
    assert_eq!(meta["limit"], "limits.max_tasks", "{j}");
    assert_eq!(meta["max"], "2", "{j}");
    for id in &held {
        let t = rpc(&d, "GetTask", json!({"id": id})).json();
        assert_eq!(t["result"]["id"], id.as_str());
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Item 6: eight readers that ask for ListTasks over large tasks and read nothing. Each
/// page stops at the connection's output bound, so the daemon holds about a page per reader
/// (it held ~95 MB answers each, past 1 GB in all), and other clients are served meanwhile.
#[test]
fn slow_readers_of_large_pages_hold_a_page_each() {
    let d = Daemon::start("smol");
    // 40 tasks of about 1.5 MB (each message near max_body_bytes, 2 MiB).
    let big = "x".repeat(1_500_000);
    for i in 0..40 {
        let r = rpc(
            &d,
            "SendMessage",
            json!({"message": message(&format!("big-{i}"), json!([{"text": big}])),
                   "configuration": {"returnImmediately": true}}),
        );
        assert!(r.json()["result"]["task"]["id"].is_string());
    }
    let before = rss_kib(d.pid());
    let ask = post(
        &RPC_HEADERS,
        &rpc_body(
            "1",
            "ListTasks",
            &json!({"pageSize": 100, "historyLength": 10}),
        ),
    );
    let mut readers = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(d.tcp).unwrap();
        s.write_all(&ask).unwrap();
        readers.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let card = d.connect(Via::Tcp).get_card();
    assert_eq!(
        card.status, 200,
        "others are served while the readers stall"
    );
    let during = rss_kib(d.pid());
    // A page holds one 1.5 MB task at most (the 256 KiB output bound, one task at least):
    // eight stalled pages are ~12 MB, far from eight whole 60 MB listings.
    assert!(
        during < before + 40 * 1024,
        "RSS {before} kB -> {during} kB with eight stalled readers"
    );
    // A reader that does read gets one task and a token to go on.
    let s = readers.pop().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut c = Client::new(s);
    let page = c.read_response().json();
    assert_eq!(page["result"]["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(page["result"]["pageSize"], 1);
    assert!(!page["result"]["nextPageToken"].as_str().unwrap().is_empty());
    eprintln!(
        "8 stalled ListTasks readers over 40 tasks of 1.5 MB: RSS {before} kB -> {during} kB"
    );
}

/// Item 6: readers that ask for one large task and read nothing. The task is written as
/// each peer reads it, from a snapshot sharing the store's content, so a stalled reader
/// holds about the connection's output bound (256 KiB), not its own copy of the answer
/// (before: 100 such readers of a 3.9 MB task took the daemon from 9 MB to 421 MB).
fn slow_readers_of_one_large_task_hold_the_output_bound_each(driver: &str) {
    let d = Daemon::start(driver);
    let big = "y".repeat(1_800_000);
    let r = rpc(
        &d,
        "SendMessage",
        json!({"message": message("one-big", json!([{"text": big}])),
               "configuration": {"returnImmediately": true}}),
    );
    let id = r.json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let get = post(&RPC_HEADERS, &rpc_body("1", "GetTask", &json!({"id": id})));
    let whole = d.connect(Via::Tcp).request(&get);
    assert_eq!(
        whole.json()["result"]["history"][0]["parts"][0]["text"],
        big
    );
    let size = whole.body.len();
    let before = rss_kib(d.pid());
    // 24 answers of ~2 MB: ~46 MB if each were built whole, within the large-answers pool
    // (64 MiB), so none is refused.
    let mut readers = Vec::new();
    for _ in 0..24 {
        let mut s = TcpStream::connect(d.tcp).unwrap();
        s.write_all(&get).unwrap();
        readers.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let card = d.connect(Via::Tcp).get_card();
    assert_eq!(
        card.status, 200,
        "others are served while the readers stall"
    );
    let during = rss_kib(d.pid());
    eprintln!(
        "{driver}: 24 stalled GetTask readers of a {size}-byte answer: RSS {before} kB -> {during} kB"
    );
    assert!(
        during < before + 16 * 1024,
        "RSS {before} kB -> {during} kB with 24 stalled readers of {size} bytes"
    );
    // Each reader that reads gets the whole answer, byte for byte.
    for s in readers.drain(..3) {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client::new(s);
        assert_eq!(c.read_response().body, whole.body);
    }
}

/// A TCP connection to `to` from the loopback address `from` (any of 127.0.0.0/8).
fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    use rustix::net::{bind, connect, socket, AddressFamily, SocketType};
    let fd: OwnedFd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    let src: SocketAddr = format!("{from}:0").parse().unwrap();
    bind(&fd, &src).unwrap();
    connect(&fd, &to).unwrap();
    let s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn request_from(from: &str, d: &Daemon, bytes: &[u8]) -> Response {
    let mut c = Client::new(connect_from(from, d.tcp));
    c.request(bytes)
}

/// Item 9: wrong bearers from rotating 127.x.y.z addresses were never refused (1,000 in
/// 0.7 s). Every loopback address is one source: the 21st failure is refused 429.
fn rotating_loopback_addresses_are_one_source(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
            env: vec![("E2E_OP".into(), "op-token".into())],
            ..Setup::default()
        },
    );
    let guess = |i: usize| {
        let auth = format!("Authorization: Bearer guess-{i}");
        let headers = [RPC_HEADERS[0], RPC_HEADERS[1], auth.as_str()];
        let from = format!("127.{}.{}.{}", i % 7, i % 13, 1 + i % 250);
        request_from(
            &from,
            &d,
            &post(&headers, &rpc_body("1", "ListTasks", &json!({}))),
        )
    };
    for i in 0..20 {
        assert_eq!(guess(i).status, 401, "failure {i}");
    }
    let r = guess(20);
    assert_refused(&r, 429, -32603, Some("RATE_LIMITED"));
    assert!(r.header("retry-after").is_some());
}

/// Item 9: device sign-ins from rotating loopback addresses share one source's share of
/// pending codes (four) and its rate.
fn device_sign_ins_from_loopback_share_one_source(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
            sections: "[a2a.device_grant]\nenabled = true\n".into(),
            env: vec![("E2E_OP".into(), "op-token".into())],
            ..Setup::default()
        },
    );
    let ask = |from: &str, i: usize| {
        let body = format!("client_id=device-{i}");
        let req = format!(
            "POST /oauth2/device_authorization HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        request_from(from, &d, req.as_bytes())
    };
    for (i, from) in ["127.0.0.1", "127.0.0.2", "127.1.2.3", "127.9.9.9"]
        .iter()
        .enumerate()
    {
        assert_eq!(ask(from, i).status, 200, "{from}");
    }
    let r = ask("127.200.0.1", 4);
    assert_eq!(r.status, 429, "{}", r.body_text());
    assert_eq!(r.json()["error"], "slow_down");
    assert!(r.header("retry-after").is_some());
}

/// Item 11: the push-config methods take ProtoJSON's snake_case names (`task_id`,
/// `push_notification_config`), as the A2A TCK sends them.
fn push_config_methods_take_snake_case_names(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            sections: "[a2a.push]\nenabled = true\nallow_private = true\n".into(),
            ..Setup::default()
        },
    );
    let t = rpc(
        &d,
        "SendMessage",
        json!({"message": message("push", json!([{"text": "hi"}])),
               "configuration": {"returnImmediately": true}}),
    )
    .json();
    let task = t["result"]["task"]["id"].as_str().unwrap().to_owned();
    let created = rpc(
        &d,
        "CreateTaskPushNotificationConfig",
        json!({"task_id": task, "id": "c1", "url": "http://127.0.0.1:9/hook"}),
    );
    assert_eq!(created.status, 200);
    let j = created.json();
    assert_eq!(j["result"]["taskId"], task.as_str(), "{j}");
    let got = rpc(
        &d,
        "GetTaskPushNotificationConfig",
        json!({"task_id": task, "id": "c1"}),
    )
    .json();
    assert_eq!(got["result"]["id"], "c1", "{got}");
    let listed = rpc(
        &d,
        "ListTaskPushNotificationConfigs",
        json!({"task_id": task}),
    )
    .json();
    assert_eq!(
        listed["result"]["configs"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let deleted = rpc(
        &d,
        "DeleteTaskPushNotificationConfig",
        json!({"task_id": task, "id": "c1"}),
    )
    .json();
    assert!(deleted.get("error").is_none(), "{deleted}");
}
