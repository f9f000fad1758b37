//! Agent processes on the real binary: conversation turns answered by the example agent
//! (`examples/agents/echo_agent.py`), its question and the answer, a crashing agent and a
//! hanging one reported as failed tasks with the reason, and subagents sent to, asked
//! about and killed through the command extension.

mod common;

use std::time::{Duration, Instant};

use common::{post, task_state, Daemon, Setup, RPC_HEADERS};
use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";
const ANNOTATIONS_URI: &str = "https://agentd.dev/a2a/ext/task-annotations";

fn script(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

fn start(driver: &str, agent: &str, timeout_ms: u64) -> Daemon {
    start_with_limits(driver, agent, timeout_ms, "")
}

fn start_with_limits(driver: &str, agent: &str, timeout_ms: u64, limits: &str) -> Daemon {
    let sections = format!(
        "[agent]\ncommand = [\"python3\", \"{}\"]\nturn_timeout_ms = {timeout_ms}\n\n\
         [a2a.introspection]\nenabled = true\n\n\
         [[subagents]]\nname = \"echo\"\ncommand = [\"python3\", \"{}\"]\n\n\
         [[subagents]]\nname = \"hang\"\ncommand = [\"python3\", \"{}\"]\n\n\
         [[subagents]]\nname = \"crashy\"\ncommand = [\"python3\", \"{}\"]\n\n\
         [[subagents]]\nname = \"stubborn\"\ncommand = [\"python3\", \"{}\"]\n",
        script(agent),
        script("examples/agents/echo_agent.py"),
        script("tests/agents/hang.py"),
        script("tests/agents/crashy.py"),
        script("tests/agents/stubborn.py"),
    );
    Daemon::start_setup(
        driver,
        &Setup {
            sections,
            limits: limits.to_owned(),
            ..Setup::default()
        },
    )
}

fn send(d: &Daemon, task: Option<&str>, part: Value, now: bool) -> Value {
    let mut message =
        json!({"role": "ROLE_USER", "messageId": format!("m-{}", next()), "parts": [part]});
    if let Some(t) = task {
        message["taskId"] = json!(t);
    }
    let mut params = json!({ "message": message });
    if now {
        params["configuration"] = json!({"returnImmediately": true});
    }
    let ext = format!("A2A-Extensions: {ANNOTATIONS_URI}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params});
    d.connect_tcp()
        .request(&post(
            &[RPC_HEADERS[0], RPC_HEADERS[1], &ext],
            body.to_string().as_bytes(),
        ))
        .json()
}

fn command(d: &Daemon, envelope: Value, now: bool) -> Value {
    let mut params = json!({"message": {"role": "ROLE_USER", "messageId": format!("c-{}", next()),
        "extensions": [COMMAND_URI], "parts": [{"data": {"agentd": envelope}}]}});
    if now {
        params["configuration"] = json!({"returnImmediately": true});
    }
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params});
    d.connect_tcp()
        .request(&post(
            &[RPC_HEADERS[0], RPC_HEADERS[1], &ext],
            body.to_string().as_bytes(),
        ))
        .json()
}

fn next() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

