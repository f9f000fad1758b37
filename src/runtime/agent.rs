//! Agent processes: programs agentd supervises that answer conversation turns (the
//! conversation agent, and named subagents), speaking a JSON-lines protocol on their stdin
//! and stdout. The protocol, and what agentd does on each misbehaviour, is
//! `docs/agent-protocol.md`.
//!
//! An [`AgentProcess`] owns one program. It starts it lazily on the first turn, writes turns
//! to it ([`AgentProcess::turn`]), and reports everything that happens as [`AgentEvent`]s on
//! the channel given at construction, in the order the agent said it. A crash, a kill or a
//! missed deadline is always reported: the process's `Exited` event, then a `Fail` for each
//! task whose turn was in flight on it. [`to_completions`] maps events to the core's
//! [`Completion`]s, so the runtime loop is: effect → [`TurnIn::from_effect`] → `turn`;
//! event → `to_completions` → `Instance::handle_completion`.
//!
//! Threads: one monitor per `AgentProcess` (exit detection, turn deadlines, restarts after a
//! backoff), and per running child a stdin writer, a stdout reader and a stderr reader. The
//! caller never blocks on the child: a short line goes straight into the stdin pipe when
//! the pipe has room and nothing waits before it (a non-blocking write), else through a
//! bounded queue to the writer thread.
//!
//! An owner with a loop of its own (the runtime) may read stdout itself instead
//! ([`AgentProcess::new_polled`]): it claims each process's stdout ([`AgentProcess::take_stdout`]),
//! waits for it to be readable beside its other work and calls [`AgentStdout::read_ready`].
//! An answer then reaches the owner with no thread between the pipe and it: each line the
//! agent writes is one wake-up fewer. Dropping the [`AgentStdout`] hands the reading back to
//! a thread, so a stdout is never left unread.
//!
//! The child runs in its own process group, so a kill reaches whatever it started; the
//! group is also killed when the child exits, so nothing it left behind outlives it.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentd_core::a2a::types::{Artifact, Part, TaskState};
use agentd_core::{Completion, Effect};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde::Deserialize;
use serde_json::Value;

/// How one agent program is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSpec {
    /// The agent's name: in events, logs and failure reasons.
    pub name: String,
    /// The program and its arguments. The program is looked up on `PATH`.
    pub command: Vec<String>,
    /// Set on top of agentd's own environment.
    pub env: Vec<(String, String)>,
    /// The working directory; agentd's own without one.
    pub cwd: Option<PathBuf>,
    /// A turn must end (reply, ask or fail) this long after [`AgentProcess::turn`]; else it
    /// fails as timed out and the process, presumed wedged, is killed.
    pub turn_timeout: Duration,
    /// The longest line the agent may write on stdout, newline excluded. A longer line kills
    /// the process: it is not speaking the protocol, and buffering it has no bound.
    pub max_line_bytes: usize,
    /// The process is killed on its Nth stdout line that is not protocol JSON (0: never).
    /// Up to then such lines are logged and ignored, so a stray debug print is survivable.
    pub max_bad_lines: u32,
    /// Lines (turns, cancels) queued for the agent's stdin before `turn` answers
    /// [`AgentError::Busy`].
    pub queue: usize,
}

impl AgentSpec {
    /// A spec with the default limits: 5 minute turns, 1 MiB lines, 10 bad lines, 64 queued.
    pub fn new(name: impl Into<String>, command: Vec<String>) -> Self {
        AgentSpec {
            name: name.into(),
            command,
            env: Vec::new(),
            cwd: None,
            turn_timeout: Duration::from_secs(300),
            max_line_bytes: 1 << 20,
            max_bad_lines: 10,
            queue: 64,
        }
    }
}

/// One conversation turn for an agent.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnIn {
    pub task: String,
    pub context: String,
    /// The id of the principal the task belongs to: `operator`, `user:alice`, ….
    pub principal: String,
    /// The parts of the message that opened or continues the task.
    pub parts: Vec<Part>,
    /// The trace the turn belongs to: the turn line's `traceparent` and `tracestate`.
    pub trace: Option<agentd_core::trace::TraceContext>,
}

impl TurnIn {
    /// The turn an [`Effect::Turn`] asks for; `None` for any other effect.
    pub fn from_effect(effect: &Effect) -> Option<TurnIn> {
        match effect {
            Effect::Turn {
                task_id,
                context_id,
                message,
                owner,
                trace,
                ..
            } => Some(TurnIn {
                task: task_id.clone(),
                context: context_id.clone(),
                principal: owner.id.clone(),
                parts: message.parts.clone(),
                trace: trace.clone(),
            }),
            _ => None,
        }
    }

    /// The `turn` line written to the agent, newline included: serialized straight from
    /// the turn, with no JSON tree copied in between.
    fn line(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            r#type: &'static str,
            task: &'a str,
            context: &'a str,
            principal: &'a str,
            parts: &'a [Part],
            text: String,
            #[serde(skip_serializing_if = "Option::is_none")]
            traceparent: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            tracestate: Option<&'a str>,
        }
        let line = Line {
            r#type: "turn",
            task: &self.task,
            context: &self.context,
            principal: &self.principal,
            parts: &self.parts,
            text: Part::joined_text(&self.parts),
            traceparent: self.trace.as_ref().map(|t| t.traceparent()),
            tracestate: self.trace.as_ref().and_then(|t| t.tracestate()),
        };
        let mut out = serde_json::to_vec(&line).expect("a turn serializes");
        out.push(b'\n');
        out
    }
}

/// Something an agent process did.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentEvent {
    /// The [`AgentSpec::name`] of the agent.
    pub agent: String,
    /// The task it concerns; `None` for the process's own events.
    pub task: Option<String>,
    pub kind: AgentEventKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum AgentEventKind {
    /// A process was started; `restarts` counts the starts before it.
    Started { pid: u32, restarts: u32 },
    /// The process could not be started; each task in `in_flight` gets a `Fail` next.
    StartFailed {
        error: String,
        in_flight: Vec<String>,
    },
    /// The agent is working on the task; an optional progress note.
    Status { text: Option<String> },
    /// (A chunk of) an artifact of the task.
    Artifact {
        id: String,
        name: String,
        parts: Vec<Part>,
        append: bool,
        last: bool,
    },
    /// The final answer: the task completes with this message.
    Reply { parts: Vec<Part> },
    /// The agent needs input: the task waits in input-required; the answer comes back as
    /// another turn of the same task.
    Ask {
        text: String,
        schema: Option<Value>,
        channel: Option<String>,
    },
    /// The task failed, with the reason.
    Fail { error: String },
    /// The process ended: `exited with status 3`, `was killed by signal 11 (SIGSEGV)`,
    /// `killed by operator: <reason>`. Each task in `in_flight` gets a `Fail` next.
    Exited {
        description: String,
        in_flight: Vec<String>,
    },
}

/// Where an agent process is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentState {
    /// No process, and nothing went wrong: not started yet, or it exited cleanly with no
    /// turn in flight. The next turn starts one.
    Idle,
    Running,
    /// It exited unasked, could not start, or was killed by agentd for misbehaving. The next
    /// turn restarts it after a short backoff.
    Crashed,
    /// Killed by [`AgentProcess::kill`]. The next turn starts it again.
    Killed,
    /// Shut down; it takes no more turns.
    Stopped,
}

impl AgentState {
    pub const fn as_str(self) -> &'static str {
        match self {
            AgentState::Idle => "idle",
            AgentState::Running => "running",
            AgentState::Crashed => "crashed",
            AgentState::Killed => "killed",
            AgentState::Stopped => "stopped",
        }
    }
}

