//! One trace across two agents: a client's `traceparent` reaches a front instance, whose
//! workflow runs an exec step, delegates to a worker instance over its unix socket
//! (`a2a.delegate`, then `a2a.send` to the worker's agent); both
//! instances export their spans over OTLP/HTTP JSON to a collector on loopback (a small
//! receiver here). Every span of the request carries the client's trace id, the worker's
//! server spans are children of the front's client spans, and the agent's turn line, the
//! exec steps' environment carry the context. A webhook request carries the trace of the
//! request that handed its task out.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::time::{Duration, Instant};

use common::receiver::{Hit, Receiver};
use common::{post, Daemon, Setup, RPC_HEADERS};
use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP collector (and webhook receiver) on loopback: keeps every POST, answers
/// `200 {}`.
struct Collector(Receiver);

impl Collector {
    fn start() -> Collector {
        Collector(Receiver::start(Vec::new()))
    }

    fn endpoint(&self) -> String {
        self.0.base()
    }

    fn hits(&self) -> Vec<Hit> {
        self.0.hits()
    }

    /// Every span exported so far, each with its resource's `service.name` as `service`.
    fn spans(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for hit in self.hits().into_iter().filter(|h| h.path == "/v1/traces") {
            assert_eq!(hit.header("content-type"), Some("application/json"));
            for rs in hit.body["resourceSpans"].as_array().unwrap() {
                let service = rs["resource"]["attributes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|a| a["key"] == "service.name")
                    .map(|a| a["value"]["stringValue"].clone())
                    .unwrap();
                for ss in rs["scopeSpans"].as_array().unwrap() {
                    for s in ss["spans"].as_array().unwrap() {
                        let mut s = s.clone();
                        s["service"] = service.clone();
                        out.push(s);
                    }
                }
            }
        }
        out
    }

    /// Every span exported so far, as the OpenTelemetry project's protobuf classes read the
    /// bodies (tests/interop/parse_otlp.py): `(traceId, spanId, parentSpanId, name)`, sorted.
    fn spans_read_by_opentelemetry_proto(&self) -> Vec<(String, String, String, String)> {
        let bodies: Vec<Value> = self
            .hits()
            .into_iter()
            .filter(|h| h.path == "/v1/traces")
            .map(|h| h.body)
            .collect();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/parse_otlp.py");
        let mut child = std::process::Command::new(common::interop_python())
            .arg(script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run the OTLP reader");
        let text = serde_json::to_vec(&bodies).unwrap();
        child.stdin.take().unwrap().write_all(&text).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "opentelemetry-proto cannot read the export: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let spans: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let mut got: Vec<_> = spans
            .iter()
            .map(|s| {
                let f = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
                (f("traceId"), f("spanId"), f("parentSpanId"), f("name"))
            })
            .collect();
        got.sort();
        got
    }

    /// Waits until `done` holds of the spans exported, up to 20 s.
    fn wait_spans(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < end,
                "no {what} after 20 s; spans: {:#}; other hits: {:?}",
                Value::Array(spans),
                self.hits()
                    .iter()
                    .filter(|h| h.path != "/v1/traces")
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A send, as a peer makes it (streaming when the card says it may).
fn is_send(span: &Value) -> bool {
    span["name"] == "SendMessage" || span["name"] == "SendStreamingMessage"
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

/// `00-<trace>-<span>-<flags>` split.
fn traceparent(v: &str) -> (String, String, String) {
    let p: Vec<&str> = v.split('-').collect();
    assert_eq!(p.len(), 4, "{v}");
    assert_eq!(p[0], "00", "{v}");
    (p[1].into(), p[2].into(), p[3].into())
}

fn worker_setup(collector: &Collector) -> Setup {
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/trace_echo.py");
    Setup {
        sections: format!(
            r#"
[agent]
name = "worker"
command = ["python3", "{agent}"]

[telemetry]
otlp_endpoint = "{endpoint}"
service_name = "worker"

[[workflows]]
name = "build"

[[workflows.steps]]
id = "start"
kind = "a2a"
command = "build.run"
roles = ["operator"]
schema = {{ type = "object", properties = {{ target = {{ type = "string" }} }}, required = ["target"] }}

[[workflows.steps]]
id = "compile"
kind = "exec"
program = "/bin/sh"
args = ["-c", "printf '{{\"traceparent\": \"%s\", \"tracestate\": \"%s\"}}' \"$TRACEPARENT\" \"$TRACESTATE\""]
"#,
            endpoint = collector.endpoint()
        ),
        ..Setup::default()
    }
}

fn front_setup(collector: &Collector, worker_sock: &str) -> Setup {
    Setup {
        sections: format!(
            r#"
[agent]
name = "front"

[telemetry]
otlp_endpoint = "{endpoint}/"
service_name = "front"

[a2a.push]
enabled = true
allow_private = true

[[a2a.peers]]
name = "worker"
endpoint = "unix://{worker_sock}"

[[workflows]]
name = "ship"

[[workflows.steps]]
id = "start"
kind = "a2a"
command = "ship.start"
roles = ["operator"]
schema = {{ type = "object", properties = {{ target = {{ type = "string" }} }}, required = ["target"] }}

[[workflows.steps]]
id = "build"
kind = "a2a.delegate"
peer = "worker"
command = "build.run"
args = {{ target = "{{{{inputs.target}}}}" }}

[[workflows.steps]]
id = "announce"
kind = "a2a.send"
peer = "worker"
text = "shipped"

[[workflows.steps]]
id = "report"
kind = "exec"
program = "/bin/sh"
args = ["-c", "printf '{{\"local\": \"%s\", \"state\": \"%s\", \"delegated\": \"%s\", \"delegated_state\": \"%s\", \"turn\": \"%s\", \"turn_state\": \"%s\"}}' \"$TRACEPARENT\" \"$TRACESTATE\" \"$0\" \"$1\" \"$2\" \"$3\"", "{{{{steps.build.output.traceparent}}}}", "{{{{steps.build.output.tracestate}}}}", "{{{{steps.announce.output.traceparent}}}}", "{{{{steps.announce.output.tracestate}}}}"]
"#,
            endpoint = collector.endpoint()
        ),
        ..Setup::default()
    }
}

/// A JSON-RPC call to `d`'s TCP listener with extra header lines.
fn call(d: &Daemon, headers: &[&str], method: &str, params: Value) -> Value {
    let mut all: Vec<&str> = RPC_HEADERS.to_vec();
    all.extend_from_slice(headers);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let resp = d
        .connect_tcp()
        .request(&post(&all, body.to_string().as_bytes()));
    resp.json()
}

#[test]
fn one_trace_spans_two_instances_delegating_over_a_unix_socket() {
    let collector = Collector::start();
    // Each driver on one side: both hand their request records to the exporter.
    let worker = Daemon::start_setup("std", &worker_setup(&collector));
    let front = Daemon::start_setup(
        "smol",
        &front_setup(&collector, worker.unix.to_str().unwrap()),
    );

    let sent = call(
        &front,
        &[
            &format!("traceparent: 00-{TRACE}-{CALLER_SPAN}-01"),
            "tracestate: vendor=opaque",
            &format!("A2A-Extensions: {COMMAND_URI}"),
        ],
        "SendMessage",
        json!({
            "message": {"role": "ROLE_USER", "messageId": "m-ship", "extensions": [COMMAND_URI],
                        "parts": [{"data": {"agentd": {"op": "ship.start", "target": "app"}}}]},
        }),
    );
    let task = &sent["result"]["task"];
    assert_eq!(
        task["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{sent}\nfront: {}\nworker: {}",
        front.stderr(),
        worker.stderr()
    );
    let task_id = task["id"].as_str().unwrap().to_owned();
    let result = task["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifactId"] == format!("{task_id}.result"))
        .map(|a| a["parts"][0]["data"].clone())
        .unwrap_or_else(|| panic!("no result artifact: {sent}"));

    // What the programs and the agent saw: the caller's trace and tracestate everywhere.
    let (local_trace, local_parent, flags) = traceparent(result["local"].as_str().unwrap());
    let (deleg_trace, deleg_parent, _) = traceparent(result["delegated"].as_str().unwrap());
    let (turn_trace, turn_parent, _) = traceparent(result["turn"].as_str().unwrap());
    assert_eq!(
        [&local_trace, &deleg_trace, &turn_trace],
        [TRACE; 3],
        "{result}"
    );
    assert_eq!(flags, "01");
    for key in ["state", "delegated_state", "turn_state"] {
        assert_eq!(result[key], "vendor=opaque", "{key}: {result}");
    }
    assert_ne!(
        local_parent, CALLER_SPAN,
        "the front's own span is the exec step's parent"
    );

    // The spans: the front's server span of the send, its two client spans and its exec
    // step's, the worker's server spans of the two sends it got and its exec step's, all
    // in the caller's trace.
    let spans = collector.wait_spans("spans of both instances", |spans| {
        let front_clients = spans
            .iter()
            .filter(|s| s["service"] == "front" && s["kind"] == 3)
            .count();
        let worker_sends = spans
            .iter()
            .filter(|s| s["service"] == "worker" && is_send(s))
            .count();
        let execs = spans.iter().filter(|s| s["kind"] == 1).count();
        front_clients >= 2 && worker_sends >= 2 && execs >= 2
    });
    let in_trace: Vec<&Value> = spans.iter().filter(|s| s["traceId"] == TRACE).collect();
    let front_server = in_trace
        .iter()
        .find(|s| s["service"] == "front" && s["kind"] == 2 && s["name"] == "SendMessage")
        .unwrap_or_else(|| panic!("no front server span: {spans:#?}"));
    assert_eq!(front_server["parentSpanId"], CALLER_SPAN);
    assert_eq!(
        attr(front_server, "a2a.task_id"),
        Some(&json!({"stringValue": task_id}))
    );
    assert_eq!(
        attr(front_server, "rpc.method"),
        Some(&json!({"stringValue": "SendMessage"}))
    );
    let front_span = front_server["spanId"].as_str().unwrap();
    // An exec step's program gets its step's span as parent, a child of the server span.
    let exec_span = |service: &str, name: &str| {
        *in_trace
            .iter()
            .find(|s| s["service"] == service && s["kind"] == 1 && s["name"] == name)
            .unwrap_or_else(|| panic!("no {service} span {name:?}: {spans:#?}"))
    };
    let report = exec_span("front", "exec report");
    assert_eq!(
        local_parent,
        report["spanId"].as_str().unwrap(),
        "the exec step's TRACEPARENT names its step's span"
    );
    assert_eq!(report["parentSpanId"], front_span);
    assert_eq!(
        attr(report, "process.executable.path"),
        Some(&json!({"stringValue": "/bin/sh"}))
    );
    for s in &in_trace {
        let start: u64 = s["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u64 = s["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(
            start > 1_700_000_000_000_000_000 && end >= start,
            "times are unix nanoseconds: {s}"
        );
    }

    let clients: Vec<&&Value> = in_trace
        .iter()
        .filter(|s| s["service"] == "front" && s["kind"] == 3)
        .collect();
    let names: HashSet<&str> = clients
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        HashSet::from(["a2a.delegate worker", "a2a.send worker"]),
        "{clients:#?}"
    );
    for c in &clients {
        assert_eq!(
            c["parentSpanId"], front_span,
            "a client span is a child of the request's server span: {c}"
        );
    }
    let client_id = |name: &str| {
        clients
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["spanId"].as_str().unwrap().to_owned())
            .unwrap()
    };

    // The worker's server spans of the two sends are children of the front's client spans.
    let worker_sends: Vec<&&Value> = in_trace
        .iter()
        .filter(|s| s["service"] == "worker" && s["kind"] == 2 && is_send(s))
        .collect();
    assert_eq!(worker_sends.len(), 2, "{spans:#?}");
    let parents: HashSet<&str> = worker_sends
        .iter()
        .map(|s| s["parentSpanId"].as_str().unwrap())
        .collect();
    let wanted = [
        client_id("a2a.delegate worker"),
        client_id("a2a.send worker"),
    ];
    assert_eq!(
        parents,
        wanted.iter().map(String::as_str).collect::<HashSet<_>>(),
        "each worker send is the child of a front client span"
    );
    // The worker's agent's turn names a worker server span; its exec step its own span,
    // whose parent is one.
    let worker_ids: HashSet<&str> = worker_sends
        .iter()
        .map(|s| s["spanId"].as_str().unwrap())
        .collect();
    assert!(worker_ids.contains(turn_parent.as_str()), "{result}");
    let compile = exec_span("worker", "exec compile");
    assert_eq!(compile["spanId"], deleg_parent.as_str(), "{result}");
    assert!(
        worker_ids.contains(compile["parentSpanId"].as_str().unwrap()),
        "{compile}"
    );
    // Nothing of this request left the trace: every span either instance made for it
    // carries the caller's trace id (the worker's only other requests are none).
    let worker_other = spans
        .iter()
        .filter(|s| s["service"] == "worker" && s["traceId"] != TRACE)
        .count();
    assert_eq!(worker_other, 0, "{spans:#?}");

    // A webhook: a message to the front (which has no agent: the task is rejected at
    // once) in another trace, with a push config; the delivery carries that trace, under a
    // client span of its own whose parent is the message's server span.
    const TRACE2: &str = "0af7651916cd43dd8448eb211c80319c";
    let rejected = call(
        &front,
        &[&format!("traceparent: 00-{TRACE2}-b7ad6b7169203331-01")],
        "SendMessage",
        json!({
            "message": {"role": "ROLE_USER", "messageId": "m-hook", "parts": [{"text": "hi"}]},
            "configuration": {"taskPushNotificationConfig": {
                "url": format!("{}/hook", collector.endpoint()), "token": "tok"}},
        }),
    );
    assert_eq!(
        rejected["result"]["task"]["status"]["state"], "TASK_STATE_REJECTED",
        "{rejected}"
    );
    let spans = collector.wait_spans("the webhook's span", |spans| {
        spans.iter().any(|s| s["name"] == "webhook")
    });
    let hook_span = spans.iter().find(|s| s["name"] == "webhook").unwrap();
    let hook_parent = spans
        .iter()
        .find(|s| s["traceId"] == TRACE2 && s["kind"] == 2)
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(hook_span["traceId"], TRACE2);
    assert_eq!(hook_span["kind"], 3);
    assert_eq!(hook_span["parentSpanId"], hook_parent["spanId"]);
    assert_eq!(hook_parent["parentSpanId"], "b7ad6b7169203331");
    let hooks: Vec<Hit> = collector
        .hits()
        .into_iter()
        .filter(|h| h.path == "/hook")
        .collect();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    let (t, parent, _) = traceparent(hooks[0].header("traceparent").unwrap());
    assert_eq!(t, TRACE2);
    assert_eq!(parent, hook_span["spanId"].as_str().unwrap());
    assert_eq!(hooks[0].header("tracestate"), None);

    // A request with an invalid traceparent starts a trace of its own: a root span.
    let got = call(
        &front,
        &["traceparent: 00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"],
        "GetTask",
        json!({"id": task_id}),
    );
    assert!(got.get("result").is_some(), "{got}");
    let spans = collector.wait_spans("the GetTask span", |spans| {
        spans.iter().any(|s| s["name"] == "GetTask")
    });
    let get_task = spans.iter().find(|s| s["name"] == "GetTask").unwrap();
    assert!(get_task.get("parentSpanId").is_none(), "{get_task}");
    assert_ne!(get_task["traceId"], TRACE);
    assert_eq!(get_task["traceId"].as_str().unwrap().len(), 32);

    // An independent reader takes every export as this test's own reading does.
    let mut ours: Vec<_> = collector
        .spans()
        .iter()
        .map(|s| {
            let f = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
            (f("traceId"), f("spanId"), f("parentSpanId"), f("name"))
        })
        .collect();
    ours.sort();
    let theirs = collector.spans_read_by_opentelemetry_proto();
    assert_eq!(theirs, ours);
    assert!(
        theirs.iter().any(|(trace, ..)| trace == TRACE),
        "{theirs:?}"
    );

    // The front counts what it exported.
    let mut c = front.connect_tcp();
    let metrics = c.request(&common::get("/metrics", &[])).body_text();
    let exported = metrics
        .lines()
        .find_map(|l| l.strip_prefix("agentd_trace_spans_exported_total "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(exported >= 4, "{metrics}");
    assert!(
        metrics.contains("agentd_trace_spans_dropped_total{reason=\"queue-full\"} 0"),
        "{metrics}"
    );
}

#[test]
fn without_telemetry_the_callers_context_is_carried_as_is() {
    // No [telemetry]: nothing is recorded, and the agent's turn line gets the caller's
    // traceparent unchanged (a request without one gets none).
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/trace_echo.py");
    let d = Daemon::start_setup(
        "smol",
        &Setup {
            sections: format!(
                "[agent]\ncommand = [\"python3\", \"{agent}\"]\n\n\
                 [[subagents]]\nname = \"tracer\"\ncommand = [\"python3\", \"{agent}\"]\n"
            ),
            ..Setup::default()
        },
    );
    let tp = format!("00-{TRACE}-{CALLER_SPAN}-00");
    let send = |headers: &[&str], id: &str| {
        let r = call(
            &d,
            headers,
            "SendMessage",
            json!({"message": {"role": "ROLE_USER", "messageId": id, "parts": [{"text": "hi"}]}}),
        );
        let t = &r["result"]["task"];
        assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
        t["status"]["message"]["parts"][0]["data"].clone()
    };
    let seen = send(&[&format!("traceparent: {tp}")], "m-1");
    assert_eq!(seen, json!({"traceparent": tp, "tracestate": null}));
    let seen = send(&[], "m-2");
    assert_eq!(seen, json!({"traceparent": null, "tracestate": null}));
    let seen = send(&["traceparent: ff-garbage"], "m-3");
    assert_eq!(seen, json!({"traceparent": null, "tracestate": null}));

    // A subagent's turn line carries the trace of the command that sent it.
    let r = call(
        &d,
        &[
            &format!("traceparent: {tp}"),
            "tracestate: vendor=sub",
            &format!("A2A-Extensions: {COMMAND_URI}"),
        ],
        "SendMessage",
        json!({"message": {"role": "ROLE_USER", "messageId": "m-sub", "extensions": [COMMAND_URI],
               "parts": [{"data": {"agentd": {"op": "subagent.send", "handle": "tracer:a", "message": "hi"}}}]}}),
    );
    let t = &r["result"]["task"];
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
    let artifacts = t["artifacts"].to_string();
    assert!(
        artifacts.contains(&tp) && artifacts.contains("vendor=sub"),
        "the subagent's reply should name the command's trace: {r}"
    );
}