fn status_text(t: &Value) -> String {
    t["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn turns_are_answered(driver: &str) {
    let mut d = start(driver, "examples/agents/echo_agent.py", 20_000);
    let r = send(&d, None, json!({"text": "hello there"}), false);
    let t = &r["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_COMPLETED", "{r}");
    assert_eq!(status_text(t), "echo: hello there");
    assert_eq!(t["artifacts"][0]["name"], "echo");
    assert_eq!(t["artifacts"][0]["parts"][0]["text"], "hello there");

    // The agent asks; the answer is held to its schema, then continues the task.
    let r = send(&d, None, json!({"text": "confirm the deploy"}), false);
    let t = &r["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_INPUT_REQUIRED", "{r}");
    assert_eq!(
        t["metadata"][ANNOTATIONS_URI]["askSchema"]["required"],
        json!(["approve"])
    );
    let id = t["id"].as_str().unwrap().to_owned();
    let bad = send(&d, Some(&id), json!({"data": {"approve": "yes"}}), false);
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    let ok = send(&d, Some(&id), json!({"data": {"approve": true}}), false);
    assert_eq!(
        status_text(&ok["result"]["task"]),
        "confirmed: confirm the deploy",
        "{ok}"
    );

    // The conversation keeps both turns and the agent's answers.
    let ctx = t["contextId"].as_str().unwrap();
    let c = command(&d, json!({"op": "conversation.get", "id": ctx}), false);
    let conv = &c["result"]["message"]["parts"][0]["data"]["conversation"];
    assert_eq!(conv["turns"], 2, "{c}");
    let texts: Vec<&str> = conv["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts.last(),
        Some(&"confirmed: confirm the deploy"),
        "{texts:?}"
    );
    let s = command(&d, json!({"op": "status"}), false);
    assert!(s["result"]["message"]["parts"][0]["data"]["model"]
        .as_str()
        .unwrap()
        .contains("python3"));
    d.assert_alive();
}

#[test]
fn the_example_agent_answers_turns_on_smol() {
    turns_are_answered("smol");
}

#[test]
fn the_example_agent_answers_turns_on_std() {
    turns_are_answered("std");
}

/// Every turn without a `contextId` starts a conversation; the runtime keeps at most
/// `max_tasks` of them, dropping the least recently active. Regression: they were never
/// dropped, so memory grew with every such turn.
#[test]
fn conversations_are_bounded_by_the_task_bound() {
    let mut d = start_with_limits(
        "smol",
        "examples/agents/echo_agent.py",
        20_000,
        "max_tasks = 3",
    );
    let mut contexts = Vec::new();
    for i in 0..6 {
        let r = send(&d, None, json!({"text": format!("turn {i}")}), false);
        let t = &r["result"]["task"];
        assert_eq!(task_state(t), "TASK_STATE_COMPLETED", "{r}");
        contexts.push(t["contextId"].as_str().unwrap().to_owned());
    }
    let s = command(&d, json!({"op": "status"}), false);
    let listed: Vec<&str> = s["result"]["message"]["parts"][0]["data"]["conversations"]
        .as_array()
        .unwrap_or_else(|| panic!("{s}"))
        .iter()
        .map(|c| c["contextId"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 3, "{listed:?}");
    // Newest first: the last turn's conversation leads.
    assert_eq!(listed[0], contexts[5], "{listed:?}");
    for kept in &contexts[3..] {
        assert!(listed.contains(&kept.as_str()), "{kept} in {listed:?}");
    }
    // The dropped ones were withdrawn from status: the count is the kept ones.
    assert_eq!(
        s["result"]["message"]["parts"][0]["data"]["counts"]["conversations"], 3,
        "{s}"
    );
    let gone = command(
        &d,
        json!({"op": "conversation.get", "id": contexts[0]}),
        false,
    );
    assert_eq!(gone["error"]["code"], -32001, "{gone}");
    let kept = command(
        &d,
        json!({"op": "conversation.get", "id": contexts[5]}),
        false,
    );
    let conv = &kept["result"]["message"]["parts"][0]["data"]["conversation"];
    assert_eq!(conv["messages"][0]["text"], "turn 5", "{kept}");

    // Activity, not age: a second turn in the oldest kept conversation keeps it, and the
    // next new conversation drops the one least recently active instead.
    let again = send_in_context(&d, &contexts[3], "turn 3 again");
    assert_eq!(
        task_state(&again["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{again}"
    );
    let r = send(&d, None, json!({"text": "turn 6"}), false);
    let newest = r["result"]["task"]["contextId"]
        .as_str()
        .unwrap()
        .to_owned();
    let conversation = |ctx: &str| {
        let r = command(&d, json!({"op": "conversation.get", "id": ctx}), false);
        r["result"]["message"]["parts"][0]["data"]["conversation"].clone()
    };
    assert!(
        conversation(&contexts[4]).is_null(),
        "the least recently active went"
    );
    let texts: Vec<Value> = conversation(&contexts[3])["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{} kept", contexts[3]))
        .iter()
        .map(|m| m["text"].clone())
        .collect();
    assert_eq!(texts.len(), 4, "{texts:?}");
    assert_eq!(
        (&texts[0], &texts[2]),
        (&json!("turn 3"), &json!("turn 3 again"))
    );
    for ctx in [&contexts[5], &newest] {
        assert!(conversation(ctx).is_object(), "{ctx} kept");
    }
    d.assert_alive();
}

/// A turn in the conversation `ctx` names.
fn send_in_context(d: &Daemon, ctx: &str, text: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message":
        {"role": "ROLE_USER", "messageId": format!("m-{}", next()), "contextId": ctx,
         "parts": [{"text": text}]}}});
    d.connect_tcp()
        .request(&post(&RPC_HEADERS[..2], body.to_string().as_bytes()))
        .json()
}