/// A snapshot of an agent process, for `status` and `subagent.status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStatus {
    pub name: String,
    pub state: AgentState,
    /// The running process's id.
    pub pid: Option<u32>,
    /// Starts after the first.
    pub restarts: u32,
    /// Why the last process ended or could not start.
    pub last_error: Option<String>,
    /// The last line the agent wrote on stderr (truncated).
    pub last_stderr: Option<String>,
    /// Tasks with a turn in flight, oldest first.
    pub in_flight: Vec<String>,
    /// When the running process started, in epoch milliseconds.
    pub started_ms: Option<u64>,
}

/// Why a turn was not taken. Nothing was written and no event follows: the caller fails
/// the task itself, with this error's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentError {
    /// The spec cannot be run: no name, or no command.
    InvalidSpec(String),
    /// The agent was shut down.
    Stopped(String),
    /// The agent's input queue is full: it is not reading its stdin fast enough.
    Busy(String),
    /// A turn of this task is already in flight on this agent.
    AlreadyInFlight { agent: String, task: String },
    /// agentd could not start a thread it needs.
    Io(String),
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentError::InvalidSpec(why) => write!(f, "invalid agent spec: {why}"),
            AgentError::Stopped(a) => write!(f, "agent {a} is stopped and takes no more turns"),
            AgentError::Busy(a) => write!(
                f,
                "agent {a} is not reading its input: too many turns are queued for it"
            ),
            AgentError::AlreadyInFlight { agent, task } => {
                write!(
                    f,
                    "agent {agent} is already working on a turn of task {task}"
                )
            }
            AgentError::Io(why) => write!(f, "agent supervisor: {why}"),
        }
    }
}

impl std::error::Error for AgentError {}

/// Where an [`AgentProcess`] reports its [`AgentEvent`]s. A channel's `Sender` is one; the
/// runtime's own sink puts them straight on its queue, with no thread in between. `send` is
/// called with the supervisor's lock held (that keeps the events in order), so it must not
/// block: an unbounded channel's send is right. A gone receiver is not an error.
pub trait EventSink: Send + Sync + 'static {
    fn send(&self, event: AgentEvent);
}

impl EventSink for Sender<AgentEvent> {
    fn send(&self, event: AgentEvent) {
        let _ = Sender::send(self, event);
    }
}

/// One supervised agent program. Dropping it kills the program (and its process group).
pub struct AgentProcess {
    shared: Arc<Shared>,
    monitor: Option<JoinHandle<()>>,
}

impl AgentProcess {
    /// Supervises `spec`; nothing runs until the first turn. Events go to `events`.
    pub fn new(spec: AgentSpec, events: impl EventSink) -> Result<Self, AgentError> {
        Self::with_stdout(spec, events, false)
    }

    /// As [`AgentProcess::new`], but each process's stdout is read by the caller: claim it
    /// with [`AgentProcess::take_stdout`] after each `Started` event.
    pub fn new_polled(spec: AgentSpec, events: impl EventSink) -> Result<Self, AgentError> {
        Self::with_stdout(spec, events, true)
    }

