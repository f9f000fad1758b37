// The cases of tests/agent_process.rs, included once per way of reading stdout.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use agentd::runtime::agent::{
    to_completions, AgentEvent, AgentEventKind, AgentSpec, AgentState, Agents, TurnIn,
};
use agentd_core::a2a::types::{Part, PartContent, TaskState};
use agentd_core::Completion;
use serde_json::json;

/// How long any expected event may take.
const PATIENCE: Duration = Duration::from_secs(20);

fn script(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn spec(name: &str, path: &str) -> AgentSpec {
    let program = if path.ends_with(".py") {
        "python3"
    } else {
        "sh"
    };
    AgentSpec::new(
        name,
        vec![program.into(), script(path).to_string_lossy().into()],
    )
}

fn start(spec: AgentSpec) -> (super::Owned, Receiver<AgentEvent>) {
    let (tx, rx) = mpsc::channel();
    (super::Owned::new(spec, tx, POLLED), rx)
}

fn turn(task: &str, parts: Vec<Part>) -> TurnIn {
    TurnIn {
        task: task.into(),
        context: "ctx-1".into(),
        principal: "user:alice".into(),
        parts,
        trace: None,
    }
}

fn text_turn(task: &str, text: &str) -> TurnIn {
    turn(task, vec![Part::text(text)])
}

/// Collects events until one matches, returning all of them; fails after [`PATIENCE`].
fn until(
    rx: &Receiver<AgentEvent>,
    what: &str,
    done: impl Fn(&AgentEvent) -> bool,
) -> Vec<AgentEvent> {
    let end = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(ev) => {
                let stop = done(&ev);
                seen.push(ev);
                if stop {
                    return seen;
                }
            }
            Err(_) => panic!("no {what} within {PATIENCE:?}; saw {seen:#?}"),
        }
    }
}

/// Collects events until the turn of `task` ends (reply, ask or fail).
fn turn_end(rx: &Receiver<AgentEvent>, task: &str) -> Vec<AgentEvent> {
    until(rx, &format!("end of the turn of {task}"), |e| {
        e.task.as_deref() == Some(task)
            && matches!(
                e.kind,
                AgentEventKind::Reply { .. }
                    | AgentEventKind::Ask { .. }
                    | AgentEventKind::Fail { .. }
            )
    })
}

fn fail_text(ev: &AgentEvent) -> &str {
    match &ev.kind {
        AgentEventKind::Fail { error } => error,
        other => panic!("expected a Fail, got {other:?}"),
    }
}

fn text_of(parts: &[Part]) -> &str {
    match &parts[0].content {
        PartContent::Text(t) => t,
        other => panic!("expected a text part, got {other:?}"),
    }
}

/// Whether a process is gone: no such pid, or a zombie left for its (new) parent to reap.
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

