//! `/metrics`, `/healthz` and `/readyz` on the real binary, on both drivers. The scrapes are
//! read by `prometheus_client`'s own text-format parser (`tests/interop/parse_metrics.py`
//! in the interop venv, which `tests/interop/setup.sh` builds from PyPI), and the test
//! checks that counters and histograms move with the traffic it sends; who may read the
//! metrics on each listener kind; readiness through start and a drain. The degraded store
//! is in `e2e_full_disk.rs` (it needs a tmpfs of its own).

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{get, post, rpc_body, Daemon, Setup, Via, RPC_HEADERS};
use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";
const EVENTS_URI: &str = "https://agentd.dev/a2a/ext/events";

const WORKFLOWS: &str = r#"
[[workflows]]
name = "quick"
[[workflows.steps]]
id = "say"
kind = "exec"
program = "/bin/echo"
args = ["hi"]

[[workflows]]
name = "nap"
[[workflows.steps]]
id = "nap"
kind = "exec"
program = "/bin/sh"
args = ["-c", "sleep 3; echo rested"]
"#;

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
    counters_and_histograms_move_with_traffic,
    gauges_follow_connections_feed_subscribers_and_the_agent,
    only_the_operator_reads_metrics_and_probes_need_no_credential,
    readiness_through_start_and_drain,
);

/// The interop venv's python.
fn python() -> &'static str {
    common::interop_python()
}

/// One scrape as the parser read it: `name{labels}` (labels sorted) → value, and each
/// family's type.
#[derive(Debug)]
struct Scrape {
    samples: BTreeMap<String, f64>,
    types: BTreeMap<String, String>,
}

impl Scrape {
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples.get(&key(name, labels)).copied()
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no {} in {:#?}", key(name, labels), self.samples))
    }

    /// Absent counts as 0 (a counter the core has not written yet).
    fn or0(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }
}