    fn with_stdout(
        spec: AgentSpec,
        events: impl EventSink,
        polled: bool,
    ) -> Result<Self, AgentError> {
        if spec.name.is_empty() {
            return Err(AgentError::InvalidSpec("an agent needs a name".into()));
        }
        if spec.command.first().is_none_or(|p| p.is_empty()) {
            return Err(AgentError::InvalidSpec(format!(
                "agent {} has no command",
                spec.name
            )));
        }
        let shared = Arc::new(Shared {
            spec,
            events: Box::new(events),
            polled,
            inner: Mutex::new(Inner {
                state: AgentState::Idle,
                proc: None,
                generation: 0,
                tasks: Vec::new(),
                restart_at: None,
                crashes: 0,
                spawns: 0,
                last_error: None,
                last_stderr: None,
                stopping: false,
                closing: false,
                monitor_until: None,
                unclaimed_stdout: None,
            }),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let monitor = thread::Builder::new()
            .name(format!("agent-{}", shared.spec.name))
            .spawn(move || s.monitor())
            .map_err(|e| AgentError::Io(format!("cannot start the monitor thread: {e}")))?;
        Ok(AgentProcess {
            shared,
            monitor: Some(monitor),
        })
    }

    pub fn name(&self) -> &str {
        &self.shared.spec.name
    }

    pub fn spec(&self) -> &AgentSpec {
        &self.shared.spec
    }

    /// Gives the agent a turn: the opening of a task, or its continuation after an ask.
    /// Starts the process if none runs (after a backoff if the last one crashed). Never
    /// blocks on the process. On `Ok` the turn ends with exactly one `Reply`, `Ask` or `Fail`
    /// event for the task, unless it is canceled.
    pub fn turn(&self, turn: TurnIn) -> Result<(), AgentError> {
        let line = turn.line();
        let sh = &self.shared;
        let mut inner = sh.lock();
        if inner.stopping {
            return Err(AgentError::Stopped(sh.spec.name.clone()));
        }
        if inner.tasks.iter().any(|t| t.task == turn.task) {
            return Err(AgentError::AlreadyInFlight {
                agent: sh.spec.name.clone(),
                task: turn.task,
            });
        }
        let now = Instant::now();
        // A timeout too large for an Instant is as good as none.
        let deadline = now
            .checked_add(sh.spec.turn_timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        let mut line = Some(line);
        let live = inner.proc.as_ref().filter(|p| p.exited.is_none()).map(|p| {
            let sent = p.input.as_ref().zip(line.take()).map(|(i, l)| i.send(l));
            (p.generation, sent)
        });
        match live {
            Some((generation, Some(sent))) => {
                match sent {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        return Err(AgentError::Busy(sh.spec.name.clone()));
                    }
                    // The writer stopped: the agent closed its stdin or is dying. The turn is
                    // lost with it, so it fails at the exit or times out.
                    Err(TrySendError::Disconnected(_)) => {
                        tracing::warn!(agent = %sh.spec.name, task = %turn.task,
                            "the agent's stdin is closed; the turn will fail");
                    }
                }
                inner.tasks.push(InFlight {
                    task: turn.task,
                    deadline,
                    sent_to: Some(generation),
                    line: None,
                });
                // The monitor need not hear of a turn to a live process unless its deadline
                // comes before the monitor's next look: a wake-up per turn is a thread hop
                // (and a waitid) for nothing.
                if inner.monitor_until.is_some_and(|at| at <= deadline) {
                    return Ok(());
                }
            }
            // A process that is stopping takes no turn; `stopping` refused it above.
            Some((_, None)) => return Err(AgentError::Stopped(sh.spec.name.clone())),
            None => {
                let waiting = inner.tasks.iter().filter(|t| t.sent_to.is_none()).count();
                if waiting >= sh.spec.queue.max(1) {
                    return Err(AgentError::Busy(sh.spec.name.clone()));
                }
                inner.tasks.push(InFlight {
                    task: turn.task,
                    deadline,
                    sent_to: None,
                    line,
                });
                // The monitor thread starts the process (woken below): a child dies with
                // the thread that forked it, and the monitor is the one that outlives it.
            }
        }
        sh.wake.notify_all();
        Ok(())
    }

    /// The task was canceled: forgets its turn and tells the agent (`cancel`), best effort.
    /// No event follows for the task; whatever the agent still says about it is ignored.
    pub fn cancel(&self, task: &str) {
        let sh = &self.shared;
        let mut inner = sh.lock();
        let Some(i) = inner.tasks.iter().position(|t| t.task == task) else {
            return;
        };
        let t = inner.tasks.remove(i);
        if let (Some(generation), Some(p)) = (t.sent_to, inner.proc.as_ref()) {
            if p.generation == generation {
                if let Some(input) = &p.input {
                    let line = line_of(&serde_json::json!({"type": "cancel", "task": task}));
                    if input.send(line).is_err() {
                        tracing::warn!(agent = %sh.spec.name, task,
                            "could not tell the agent of a cancel: its input is full or closed");
                    }
                }
            }
        }
        sh.wake.notify_all();
    }

    /// Kills the running process and its process group: `Exited` with
    /// `killed by <by>: <reason>`, then a `Fail` for each in-flight task saying so. Returns
    /// whether a process was running. The next turn starts a new one.
    pub fn kill(&self, by: &str, reason: &str) -> bool {
        let sh = &self.shared;
        let mut inner = sh.lock();
        if inner.proc.is_none() {
            return false;
        }
        sh.kill_current(
            &mut inner,
            format!("killed by {by}: {reason}"),
            AgentState::Killed,
            false,
        );
        true
    }

    /// In polled mode, the stdout of a process started since the last call, for the caller
    /// to read ([`AgentStdout::read_ready`] when its descriptor is readable). `None` in
    /// thread mode, or when nothing new started.
    pub fn take_stdout(&self) -> Option<AgentStdout> {
        let (generation, pipe) = self.shared.lock().unclaimed_stdout.take()?;
        Some(AgentStdout {
            shared: self.shared.clone(),
            generation,
            pipe: Some(pipe),
            line: Vec::new(),
        })
    }

    /// Its process's state alone (cheaper than [`AgentProcess::status`]).
    pub fn state(&self) -> AgentState {
        self.shared.lock().state
    }

    pub fn status(&self) -> AgentStatus {
        let sh = &self.shared;
        let inner = sh.lock();
        AgentStatus {
            name: sh.spec.name.clone(),
            state: inner.state,
            pid: inner.proc.as_ref().map(|p| p.pid),
            restarts: inner.spawns.saturating_sub(1),
            last_error: inner.last_error.clone(),
            last_stderr: inner.last_stderr.clone(),
            in_flight: inner.tasks.iter().map(|t| t.task.clone()).collect(),
            started_ms: inner.proc.as_ref().map(|p| p.started_ms),
        }
    }

    /// Stops the agent for good: writes `shutdown`, closes its stdin and waits up to `grace`
    /// for it to exit (turns in flight may still be answered meanwhile), then kills it. Turns
    /// still in flight at the exit fail; later turns are refused with
    /// [`AgentError::Stopped`]. In polled mode, drop the [`AgentStdout`] first: its stdout
    /// is read by a thread while this waits.
    pub fn shutdown(&self, grace: Duration) {
        shutdown_together([self], grace);
    }
}

/// [`AgentProcess::shutdown`] of every one of `procs` at once, all within the same `grace`:
/// each gets its shutdown line before any is waited for, so agents that ignore it cost one
/// grace in all, not one each.
pub fn shutdown_together<'a>(procs: impl IntoIterator<Item = &'a AgentProcess>, grace: Duration) {
    let procs: Vec<&AgentProcess> = procs.into_iter().collect();
    let deadline = Instant::now() + grace;
    for p in &procs {
        p.shared.begin_shutdown();
    }
    for p in &procs {
        p.shared.finish_shutdown(deadline, grace);
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        {
            let sh = &self.shared;
            let mut inner = sh.lock();
            inner.closing = true;
            inner.stopping = true;
            sh.fail_waiting(&mut inner, "agentd stopped supervising it");
            if inner.proc.is_some() {
                sh.kill_current(
                    &mut inner,
                    "killed by agentd: its supervisor was dropped".into(),
                    AgentState::Stopped,
                    false,
                );
            }
            inner.state = AgentState::Stopped;
            sh.wake.notify_all();
        }
        if let Some(m) = self.monitor.take() {
            let _ = m.join();
        }
    }
}

/// Reaps a killed child on the reaper thread, one for the whole daemon, started by the
/// first kill. A process with much memory takes a while to die, and a kill may come from
/// an executor thread (a `kill` command, a bad line read there, a dropped subagent), which
/// must not wait for that. Without the thread (it could not start), the child is waited for
/// here, as before it.
fn reap_later(child: Child) {
    static REAPER: OnceLock<Option<Sender<Child>>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Child>();
        match thread::Builder::new()
            .name("agent-reaper".into())
            .spawn(move || reap_until_closed(&rx))
        {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the agent reaper thread; killed agents are reaped in place");
                None
            }
        }
    });
    let unsent = match reaper {
        Some(tx) => tx.send(child).err().map(|e| e.0),
        None => Some(child),
    };
    if let Some(mut child) = unsent {
        let _ = child.wait();
    }
}

/// The reaper thread: waits for a child, then looks every [`EXIT_POLL`] until each it holds
/// has died. SIGKILLed, each does.
fn reap_until_closed(rx: &Receiver<Child>) {
    let mut dying: Vec<Child> = Vec::new();
    loop {
        if dying.is_empty() {
            match rx.recv() {
                Ok(child) => dying.push(child),
                Err(_) => return,
            }
        }
        dying.extend(rx.try_iter());
        dying.retain_mut(|child| match child.try_wait() {
            Ok(None) => true,
            // Reaped, or not ours to wait for (an error says so): forgotten either way.
            Ok(Some(_)) | Err(_) => false,
        });
        if !dying.is_empty() {
            thread::sleep(EXIT_POLL);
        }
    }
}

/// Named agents (the conversation agent, subagents) sharing one event channel.
pub struct Agents {
    procs: BTreeMap<String, AgentProcess>,
}

impl Agents {
    /// Supervises every spec; two with the same name are refused.
    pub fn new(
        specs: impl IntoIterator<Item = AgentSpec>,
        events: Sender<AgentEvent>,
    ) -> Result<Self, AgentError> {
        let mut procs = BTreeMap::new();
        for spec in specs {
            if procs.contains_key(&spec.name) {
                return Err(AgentError::InvalidSpec(format!(
                    "two agents are named {}",
                    spec.name
                )));
            }
            let name = spec.name.clone();
            procs.insert(name, AgentProcess::new(spec, events.clone())?);
        }
        Ok(Agents { procs })
    }

    pub fn get(&self, name: &str) -> Option<&AgentProcess> {
        self.procs.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.procs.keys().map(String::as_str)
    }

    pub fn statuses(&self) -> Vec<AgentStatus> {
        self.procs.values().map(AgentProcess::status).collect()
    }

    /// Shuts every agent down at once, all within the same `grace`.
    pub fn shutdown(&self, grace: Duration) {
        shutdown_together(self.procs.values(), grace);
    }
}

/// A process's stdout read by the owner's loop (polled mode, [`AgentProcess::take_stdout`]):
/// wait until its descriptor ([`AgentStdout::fd`]) is readable or hung up, then call
/// [`AgentStdout::read_ready`]. Lines are handled as the reader thread would: events in
/// order, bad lines counted, a line past `max_line_bytes` kills the process.
pub struct AgentStdout {
    shared: Arc<Shared>,
    generation: u64,
    /// Non-blocking. `None` once it is finished (end of file, error or a killed process).
    pipe: Option<ChildStdout>,
    /// The line begun so far (never more than `max_line_bytes`).
    line: Vec<u8>,
}

/// Bytes one [`AgentStdout::read_ready`] reads at most, so a chatty agent cannot keep its
/// owner from the rest of its work; what is left is still readable on the next wait.
const READ_READY_BUDGET: usize = 64 * 1024;

