//! The runtime behind the ops, on the real binary: workflows from the config file run
//! through the command extension (exec and human steps, a gate answered wrong then right),
//! their events on the feed, another run cancelled, pause and resume, `admin.set`, the
//! introspection ops, a drain (by `admin.drain` and by SIGTERM) that lets in-flight work
//! finish and exits 0, and load errors that name the file and line.

mod common;

use std::time::Duration;

use common::{post, task_state, Daemon, Setup, RPC_HEADERS};
use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";
const ANNOTATIONS_URI: &str = "https://agentd.dev/a2a/ext/task-annotations";

/// The workflows every daemon here loads.
const WORKFLOWS: &str = r#"
[[workflows]]
name = "release"
description = "Build, ask a person, ship"

[[workflows.steps]]
id = "start"
kind = "a2a"
command = "release.start"
roles = ["user", "operator"]
schema = { type = "object", properties = { tag = { type = "string" } }, required = ["tag"], additionalProperties = false }

[[workflows.steps]]
id = "build"
kind = "exec"
program = "/bin/sh"
args = ["-c", "printf '{\"built\": \"%s\"}' \"$0\"", "{{inputs.tag}}"]

[[workflows.steps]]
id = "approve"
kind = "human"
prompt = "Ship {{steps.build.output.built}}?"
schema = { type = "object", properties = { approve = { type = "boolean" } }, required = ["approve"] }
channel = "ops"

[[workflows.steps]]
id = "ship"
kind = "exec"
program = "/bin/sh"
args = ["-c", "printf '{\"shipped\": \"%s\", \"approved\": %s}' \"$0\" \"$1\"", "{{steps.build.output.built}}", "{{steps.approve.output.approve}}"]

[[workflows]]
name = "waiter"
[[workflows.steps]]
id = "wait"
kind = "signal"
signal = "go"

[[workflows]]
name = "broken"
[[workflows.steps]]
id = "fail"
kind = "exec"
program = "/bin/sh"
args = ["-c", "echo 'disk on fire' >&2; exit 3"]

[[workflows]]
name = "slow"
[[workflows.steps]]
id = "nap"
kind = "exec"
program = "/bin/sh"
args = ["-c", "sleep {{inputs.secs}}; echo rested"]
timeout_ms = 300

[[workflows]]
name = "slow2"
[[workflows.steps]]
id = "nap"
kind = "exec"
program = "/bin/sh"
args = ["-c", "sleep 4; echo rested"]

[[workflows]]
name = "quick"
[[workflows.steps]]
id = "say"
kind = "exec"
program = "/bin/echo"
args = ["hi {{inputs.who}}"]
"#;

fn start(driver: &str, extra_sections: &str) -> Daemon {
    let setup = Setup {
        sections: format!(
            "[a2a.events]\nenabled = true\nstream_deadline_ms = 800\n{extra_sections}\n{WORKFLOWS}"
        ),
        limits: "stream_queue = 4096\n".into(),
        ..Setup::default()
    };
    Daemon::start_setup(driver, &setup)
}

/// Sends a command (over TCP, as the loopback operator); returns the whole JSON-RPC answer
/// and the HTTP response.
fn command_full(d: &Daemon, envelope: Value, configuration: Value) -> common::Response {
    let mut params = json!({"message": {
        "role": "ROLE_USER",
        "messageId": format!("m-{}", rand_id()),
        "extensions": [COMMAND_URI],
        "parts": [{"data": {"agentd": envelope}, "mediaType": "application/json"}],
    }});
    if !configuration.is_null() {
        params["configuration"] = configuration;
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params});
    let ext = format!("A2A-Extensions: {COMMAND_URI}, {ANNOTATIONS_URI}");
    let headers = [RPC_HEADERS[0], RPC_HEADERS[1], ext.as_str()];
    d.connect_tcp()
        .request(&post(&headers, body.to_string().as_bytes()))
}