fn key(name: &str, labels: &[(&str, &str)]) -> String {
    let mut l: Vec<_> = labels.to_vec();
    l.sort();
    let inner: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// Parses an exposition with prometheus_client; panics with the parser's error if it cannot.
fn parse(text: &str) -> Scrape {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/parse_metrics.py"
    );
    let mut child = Command::new(python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client cannot parse /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut samples = BTreeMap::new();
    let mut types = BTreeMap::new();
    for s in list {
        let labels: Vec<(String, String)> = s["labels"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let value = match &s["value"] {
            Value::String(s) if s == "+Inf" => f64::INFINITY,
            v => v.as_f64().unwrap(),
        };
        samples.insert(key(s["name"].as_str().unwrap(), &labels), value);
        types.insert(
            s["family"].as_str().unwrap().to_owned(),
            s["type"].as_str().unwrap().to_owned(),
        );
    }
    Scrape { samples, types }
}

/// Scrapes over the unix socket (its peers are the operator).
fn scrape(d: &Daemon) -> Scrape {
    let r = d.connect(Via::Unix).request(&get("/metrics", &[]));
    assert_eq!(r.status, 200, "{}", r.body_text());
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    parse(&r.body_text())
}

fn command(d: &Daemon, envelope: Value) -> Value {
    let params = json!({"message": {
        "role": "ROLE_USER",
        "messageId": common::fresh_id(),
        "extensions": [COMMAND_URI],
        "parts": [{"data": {"agentd": envelope}, "mediaType": "application/json"}],
    }, "configuration": {"returnImmediately": true}});
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let headers = [RPC_HEADERS[0], RPC_HEADERS[1], ext.as_str()];
    d.connect_tcp()
        .request(&post(&headers, &rpc_body("1", "SendMessage", &params)))
        .json()
}

fn start(driver: &str, extra: &str) -> Daemon {
    let setup = Setup {
        sections: format!("{extra}\n{WORKFLOWS}"),
        ..Setup::default()
    };
    Daemon::start_setup(driver, &setup)
}

/// Polls `f` until it holds (the runtime counts its objects after each round of work).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn counters_and_histograms_move_with_traffic(driver: &str) {
    let d = start(driver, "");
    let before = scrape(&d);
    // Every family has a type the parser read from its `# TYPE` line.
    for (family, ty) in &before.types {
        assert!(family.starts_with("agentd_"), "{family}");
        assert!(
            ["counter", "gauge", "histogram"].contains(&ty.as_str()),
            "{family}: {ty}"
        );
    }
    assert!(before.value("agentd_process_resident_memory_bytes", &[]) > 100_000.0);
    assert!(before.value("agentd_process_open_fds", &[]) >= 3.0);
    assert!(before.value("agentd_process_threads", &[]) >= 2.0);
    assert!(before.value("agentd_store_segments", &[]) >= 1.0);
    assert!(
        before.value("agentd_connections_open", &[]) >= 1.0,
        "the scrape's own"
    );

    let not_found = [
        ("method", "GetTask"),
        ("code", "-32001"),
        ("reason", "TASK_NOT_FOUND"),
    ];
    let sends = [("method", "SendMessage"), ("code", "ok")];
    let get_count = [("method", "GetTask")];
    // Traffic: three reads of unknown tasks, two turns (rejected: no agent is configured,
    // each a task written to the store), a workflow run, the card.
    for i in 0..3 {
        let r = d
            .connect_tcp()
            .rpc("1", "GetTask", json!({"id": format!("nope-{i}")}));
        assert_eq!(r["error"]["code"], -32001, "{r}");
    }
    for _ in 0..2 {
        let r = d.connect_tcp().rpc(
            "1",
            "SendMessage",
            common::text_message(&common::fresh_id(), "hi"),
        );
        assert!(r.get("result").is_some(), "{r}");
    }
    let run = command(&d, json!({"op": "workflow.run", "workflow": "quick"}));
    let run_task = run["result"]["task"]["id"].as_str().unwrap().to_owned();
    d.wait_task_state(&run_task, "TASK_STATE_COMPLETED");
    assert_eq!(d.connect_tcp().get_card().status, 200);

    let after = scrape(&d);
    // Every family is there once traffic made its samples (an empty family is left out by
    // the parser; the subagents' is empty here: none is configured).
    for family in [
        "agentd_requests",
        "agentd_request_duration_seconds",
        "agentd_tasks",
        "agentd_connections_open",
        "agentd_streams_open",
        "agentd_feed_subscribers",
        "agentd_limiter_refusals",
        "agentd_store_append_seconds",
        "agentd_store_fsync_seconds",
        "agentd_store_journal_bytes",
        "agentd_store_segments",
        "agentd_runs",
        "agentd_agents",
        "agentd_push_deliveries",
        "agentd_process_resident_memory_bytes",
        "agentd_process_open_fds",
        "agentd_process_threads",
    ] {
        assert!(
            after.types.contains_key(family),
            "{family} missing: {:?}",
            after.types
        );
    }
    assert_eq!(
        after.value("agentd_requests_total", &not_found)
            - before.or0("agentd_requests_total", &not_found),
        3.0
    );
    assert!(
        after.value("agentd_requests_total", &sends) - before.or0("agentd_requests_total", &sends)
            >= 3.0,
        "two turns and a command"
    );
    // Every GetTask (the three above, and wait_task_state's polls) is in the histogram.
    let count = "agentd_request_duration_seconds_count";
    let gets = |s: &Scrape| -> f64 {
        s.samples
            .iter()
            .filter(|(k, _)| {
                k.starts_with("agentd_requests_total{") && k.contains("method=\"GetTask\"")
            })
            .map(|(_, v)| v)
            .sum()
    };
    assert!(gets(&after) - gets(&before) >= 3.0);
    assert_eq!(
        after.value(count, &get_count) - before.or0(count, &get_count),
        gets(&after) - gets(&before)
    );
    let inf = [("method", "GetTask"), ("le", "+Inf")];
    assert_eq!(
        after.value("agentd_request_duration_seconds_bucket", &inf),
        after.value(count, &get_count)
    );
    assert!(
        after.value(
            "agentd_requests_total",
            &[("method", "card"), ("code", "ok")]
        ) >= 1.0
    );
    assert!(
        after.value(
            "agentd_requests_total",
            &[("method", "metrics"), ("code", "ok")]
        ) >= 1.0,
        "the first scrape is counted"
    );
    // The turns and the run were written: the store's histograms moved.
    for h in [
        "agentd_store_fsync_seconds_count",
        "agentd_store_append_seconds_count",
    ] {
        assert!(after.value(h, &[]) > before.value(h, &[]), "{h}");
    }
    assert!(
        after.value("agentd_store_batches_total", &[])
            > before.value("agentd_store_batches_total", &[])
    );
    assert!(
        after.value("agentd_store_journal_bytes", &[])
            > before.value("agentd_store_journal_bytes", &[])
    );
    assert!(after.value("agentd_tasks", &[("state", "rejected")]) >= 2.0);
    assert!(after.value("agentd_tasks", &[("state", "completed")]) >= 1.0);
    eventually("the run counted completed", || {
        scrape(&d).value("agentd_runs", &[("state", "completed")]) >= 1.0
    });
    assert_eq!(
        after.value("agentd_push_deliveries_total", &[("outcome", "delivered")]),
        0.0
    );

    // A stream open shows in the gauge, and leaves it when it ends.
    let nap = command(&d, json!({"op": "workflow.run", "workflow": "nap"}));
    let nap_task = nap["result"]["task"]["id"].as_str().unwrap().to_owned();
    d.wait_task_state(&nap_task, "TASK_STATE_WORKING");
    eventually("the run counted running", || {
        scrape(&d).value("agentd_runs", &[("state", "running")]) == 1.0
    });
    let mut watcher = d.connect_tcp();
    let sub = common::rpc_request("4", "SubscribeToTask", &json!({"id": nap_task}));
    let watch = std::thread::spawn(move || watcher.request(&sub));
    eventually("the stream counted open", || {
        scrape(&d).value("agentd_streams_open", &[]) == 1.0
    });
    let s = scrape(&d);
    assert_eq!(s.value("agentd_tasks", &[("state", "working")]), 1.0);
    watch.join().unwrap();
    eventually("the stream counted closed", || {
        scrape(&d).value("agentd_streams_open", &[]) == 0.0
    });
}

/// The gauges that go down as well as up: connections, feed subscribers, and the
/// conversation agent's process by state.
fn gauges_follow_connections_feed_subscribers_and_the_agent(driver: &str) {
    let agent =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agents/echo_agent.py");
    // A subscriber that went away is found on the next write to it: a quiet feed's next
    // keep-alive comment, soon here.
    let setup = Setup {
        limits: "sse_keepalive_ms = 200".into(),
        sections: format!(
            "[agent]\ncommand = [\"python3\", {:?}]\n\n[a2a.events]\nenabled = true\n",
            agent.display().to_string()
        ),
        ..Setup::default()
    };
    let d = Daemon::start_setup(driver, &setup);
    // The agent is counted once, in one state, and a turn leaves it alive.
    let r = d.connect_tcp().rpc(
        "1",
        "SendMessage",
        common::text_message(&common::fresh_id(), "hi"),
    );
    let task = r["result"]["task"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    d.wait_task_state(&task, "TASK_STATE_COMPLETED");
    eventually("the agent counted alive", || {
        let s = scrape(&d);
        s.value("agentd_agents", &[("state", "idle")])
            + s.value("agentd_agents", &[("state", "running")])
            == 1.0
    });
    let s = scrape(&d);
    for state in ["crashed", "killed", "stopped"] {
        assert_eq!(
            s.value("agentd_agents", &[("state", state)]),
            0.0,
            "{state}"
        );
    }

    // Three held connections count, and stop counting when they close; the scrape's own
    // (on the unix socket) is the one left.
    let quiet = || scrape(&d).value("agentd_connections_open", &[]);
    eventually("only the scrape's connection open", || quiet() == 1.0);
    let mut held: Vec<_> = (0..3).map(|_| d.connect_tcp()).collect();
    for c in &mut held {
        assert_eq!(c.get_card().status, 200);
    }
    assert_eq!(quiet(), 4.0, "three held connections and the scrape's");
    drop(held);
    eventually("the held connections counted closed", || quiet() == 1.0);

    // A feed subscriber counts while its stream is open.
    assert_eq!(scrape(&d).value("agentd_feed_subscribers", &[]), 0.0);
    let mut reader = d.connect_tcp();
    let ext = format!("A2A-Extensions: {EVENTS_URI}");
    let headers = [RPC_HEADERS[0], RPC_HEADERS[1], ext.as_str()];
    let body = rpc_body("1", "agentd.events/SubscribeToEvents", &json!({}));
    reader.send(&post(&headers, &body));
    eventually("the subscriber counted", || {
        scrape(&d).value("agentd_feed_subscribers", &[]) == 1.0
    });
    drop(reader);
    eventually("the subscriber counted gone", || {
        scrape(&d).value("agentd_feed_subscribers", &[]) == 0.0
    });
}

fn only_the_operator_reads_metrics_and_probes_need_no_credential(driver: &str) {
    // Loopback TCP without a bearer: the implicit operator reads them, a browser does not.
    let d = start(driver, "");
    assert_eq!(d.connect_tcp().request(&get("/metrics", &[])).status, 200);
    let r = d
        .connect_tcp()
        .request(&get("/metrics", &["Origin: https://page.example"]));
    assert_eq!(r.status, 401);
    drop(d);

    // With a bearer configured: the operator's token, or the unix socket; nobody else.
    let setup = Setup {
        a2a: "bearer = \"{{secret:OP_TOKEN}}\"\n".into(),
        sections: "[[a2a.principals]]\nid = \"alice\"\nrole = \"user\"\nmatch = { bearer_ref = \"{{secret:ALICE_TOKEN}}\" }\n".into(),
        env: vec![
            ("OP_TOKEN".into(), "op-secret".into()),
            ("ALICE_TOKEN".into(), "alice-secret".into()),
        ],
        ..Setup::default()
    };
    let d = Daemon::start_setup(driver, &setup);
    let r = d.connect_tcp().request(&get("/metrics", &[]));
    assert_eq!(r.status, 401, "{}", r.body_text());
    assert!(r.header("www-authenticate").is_some());
    let r = d
        .connect_tcp()
        .request(&get("/metrics", &["Authorization: Bearer alice-secret"]));
    assert_eq!(r.status, 403, "{}", r.body_text());
    let r = d
        .connect_tcp()
        .request(&get("/metrics", &["Authorization: Bearer op-secret"]));
    assert_eq!(r.status, 200);
    let s = parse(&r.body_text());
    assert_eq!(
        s.value(
            "agentd_requests_total",
            &[
                ("method", "metrics"),
                ("code", "-31401"),
                ("reason", "UNAUTHENTICATED")
            ]
        ),
        1.0,
        "{:#?}",
        s.samples
    );
    assert_eq!(
        s.value(
            "agentd_requests_total",
            &[
                ("method", "metrics"),
                ("code", "-31403"),
                ("reason", "PERMISSION_DENIED")
            ]
        ),
        1.0
    );
    assert_eq!(scrape(&d).types["agentd_requests"], "counter");
    for path in ["/healthz", "/readyz"] {
        let r = d.connect_tcp().request(&get(path, &[]));
        assert_eq!(r.status, 200, "{path}: no credential needed");
        assert_eq!(r.header("cache-control"), Some("no-store"));
    }
}

fn probe(d: &Daemon, path: &str) -> (u16, String) {
    let r = d.connect_tcp().request(&get(path, &[]));
    (r.status, r.body_text())
}

fn readiness_through_start_and_drain(driver: &str) {
    let mut d = start(driver, "");
    // Ready as soon as the listeners are announced.
    assert_eq!(probe(&d, "/healthz"), (200, "ok\n".into()));
    assert_eq!(probe(&d, "/readyz"), (200, "ready\n".into()));
    // Work in flight keeps the drain open for a few seconds.
    let nap = command(&d, json!({"op": "workflow.run", "workflow": "nap"}));
    let id = nap["result"]["task"]["id"].as_str().unwrap().to_owned();
    d.wait_task_state(&id, "TASK_STATE_WORKING");
    d.signal("TERM");
    eventually("readyz says draining", || {
        probe(&d, "/readyz") == (503, "not ready: draining\n".into())
    });
    assert_eq!(
        probe(&d, "/healthz"),
        (200, "ok\n".into()),
        "a draining daemon is alive"
    );
    let s = scrape(&d);
    assert_eq!(s.value("agentd_draining", &[]), 1.0);
    assert!(
        s.value(
            "agentd_requests_total",
            &[("method", "readyz"), ("code", "503")]
        ) >= 1.0
    );
    let status = d
        .wait_exit(Duration::from_secs(20))
        .expect("the drained daemon exits");
    assert!(status.success(), "exit {status}");
}