impl AgentStdout {
    /// Reads what the pipe holds (up to a budget) and handles every whole line in it.
    /// Returns whether to keep waiting on it: `false` once it is finished, when it may be
    /// dropped. Never blocks.
    pub fn read_ready(&mut self) -> bool {
        let mut buf = [0u8; 8192];
        let mut read = 0;
        while read < READ_READY_BUDGET {
            let Some(pipe) = self.pipe.as_mut() else {
                return false;
            };
            match pipe.read(&mut buf) {
                Ok(0) => {
                    // A last line without a newline counts, as on the reader thread.
                    if !self.line.is_empty() {
                        let line = std::mem::take(&mut self.line);
                        self.shared.on_line(self.generation, &line);
                    }
                    self.finish();
                    return false;
                }
                Ok(n) => {
                    read += n;
                    if !self.take(&buf[..n]) {
                        self.finish();
                        return false;
                    }
                    if n < buf.len() {
                        // A pipe's read takes all it holds: it is empty now, and a read to
                        // hear so would be a system call per wake-up for nothing. What
                        // comes next shows on the next wait (the poll, or the reactor's
                        // re-armed watch, sees data already there).
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(agent = %self.shared.spec.name, error = %e, "cannot read the agent's stdout");
                    self.finish();
                    return false;
                }
            }
        }
        true
    }

    /// The descriptor to wait on (readable or hung up); `None` once it is finished.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.pipe.as_ref().map(AsFd::as_fd)
    }

    /// Splits `bytes` into lines and handles each whole one; `false` on a line too long.
    fn take(&mut self, mut bytes: &[u8]) -> bool {
        let max = self.shared.spec.max_line_bytes;
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let take = newline.unwrap_or(bytes.len());
            if self.line.len() + take > max {
                self.shared.line_too_long(self.generation);
                return false;
            }
            self.line.extend_from_slice(&bytes[..take]);
            let Some(at) = newline else {
                break;
            };
            bytes = &bytes[at + 1..];
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            self.shared.on_line(self.generation, &self.line);
            self.line.clear();
        }
        true
    }

    fn finish(&mut self) {
        self.pipe = None;
        self.line = Vec::new();
        self.shared.stdout_closed(self.generation);
    }
}

impl Drop for AgentStdout {
    /// An unfinished stdout goes back to a reader thread: the process is never left
    /// writing into a pipe nobody reads.
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            let begun = std::mem::take(&mut self.line);
            self.shared
                .hand_stdout_to_thread(self.generation, pipe, begun);
        }
    }
}

/// The core's completions for an event: what the runtime hands to
/// `Instance::handle_completion`, in order. Process events (`Started`, `Exited`,
/// `StartFailed`) map to none: their tasks get their own `Fail` events.
pub fn to_completions(event: &AgentEvent) -> Vec<Completion> {
    into_completions(event.clone())
}

/// [`to_completions`] of an event the caller is done with: its parts move into the
/// completions instead of being copied.
pub fn into_completions(event: AgentEvent) -> Vec<Completion> {
    let Some(task_id) = event.task else {
        return Vec::new();
    };
    let status = |task_id, state, message| Completion::Status {
        task_id,
        state,
        message,
    };
    match event.kind {
        AgentEventKind::Status { text } => vec![status(
            task_id,
            TaskState::Working,
            text.map(|t| vec![Part::text(t)]),
        )],
        AgentEventKind::Artifact {
            id,
            name,
            parts,
            append,
            last,
        } => vec![Completion::Artifact {
            task_id,
            artifact: Artifact {
                artifact_id: id,
                description: String::new(),
                extensions: Vec::new(),
                metadata: None,
                name,
                parts,
            },
            append,
            last_chunk: last,
        }],
        AgentEventKind::Reply { parts } => {
            vec![status(task_id, TaskState::Completed, Some(parts))]
        }
        AgentEventKind::Ask {
            text,
            schema,
            channel,
        } => vec![
            // The gate's facts first, so the input-required status carries them.
            Completion::Ask {
                task_id: task_id.clone(),
                schema,
                channel,
                // The agent asks the task's owner.
                operator_only: false,
            },
            status(
                task_id,
                TaskState::InputRequired,
                Some(vec![Part::text(text)]),
            ),
        ],
        AgentEventKind::Fail { error } => vec![status(
            task_id,
            TaskState::Failed,
            Some(vec![Part::text(error)]),
        )],
        AgentEventKind::Started { .. }
        | AgentEventKind::StartFailed { .. }
        | AgentEventKind::Exited { .. } => Vec::new(),
    }
}

// ---- the supervisor ----

/// How long after a child's exit its stdout and stderr may still be drained before the exit
/// is settled: lines it wrote before dying are delivered first. (A pipe held open by
/// something that escaped its process group would otherwise delay the exit forever.)
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Exit polling while a child's stdout is closed (it is probably exiting).
const EXIT_POLL: Duration = Duration::from_millis(20);
/// The monitor's slowest tick: a safety net for exits that close no pipe.
const IDLE_TICK: Duration = Duration::from_millis(500);
/// A stderr line is cut here.
const STDERR_LINE_MAX: usize = 4096;
/// Stderr lines logged per second per process; the rest are counted, then summarized.
const STDERR_LINES_PER_SEC: u32 = 50;

struct Shared {
    spec: AgentSpec,
    events: Box<dyn EventSink>,
    /// Stdout is read by the owner ([`AgentStdout`]), not by a thread of its own.
    polled: bool,
    inner: Mutex<Inner>,
    /// Wakes the monitor (a new turn, a closed stdout, an exit) and shutdown waiters.
    wake: Condvar,
}

struct Inner {
    state: AgentState,
    proc: Option<Proc>,
    /// Bumped per spawn: threads of an old process recognize themselves as stale.
    generation: u64,
    /// Turns in flight, oldest first.
    tasks: Vec<InFlight>,
    /// No restart before this (the crash backoff).
    restart_at: Option<Instant>,
    /// Crashes since a process last ended a turn: drives the backoff.
    crashes: u32,
    spawns: u32,
    last_error: Option<String>,
    last_stderr: Option<String>,
    /// Shut down (or dropped): no more turns.
    stopping: bool,
    /// Dropped: the monitor ends.
    closing: bool,
    /// When the waiting monitor looks again at the latest (deadlines, exits), set under the
    /// lock as it starts waiting: a turn whose deadline is later need not wake it.
    monitor_until: Option<Instant>,
    /// Polled mode: the newest process's stdout (with its generation) until the owner
    /// claims it.
    unclaimed_stdout: Option<(u64, ChildStdout)>,
}

struct InFlight {
    task: String,
    deadline: Instant,
    /// The generation of the process it was written to; `None` while it waits for one.
    sent_to: Option<u64>,
    /// Its `turn` line, while it waits for a process.
    line: Option<Vec<u8>>,
}

struct Proc {
    child: Child,
    pid: u32,
    generation: u64,
    /// The way to its stdin; `None` once stdin is being closed for a shutdown.
    input: Option<Input>,
    started_ms: u64,
    stdout_done: bool,
    stderr_done: bool,
    /// How it exited and when that was seen, while its stdout drains.
    exited: Option<(ExitStatus, Instant)>,
    /// A shutdown asked it to exit.
    stop_requested: bool,
    bad_lines: u32,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sent under the lock, so events from the reader and the monitor keep their order. A
    /// gone receiver is not an error: the runtime stopped listening.
    fn emit(&self, task: Option<String>, kind: AgentEventKind) {
        self.events.send(AgentEvent {
            agent: self.spec.name.clone(),
            task,
            kind,
        });
    }