fn eventually_gone(pid: u32) -> bool {
    let end = Instant::now() + PATIENCE;
    while Instant::now() < end {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Whether `pid` is reaped (not even a zombie) within [`PATIENCE`].
fn eventually_reaped(pid: u32) -> bool {
    let end = Instant::now() + PATIENCE;
    while Instant::now() < end {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_turn_is_answered_with_status_artifact_and_reply() {
    let (agent, rx) = start(spec("echo", "examples/agents/echo_agent.py"));
    assert_eq!(agent.status().state, AgentState::Idle);
    assert_eq!(
        agent.status().pid,
        None,
        "nothing runs before the first turn"
    );
    agent.turn(text_turn("t1", "hello")).unwrap();
    let events = turn_end(&rx, "t1");
    let kinds: Vec<_> = events.iter().map(|e| &e.kind).collect();
    assert!(
        matches!(kinds[0], AgentEventKind::Started { restarts: 0, .. }),
        "{kinds:?}"
    );
    assert_eq!(
        kinds[1],
        &AgentEventKind::Status {
            text: Some("echoing".into())
        }
    );
    assert_eq!(
        kinds[2],
        &AgentEventKind::Artifact {
            id: "echo".into(),
            name: "echo".into(),
            parts: vec![Part::text("hello")],
            append: false,
            last: true
        }
    );
    let AgentEventKind::Reply { parts } = kinds[3] else {
        panic!("{kinds:?}")
    };
    assert_eq!(text_of(parts), "echo: hello");
    assert!(events.iter().all(|e| e.agent == "echo"));

    // The same events as the core's completions, in the order the core takes them.
    let completions: Vec<Completion> = events.iter().flat_map(to_completions).collect();
    assert!(matches!(
        &completions[0],
        Completion::Status {
            state: TaskState::Working,
            ..
        }
    ));
    assert!(matches!(
        &completions[1],
        Completion::Artifact {
            last_chunk: true,
            ..
        }
    ));
    assert!(matches!(
        &completions[2],
        Completion::Status { state: TaskState::Completed, task_id, .. } if task_id == "t1"
    ));

    let st = agent.status();
    assert_eq!(st.state, AgentState::Running);
    assert!(st.pid.is_some() && st.started_ms.is_some());
    assert!(st.in_flight.is_empty());
}

#[test]
fn an_ask_is_continued_by_another_turn_of_the_same_task() {
    let (agent, rx) = start(spec("echo", "examples/agents/echo_agent.py"));
    agent.turn(text_turn("t1", "confirm the deploy")).unwrap();
    let ask = turn_end(&rx, "t1").pop().unwrap();
    let AgentEventKind::Ask { text, schema, .. } = &ask.kind else {
        panic!("{ask:?}")
    };
    assert!(text.contains("confirm the deploy"), "{text}");
    let schema = schema.clone().expect("the ask carries its schema");
    assert_eq!(schema["required"], json!(["approve"]));
    let completions = to_completions(&ask);
    assert!(matches!(
        &completions[0],
        Completion::Ask {
            schema: Some(_),
            ..
        }
    ));
    assert!(matches!(
        &completions[1],
        Completion::Status {
            state: TaskState::InputRequired,
            ..
        }
    ));
    assert!(agent.status().in_flight.is_empty(), "an ask ends the turn");

    agent
        .turn(turn("t1", vec![Part::data(json!({"approve": true}))]))
        .unwrap();
    let reply = turn_end(&rx, "t1").pop().unwrap();
    let AgentEventKind::Reply { parts } = &reply.kind else {
        panic!("{reply:?}")
    };
    assert_eq!(text_of(parts), "confirmed: confirm the deploy");
}

#[test]
fn a_crash_mid_turn_fails_the_task_and_the_next_turn_restarts_the_agent() {
    let (agent, rx) = start(spec("crashy", "tests/agents/crashy.py"));
    agent.turn(text_turn("t1", "crash")).unwrap();
    let events = turn_end(&rx, "t1");
    let exited = events
        .iter()
        .find_map(|e| match &e.kind {
            AgentEventKind::Exited {
                description,
                in_flight,
            } => Some((description.clone(), in_flight.clone())),
            _ => None,
        })
        .expect("the exit is reported");
    assert_eq!(exited, ("exited with status 3".into(), vec!["t1".into()]));
    // The status it wrote before dying is delivered before the exit is settled.
    assert!(events
        .iter()
        .any(|e| matches!(e.kind, AgentEventKind::Status { .. })));
    assert_eq!(
        fail_text(events.last().unwrap()),
        "agent process crashy exited with status 3 while working on this task"
    );
    let st = agent.status();
    assert_eq!(st.state, AgentState::Crashed);
    assert_eq!(st.pid, None);
    assert_eq!(st.last_error.as_deref(), Some("exited with status 3"));

    agent.turn(text_turn("t2", "again")).unwrap();
    let events = turn_end(&rx, "t2");
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, AgentEventKind::Started { restarts: 1, .. })),
        "the restart is reported: {events:?}"
    );
    assert!(matches!(
        events.last().unwrap().kind,
        AgentEventKind::Reply { .. }
    ));
    assert_eq!(agent.status().restarts, 1);
    assert_eq!(agent.status().state, AgentState::Running);
}

#[test]
fn a_hanging_turn_times_out_and_leaves_no_process_behind() {
    let mut s = spec("hang", "tests/agents/hang.py");
    s.turn_timeout = Duration::from_secs(1);
    let (agent, rx) = start(s);
    agent.turn(text_turn("t1", "anything")).unwrap();
    // The agent reports its grandchild's pid in a status note.
    let note = until(&rx, "the grandchild's pid", |e| {
        matches!(e.kind, AgentEventKind::Status { .. })
    })
    .pop()
    .unwrap();
    let AgentEventKind::Status {
        text: Some(grandchild),
    } = note.kind
    else {
        panic!("{note:?}")
    };
    let grandchild: u32 = grandchild.parse().unwrap();
    let pid = agent.status().pid.expect("it runs");

    let events = turn_end(&rx, "t1");
    assert_eq!(
        fail_text(events.last().unwrap()),
        "timed out after 1s waiting for agent process hang to answer this turn"
    );
    let exited = until(&rx, "the exit", |e| {
        matches!(e.kind, AgentEventKind::Exited { .. })
    });
    let AgentEventKind::Exited {
        description,
        in_flight,
    } = &exited.last().unwrap().kind
    else {
        unreachable!()
    };
    assert!(description.contains("timed out"), "{description}");
    assert!(in_flight.is_empty(), "the timed-out task already failed");
    assert!(eventually_gone(pid), "the agent {pid} is gone");
    assert!(
        eventually_gone(grandchild),
        "its grandchild {grandchild} is gone"
    );
    assert_eq!(agent.status().state, AgentState::Crashed);
}

#[test]
fn an_over_long_line_kills_the_agent() {
    let mut s = spec("longline", "tests/agents/longline.py");
    s.max_line_bytes = 4096;
    let (agent, rx) = start(s);
    agent.turn(text_turn("t1", "talk")).unwrap();
    let events = turn_end(&rx, "t1");
    assert_eq!(
        fail_text(events.last().unwrap()),
        "agent process longline was killed by agentd: it wrote a line longer than 4096 bytes on stdout"
    );
    assert_eq!(agent.status().state, AgentState::Crashed);
    assert_eq!(agent.status().pid, None);
}

#[test]
fn lines_at_the_edges_of_the_rules_are_read_as_the_rules_say() {
    let mut s = spec("edges", "tests/agents/edges.py");
    s.max_line_bytes = 512;
    let (agent, rx) = start(s);
    let reply = |events: &[AgentEvent]| match &events.last().unwrap().kind {
        AgentEventKind::Reply { parts } => text_of(parts).to_owned(),
        other => panic!("{other:?}"),
    };

    // Exactly the limit (a `\r` counted), arriving in two reads: taken whole.
    agent.turn(text_turn("t1", "exact")).unwrap();
    assert_eq!(reply(&turn_end(&rx, "t1")), "ok");

    // A last line with no newline counts, before the exit is reported.
    agent.turn(text_turn("t2", "eof")).unwrap();
    assert_eq!(reply(&turn_end(&rx, "t2")), "last words");
    until(&rx, "the exit", |e| {
        matches!(&e.kind, AgentEventKind::Exited { in_flight, .. } if in_flight.is_empty())
    });

    // One byte past the limit kills the (restarted) agent.
    agent.turn(text_turn("t3", "over")).unwrap();
    assert_eq!(
        fail_text(turn_end(&rx, "t3").last().unwrap()),
        "agent process edges was killed by agentd: it wrote a line longer than 512 bytes on stdout"
    );
}

#[test]
fn garbage_lines_are_ignored_up_to_the_limit() {
    let mut s = spec("garbage", "tests/agents/garbage.py");
    s.max_bad_lines = 10;
    let (agent, rx) = start(s);
    agent.turn(text_turn("t1", "talk")).unwrap();
    let events = turn_end(&rx, "t1");
    let AgentEventKind::Reply { parts } = &events.last().unwrap().kind else {
        panic!("{events:?}")
    };
    assert_eq!(text_of(parts), "after the noise");
    // The reply for a task it was never given is not passed on.
    assert!(events
        .iter()
        .all(|e| e.task.as_deref() != Some("not-given")));
    assert_eq!(agent.status().state, AgentState::Running);
}

#[test]
fn too_many_garbage_lines_kill_the_agent() {
    let mut s = spec("garbage", "tests/agents/garbage.py");
    s.max_bad_lines = 2;
    let (agent, rx) = start(s);
    agent.turn(text_turn("t1", "talk")).unwrap();
    let error = fail_text(turn_end(&rx, "t1").last().unwrap()).to_owned();
    assert!(
        error.starts_with(
            "agent process garbage was killed by agentd: it wrote 2 lines on stdout that are not agent protocol"
        ),
        "{error}"
    );
    assert_eq!(agent.status().state, AgentState::Crashed);
}

#[test]
fn an_agent_that_exits_at_start_fails_the_turn_and_says_how() {
    let (agent, rx) = start(spec("quitter", "tests/agents/exit_at_start.sh"));
    agent.turn(text_turn("t1", "hi")).unwrap();
    let events = turn_end(&rx, "t1");
    assert_eq!(
        fail_text(events.last().unwrap()),
        "agent process quitter exited with status 7 while working on this task"
    );
    let st = agent.status();
    assert_eq!(st.state, AgentState::Crashed);
    assert_eq!(
        st.last_stderr.as_deref(),
        Some("cannot start: no model configured")
    );
}

#[test]
fn a_program_that_cannot_start_fails_the_turn() {
    let (agent, rx) = start(AgentSpec::new(
        "missing",
        vec!["/nonexistent/agentd-test-agent".into()],
    ));
    agent.turn(text_turn("t1", "hi")).unwrap();
    let events = turn_end(&rx, "t1");
    assert!(matches!(events[0].kind, AgentEventKind::StartFailed { .. }));
    let error = fail_text(events.last().unwrap());
    assert!(
        error.starts_with("agent process missing could not start: "),
        "{error}"
    );
    assert_eq!(agent.status().state, AgentState::Crashed);
}

#[test]
fn kill_fails_the_in_flight_tasks_with_the_reason() {
    let (agent, rx) = start(spec("hang", "tests/agents/hang.py"));
    agent.turn(text_turn("t1", "anything")).unwrap();
    until(&rx, "the agent at work", |e| {
        matches!(e.kind, AgentEventKind::Status { .. })
    });
    let pid = agent.status().pid.unwrap();
    assert!(agent.kill("operator", "runaway"));
    // kill settles the exit before it returns.
    let st = agent.status();
    assert_eq!(st.state, AgentState::Killed);
    assert_eq!(st.pid, None);
    assert!(st.in_flight.is_empty());
    let events = turn_end(&rx, "t1");
    assert!(events.iter().any(|e| e.kind
        == AgentEventKind::Exited {
            description: "killed by operator: runaway".into(),
            in_flight: vec!["t1".into()]
        }));
    assert_eq!(
        fail_text(events.last().unwrap()),
        "agent process hang was killed by operator: runaway"
    );
    assert!(eventually_gone(pid));
    assert!(!agent.kill("operator", "again"), "nothing runs any more");
}

#[test]
fn dropping_the_supervisor_kills_the_child() {
    let (agent, rx) = start(spec("hang", "tests/agents/hang.py"));
    agent.turn(text_turn("t1", "anything")).unwrap();
    let note = until(&rx, "the agent at work", |e| {
        matches!(e.kind, AgentEventKind::Status { .. })
    })
    .pop()
    .unwrap();
    let AgentEventKind::Status {
        text: Some(grandchild),
    } = note.kind
    else {
        panic!("{note:?}")
    };
    let pid = agent.status().pid.unwrap();
    drop(agent);
    // Killed before the drop returns, reaped soon after by the reaper thread: no zombie.
    assert!(
        eventually_reaped(pid),
        "the child {pid} was not reaped after the drop"
    );
    assert!(eventually_gone(grandchild.parse().unwrap()));
    // Its in-flight task is failed, not forgotten.
    let events: Vec<_> = rx.try_iter().collect();
    assert!(events
        .iter()
        .any(|e| e.task.as_deref() == Some("t1") && matches!(e.kind, AgentEventKind::Fail { .. })));
}

#[test]
fn cancel_forgets_the_turn_and_later_lines_about_it_are_ignored() {
    let mut s = spec("hang", "tests/agents/hang.py");
    s.turn_timeout = Duration::from_secs(2);
    let (agent, rx) = start(s);
    agent.turn(text_turn("t1", "anything")).unwrap();
    until(&rx, "the agent at work", |e| {
        matches!(e.kind, AgentEventKind::Status { .. })
    });
    agent.cancel("t1");
    assert!(agent.status().in_flight.is_empty());
    // No timeout fires for a canceled turn, so nothing kills the (hanging) agent.
    std::thread::sleep(Duration::from_secs(3));
    assert!(rx.try_iter().next().is_none());
    assert_eq!(agent.status().state, AgentState::Running);
}

#[test]
fn shutdown_is_graceful_and_final() {
    let (agent, rx) = start(spec("echo", "examples/agents/echo_agent.py"));
    agent.turn(text_turn("t1", "hello")).unwrap();
    turn_end(&rx, "t1");
    let pid = agent.status().pid.unwrap();
    agent.shutdown(Duration::from_secs(10));
    let st = agent.status();
    assert_eq!(st.state, AgentState::Stopped);
    assert_eq!(st.last_error, None, "a clean exit is no error");
    assert!(gone(pid));
    let exited = until(&rx, "the exit", |e| {
        matches!(e.kind, AgentEventKind::Exited { .. })
    });
    assert_eq!(
        exited.last().unwrap().kind,
        AgentEventKind::Exited {
            description: "exited with status 0".into(),
            in_flight: vec![]
        }
    );
    let refused = agent.turn(text_turn("t2", "more")).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "agent echo is stopped and takes no more turns"
    );
}