fn command(d: &Daemon, envelope: Value) -> Value {
    command_full(d, envelope, Value::Null).json()
}

fn command_now(d: &Daemon, envelope: Value) -> Value {
    command_full(d, envelope, json!({"returnImmediately": true})).json()
}

/// A command's result document (message ops).
fn read(d: &Daemon, envelope: Value) -> Value {
    let doc = command(d, envelope.clone());
    assert!(doc.get("error").is_none(), "{envelope}: {doc}");
    doc["result"]["message"]["parts"][0]["data"].clone()
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

fn send_to_task(d: &Daemon, task_id: &str, part: Value) -> Value {
    let params = json!({"message": {"role": "ROLE_USER", "messageId": format!("a-{}", rand_id()),
                        "taskId": task_id, "parts": [part]}});
    d.connect_tcp().rpc("2", "SendMessage", params)
}

fn get_task(d: &Daemon, id: &str) -> Value {
    d.connect_tcp().rpc_ok("GetTask", json!({"id": id}))
}

fn result_data(task: &Value) -> Value {
    let id = task["id"].as_str().unwrap();
    let a = task["artifacts"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["artifactId"] == format!("{id}.result")))
        .unwrap_or_else(|| panic!("no result artifact on {task}"));
    a["parts"][0]["data"].clone()
}

/// Every event the feed holds, replayed from the start (the stream ends at its deadline).
fn feed(d: &Daemon) -> Vec<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "agentd.events/SubscribeToEvents", "params": {}});
    let headers = [
        RPC_HEADERS[0],
        RPC_HEADERS[1],
        "A2A-Extensions: https://agentd.dev/a2a/ext/events",
    ];
    let r = d
        .connect_tcp()
        .request(&post(&headers, body.to_string().as_bytes()));
    r.sse_events()
        .into_iter()
        .filter_map(|e| e["result"].get("event").cloned())
        .collect()
}