    fn monitor(self: Arc<Self>) {
        let mut inner = self.lock();
        loop {
            if inner.closing {
                return;
            }
            self.poll_exit(&mut inner);
            self.check_deadlines(&mut inner);
            self.ensure_started(&mut inner);

            let now = Instant::now();
            let mut wait = IDLE_TICK;
            if let Some(p) = &inner.proc {
                if p.stdout_done || p.exited.is_some() {
                    wait = wait.min(EXIT_POLL);
                }
            }
            if let Some(d) = inner.tasks.iter().map(|t| t.deadline).min() {
                wait = wait.min(d.saturating_duration_since(now));
            }
            if let Some(at) = inner.restart_at {
                if inner.tasks.iter().any(|t| t.sent_to.is_none()) {
                    wait = wait.min(at.saturating_duration_since(now));
                }
            }
            let wait = wait.max(Duration::from_millis(1));
            inner.monitor_until = Some(now + wait);
            inner = self
                .wake
                .wait_timeout(inner, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Starts a process for the turns waiting for one, unless the backoff says not yet.
    fn ensure_started(self: &Arc<Self>, inner: &mut Inner) {
        if inner.proc.is_some() || inner.stopping {
            return;
        }
        if !inner.tasks.iter().any(|t| t.sent_to.is_none()) {
            return;
        }
        if inner.restart_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        inner.restart_at = None;
        match self.spawn(inner) {
            Ok(proc) => {
                let restarts = inner.spawns;
                inner.spawns += 1;
                inner.state = AgentState::Running;
                if restarts > 0 {
                    tracing::info!(agent = %self.spec.name, pid = proc.pid, restarts, "agent restarted");
                } else {
                    tracing::info!(agent = %self.spec.name, pid = proc.pid, "agent started");
                }
                self.emit(
                    None,
                    AgentEventKind::Started {
                        pid: proc.pid,
                        restarts,
                    },
                );
                for t in inner.tasks.iter_mut().filter(|t| t.sent_to.is_none()) {
                    t.sent_to = Some(proc.generation);
                    if let (Some(line), Some(input)) = (t.line.take(), &proc.input) {
                        // Cannot be full: the waiting turns are bounded by the queue size.
                        let _ = input.send(line);
                    }
                }
                inner.proc = Some(proc);
            }
            Err(e) => {
                let error = format!("agent process {} could not start: {e}", self.spec.name);
                tracing::warn!(agent = %self.spec.name, "{error}");
                let mut failed = Vec::new();
                inner.tasks.retain(|t| {
                    let waiting = t.sent_to.is_none();
                    if waiting {
                        failed.push(t.task.clone());
                    }
                    !waiting
                });
                inner.state = AgentState::Crashed;
                inner.last_error = Some(error.clone());
                inner.crashes += 1;
                inner.restart_at = Some(Instant::now() + backoff(inner.crashes));
                self.emit(
                    None,
                    AgentEventKind::StartFailed {
                        error: error.clone(),
                        in_flight: failed.clone(),
                    },
                );
                for task in failed {
                    self.emit(
                        Some(task),
                        AgentEventKind::Fail {
                            error: error.clone(),
                        },
                    );
                }
            }
        }
    }

    fn spawn(self: &Arc<Self>, inner: &mut Inner) -> io::Result<Proc> {
        let (program, args) = self
            .spec
            .command
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
        let path_env = self
            .spec
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str());
        // Spawned only from the monitor thread, which outlives the process (see `child`).
        let mut cmd = super::child::command(program, args, path_env, self.spec.cwd.as_deref())?;
        cmd.envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let (stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => unreachable!("all three pipes were asked for"),
            };
        inner.generation += 1;
        let generation = inner.generation;
        let (tx, rx) = mpsc::sync_channel(self.spec.queue.max(1));
        // A second, non-blocking description of the same pipe: a line the pipe has room
        // for is written at once, without waking the writer thread.
        let direct = nonblocking_twin(&stdin)
            .map_err(|e| tracing::debug!(agent = %self.spec.name, error = %e, "stdin is written by its thread alone"))
            .ok();
        let queued = Arc::new(AtomicUsize::new(0));
        let input = Input {
            queue: tx,
            direct,
            queued: queued.clone(),
        };
        let name = &self.spec.name;
        let threads = (|| {
            thread::Builder::new()
                .name(format!("agent-{name}-in"))
                .spawn(move || write_lines(stdin, rx, &queued))?;
            if self.polled {
                rustix::io::ioctl_fionbio(&stdout, true)?;
                // An earlier process's stdout nobody claimed (it was killed and this one
                // started before the owner looked): read to its end, as a thread would
                // have. Its process is settled, so a failure here needs no `stdout_closed`.
                if let Some((old, pipe)) = inner.unclaimed_stdout.replace((generation, stdout)) {
                    if let Err(e) = self.try_hand_stdout_to_thread(old, pipe, Vec::new()) {
                        tracing::warn!(agent = %self.spec.name, error = %e, "cannot read the agent's stdout");
                    }
                }
            } else {
                self.read_stdout_on_thread(generation, stdout)?;
            }
            let sh = self.clone();
            thread::Builder::new()
                .name(format!("agent-{name}-err"))
                .spawn(move || sh.read_stderr(generation, pid, stderr))?;
            io::Result::Ok(())
        })();
        if let Err(e) = threads {
            kill_group(pid);
            let _ = child.wait();
            return Err(e);
        }
        Ok(Proc {
            child,
            pid,
            generation,
            input: Some(input),
            started_ms: epoch_ms(),
            stdout_done: false,
            stderr_done: false,
            exited: None,
            stop_requested: false,
            bad_lines: 0,
        })
    }

    /// Notices a child that exited on its own. Its process group is killed before it is
    /// reaped (its pid, hence the group id, cannot be reused until then), then the exit is
    /// settled once its stdout and stderr are drained: what it said before dying comes
    /// first, and `last_stderr` holds its last words.
    fn poll_exit(&self, inner: &mut Inner) {
        let Some(p) = inner.proc.as_mut() else {
            return;
        };
        if p.exited.is_none() {
            let pid = Pid::from_raw(p.pid as i32).expect("a child's pid is positive");
            let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
            match rustix::process::waitid(WaitId::Pid(pid), opts) {
                Ok(None) => return,
                Ok(Some(_)) => kill_group(p.pid),
                // Unexpected; std's own wait below decides.
                Err(e) => tracing::debug!(agent = %self.spec.name, error = %e, "waitid"),
            }
            match p.child.try_wait() {
                Ok(Some(status)) => p.exited = Some((status, Instant::now())),
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(agent = %self.spec.name, error = %e, "cannot wait for the agent");
                    return;
                }
            }
        }
        let Some((status, at)) = p.exited else {
            return;
        };
        if !(p.stdout_done && p.stderr_done) && at.elapsed() < DRAIN_GRACE {
            return;
        }
        let description = describe(status);
        let generation = p.generation;
        if p.stop_requested {
            let reason = format!(
                "agent process {} stopped for shutdown while working on this task",
                self.spec.name
            );
            self.finish_exit(inner, description, reason, AgentState::Stopped, false);
            return;
        }
        let busy = inner.tasks.iter().any(|t| t.sent_to == Some(generation));
        let crash = busy || !status.success();
        let reason = format!(
            "agent process {} {description} while working on this task",
            self.spec.name
        );
        let state = if crash {
            AgentState::Crashed
        } else {
            AgentState::Idle
        };
        self.finish_exit(inner, description, reason, state, crash);
    }

    /// Kills the current process group and settles its exit now; the reaper thread reaps
    /// the child ([`reap_later`]). `reason` reads `killed by <who>: <why>`; whatever the
    /// process still wrote is ignored.
    fn kill_current(&self, inner: &mut Inner, reason: String, state: AgentState, crash: bool) {
        let Some(p) = inner.proc.as_mut() else {
            return;
        };
        // Once reaped (`exited`), its pid may belong to someone else: no signal then. Until
        // then it cannot, so the group id is still this process's.
        if p.exited.is_none() {
            kill_group(p.pid);
        }
        let task_reason = format!("agent process {} was {reason}", self.spec.name);
        self.finish_exit(inner, reason, task_reason, state, crash);
    }

    /// Forgets the process: `Exited`, then a `Fail` for each of its in-flight tasks.
    fn finish_exit(
        &self,
        inner: &mut Inner,
        description: String,
        task_reason: String,
        state: AgentState,
        crash: bool,
    ) {
        let Some(p) = inner.proc.take() else {
            return;
        };
        if p.exited.is_none() {
            // Killed, not reaped yet.
            reap_later(p.child);
        }
        let mut failed = Vec::new();
        inner.tasks.retain(|t| {
            let lost = t.sent_to == Some(p.generation);
            if lost {
                failed.push(t.task.clone());
            }
            !lost
        });
        if crash || state == AgentState::Killed {
            tracing::warn!(agent = %self.spec.name, pid = p.pid, in_flight = failed.len(), "agent process {description}");
        } else {
            tracing::info!(agent = %self.spec.name, pid = p.pid, "agent process {description}");
        }
        inner.state = if inner.stopping {
            AgentState::Stopped
        } else {
            state
        };
        if crash || state == AgentState::Killed {
            inner.last_error = Some(description.clone());
        }
        if crash {
            inner.crashes += 1;
            inner.restart_at = Some(Instant::now() + backoff(inner.crashes));
        } else {
            inner.restart_at = None;
        }
        self.emit(
            None,
            AgentEventKind::Exited {
                description,
                in_flight: failed.clone(),
            },
        );
        for task in failed {
            self.emit(
                Some(task),
                AgentEventKind::Fail {
                    error: task_reason.clone(),
                },
            );
        }
        self.wake.notify_all();
    }

    /// Fails the turns past their deadline; a process that missed one is killed.
    fn check_deadlines(&self, inner: &mut Inner) {
        let now = Instant::now();
        while let Some(i) = inner.tasks.iter().position(|t| t.deadline <= now) {
            let t = inner.tasks.remove(i);
            let after = fmt_duration(self.spec.turn_timeout);
            tracing::warn!(agent = %self.spec.name, task = %t.task, "turn timed out after {after}");
            self.emit(
                Some(t.task.clone()),
                AgentEventKind::Fail {
                    error: format!(
                        "timed out after {after} waiting for agent process {} to answer this turn",
                        self.spec.name
                    ),
                },
            );
            let current = inner.proc.as_ref().map(|p| p.generation);
            if t.sent_to.is_some() && t.sent_to == current {
                self.kill_current(
                    inner,
                    format!(
                        "killed by agentd: the turn of task {} timed out after {after}",
                        t.task
                    ),
                    AgentState::Crashed,
                    true,
                );
            }
        }
    }

    fn fail_waiting(&self, inner: &mut Inner, why: &str) {
        let mut failed = Vec::new();
        inner.tasks.retain(|t| {
            let waiting = t.sent_to.is_none();
            if waiting {
                failed.push(t.task.clone());
            }
            !waiting
        });
        for task in failed {
            self.emit(
                Some(task),
                AgentEventKind::Fail {
                    error: format!(
                        "agent process {} did not take this turn: {why}",
                        self.spec.name
                    ),
                },
            );
        }
    }

    fn begin_shutdown(self: &Arc<Self>) {
        let mut inner = self.lock();
        inner.stopping = true;
        // Nobody claims it from now on: a thread reads it while the process winds down
        // (handed over below, out of the lock, which a failure to hand it over takes).
        let unclaimed = inner.unclaimed_stdout.take();
        self.fail_waiting(&mut inner, "agentd is shutting it down");
        match inner.proc.as_mut() {
            Some(p) => {
                p.stop_requested = true;
                if let Some(input) = p.input.take() {
                    let _ = input.send(line_of(&serde_json::json!({"type": "shutdown"})));
                    // Dropping the queue's sender ends the writer once it has written
                    // everything queued, which closes the agent's stdin.
                }
            }
            None => inner.state = AgentState::Stopped,
        }
        self.wake.notify_all();
        drop(inner);
        if let Some((generation, pipe)) = unclaimed {
            self.hand_stdout_to_thread(generation, pipe, Vec::new());
        }
    }

    fn finish_shutdown(&self, deadline: Instant, grace: Duration) {
        let mut inner = self.lock();
        while inner.proc.is_some() {
            let now = Instant::now();
            if now >= deadline {
                self.kill_current(
                    &mut inner,
                    format!(
                        "killed by agentd: it did not stop within {} of the shutdown request",
                        fmt_duration(grace)
                    ),
                    AgentState::Stopped,
                    false,
                );
                break;
            }
            inner = self
                .wake
                .wait_timeout(inner, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        inner.state = AgentState::Stopped;
    }

    fn read_stdout_on_thread(
        self: &Arc<Self>,
        generation: u64,
        out: impl Read + Send + 'static,
    ) -> io::Result<()> {
        let sh = self.clone();
        thread::Builder::new()
            .name(format!("agent-{}-out", self.spec.name))
            .spawn(move || sh.read_stdout(generation, out))
            .map(drop)
    }

    /// An owner's stdout (polled mode) read by a thread from here on: blocking again, with
    /// the line it had begun first. Failing that, the pipe is closed (the agent then sees
    /// EPIPE) and stdout counts as done, so the exit still settles. Takes the lock on
    /// failure: never call it with the lock held.
    fn hand_stdout_to_thread(self: &Arc<Self>, generation: u64, pipe: ChildStdout, begun: Vec<u8>) {
        if let Err(e) = self.try_hand_stdout_to_thread(generation, pipe, begun) {
            tracing::warn!(agent = %self.spec.name, error = %e, "cannot read the agent's stdout");
            self.stdout_closed(generation);
        }
    }

    fn try_hand_stdout_to_thread(
        self: &Arc<Self>,
        generation: u64,
        pipe: ChildStdout,
        begun: Vec<u8>,
    ) -> io::Result<()> {
        rustix::io::ioctl_fionbio(&pipe, false)?;
        self.read_stdout_on_thread(generation, io::Cursor::new(begun).chain(pipe))
    }

    /// The process of `generation` will say nothing more: its exit may settle.
    fn stdout_closed(&self, generation: u64) {
        let mut inner = self.lock();
        if let Some(p) = inner.proc.as_mut().filter(|p| p.generation == generation) {
            p.stdout_done = true;
            self.wake.notify_all();
        }
    }

    /// Kills the process of `generation` (if still current) for a stdout line past the bound.
    fn line_too_long(&self, generation: u64) {
        let max = self.spec.max_line_bytes;
        let mut inner = self.lock();
        if inner
            .proc
            .as_ref()
            .is_some_and(|p| p.generation == generation)
        {
            self.kill_current(
                &mut inner,
                format!("killed by agentd: it wrote a line longer than {max} bytes on stdout"),
                AgentState::Crashed,
                true,
            );
        }
    }

    fn read_stdout(self: Arc<Self>, generation: u64, out: impl Read) {
        let max = self.spec.max_line_bytes;
        let mut r = BufReader::new(out);
        let mut line = Vec::new();
        loop {
            match read_line(&mut r, &mut line, max) {
                Ok(Line::Eof) => break,
                Ok(Line::Full) => self.on_line(generation, &line),
                Ok(Line::TooLong) => {
                    self.line_too_long(generation);
                    break;
                }
                Err(e) => {
                    tracing::warn!(agent = %self.spec.name, error = %e, "cannot read the agent's stdout");
                    break;
                }
            }
        }
        self.stdout_closed(generation);
    }

    fn on_line(&self, generation: u64, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match parse_line(line) {
            Ok(Said::Log { level, message }) => self.log(&level, &message),
            Ok(Said::Task {
                task,
                kind,
                ends_turn,
            }) => {
                let mut inner = self.lock();
                if inner
                    .proc
                    .as_ref()
                    .is_none_or(|p| p.generation != generation)
                {
                    // A process already settled (killed): its tasks were failed then.
                    return;
                }
                let given = inner
                    .tasks
                    .iter()
                    .position(|t| t.task == task && t.sent_to == Some(generation));
                let Some(i) = given else {
                    tracing::warn!(agent = %self.spec.name, task = %task,
                        "ignored a line about a task with no turn in flight on this agent");
                    return;
                };
                if ends_turn {
                    inner.tasks.remove(i);
                    // It answered: whatever crashed before is behind it.
                    inner.crashes = 0;
                }
                self.emit(Some(task), kind);
            }
            Err(why) => {
                let mut inner = self.lock();
                let Some(p) = inner.proc.as_mut().filter(|p| p.generation == generation) else {
                    return;
                };
                p.bad_lines += 1;
                let n = p.bad_lines;
                tracing::warn!(agent = %self.spec.name, line = %excerpt(line), "ignored a stdout line that is not agent protocol: {why}");
                if self.spec.max_bad_lines > 0 && n >= self.spec.max_bad_lines {
                    self.kill_current(
                        &mut inner,
                        format!("killed by agentd: it wrote {n} lines on stdout that are not agent protocol (the last: {why})"),
                        AgentState::Crashed,
                        true,
                    );
                }
            }
        }
    }

    fn log(&self, level: &str, message: &str) {
        let agent = &self.spec.name;
        match level {
            "error" => tracing::error!(agent = %agent, "{message}"),
            "warn" | "warning" => tracing::warn!(agent = %agent, "{message}"),
            "debug" => tracing::debug!(agent = %agent, "{message}"),
            "trace" => tracing::trace!(agent = %agent, "{message}"),
            _ => tracing::info!(agent = %agent, "{message}"),
        }
    }

    /// Logs stderr line by line, each cut at [`STDERR_LINE_MAX`], at most
    /// [`STDERR_LINES_PER_SEC`] a second; it is always drained, so the agent never blocks
    /// on it.
    fn read_stderr(self: Arc<Self>, generation: u64, pid: u32, err: impl Read) {
        let agent = &self.spec.name;
        let mut r = BufReader::new(err);
        let mut line = Vec::new();
        let mut window = Instant::now();
        let (mut logged, mut dropped) = (0u32, 0u64);
        loop {
            let cut = match read_line(&mut r, &mut line, STDERR_LINE_MAX) {
                Ok(Line::Eof) | Err(_) => break,
                Ok(Line::Full) => false,
                Ok(Line::TooLong) => {
                    if skip_line(&mut r).is_err() {
                        break;
                    }
                    true
                }
            };
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            {
                let mut inner = self.lock();
                if inner.generation == generation {
                    inner.last_stderr = Some(excerpt(text.as_bytes()));
                }
            }
            if window.elapsed() >= Duration::from_secs(1) {
                if dropped > 0 {
                    tracing::warn!(agent = %agent, pid, "{dropped} stderr lines not logged (too many)");
                }
                (window, logged, dropped) = (Instant::now(), 0, 0);
            }
            if logged < STDERR_LINES_PER_SEC {
                logged += 1;
                let cut = if cut { " [cut]" } else { "" };
                tracing::info!(agent = %agent, pid, "stderr: {text}{cut}");
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            tracing::warn!(agent = %agent, pid, "{dropped} stderr lines not logged (too many)");
        }
        let mut inner = self.lock();
        if let Some(p) = inner.proc.as_mut().filter(|p| p.generation == generation) {
            p.stderr_done = true;
            self.wake.notify_all();
        }
    }
}

/// What one stdout line said.
enum Said {
    Log {
        level: String,
        message: String,
    },
    Task {
        task: String,
        kind: AgentEventKind,
        /// A reply, ask or fail: the turn is over.
        ends_turn: bool,
    },
}

/// The lines an agent writes, as JSON.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Wire {
    Status {
        task: String,
        #[serde(default)]
        text: Option<String>,
    },
    Artifact {
        task: String,
        name: String,
        #[serde(default)]
        id: Option<String>,
        #[serde(flatten)]
        content: Content,
        #[serde(default)]
        append: bool,
        #[serde(default)]
        last: bool,
    },
    Reply {
        task: String,
        #[serde(flatten)]
        content: Content,
    },
    Ask {
        task: String,
        text: String,
        #[serde(default)]
        schema: Option<Value>,
        #[serde(default)]
        channel: Option<String>,
    },
    Fail {
        task: String,
        error: String,
    },
    Log {
        #[serde(default)]
        level: Option<String>,
        message: String,
    },
}

/// What a reply or artifact holds: exactly one of `text`, `data` or `parts`.
#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    data: Option<Value>,
    #[serde(default)]
    parts: Option<Vec<Part>>,
}

impl Content {
    fn parts(self) -> Result<Vec<Part>, String> {
        match (self.text, self.data, self.parts) {
            (Some(t), None, None) => Ok(vec![Part::text(t)]),
            (None, Some(d), None) => Ok(vec![Part::data(d)]),
            (None, None, Some(p)) if !p.is_empty() => Ok(p),
            (None, None, Some(_)) => Err("parts is empty".into()),
            _ => Err("it needs exactly one of text, data, parts".into()),
        }
    }
}

fn parse_line(line: &[u8]) -> Result<Said, String> {
    let wire: Wire = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let task = |task: String, kind, ends_turn| Said::Task {
        task,
        kind,
        ends_turn,
    };
    Ok(match wire {
        Wire::Status { task: t, text } => task(t, AgentEventKind::Status { text }, false),
        Wire::Artifact {
            task: t,
            name,
            id,
            content,
            append,
            last,
        } => {
            if name.is_empty() {
                return Err("an artifact needs a name".into());
            }
            let kind = AgentEventKind::Artifact {
                id: id.filter(|i| !i.is_empty()).unwrap_or_else(|| name.clone()),
                name,
                parts: content.parts()?,
                append,
                last,
            };
            task(t, kind, false)
        }
        Wire::Reply { task: t, content } => task(
            t,
            AgentEventKind::Reply {
                parts: content.parts()?,
            },
            true,
        ),
        Wire::Ask {
            task: t,
            text,
            schema,
            channel,
        } => {
            if schema.as_ref().is_some_and(|s| !s.is_object()) {
                return Err("an ask's schema must be a JSON object".into());
            }
            let kind = AgentEventKind::Ask {
                text,
                schema,
                channel,
            };
            task(t, kind, true)
        }
        Wire::Fail { task: t, error } => task(t, AgentEventKind::Fail { error }, true),
        Wire::Log { level, message } => Said::Log {
            level: level.unwrap_or_default(),
            message,
        },
    })
}

enum Line {
    Eof,
    Full,
    /// Longer than allowed; the buffer holds its first bytes, the rest is unread.
    TooLong,
}

/// Reads one line into `line` (newline and a trailing `\r` dropped), never buffering more
/// than `max` bytes of it. A last line without a newline counts.
fn read_line(r: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> io::Result<Line> {
    line.clear();
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(if line.is_empty() {
                Line::Eof
            } else {
                Line::Full
            });
        }
        let (take, found) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            let room = max - line.len();
            line.extend_from_slice(&buf[..room]);
            r.consume(room);
            return Ok(Line::TooLong);
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take + usize::from(found));
        if found {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Line::Full);
        }
    }
}