#[test]
fn a_hanging_agent_is_killed_when_shutdown_grace_ends() {
    let (agent, rx) = start(spec("hang", "tests/agents/hang.py"));
    agent.turn(text_turn("t1", "anything")).unwrap();
    until(&rx, "the agent at work", |e| {
        matches!(e.kind, AgentEventKind::Status { .. })
    });
    agent.shutdown(Duration::from_millis(300));
    let events = turn_end(&rx, "t1");
    assert_eq!(
        fail_text(events.last().unwrap()),
        "agent process hang was killed by agentd: it did not stop within 300ms of the shutdown request"
    );
    assert_eq!(agent.status().state, AgentState::Stopped);
}

#[test]
fn named_agents_share_one_event_channel() {
    let (tx, rx) = mpsc::channel();
    let agents = Agents::new(
        [
            spec("echo", "examples/agents/echo_agent.py"),
            spec("crashy", "tests/agents/crashy.py"),
        ],
        tx.clone(),
    )
    .unwrap();
    assert_eq!(agents.names().collect::<Vec<_>>(), ["crashy", "echo"]);
    agents
        .get("echo")
        .unwrap()
        .turn(text_turn("a", "x"))
        .unwrap();
    agents
        .get("crashy")
        .unwrap()
        .turn(text_turn("b", "y"))
        .unwrap();
    let mut answered = Vec::new();
    while answered.len() < 2 {
        let ev = until(&rx, "a reply", |e| {
            matches!(e.kind, AgentEventKind::Reply { .. })
        })
        .pop()
        .unwrap();
        answered.push((ev.agent, ev.task.unwrap()));
    }
    answered.sort();
    assert_eq!(
        answered,
        [("crashy".into(), "b".into()), ("echo".into(), "a".into())]
    );
    agents.shutdown(Duration::from_secs(10));
    assert!(agents
        .statuses()
        .iter()
        .all(|s| s.state == AgentState::Stopped));
    assert!(Agents::new([spec("x", "a.py"), spec("x", "b.py")], tx).is_err());
}

