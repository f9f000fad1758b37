//! Agent processes, with real programs: the example echo agent and the misbehaving test
//! agents of `tests/agents/`. Deadlines here are generous bounds, not measurements.
//!
//! Every case runs twice: with stdout read by the supervisor's own thread, and in polled
//! mode, read by an owner loop ([`Owned`]) that waits on the pipe as the runtime does.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use agentd::runtime::agent::{AgentEvent, AgentProcess, AgentSpec, AgentStdout};
use rustix::event::{poll, PollFd, PollFlags, Timespec};

mod threads {
    const POLLED: bool = false;
    include!("agent_process/cases.rs");
}

mod polled {
    const POLLED: bool = true;
    include!("agent_process/cases.rs");
}

/// An agent under test. In polled mode an owner thread claims each process's stdout and
/// reads it when `poll` says so, as the runtime's loop does; dropping this stops the owner
/// (its `AgentStdout` goes back to a reader thread), then the supervisor.
pub struct Owned {
    process: Option<Arc<AgentProcess>>,
    stop: Arc<AtomicBool>,
    owner: Option<JoinHandle<()>>,
}

impl Owned {
    fn new(spec: AgentSpec, events: Sender<AgentEvent>, polled: bool) -> Owned {
        let process = Arc::new(if polled {
            AgentProcess::new_polled(spec, events).expect("a valid spec")
        } else {
            AgentProcess::new(spec, events).expect("a valid spec")
        });
        let stop = Arc::new(AtomicBool::new(false));
        let owner = polled.then(|| {
            let (p, s) = (process.clone(), stop.clone());
            std::thread::spawn(move || read_stdout_as_owner(&p, &s))
        });
        Owned {
            process: Some(process),
            stop,
            owner,
        }
    }
}

fn read_stdout_as_owner(process: &AgentProcess, stop: &AtomicBool) {
    let tick = Timespec::try_from(Duration::from_millis(10)).expect("a short timeout");
    let mut out: Option<AgentStdout> = None;
    while !stop.load(Ordering::SeqCst) {
        if let Some(o) = process.take_stdout() {
            out = Some(o);
        }
        let ready = match out.as_ref().and_then(AgentStdout::fd) {
            Some(fd) => {
                let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
                let _ = poll(&mut fds, Some(&tick));
                !fds[0].revents().is_empty()
            }
            None => {
                out = None;
                std::thread::sleep(Duration::from_millis(10));
                false
            }
        };
        if ready && out.as_mut().is_some_and(|o| !o.read_ready()) {
            out = None;
        }
    }
}

impl Deref for Owned {
    type Target = AgentProcess;
    fn deref(&self) -> &AgentProcess {
        self.process.as_ref().expect("alive until dropped")
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.owner.take() {
            let _ = h.join();
        }
        self.process.take();
    }
}

/// What only polled mode has: handing a stdout back to a reader thread.
mod hand_back {
    use super::*;
    use agentd::runtime::agent::{AgentEventKind, TurnIn};
    use agentd_core::a2a::types::Part;
    use std::sync::mpsc::{channel, Receiver};
    use std::time::Instant;

    fn turn(task: &str) -> TurnIn {
        TurnIn {
            task: task.into(),
            context: "ctx-1".into(),
            principal: "user:alice".into(),
            parts: vec![Part::text("hi")],
            trace: None,
        }
    }

    fn is_reply(ev: &AgentEvent, task: &str) -> bool {
        ev.task.as_deref() == Some(task) && matches!(ev.kind, AgentEventKind::Reply { .. })
    }

    /// The events seen until `done`, failing after 20 s.
    fn wait_for(rx: &Receiver<AgentEvent>, done: impl Fn(&AgentEvent) -> bool) -> Vec<AgentEvent> {
        let end = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let ev = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("not within 20 s; saw {seen:#?}"));
            let stop = done(&ev);
            seen.push(ev);
            if stop {
                return seen;
            }
        }
    }

    /// The echo agent in polled mode, started by a first turn `t1` whose stdout nobody
    /// has claimed yet.
    fn started_echo() -> (AgentProcess, Receiver<AgentEvent>) {
        let echo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents/echo_agent.py");
        let (tx, rx) = channel();
        let agent = AgentProcess::new_polled(
            AgentSpec::new("echo", vec!["python3".into(), echo.into()]),
            tx,
        )
        .unwrap();
        agent.turn(turn("t1")).unwrap();
        wait_for(&rx, |e| matches!(e.kind, AgentEventKind::Started { .. }));
        (agent, rx)
    }

    #[test]
    fn a_dropped_stdout_is_read_by_a_thread_from_then_on() {
        let (agent, rx) = started_echo();
        let mut out = agent.take_stdout().expect("the started process's stdout");
        assert!(agent.take_stdout().is_none(), "claimed once");
        // Nothing reads it but us: the reply comes when we read.
        let tick = Timespec::try_from(Duration::from_millis(50)).unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        let mut replied = false;
        while !replied && Instant::now() < end {
            let mut fds = [PollFd::from_borrowed_fd(
                out.fd().expect("open"),
                PollFlags::IN,
            )];
            let _ = poll(&mut fds, Some(&tick));
            assert!(out.read_ready(), "the agent is still running");
            replied = rx.try_iter().any(|e| is_reply(&e, "t1"));
        }
        assert!(replied, "the owner's reads delivered the reply");
        drop(out);
        agent.turn(turn("t2")).unwrap();
        wait_for(&rx, |e| is_reply(e, "t2"));
    }

    #[test]
    fn shutdown_reads_a_stdout_nobody_claimed() {
        let (agent, rx) = started_echo();
        // The reply sits in the pipe, unread; the shutdown hands the pipe to a thread, so
        // the turn is answered rather than failed at the exit.
        agent.shutdown(Duration::from_secs(10));
        let seen: Vec<AgentEvent> = rx.try_iter().collect();
        assert!(seen.iter().any(|e| is_reply(e, "t1")), "{seen:#?}");
        assert!(
            seen.iter().any(|e| matches!(&e.kind,
                AgentEventKind::Exited { description, .. } if description.contains("exited with status 0"))),
            "it exited on its own: {seen:#?}"
        );
    }
}