/// Discards input up to and including the next newline.
fn skip_line(r: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
}

/// The way to an agent's stdin. Every line goes through [`Input::send`], with the
/// supervisor's lock held, so lines keep their order.
struct Input {
    /// The writer thread's queue (bounded by the spec's `queue`): it blocks on the pipe
    /// so nobody else does.
    queue: SyncSender<Vec<u8>>,
    /// The same pipe, opened again non-blocking: a short line is written straight into it
    /// while nothing waits in the queue. `None` where it could not be opened.
    direct: Option<std::fs::File>,
    /// Lines handed to the writer thread and not yet all written.
    queued: Arc<AtomicUsize>,
}

/// Writes of at most this many bytes to a pipe are atomic: all or nothing (Linux's
/// PIPE_BUF), so a direct write never leaves half a line behind.
const PIPE_ATOMIC: usize = 4096;

impl Input {
    /// Writes the line into the pipe now if nothing is queued before it and the pipe has
    /// room for all of it; else queues it for the writer thread (never blocks). A pipe
    /// that is closed (the agent closed its stdin or died) is `Disconnected`: the exit
    /// settles the turn.
    fn send(&self, mut line: Vec<u8>) -> Result<(), TrySendError<Vec<u8>>> {
        if let Some(mut pipe) = self.direct.as_ref() {
            // Acquire: every line the writer took is in the pipe before this one.
            if line.len() <= PIPE_ATOMIC && self.queued.load(Ordering::Acquire) == 0 {
                match pipe.write(&line) {
                    Ok(n) if n == line.len() => return Ok(()),
                    // Not at or under PIPE_BUF; should it happen, the rest follows.
                    Ok(n) => drop(line.drain(..n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Err(TrySendError::Disconnected(line)),
                }
            }
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.queue.try_send(line).inspect_err(|_| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        })
    }
}

/// A second open file description of the child's stdin pipe, non-blocking, so the writer
/// thread's own (blocking) one is unchanged.
fn nonblocking_twin(stdin: &ChildStdin) -> io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(format!("/proc/self/fd/{}", stdin.as_raw_fd()))
}

fn write_lines(mut stdin: ChildStdin, rx: Receiver<Vec<u8>>, queued: &AtomicUsize) {
    for line in rx {
        if stdin.write_all(&line).and_then(|()| stdin.flush()).is_err() {
            // The agent closed its stdin or died: the supervisor notices the exit. The
            // count stays up, so nothing is written past what was lost.
            return;
        }
        // Release: the line is in the pipe before a direct write may follow it.
        queued.fetch_sub(1, Ordering::Release);
    }
}

/// SIGKILL to the child's process group, and to the child itself in case it left the group.
/// Only called while the child is unreaped, so neither id can name a stranger.
fn kill_group(pid: u32) {
    if let Some(pid) = Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
}

fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let name = match sig {
                1 => " (SIGHUP)",
                2 => " (SIGINT)",
                6 => " (SIGABRT)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                13 => " (SIGPIPE)",
                15 => " (SIGTERM)",
                _ => "",
            };
            format!("was killed by signal {sig}{name}")
        }
        None => format!("ended ({status})"),
    }
}