fn workflow_with_a_gate(driver: &str) {
    let mut d = start(driver, "");
    // A unary send blocks until the run reaches its gate.
    let doc = command(&d, json!({"op": "release.start", "tag": "v1.2"}));
    let task = &doc["result"]["task"];
    assert_eq!(task_state(task), "TASK_STATE_INPUT_REQUIRED", "{doc}");
    let id = task["id"].as_str().unwrap().to_owned();
    let question = &task["status"]["message"]["parts"][0]["text"];
    assert_eq!(
        question, "Ship v1.2?",
        "the prompt is filled from the exec step's output"
    );
    let notes = &task["metadata"][ANNOTATIONS_URI];
    assert_eq!(
        notes["askSchema"]["required"],
        json!(["approve"]),
        "{notes}"
    );
    assert_eq!(notes["askChannel"], "ops");
    assert_eq!(notes["link"]["kind"], "run");

    // A wrong answer is refused and the gate stays open.
    let refused = send_to_task(&d, &id, json!({"text": "sure"}));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("askSchema"));
    assert_eq!(task_state(&get_task(&d, &id)), "TASK_STATE_INPUT_REQUIRED");

    // The right one continues the run to its end; the last step's output is the result.
    let answered = send_to_task(&d, &id, json!({"data": {"approve": true}}));
    let t = &answered["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_COMPLETED", "{answered}");
    assert_eq!(result_data(t), json!({"shipped": "v1.2", "approved": true}));

    // workflow.status and run.get (introspection is off: refused) tell the same story.
    let runs = read(&d, json!({"op": "workflow.status"}))["runs"].clone();
    assert_eq!(runs[0]["status"], "completed");
    assert_eq!(runs[0]["output"]["shipped"], "v1.2");
    let off = command(&d, json!({"op": "run.get", "run": runs[0]["run"]}));
    assert_eq!(off["error"]["code"], -32004, "{off}");
    // So does status: the run the runtime published, and how many there are.
    let status = read(&d, json!({"op": "status"}));
    assert_eq!(status["runs"][0]["id"], runs[0]["run"], "{status}");
    assert_eq!(status["runs"][0]["status"], "completed", "{status}");
    assert_eq!(status["counts"]["runs"], 1, "{status}");

    // The feed saw each step start and end, and the run's states, in order.
    let events = feed(&d);
    let steps: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["kind"] == "step")
        .map(|e| {
            (
                e["data"]["step"].as_str().unwrap().to_owned(),
                e["data"]["phase"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = ["start", "build", "approve", "ship"]
        .iter()
        .flat_map(|s| {
            [
                (s.to_string(), "start".to_string()),
                (s.to_string(), "done".to_string()),
            ]
        })
        .collect();
    assert_eq!(steps, want);
    let statuses: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "run")
        .map(|e| e["data"]["status"].as_str().unwrap())
        .collect();
    assert!(
        statuses.contains(&"waiting") && statuses.last() == Some(&"completed"),
        "{statuses:?}"
    );
    d.assert_alive();
}

#[test]
fn a_workflow_runs_exec_and_human_steps_on_smol() {
    workflow_with_a_gate("smol");
}

#[test]
fn a_workflow_runs_exec_and_human_steps_on_std() {
    workflow_with_a_gate("std");
}

#[test]
fn bad_arguments_start_no_run_and_failures_say_why() {
    let d = start("smol", "");
    for envelope in [
        json!({"op": "release.start", "tag": 7}),
        json!({"op": "workflow.run", "workflow": "quick", "inputs": 3}),
        json!({"op": "workflow.run", "workflow": "nope"}),
    ] {
        let r = command_full(&d, envelope.clone(), Value::Null);
        assert_eq!(r.status, 200, "{envelope}");
        let e = &r.json()["error"];
        assert_eq!(e["code"], -32602, "{envelope}: {e}");
        assert_eq!(
            e["data"][0]["reason"], "INVALID_COMMAND_ARGS",
            "{envelope}: {e}"
        );
    }
    let bad = command(&d, json!({"op": "workflow.run", "workflow": "nope"}));
    assert!(bad["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no workflow named"));
    let listed = d.connect_tcp().rpc_ok("ListTasks", json!({}));
    assert_eq!(
        listed["totalSize"], 0,
        "a refused command leaves no task: {listed}"
    );

    // A non-zero exit fails the step and the run, quoting stderr.
    let doc = command(&d, json!({"op": "workflow.run", "workflow": "broken"}));
    let t = &doc["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_FAILED", "{doc}");
    let why = t["status"]["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(
        why.contains("exit status 3") && why.contains("disk on fire"),
        "{why}"
    );
    // A step past its timeout fails too.
    let doc = command(
        &d,
        json!({"op": "workflow.run", "workflow": "slow", "inputs": {"secs": 30}}),
    );
    let why = doc["result"]["task"]["status"]["message"]["parts"][0]["text"].clone();
    assert!(
        why.as_str().unwrap().contains("timed out after 300 ms"),
        "{doc}"
    );
    let runs = read(&d, json!({"op": "workflow.status"}))["runs"].clone();
    assert!(runs
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["status"] == "failed" && r["error"].is_string()));
}

#[test]
fn one_run_is_cancelled_and_a_signal_wakes_the_other() {
    let d = start("std", "");
    let a = command_now(&d, json!({"op": "workflow.run", "workflow": "waiter"}));
    let b = command_now(&d, json!({"op": "workflow.run", "workflow": "waiter"}));
    let (ta, tb) = (
        a["result"]["task"]["id"].as_str().unwrap().to_owned(),
        b["result"]["task"]["id"].as_str().unwrap().to_owned(),
    );
    let runs = read(&d, json!({"op": "workflow.status"}))["runs"].clone();
    assert_eq!(runs.as_array().unwrap().len(), 2);
    let run_a = runs[0]["run"].as_str().unwrap().to_owned();
    d.wait_task_state(&ta, "TASK_STATE_WORKING");

    let c = command(&d, json!({"op": "workflow.cancel", "run": run_a}));
    assert_eq!(
        task_state(&c["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{c}"
    );
    assert_eq!(task_state(&get_task(&d, &ta)), "TASK_STATE_CANCELED");
    let again = command(&d, json!({"op": "workflow.cancel", "run": run_a}));
    assert_eq!(
        again["error"]["code"], -32002,
        "a finished run is not cancelable: {again}"
    );
    let unknown = command(&d, json!({"op": "workflow.cancel", "run": "run-nope"}));
    assert_eq!(unknown["error"]["message"], "no such run");

    let s = command(
        &d,
        json!({"op": "workflow.signal", "name": "go", "payload": {"x": 1}}),
    );
    assert_eq!(
        result_data(&s["result"]["task"]),
        json!({"signal": "go", "delivered": 1})
    );
    let done = d.wait_task_state(&tb, "TASK_STATE_COMPLETED");
    assert_eq!(
        result_data(&done),
        json!({"x": 1}),
        "the signal's payload is the output"
    );
}

#[test]
fn pause_holds_new_steps_until_resume() {
    let d = start("smol", "");
    let p = command(&d, json!({"op": "admin.pause", "reason": "upgrade"}));
    assert_eq!(
        result_data(&p["result"]["task"]),
        json!({"ok": true, "state": "paused", "reason": "upgrade"})
    );
    assert_eq!(read(&d, json!({"op": "status"}))["paused"], true);
    let r = command_now(
        &d,
        json!({"op": "workflow.run", "workflow": "quick", "inputs": {"who": "ann"}}),
    );
    let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();
    std::thread::sleep(Duration::from_millis(200));
    let runs = read(&d, json!({"op": "workflow.status"}))["runs"].clone();
    assert_eq!(runs[0]["status"], "paused");
    assert_ne!(task_state(&get_task(&d, &id)), "TASK_STATE_COMPLETED");
    let r = command(&d, json!({"op": "admin.resume"}));
    assert_eq!(
        result_data(&r["result"]["task"]),
        json!({"ok": true, "state": "running"})
    );
    let t = d.wait_task_state(&id, "TASK_STATE_COMPLETED");
    assert_eq!(t["artifacts"][0]["parts"][0]["text"], "hi ann");
    let lifecycle: Vec<Value> = feed(&d)
        .into_iter()
        .filter(|e| e["kind"] == "lifecycle")
        .map(|e| e["data"].clone())
        .collect();
    assert_eq!(
        lifecycle,
        vec![
            json!({"paused": true, "reason": "upgrade"}),
            json!({"paused": false})
        ]
    );
}

#[test]
fn admin_set_turns_introspection_on_and_approval_to_deny() {
    let d = start("std", "");
    let off = command(&d, json!({"op": "debug.events"}));
    assert_eq!(off["error"]["code"], -32004, "{off}");
    let refused = command(
        &d,
        json!({"op": "admin.set", "path": "a2a.listen", "value": "x"}),
    );
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let why = refused["error"]["message"].as_str().unwrap();
    assert!(
        why.contains("agentd.path") && why.contains("\"a2a.listen\" is not one of"),
        "the refusal names the path: {refused}"
    );
    let bad = command(
        &d,
        json!({"op": "admin.set", "path": "agent.approval", "value": "maybe"}),
    );
    assert_eq!(bad["error"]["code"], -32602, "{bad}");

    let on = command(
        &d,
        json!({"op": "admin.set", "path": "a2a.introspection.enabled", "value": true}),
    );
    assert_eq!(
        result_data(&on["result"]["task"]),
        json!({"path": "a2a.introspection.enabled", "value": true})
    );
    let q = command(
        &d,
        json!({"op": "workflow.run", "workflow": "quick", "inputs": {"who": "bo"}}),
    );
    assert_eq!(task_state(&q["result"]["task"]), "TASK_STATE_COMPLETED");
    let runs = read(&d, json!({"op": "workflow.status"}))["runs"].clone();
    let run = read(&d, json!({"op": "run.get", "run": runs[0]["run"]}));
    assert_eq!(run["run"]["steps"]["say"]["output"], "hi bo", "{run}");
    assert_eq!(run["run"]["vars"]["inputs"], json!({"who": "bo"}));
    let logs = read(&d, json!({"op": "debug.events", "prefix": "run "}));
    let names: Vec<&str> = logs["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"run started") && names.contains(&"run finished"),
        "{logs}"
    );
    let audit: Vec<Value> = feed(&d)
        .into_iter()
        .filter(|e| e["kind"] == "audit")
        .collect();
    assert!(
        audit.iter().any(|e| e["data"]["action"] == "workflow.run"),
        "{audit:?}"
    );

    let deny = command(
        &d,
        json!({"op": "admin.set", "path": "agent.approval", "value": "deny"}),
    );
    assert_eq!(result_data(&deny["result"]["task"])["value"], "deny");
    let q = command(
        &d,
        json!({"op": "workflow.run", "workflow": "quick", "inputs": {"who": "cy"}}),
    );
    let why = q["result"]["task"]["status"]["message"]["parts"][0]["text"].clone();
    assert!(
        why.as_str().unwrap().contains("agent.approval = deny"),
        "{q}"
    );
    let configs: Vec<Value> = feed(&d)
        .into_iter()
        .filter(|e| e["kind"] == "config")
        .map(|e| e["data"].clone())
        .collect();
    assert_eq!(configs.len(), 2, "{configs:?}");
}

#[test]
fn approval_ask_gates_each_exec_step_for_the_operator() {
    let d = start("smol", "");
    command(
        &d,
        json!({"op": "admin.set", "path": "agent.approval", "value": "ask"}),
    );
    let q = command(
        &d,
        json!({"op": "workflow.run", "workflow": "quick", "inputs": {"who": "di"}}),
    );
    let t = &q["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_INPUT_REQUIRED", "{q}");
    let id = t["id"].as_str().unwrap().to_owned();
    let a = send_to_task(&d, &id, json!({"data": {"approve": true}}));
    assert_eq!(
        task_state(&a["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{a}"
    );
    let q = command(
        &d,
        json!({"op": "workflow.run", "workflow": "quick", "inputs": {"who": "ed"}}),
    );
    let id = q["result"]["task"]["id"].as_str().unwrap().to_owned();
    let a = send_to_task(&d, &id, json!({"text": "{\"approve\": false}"}));
    assert_eq!(task_state(&a["result"]["task"]), "TASK_STATE_FAILED", "{a}");
}

/// `ask` keeps an operator in the loop: the run's owner cannot approve its own exec step.
#[test]
fn only_an_operator_answers_an_approval_gate() {
    let setup = Setup {
        a2a: "bearer = \"{{secret:OP_TOKEN}}\"".into(),
        sections: format!(
            "[agent]\napproval = \"ask\"\n\n[[a2a.principals]]\nid = \"alice\"\nrole = \"user\"\n\
             match = {{ bearer_ref = \"{{{{secret:ALICE_TOKEN}}}}\" }}\n{WORKFLOWS}"
        ),
        env: vec![
            ("OP_TOKEN".into(), "op-secret".into()),
            ("ALICE_TOKEN".into(), "alice-secret".into()),
        ],
        ..Setup::default()
    };
    let d = Daemon::start_setup("smol", &setup);
    let call = |token: &str, message: Value, command: bool| -> (u16, Value) {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": message}});
        let auth = format!("Authorization: Bearer {token}");
        let ext = format!("A2A-Extensions: {COMMAND_URI}");
        let mut headers = vec![RPC_HEADERS[0], RPC_HEADERS[1], auth.as_str()];
        if command {
            headers.push(ext.as_str());
        }
        let r = d
            .connect_tcp()
            .request(&post(&headers, body.to_string().as_bytes()));
        (r.status, r.json())
    };
    let (_, q) = call(
        "alice-secret",
        json!({"role": "ROLE_USER", "messageId": "run-1", "extensions": [COMMAND_URI],
            "parts": [{"data": {"agentd": {"op": "workflow.run", "workflow": "quick",
                "inputs": {"who": "al"}}}}]}),
        true,
    );
    let t = &q["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_INPUT_REQUIRED", "{q}");
    let id = t["id"].as_str().unwrap().to_owned();
    let approve = |n: u32| {
        json!({"role": "ROLE_USER", "messageId": format!("ok-{n}"), "taskId": id,
            "parts": [{"data": {"approve": true}}]})
    };
    let (status, r) = call("alice-secret", approve(1), false);
    assert_eq!(status, 403, "{r}");
    assert_eq!(r["error"]["code"], -31403, "{r}");
    assert_eq!(r["error"]["data"][0]["reason"], "PERMISSION_DENIED", "{r}");
    // Nothing changed: the gate still waits, now for the operator, who approves.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": id}});
    let g = d
        .connect_tcp()
        .request(&post(
            &[
                RPC_HEADERS[0],
                RPC_HEADERS[1],
                "Authorization: Bearer op-secret",
            ],
            body.to_string().as_bytes(),
        ))
        .json();
    assert_eq!(task_state(&g["result"]), "TASK_STATE_INPUT_REQUIRED", "{g}");
    let (_, r) = call("op-secret", approve(2), false);
    assert_eq!(
        task_state(&r["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{r}"
    );
}

fn drain(by_signal: bool) {
    let mut d = start("smol", "");
    // Parked at a gate: its task waits for a person and cannot end on its own.
    let gated = command(&d, json!({"op": "release.start", "tag": "v9"}));
    assert_eq!(
        task_state(&gated["result"]["task"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{gated}"
    );
    // In flight: a run whose exec step takes longer than the drain's 3 s grace for waiting
    // clients, so only counting it as in flight keeps the daemon up until it ends.
    let r = command_now(&d, json!({"op": "workflow.run", "workflow": "slow2"}));
    let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();
    d.wait_task_state(&id, "TASK_STATE_WORKING");
    // A subscriber to the task in flight: the drain waits for it to be answered.
    let mut watcher = d.connect_tcp();
    let sub = common::rpc_request("4", "SubscribeToTask", &json!({"id": id}));
    let watch = std::thread::spawn(move || watcher.request(&sub));
    if by_signal {
        d.signal("TERM");
        std::thread::sleep(Duration::from_millis(100));
    } else {
        let a = command(&d, json!({"op": "admin.drain", "reason": "maintenance"}));
        assert_eq!(
            result_data(&a["result"]["task"]),
            json!({"ok": true, "state": "draining", "reason": "maintenance"})
        );
    }
    // New work is refused with DRAINING and Retry-After; reads still answer.
    let refused = command_full(
        &d,
        json!({"op": "workflow.run", "workflow": "quick", "inputs": {"who": "x"}}),
        Value::Null,
    );
    assert_eq!(refused.status, 200);
    assert_eq!(refused.header("retry-after"), Some("5"));
    let e = refused.json()["error"].clone();
    assert_eq!(e["code"], -32603);
    assert_eq!(e["data"][0]["reason"], "DRAINING", "{e}");
    let turn = d
        .connect_tcp()
        .rpc("3", "SendMessage", common::text_message("t-1", "hello"));
    assert_eq!(turn["error"]["data"][0]["reason"], "DRAINING", "{turn}");
    assert_eq!(read(&d, json!({"op": "status"}))["draining"], true);
    // The run in flight finishes (its subscriber sees it end); then the daemon exits 0.
    let stream = watch.join().unwrap().sse_events();
    let last = stream.last().cloned().unwrap_or_default();
    assert_eq!(
        last["result"]["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{stream:?}"
    );
    let artifacts: Vec<&Value> = stream
        .iter()
        .filter_map(|e| e["result"].get("artifactUpdate"))
        .collect();
    assert_eq!(artifacts[0]["artifact"]["parts"][0]["text"], "rested");
    let status = d
        .wait_exit(Duration::from_secs(15))
        .expect("the drained daemon exits");
    assert!(status.success(), "exit {status}");
}

#[test]
fn admin_drain_lets_work_finish_then_exits_zero() {
    drain_with(false);
}

#[test]
fn sigterm_drains_gracefully() {
    drain_with(true);
}

fn drain_with(by_signal: bool) {
    drain(by_signal)
}

#[test]
fn workflow_mistakes_are_load_errors_naming_file_and_line() {
    let dir = std::env::temp_dir().join(format!("agentd-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "next = \"nowhere\"",
            "agentd.toml:6:",
            "next names \"nowhere\"",
        ),
        ("kind2 = 1", "agentd.toml:", "unknown field `kind2`"),
    ];
    for (extra, at, what) in cases {
        let config = dir.join("agentd.toml");
        let text = format!(
            "[a2a]\nlisten = \"tcp://127.0.0.1:0\"\n\n[[workflows]]\nname = \"bad\"\n[[workflows.steps]]\nid = \"x\"\nkind = \"exec\"\nprogram = \"/bin/true\"\n{extra}\n"
        );
        std::fs::write(&config, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(at) && stderr.contains(what), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_scoped_grant_limits_which_workflows_a_caller_may_run() {
    // A user whose only workflow grant is `workflow.run:sl*`: "slow" is its to run, "quick"
    // is refused with 403 whether or not it exists.
    let setup = Setup {
        a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
        sections: format!(
            "[[a2a.principals]]\nid = \"user:ann\"\nrole = \"user\"\ngrants = [\"workflow.run:sl*\"]\n\
             match = {{ bearer_ref = \"{{{{secret:E2E_ANN}}}}\" }}\n{WORKFLOWS}"
        ),
        env: vec![
            ("E2E_OP".into(), "op-token".into()),
            ("E2E_ANN".into(), "ann-token".into()),
        ],
        ..Setup::default()
    };
    let d = Daemon::start_setup("std", &setup);
    let as_ann = |envelope: Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
            "role": "ROLE_USER", "messageId": format!("m-{}", rand_id()), "extensions": [COMMAND_URI],
            "parts": [{"data": {"agentd": envelope}}]}, "configuration": {"returnImmediately": true}}});
        let ext = format!("A2A-Extensions: {COMMAND_URI}");
        let headers = [
            RPC_HEADERS[0],
            RPC_HEADERS[1],
            ext.as_str(),
            "Authorization: Bearer ann-token",
        ];
        d.connect_tcp()
            .request(&post(&headers, body.to_string().as_bytes()))
    };
    for name in ["quick", "no-such-workflow"] {
        let r = as_ann(json!({"op": "workflow.run", "workflow": name}));
        assert_eq!(r.status, 403, "{name}: {}", r.body_text());
        let e = &r.json()["error"];
        assert_eq!(e["code"], -31403, "{e}");
        assert_eq!(e["data"][0]["reason"], "PERMISSION_DENIED", "{e}");
    }
    let r = as_ann(json!({"op": "workflow.run", "workflow": "slow", "inputs": {"secs": 0}}));
    assert_eq!(r.status, 200, "{}", r.body_text());
    assert!(
        r.json()["result"]["task"]["id"].is_string(),
        "{}",
        r.body_text()
    );
    // The run is ann's: workflow.status shows it to her, and not the operator's view alone.
    let runs = as_ann(json!({"op": "workflow.status"})).json();
    let runs = &runs["result"]["message"]["parts"][0]["data"]["runs"];
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
}