/// An agent that reads nothing for a while, then answers every turn with its text: turns
/// fill the pipe (written straight into it), then the writer's queue, then are refused as
/// busy, none of it blocking the caller; once it reads, every turn taken is answered, in
/// order and whole, and later turns go on as usual.
#[test]
fn a_stalled_agent_never_blocks_the_caller_and_gets_every_line_whole_in_order() {
    let code = "import json, sys, time\n\
                time.sleep(2)\n\
                for line in sys.stdin:\n\
                \x20   m = json.loads(line)\n\
                \x20   if m['type'] == 'turn':\n\
                \x20       print(json.dumps({'type': 'reply', 'task': m['task'], 'text': m['text']}), flush=True)\n";
    let mut s = AgentSpec::new("stall", vec!["python3".into(), "-c".into(), code.into()]);
    s.queue = 4;
    let (agent, rx) = start(s);
    let text = |i: usize| {
        // One turn past PIPE_BUF, which always goes through the writer thread.
        let n = if i == 1 { 10_000 } else { 1000 };
        format!("{i}:{}", "x".repeat(n))
    };
    // The process starts on the first turn; the others go to it.
    agent.turn(text_turn("t0", &text(0))).unwrap();
    until(&rx, "the start", |e| {
        matches!(e.kind, AgentEventKind::Started { .. })
    });
    let mut taken = 1;
    // The long turn goes through the writer thread, and lines queue behind it until the
    // thread has written it: on a loaded machine the queue can fill first. Busy that early
    // is waited out (the writer gets to run); past it, Busy is the pipe and queue full.
    let mut early_busy = 0;
    let refused = loop {
        assert!(taken < 5000, "a stalled agent took {taken} turns");
        let t0 = Instant::now();
        let r = agent.turn(text_turn(&format!("t{taken}"), &text(taken)));
        assert!(t0.elapsed() < Duration::from_secs(1), "turn blocked");
        match r {
            Ok(()) => taken += 1,
            Err(_) if taken <= 10 && early_busy < 50 => {
                early_busy += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(refused, agentd::runtime::agent::AgentError::Busy(_)),
        "{refused:?}"
    );
    assert!(taken > 10, "the pipe took lines before the queue: {taken}");
    let last = format!("t{}", taken - 1);
    let replies = until(&rx, "every reply", |e| {
        e.task.as_deref() == Some(last.as_str()) && matches!(e.kind, AgentEventKind::Reply { .. })
    });
    let got: Vec<(String, String)> = replies
        .iter()
        .filter_map(|e| match &e.kind {
            AgentEventKind::Reply { parts } => match &parts[0].content {
                PartContent::Text(t) => Some((e.task.clone().unwrap(), t.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let want: Vec<(String, String)> = (0..taken).map(|i| (format!("t{i}"), text(i))).collect();
    assert!(got == want, "replies out of order or cut");
    for i in 0..3 {
        let task = format!("after{i}");
        agent.turn(text_turn(&task, "again")).unwrap();
        let ev = turn_end(&rx, &task);
        assert!(matches!(
            ev.last().unwrap().kind,
            AgentEventKind::Reply { .. }
        ));
    }
}