/// 100ms after the first crash, doubling per consecutive crash, at most 5s.
fn backoff(crashes: u32) -> Duration {
    let ms = 100u64.saturating_mul(1 << crashes.saturating_sub(1).min(6));
    Duration::from_millis(ms.min(5_000))
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn line_of(v: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(v).expect("a JSON value serializes");
    line.push(b'\n');
    line
}

/// A line for a log: lossy UTF-8, at most 200 characters.
fn excerpt(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.into_owned(),
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn said(line: &str) -> Result<AgentEventKind, String> {
        match parse_line(line.as_bytes())? {
            Said::Task { kind, .. } => Ok(kind),
            Said::Log { .. } => Err("log".into()),
        }
    }

    #[test]
    fn lines_parse_into_events() {
        assert_eq!(
            said(r#"{"type":"reply","task":"t","data":{"a":1}}"#),
            Ok(AgentEventKind::Reply {
                parts: vec![Part::data(json!({"a":1}))]
            })
        );
        assert_eq!(
            said(r#"{"type":"artifact","task":"t","name":"n","text":"x","last":true}"#),
            Ok(AgentEventKind::Artifact {
                id: "n".into(),
                name: "n".into(),
                parts: vec![Part::text("x")],
                append: false,
                last: true
            })
        );
        for bad in [
            r#"{"type":"reply","task":"t"}"#,
            r#"{"type":"reply","task":"t","text":"a","data":1}"#,
            r#"{"type":"reply","task":"t","parts":[]}"#,
            r#"{"type":"artifact","task":"t","name":"","text":"x"}"#,
            r#"{"type":"ask","task":"t","text":"?","schema":3}"#,
            r#"{"type":"nope","task":"t"}"#,
            r#"{"task":"t"}"#,
            "not json",
        ] {
            assert!(said(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_are_bounded() {
        let mut r = io::Cursor::new(b"ab\r\n0123456789\nlast".to_vec());
        let mut line = Vec::new();
        assert!(matches!(read_line(&mut r, &mut line, 4), Ok(Line::Full)));
        assert_eq!(line, b"ab");
        assert!(matches!(read_line(&mut r, &mut line, 4), Ok(Line::TooLong)));
        assert_eq!(line, b"0123");
        skip_line(&mut r).unwrap();
        assert!(matches!(read_line(&mut r, &mut line, 4), Ok(Line::Full)));
        assert_eq!(line, b"last");
        assert!(matches!(read_line(&mut r, &mut line, 4), Ok(Line::Eof)));
    }

    #[test]
    fn completions_follow_the_event() {
        let ev = |kind| AgentEvent {
            agent: "a".into(),
            task: Some("t".into()),
            kind,
        };
        let ask = to_completions(&ev(AgentEventKind::Ask {
            text: "sure?".into(),
            schema: Some(json!({"type":"object"})),
            channel: None,
        }));
        assert!(matches!(
            &ask[0],
            Completion::Ask {
                schema: Some(_),
                ..
            }
        ));
        assert!(matches!(
            &ask[1],
            Completion::Status {
                state: TaskState::InputRequired,
                ..
            }
        ));
        let fail = to_completions(&ev(AgentEventKind::Fail { error: "x".into() }));
        assert_eq!(
            fail,
            vec![Completion::Status {
                task_id: "t".into(),
                state: TaskState::Failed,
                message: Some(vec![Part::text("x")])
            }]
        );
        assert!(to_completions(&ev(AgentEventKind::Exited {
            description: "exited with status 1".into(),
            in_flight: vec![]
        }))
        .is_empty());
    }

    #[test]
    fn the_runtime_can_share_agents_across_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<AgentProcess>();
        shared::<Agents>();
    }

    /// Whether `pid` is running: not reaped, and not a zombie waiting to be.
    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    /// A kill does not wait for the process to die: the reaper thread reaps it later, and
    /// does (no zombie is left behind).
    #[test]
    fn a_killed_child_is_reaped_later_on_the_reaper_thread() {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        reap_later(child);
        // Waited for in place, it would have been reaped after its 30 s.
        assert!(running(pid), "reap_later waited for the child");
        // `sleep` shares the test's process group: it alone is signalled.
        let target = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::kill_process(target, rustix::process::Signal::KILL).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                Instant::now() < deadline,
                "the killed child {pid} was not reaped"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(50), Duration::from_secs(5));
    }
}