/// A turn held while paused and then canceled is never sent to the agent on resume (and
/// the held list does not keep it).
#[test]
fn a_canceled_held_turn_is_dropped_not_sent_on_resume() {
    let mut d = start("std", "examples/agents/echo_agent.py", 20_000);
    let p = command(&d, json!({"op": "admin.pause", "reason": "test"}), false);
    assert!(p["result"].is_object(), "{p}");
    let r = send(&d, None, json!({"text": "held"}), true);
    let t = &r["result"]["task"];
    let (id, ctx) = (t["id"].as_str().unwrap(), t["contextId"].as_str().unwrap());
    let c = d.connect_tcp().rpc("2", "CancelTask", json!({ "id": id }));
    assert_eq!(task_state(&c["result"]), "TASK_STATE_CANCELED", "{c}");
    let r = command(&d, json!({"op": "admin.resume"}), false);
    assert!(r["result"].is_object(), "{r}");
    // A turn after the resume is answered; the canceled one never reached the agent.
    let after = send(&d, None, json!({"text": "after"}), false);
    assert_eq!(
        task_state(&after["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{after}"
    );
    let gone = command(&d, json!({"op": "conversation.get", "id": ctx}), false);
    assert_eq!(gone["error"]["code"], -32001, "{gone}");
    d.assert_alive();
}

#[test]
fn a_crashing_agent_fails_its_task_with_the_reason_and_restarts() {
    let mut d = start("smol", "tests/agents/crashy.py", 20_000);
    let r = send(&d, None, json!({"text": "crash"}), false);
    let t = &r["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_FAILED", "{r}");
    assert!(status_text(t).contains("exited with status 3"), "{r}");
    let r = send(&d, None, json!({"text": "again"}), false);
    assert_eq!(
        status_text(&r["result"]["task"]),
        "fine",
        "the next turn restarts it: {r}"
    );
    assert!(d.stderr().contains("agent process ended"));
    d.assert_alive();
}

#[test]
fn a_hanging_agent_times_out() {
    let mut d = start("std", "tests/agents/hang.py", 600);
    let started = Instant::now();
    let r = send(&d, None, json!({"text": "anything"}), false);
    let t = &r["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_FAILED", "{r}");
    assert!(status_text(t).contains("timed out"), "{r}");
    assert!(started.elapsed() < Duration::from_secs(15));
    d.assert_alive();
}

#[test]
fn subagents_are_sent_to_asked_about_and_killed() {
    let d = start("smol", "examples/agents/echo_agent.py", 20_000);
    let r = command(
        &d,
        json!({"op": "subagent.send", "handle": "echo:a", "message": "ping"}),
        false,
    );
    let t = &r["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_COMPLETED", "{r}");
    let id = t["id"].as_str().unwrap();
    let result = t["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifactId"] == format!("{id}.result"))
        .unwrap();
    assert_eq!(
        result["parts"][0]["data"],
        json!({"ok": true, "handle": "echo:a", "reply": "echo: ping"})
    );
    let s = command(
        &d,
        json!({"op": "subagent.status", "handle": "echo:a"}),
        false,
    );
    let doc = &s["result"]["message"]["parts"][0]["data"];
    assert_eq!(doc["status"], "idle", "{s}");
    assert_eq!(doc["result"], "echo: ping");
    let g = command(&d, json!({"op": "subagent.get", "handle": "echo:a"}), false);
    assert_eq!(
        g["result"]["message"]["parts"][0]["data"]["subagent"]["attempt"], 1,
        "{g}"
    );

    // Killing a subagent mid-turn fails its task with the reason.
    let r = command(
        &d,
        json!({"op": "subagent.send", "handle": "hang", "message": "work"}),
        true,
    );
    let hung = r["result"]["task"]["id"].as_str().unwrap().to_owned();
    std::thread::sleep(Duration::from_millis(300));
    let k = command(
        &d,
        json!({"op": "subagent.kill", "handle": "hang", "reason": "runaway"}),
        false,
    );
    assert_eq!(
        task_state(&k["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{k}"
    );
    let t = d.wait_task_state(&hung, "TASK_STATE_FAILED");
    assert!(status_text(&t).contains("runaway"), "{t}");
    // Its process is reaped, later, by the daemon's reaper thread: no zombie is left.
    let killed = *agent_pids_of(&d, "hang")
        .first()
        .unwrap_or_else(|| panic!("no pid for the hang subagent in:\n{}", d.stderr()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{killed}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the killed subagent {killed} was not reaped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A killed subagent is gone: no process, no thread, no entry.
    let s = command(
        &d,
        json!({"op": "subagent.status", "handle": "hang"}),
        false,
    );
    assert_eq!(s["error"]["code"], -32001, "{s}");

    // A crash is reported, not hidden.
    let r = command(
        &d,
        json!({"op": "subagent.send", "handle": "crashy", "message": "crash"}),
        false,
    );
    let t = &r["result"]["task"];
    assert_eq!(task_state(t), "TASK_STATE_FAILED", "{r}");
    assert!(status_text(t).contains("exited with status 3"), "{r}");
    let s = command(
        &d,
        json!({"op": "subagent.status", "handle": "crashy"}),
        false,
    );
    let doc = &s["result"]["message"]["parts"][0]["data"];
    assert_eq!(doc["status"], "crashed", "{s}");
    assert!(doc["error"]
        .as_str()
        .unwrap()
        .contains("exited with status 3"));

    let unknown = command(
        &d,
        json!({"op": "subagent.send", "handle": "nope", "message": "x"}),
        false,
    );
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert_eq!(
        unknown["error"]["data"][0]["reason"], "INVALID_COMMAND_ARGS",
        "{unknown}"
    );
    let missing = command(
        &d,
        json!({"op": "subagent.status", "handle": "echo:zzz"}),
        false,
    );
    assert_eq!(missing["error"]["message"], "no such subagent");
    assert_eq!(missing["error"]["code"], -32001, "{missing}");
    assert_eq!(
        missing["error"]["data"][0]["reason"], "TASK_NOT_FOUND",
        "{missing}"
    );
}

#[test]
fn admin_cancel_stops_an_agent_turn() {
    let d = start("smol", "tests/agents/hang.py", 60_000);
    let r = send(&d, None, json!({"text": "work forever"}), true);
    let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();
    d.wait_task_state(&id, "TASK_STATE_WORKING");
    let c = command(
        &d,
        json!({"op": "admin.cancel", "run": id, "reason": "enough"}),
        false,
    );
    assert_eq!(
        task_state(&c["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{c}"
    );
    let t = d.wait_task_state(&id, "TASK_STATE_CANCELED");
    assert!(status_text(&t).contains("enough"), "{t}");
}

#[test]
fn the_card_offers_a_conversation_only_with_an_agent() {
    let skills = |d: &Daemon| -> Vec<String> {
        let card = d.connect_tcp().get_card().json();
        card["skills"]
            .as_array()
            .unwrap_or_else(|| panic!("skills is a list: {card}"))
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let with = start("smol", "examples/agents/echo_agent.py", 20_000);
    assert_eq!(skills(&with), ["conversation"]);
    // No agent: every turn is rejected, so the card promises no conversation.
    let without = Daemon::start("smol");
    assert_eq!(skills(&without), Vec::<String>::new());
}

#[test]
fn subagents_are_bounded_per_caller_idle_ones_retired_first() {
    let d = start("smol", "examples/agents/echo_agent.py", 20_000);
    let status = |handle: &str| {
        command(
            &d,
            json!({"op": "subagent.status", "handle": handle}),
            false,
        )
    };
    // Ten subagents that answer at once: past the caller's bound of 8, the least recently
    // used idle one is retired for each new one.
    for i in 0..10 {
        let r = command(
            &d,
            json!({"op": "subagent.send", "handle": format!("echo:{i}"), "message": "hi"}),
            false,
        );
        assert_eq!(
            task_state(&r["result"]["task"]),
            "TASK_STATE_COMPLETED",
            "{r}"
        );
    }
    assert_eq!(status("echo:0")["error"]["code"], -32001, "retired");
    assert_eq!(status("echo:1")["error"]["code"], -32001, "retired");
    assert!(status("echo:9")["result"].is_object());
    // Eight that never answer take every place; a ninth is refused, and nothing starts.
    for i in 0..8 {
        let r = command(
            &d,
            json!({"op": "subagent.send", "handle": format!("hang:{i}"), "message": "work"}),
            true,
        );
        assert!(r["result"]["task"].is_object(), "{r}");
    }
    let r = command(
        &d,
        json!({"op": "subagent.send", "handle": "hang:8", "message": "work"}),
        true,
    );
    assert_eq!(r["error"]["code"], -32603, "{r}");
    let info = &r["error"]["data"][0];
    assert_eq!(info["reason"], "LIMIT_REACHED", "{r}");
    assert_eq!(
        info["metadata"]["limit"], "limits.max_subagents_per_principal",
        "{r}"
    );
    assert_eq!(info["metadata"]["max"], "8", "{r}");
    assert_eq!(
        status("hang:8")["error"]["code"],
        -32001,
        "nothing was started"
    );
    // A kill makes room.
    command(
        &d,
        json!({"op": "subagent.kill", "handle": "hang:0"}),
        false,
    );
    let r = command(
        &d,
        json!({"op": "subagent.send", "handle": "hang:8", "message": "work"}),
        true,
    );
    assert!(r["result"]["task"].is_object(), "{r}");
}

/// Whether `pid` is gone (reaped, or a zombie waiting for a parent that is no more).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn wait_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} {pid} outlived the daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn agent_pid(d: &Daemon) -> u32 {
    agent_pids(d)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("no agent pid in the log:\n{}", d.stderr()))
}

/// The pid of every agent process the daemon's log says it started, in order.
fn agent_pids(d: &Daemon) -> Vec<u32> {
    agent_pids_of(d, "")
}

/// [`agent_pids`] of the agents whose log field `agent=` begins with `name`.
fn agent_pids_of(d: &Daemon, name: &str) -> Vec<u32> {
    let field = format!("agent={name}");
    d.stderr()
        .lines()
        .filter(|l| l.contains("agent process started") && l.contains(&field))
        .filter_map(|l| l.split("pid=").nth(1))
        .filter_map(|p| p.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn an_agent_and_what_it_started_die_with_a_killed_daemon() {
    // hang.py ignores the end of its input and every line, and starts a grandchild: only a
    // kill of its whole group stops them. The daemon is SIGKILLed, so it kills nothing.
    for driver in ["smol", "std"] {
        let mut d = start(driver, "tests/agents/hang.py", 60_000);
        let r = send(&d, None, json!({"text": "work forever"}), true);
        let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();
        let t = d.wait_task_state(&id, "TASK_STATE_WORKING");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut t = t;
        // The agent reports its grandchild's pid as its first status text.
        let grandchild: u32 = loop {
            if let Ok(pid) = status_text(&t).trim().parse() {
                break pid;
            }
            assert!(Instant::now() < deadline, "no grandchild pid in {t}");
            std::thread::sleep(Duration::from_millis(20));
            t = d.wait_task_state(&id, "TASK_STATE_WORKING");
        };
        let agent = agent_pid(&d);
        assert!(!gone(agent) && !gone(grandchild), "{driver}: both run");
        d.kill();
        wait_gone(agent, "the agent process");
        wait_gone(grandchild, "the agent's own child");
    }
}

#[test]
fn a_drain_says_what_it_waits_for() {
    let d = start("smol", "tests/agents/hang.py", 60_000);
    let r = send(&d, None, json!({"text": "work forever"}), true);
    let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();
    d.wait_task_state(&id, "TASK_STATE_WORKING");
    d.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let log = d.stderr();
        if let Some(l) = log.lines().find(|l| l.contains("draining: waiting for")) {
            break l.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the drain never said what it waits for:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        line.contains(&format!("task {id} (a turn of the conversation agent)")),
        "{line}"
    );
    assert!(line.contains("tasks=1"), "{line}");
}

/// A drain ends every agent process, the conversation agent's and the subagents', within
/// one grace for all of them: these ignore their shutdown line and the end of their stdin,
/// so only a kill stops them.
fn drain_stops_the_agent_processes(driver: &str) {
    let mut d = start(driver, "tests/agents/stubborn.py", 20_000);
    let r = send(&d, None, json!({"text": "hello"}), false);
    assert_eq!(
        task_state(&r["result"]["task"]),
        "TASK_STATE_COMPLETED",
        "{r}"
    );
    for handle in ["stubborn:a", "stubborn:b"] {
        let r = command(
            &d,
            json!({"op": "subagent.send", "handle": handle, "message": "hi"}),
            false,
        );
        assert_eq!(
            task_state(&r["result"]["task"]),
            "TASK_STATE_COMPLETED",
            "{r}"
        );
    }
    let pids = agent_pids(&d);
    assert_eq!(pids.len(), 3, "three agents started:\n{}", d.stderr());
    assert!(pids.iter().all(|&pid| !gone(pid)), "{pids:?} run");
    let asked = Instant::now();
    let c = command(&d, json!({"op": "admin.drain"}), false);
    assert!(c.get("result").is_some(), "{c}");
    let status = d
        .wait_exit(Duration::from_secs(15))
        .expect("the drained daemon exits");
    assert!(status.success(), "{status}");
    // Each agent's grace is 2 s: waited for one after another, three took 6 s.
    let took = asked.elapsed();
    assert!(
        took < Duration::from_millis(4500),
        "the drain took {took:?}"
    );
    for pid in pids {
        wait_gone(pid, "agent process");
    }
}

#[test]
fn a_drain_stops_the_agent_processes_too_on_std() {
    drain_stops_the_agent_processes("std");
}

/// On smol the runtime is an executor task, which hands the agents' shutdown to a thread.
#[test]
fn a_drain_stops_the_agent_processes_too_on_smol() {
    drain_stops_the_agent_processes("smol");
}

/// §7.6: two bearers who both name their context `root` get two conversations, each keyed by
/// its own internal key; each sees only its own turns and its own name, and an operator sees
/// both under their internal keys in `status`.
#[test]
fn two_principals_root_conversations_stay_separate() {
    let sections = format!(
        "[agent]\ncommand = [\"python3\", \"{}\"]\nturn_timeout_ms = 20000\n\n\
         [a2a.introspection]\nenabled = true\n\n\
         [[a2a.principals]]\nid = \"ann\"\nrole = \"user\"\nmatch = {{ bearer_ref = \"{{{{secret:E2E_ANN}}}}\" }}\n\n\
         [[a2a.principals]]\nid = \"bob\"\nrole = \"user\"\nmatch = {{ bearer_ref = \"{{{{secret:E2E_BOB}}}}\" }}\n",
        script("examples/agents/echo_agent.py"),
    );
    let mut d = Daemon::start_setup(
        "smol",
        &Setup {
            a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
            sections,
            env: vec![
                ("E2E_OP".into(), "op-token".into()),
                ("E2E_ANN".into(), "ann-token".into()),
                ("E2E_BOB".into(), "bob-token".into()),
            ],
            ..Setup::default()
        },
    );
    let rpc = |token: &str, message: Value| -> Value {
        let auth = format!("Authorization: Bearer {token}");
        let ext = format!("A2A-Extensions: {COMMAND_URI}");
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": message}});
        d.connect_tcp()
            .request(&post(
                &[RPC_HEADERS[0], RPC_HEADERS[1], &auth, &ext],
                body.to_string().as_bytes(),
            ))
            .json()
    };
    let turn = |token: &str, text: &str| -> Value {
        let r = rpc(
            token,
            json!({"role": "ROLE_USER", "messageId": format!("m-{}", next()),
                "contextId": "root", "parts": [{"text": text}]}),
        );
        let t = r["result"]["task"].clone();
        assert_eq!(task_state(&t), "TASK_STATE_COMPLETED", "{r}");
        assert_eq!(t["contextId"], "root", "each owner sees its own name: {r}");
        t
    };
    let op = |token: &str, envelope: Value| -> Value {
        let r = rpc(
            token,
            json!({"role": "ROLE_USER", "messageId": format!("c-{}", next()),
                "extensions": [COMMAND_URI], "parts": [{"data": {"agentd": envelope}}]}),
        );
        r["result"]["message"]["parts"][0]["data"].clone()
    };
    turn("ann-token", "ann's secret");
    turn("bob-token", "bob's note");
    turn("ann-token", "ann again");

    // Each principal's `root` holds only its own turns.
    let texts = |conv: &Value| -> Vec<String> {
        conv["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("{conv}"))
            .iter()
            .map(|m| m["text"].as_str().unwrap().to_owned())
            .collect()
    };
    let ann =
        op("ann-token", json!({"op": "conversation.get", "id": "root"}))["conversation"].clone();
    let bob =
        op("bob-token", json!({"op": "conversation.get", "id": "root"}))["conversation"].clone();
    assert_eq!(ann["turns"], 2, "{ann}");
    assert_eq!(bob["turns"], 1, "{bob}");
    assert!(texts(&ann).iter().all(|t| !t.contains("bob")), "{ann}");
    assert!(texts(&bob).iter().all(|t| !t.contains("ann")), "{bob}");
    let (ka, kb) = (ann["id"].as_str().unwrap(), bob["id"].as_str().unwrap());
    for k in [ka, kb] {
        assert!(k.starts_with("ctx-") && k.len() == 36, "{k}");
    }
    assert_ne!(ka, kb);

    // The operator sees both under their internal keys, and addresses them by those keys.
    let status = op("op-token", json!({"op": "status"}));
    let mut listed: Vec<(String, String, String)> = status["conversations"]
        .as_array()
        .unwrap_or_else(|| panic!("{status}"))
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or("").to_owned();
            (s("id"), s("contextId"), s("principal"))
        })
        .collect();
    assert_eq!(status["counts"]["conversations"], 2, "{status}");
    listed.sort_by(|a, b| a.2.cmp(&b.2));
    assert_eq!(
        listed,
        [
            (ka.to_owned(), "root".to_owned(), "user:ann".to_owned()),
            (kb.to_owned(), "root".to_owned(), "user:bob".to_owned()),
        ]
    );
    let by_key =
        op("op-token", json!({"op": "conversation.get", "id": kb}))["conversation"].clone();
    assert_eq!(texts(&by_key), texts(&bob));
    // A user cannot reach the other's conversation by its key.
    let r = rpc(
        "ann-token",
        json!({"role": "ROLE_USER", "messageId": "c-x", "extensions": [COMMAND_URI],
            "parts": [{"data": {"agentd": {"op": "conversation.get", "id": kb}}}]}),
    );
    assert_eq!(r["error"]["code"], -32001, "{r}");
    d.assert_alive();
}
