//! The runtime: its loop (on its own thread, or as a task on the smol executor), the effects
//! it takes from the core, and the objects it owns. The work is split by subject: [`runs`] (workflow runs and the drain),
//! [`commands`] (the ops) and [`agents`] (agent processes, subagents, conversations).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::thread;
use std::time::Duration;

use agentd_core::a2a::types::{Message, Part, PartContent, TaskState};
use agentd_core::auth::Principal;
use agentd_core::errors::{ErrorKind, RpcError};
use agentd_core::ext::annotations::{Link, LinkKind};
use agentd_core::feed::FeedEvent;
use agentd_core::view::{ObjectKind, WorkflowEntry};
use agentd_core::{CallId, CommandAnswer, Completion, CompletionError, Effect, Instance, Now};
use agentd_io_common::Clock;
use serde_json::{json, Map, Value};

use super::agent::{self, AgentEvent, AgentEventKind, AgentProcess, AgentSpec, TurnIn};
use super::exec::{self, ExecJob};
use super::logring;
use super::peer::{OutboundSend, PeerClient, PeerError, PeerOutcome};
use super::workflow::{self, StepKind, Workflow};
use super::NO_AGENT;

mod agents;
mod commands;
mod conversations;
mod mailbox;
mod runs;

use conversations::{
    conversation_doc, conversation_key, Conversation, ConversationKey, Conversations, Said, Speaker,
};

use mailbox::{Inbox, Mailbox, Woken};

pub use commands::SERVED_OPS;

/// Finished runs kept for `workflow.status` and `run.get`; older ones are forgotten (and
/// their departure is a `run.removed` event).
const FINISHED_RUNS_KEPT: usize = 1000;
/// Step output strings `run.get` shows are cut at this many bytes.
const RUN_GET_OUTPUT_BYTES: usize = 2048;
/// Messages the runtime handles under one hold of the instance lock at most.
const MSG_BATCH: usize = 32;
/// How long a drained instance waits for its last answers to leave before it exits.
const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// What the runtime is configured with.
#[derive(Default)]
pub struct Settings {
    pub workflows: Vec<Workflow>,
    /// `agent.approval`: whether exec steps run (`auto`), wait for an operator (`ask`) or
    /// are refused (`deny`).
    pub approval: Approval,
    /// The conversation agent (`[agent] command`): answers turns that are not commands.
    pub agent: Option<AgentSpec>,
    /// `[[subagents]]`: the kinds of named agent processes `subagent.send` starts.
    pub subagents: Vec<AgentSpec>,
    /// `[[a2a.peers]]`: the agents `a2a.send` and `a2a.delegate` steps call.
    pub peers: Vec<PeerClient>,
    /// `[a2a.push]`: how webhooks are called.
    pub push: super::push::DeliveryOptions,
    /// Bounds on what callers make the runtime start.
    pub limits: RuntimeLimits,
}

/// Bounds on what callers make the runtime start (`[limits]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeLimits {
    /// Live subagents of one principal (`limits.max_subagents_per_principal`).
    pub max_subagents_per_principal: usize,
    /// Live subagents in all (`limits.max_subagents`).
    pub max_subagents: usize,
}

impl Default for RuntimeLimits {
    fn default() -> Self {
        RuntimeLimits {
            max_subagents_per_principal: 8,
            max_subagents: 64,
        }
    }
}

/// The name of the conversation agent's process, in events and failure reasons.
pub const CONVERSATION_AGENT: &str = "conversation";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Approval {
    #[default]
    Auto,
    Ask,
    Deny,
}

impl Approval {
    pub fn parse(s: &str) -> Option<Approval> {
        match s {
            "auto" => Some(Approval::Auto),
            "ask" => Some(Approval::Ask),
            "deny" => Some(Approval::Deny),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Approval::Auto => "auto",
            Approval::Ask => "ask",
            Approval::Deny => "deny",
        }
    }
}

/// Why the runtime ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// A drain finished: every piece of in-flight work ended.
    Drained,
}

/// The running runtime: send it a termination request, wait for it to end.
pub struct RuntimeHandle {
    mail: Mailbox,
    pub exit: Receiver<Exit>,
}

impl RuntimeHandle {
    /// A graceful drain, as `admin.drain` does (SIGTERM sends this).
    pub fn drain(&self, reason: &str) {
        self.mail.send(Msg::Drain(reason.to_owned()));
    }

    /// A handle that only asks for a drain, for another thread.
    pub fn drain_handle(&self) -> DrainHandle {
        DrainHandle(self.mail.clone())
    }

    /// A handle that hands reloaded configuration to the runtime, for the SIGHUP thread.
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle(self.mail.clone())
    }
}

/// What a reload (SIGHUP) applies: the core's reloadable keys and the runtime's own. The
/// runtime applies it all under one hold of the instance lock and announces it with one
/// `config` feed event.
pub struct Reload {
    pub core: agentd_core::Reloadable,
    /// `agent.approval`: overwrites what `admin.set` made of it.
    pub approval: Approval,
    /// `a2a.peers`, when they changed: calls already made finish on the old clients.
    pub peers: Option<Vec<PeerClient>>,
}

/// Hands a reload to the runtime.
pub struct ReloadHandle(Mailbox);

impl ReloadHandle {
    pub fn reload(&self, r: Reload) {
        self.0.send(Msg::Reload(Box::new(r)));
    }
}

/// Asks the runtime for a graceful drain.
pub struct DrainHandle(Mailbox);

impl DrainHandle {
    pub fn drain(&self, reason: &str) {
        self.0.send(Msg::Drain(reason.to_owned()));
    }
}

pub(crate) enum Msg {
    /// The instance queued effects.
    Wake,
    /// A step's worker finished.
    StepDone {
        run: String,
        step: usize,
        attempt: u32,
        result: Result<Value, String>,
    },
    Drain(String),
    /// SIGHUP: a reloaded configuration, already checked.
    Reload(Box<Reload>),
    /// An agent process spoke, or its process changed.
    Agent(AgentEvent),
}

/// Starts the runtime on its own thread (the std driver's way).
pub fn spawn(
    instance: Arc<Mutex<Instance>>,
    clock: Clock,
    settings: Settings,
) -> std::io::Result<RuntimeHandle> {
    let (mut rt, inbox, handle) = build(instance, clock, settings, Home::Thread)?;
    thread::Builder::new()
        .name("agentd-runtime".into())
        .spawn(move || rt.run(inbox))?;
    Ok(handle)
}

/// The runtime as a task, for the executor that serves the connections (the smol driver's
/// way; run it with `ServerHandle::spawn`). It sleeps as a task: a connection that queues
/// work wakes it as it would another task, the executor's reactor watches the agent's
/// stdout, and its wake-ups of connections land on the executor it runs on, where a thread
/// of its own would have to be woken and then wake an executor thread. It holds the
/// instance lock no longer than the thread does; what blocks (programs, peer calls,
/// deliveries, the agent's stdin when its pipe is full) is on other threads either way.
pub fn start_task(
    instance: Arc<Mutex<Instance>>,
    clock: Clock,
    settings: Settings,
) -> std::io::Result<(RuntimeHandle, RuntimeTask)> {
    let (mut rt, inbox, handle) = build(instance, clock, settings, Home::Task)?;
    Ok((handle, Box::pin(async move { rt.run_as_task(inbox).await })))
}

/// [`start_task`]'s runtime, to spawn on an executor.
pub type RuntimeTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Where the runtime runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Home {
    Thread,
    Task,
}

fn build(
    instance: Arc<Mutex<Instance>>,
    clock: Clock,
    settings: Settings,
    home: Home,
) -> std::io::Result<(Runtime, Inbox, RuntimeHandle)> {
    let (mail, inbox) = Mailbox::new();
    let (exit_tx, exit_rx) = channel();
    let metrics = Arc::new(crate::metrics::RuntimeMetrics::default());
    {
        let mut inst = instance.lock().unwrap_or_else(|p| p.into_inner());
        inst.set_workflows(
            settings
                .workflows
                .iter()
                .map(|w| WorkflowEntry {
                    name: w.name.clone(),
                    doc: w.status_doc(),
                    roles: w.roles(),
                })
                .collect(),
        );
        logring::set_recording(inst.config().introspection_enabled);
        // The runtime's and the process's parts of `/metrics` (the store's is the pump's).
        inst.add_metrics_source(metrics.clone());
        inst.add_metrics_source(Arc::new(crate::metrics::ProcessMetrics));
    }
    // Agent events go straight onto the runtime's one queue: no thread in between. The
    // conversation agent's stdout is read by the runtime itself where it can sleep on it
    // (a task always can; a thread needs the doorbell's eventfd): a turn's answer reaches
    // the runtime with no thread hop.
    let agent_tx = AgentSink(mail.clone());
    let polled = home == Home::Task || inbox.can_poll();
    let conversation = match settings.agent {
        Some(spec) if polled => Some(AgentProcess::new_polled(spec, agent_tx.clone())),
        Some(spec) => Some(AgentProcess::new(spec, agent_tx.clone())),
        None => None,
    }
    .transpose()
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    if let Some(a) = &conversation {
        let mut inst = instance.lock().unwrap_or_else(|p| p.into_inner());
        inst.set_model(a.spec().command.first().cloned().unwrap_or_default());
    }
    let mut push = super::push::DeliveryPool::new(Arc::new(settings.push));
    push.counts = metrics.push.clone();
    let rt = Runtime {
        inst: instance,
        push,
        metrics,
        peers: settings
            .peers
            .into_iter()
            .map(|p| (p.name().to_owned(), Arc::new(p)))
            .collect(),
        conversation,
        subagent_kinds: settings
            .subagents
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect(),
        subagents: BTreeMap::new(),
        agent_tx,
        agent_stdout: None,
        agent_tasks: HashMap::new(),
        held_turns: Vec::new(),
        clock,
        workflows: settings
            .workflows
            .into_iter()
            .map(|w| (w.name.clone(), Arc::new(w)))
            .collect(),
        approval: settings.approval,
        limits: settings.limits,
        runs: HashMap::new(),
        finished: VecDeque::new(),
        task_runs: HashMap::new(),
        gates: HashMap::new(),
        conversations: Conversations::default(),
        next_run: 1,
        mail: mail.clone(),
        draining: None,
        drain_report_at: 0,
        exit: exit_tx,
    };
    let handle = RuntimeHandle {
        mail,
        exit: exit_rx,
    };
    Ok((rt, inbox, handle))
}

/// Puts an agent process's events on the runtime's queue, in the order it emits them (it
/// emits under its own lock). The channel is unbounded, so a send never blocks the agent's
/// reader or monitor.
#[derive(Clone)]
struct AgentSink(Mailbox);

impl agent::EventSink for AgentSink {
    fn send(&self, event: AgentEvent) {
        self.0.send(Msg::Agent(event));
    }
}

/// Wakes the runtime when the instance queues an effect.
struct EffectWake(Mailbox);

impl Wake for EffectWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.send(Msg::Wake);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunStatus {
    Running,
    /// At a human gate or waiting for a signal.
    Waiting,
    Paused,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Paused => "paused",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
    fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

#[derive(Clone, Debug, Default)]
struct StepState {
    status: &'static str,
    attempt: u32,
    started: Option<u64>,
    finished: Option<u64>,
    error: Option<String>,
    wait: Value,
    output: Value,
}

/// What a run waits on, if anything.
#[derive(Clone, Debug, PartialEq)]
enum Waiting {
    None,
    /// A human step's gate (or the approval gate before an exec step).
    Gate {
        approval: bool,
    },
    Signal {
        name: String,
        until_mono: Option<u64>,
    },
    /// A worker runs the step.
    Worker,
}

struct Run {
    id: String,
    workflow: Arc<Workflow>,
    owner: Principal,
    task_id: String,
    /// The internal key of the conversation it runs in (§7.6).
    context_id: String,
    /// The owner's own name for that conversation.
    context_name: String,
    /// How it was started: `workflow.run` or the declared command's op.
    start: String,
    inputs: Value,
    status: RunStatus,
    /// Paused by `admin.pause {run}`.
    held: bool,
    current: Option<usize>,
    steps: Vec<StepState>,
    waiting: Waiting,
    cancel: Arc<AtomicBool>,
    created: u64,
    updated: u64,
    finished: Option<u64>,
    output: Value,
    error: Option<String>,
    /// The trace of the request that started it: its exec steps' `TRACEPARENT`, its peer
    /// calls' parent.
    trace: Option<agentd_core::trace::TraceContext>,
}

impl Run {
    /// The run's variables, as templates read them.
    fn vars(&self) -> Value {
        let steps: Map<String, Value> = self
            .workflow
            .steps
            .iter()
            .zip(&self.steps)
            .filter(|(_, s)| s.finished.is_some())
            .map(|(d, s)| (d.id.clone(), json!({"output": s.output})))
            .collect();
        json!({
            "inputs": self.inputs,
            "run": {"id": self.id, "workflow": self.workflow.name, "principal": self.owner.id, "task": self.task_id},
            "steps": steps,
        })
    }

    /// The feed's `run` object.
    fn doc(&self) -> Value {
        let steps: Map<String, Value> = self
            .workflow
            .steps
            .iter()
            .zip(&self.steps)
            .map(|(d, s)| (d.id.clone(), json!(s.attempt)))
            .collect();
        json!({
            "id": self.id,
            "workflow": self.workflow.name,
            "status": self.status.as_str(),
            "start": self.start,
            "steps": steps,
            "tokens": 0,
            "created": self.created,
            "updated": self.updated,
            "finished": self.finished,
            "output": self.output,
            "error": self.error,
            "task": self.task_id,
            "principal": self.owner.id,
        })
    }

    /// `plan.get`'s plan: every step, its state and its output so far.
    fn plan(&self) -> Value {
        let steps: Vec<Value> = self
            .workflow
            .steps
            .iter()
            .zip(&self.steps)
            .map(|(d, s)| {
                json!({"id": d.id, "kind": d.kind.name(), "status": s.status, "output": s.output, "error": s.error})
            })
            .collect();
        json!({"run": self.id, "workflow": self.workflow.name, "status": self.status.as_str(), "steps": steps})
    }

    fn progress(&self) -> String {
        let done = self.steps.iter().filter(|s| s.status == "done").count();
        format!(
            "{done} of {} steps done; run {}",
            self.steps.len(),
            self.status.as_str()
        )
    }
}

/// Who answers an agent task.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AgentTask {
    /// A turn of the conversation agent, in the conversation of this key (owner id,
    /// contextId): its reply is recorded there without a search of every conversation.
    Conversation(ConversationKey),
    /// A `subagent.send` task of this handle.
    Subagent(String),
}

/// A named agent process a principal started with `subagent.send`.
struct Subagent {
    handle: String,
    owner: Principal,
    process: AgentProcess,
    status: &'static str,
    attempt: u64,
    instruction: Value,
    result: Value,
    error: Option<String>,
    requested_by: String,
    created: u64,
    updated: u64,
}

impl Subagent {
    fn feed_doc(&self) -> Value {
        json!({"handle": self.handle, "mode": "process", "status": self.status, "tokens": 0,
               "error": self.error, "updated": self.updated})
    }
}

struct Runtime {
    inst: Arc<Mutex<Instance>>,
    push: super::push::DeliveryPool,
    /// What `/metrics` shows of the runtime, counted after each round of work.
    metrics: Arc<crate::metrics::RuntimeMetrics>,
    peers: HashMap<String, Arc<PeerClient>>,
    conversation: Option<AgentProcess>,
    subagent_kinds: HashMap<String, AgentSpec>,
    /// Handle → the subagent.
    subagents: BTreeMap<String, Subagent>,
    agent_tx: AgentSink,
    /// The conversation agent's current stdout, which this thread reads (polled mode).
    agent_stdout: Option<agent::AgentStdout>,
    /// Task id → what answers it: the conversation agent or a subagent's handle.
    agent_tasks: HashMap<String, AgentTask>,
    /// Turns that arrived while the instance was paused.
    held_turns: Vec<Effect>,
    clock: Clock,
    workflows: HashMap<String, Arc<Workflow>>,
    approval: Approval,
    limits: RuntimeLimits,
    runs: HashMap<String, Run>,
    /// Finished run ids, oldest first.
    finished: VecDeque<String>,
    /// Task id → the run it tracks.
    task_runs: HashMap<String, String>,
    /// Task id → the run whose gate it is.
    gates: HashMap<String, String>,
    /// (owner id, contextId key) → conversation. At most `max_tasks` of them (every held
    /// task is in one): past it the least recently active is dropped (`conversation.removed`).
    conversations: Conversations,
    next_run: u64,
    mail: Mailbox,
    /// The drain's reason, once one started.
    draining: Option<(String, Option<u64>)>,
    /// When a drain next says what it is waiting for (monotonic ms).
    drain_report_at: u64,
    exit: Sender<Exit>,
}

type Inst<'a> = std::sync::MutexGuard<'a, Instance>;

impl Runtime {
    /// Counts the runtime's objects by state for `/metrics`: O(runs kept + subagents), a
    /// few microseconds, once per round of work.
    fn count_for_metrics(&self) {
        use crate::metrics::{RuntimeCounts, AGENT_STATES, RUN_STATES};
        let mut c = RuntimeCounts::default();
        for r in self.runs.values() {
            let state = if r.held && !r.status.is_final() {
                "paused"
            } else {
                r.status.as_str()
            };
            if let Some(i) = RUN_STATES.iter().position(|s| *s == state) {
                c.runs[i] += 1;
            }
        }
        if let Some(a) = &self.conversation {
            let state = a.state().as_str();
            if let Some(i) = AGENT_STATES.iter().position(|s| *s == state) {
                c.agents[i] += 1;
            }
        }
        for s in self.subagents.values() {
            match c.subagents.iter_mut().find(|(k, _)| *k == s.status) {
                Some((_, n)) => *n += 1,
                None => c.subagents.push((s.status, 1)),
            }
        }
        c.subagents.sort_unstable();
        c.conversations = self.conversations.len() as u64;
        self.metrics.set(c);
    }

    /// The runtime thread's loop.
    fn run(&mut self, inbox: Inbox) {
        let waker = self.effect_waker();
        let mut msg = None;
        loop {
            if self.round(msg.take(), &inbox, &waker) {
                return self.exit_after_drain();
            }
            self.adopt_stdout();
            msg = match inbox.next(self.next_timer(), &mut self.agent_stdout) {
                Woken::Msg(m) => Some(m),
                Woken::Nothing => None,
                Woken::Closed => return,
            };
        }
    }

    /// The runtime task's loop: [`Runtime::run`]'s, asleep as a task between rounds.
    async fn run_as_task(&mut self, mut inbox: Inbox) {
        let waker = self.effect_waker();
        let mut msg = None;
        loop {
            if self.round(msg.take(), &inbox, &waker) {
                // The agents' shutdown waits for them: not on the executor's threads.
                let conversation = self.conversation.take();
                let subagents = std::mem::take(&mut self.subagents);
                let exit = self.exit.clone();
                self.agent_stdout = None;
                let ended = thread::Builder::new()
                    .name("agentd-runtime-exit".into())
                    .spawn(move || {
                        shut_down_agents(conversation.as_ref(), subagents.values());
                        let _ = exit.send(Exit::Drained);
                    });
                if let Err(e) = ended {
                    tracing::warn!(error = %e, "no thread to shut the agents down; ending now");
                    let _ = self.exit.send(Exit::Drained);
                }
                return;
            }
            if self.adopt_stdout() {
                inbox.watch(&mut self.agent_stdout);
            }
            msg = match inbox
                .next_as_task(self.next_timer(), &mut self.agent_stdout)
                .await
            {
                Woken::Msg(m) => Some(m),
                Woken::Nothing => None,
                Woken::Closed => return,
            };
        }
    }

    /// What the instance wakes when it queues an effect: a message to the runtime.
    fn effect_waker(&self) -> Waker {
        Waker::from(Arc::new(EffectWake(self.mail.clone())))
    }

    /// One round under one hold of the instance lock: `msg` (what woke the runtime) and the
    /// messages queued behind it, the effects, the timers. Whether a drain has finished, and
    /// the runtime is to end.
    fn round(&mut self, mut msg: Option<Msg>, inbox: &Inbox, waker: &Waker) -> bool {
        let inst_arc = self.inst.clone();
        let mut inst = inst_arc.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.clock.now();
        // The message that woke us, and those queued behind it (a turn's status, artifact
        // and reply come close together), under this one hold of the lock; at most a batch,
        // so the connections are not held off for long.
        let mut handled = 0;
        while let Some(m) = msg.take() {
            self.on_msg(&mut inst, m, now);
            handled += 1;
            if handled < MSG_BATCH {
                msg = inbox.try_next();
            }
        }
        while let Some(effect) = inst.poll_effect() {
            self.on_effect(&mut inst, effect, now);
        }
        self.on_timers(&mut inst, now);
        self.count_for_metrics();
        if self.drain_done(&mut inst, now) {
            tracing::info!("drained: every piece of in-flight work ended; exiting");
            return true;
        }
        // Registered under the lock: an effect queued after it wakes us.
        inst.register_effect_waker(waker);
        false
    }

    /// A process started since the last look: its stdout is the runtime's to read. Whether
    /// there was one.
    fn adopt_stdout(&mut self) -> bool {
        match self
            .conversation
            .as_ref()
            .and_then(AgentProcess::take_stdout)
        {
            Some(out) => {
                self.agent_stdout = Some(out);
                true
            }
            None => false,
        }
    }

    /// The runtime thread's end after a drain.
    fn exit_after_drain(&mut self) {
        // Its stdout goes back to a thread, which reads it while it winds down.
        self.agent_stdout = None;
        shut_down_agents(self.conversation.as_ref(), self.subagents.values());
        let _ = self.exit.send(Exit::Drained);
    }

    fn on_msg(&mut self, inst: &mut Inst<'_>, msg: Msg, now: Now) {
        match msg {
            Msg::Wake => {}
            Msg::StepDone {
                run,
                step,
                attempt,
                result,
            } => self.on_step_done(inst, &run, step, attempt, result, now),
            Msg::Drain(reason) => self.start_drain(inst, &reason, now),
            Msg::Reload(r) => self.apply_reload(inst, *r, now),
            Msg::Agent(ev) => self.on_agent_event(inst, ev, now),
        }
    }

    /// Applies a reload: the core's keys swap in one step, then the runtime's, all under the
    /// lock the caller holds; one `config` event names what changed.
    fn apply_reload(&mut self, inst: &mut Inst<'_>, r: Reload, now: Now) {
        let mut paths = inst.reload(r.core);
        logring::set_recording(inst.config().introspection_enabled);
        if r.approval != self.approval {
            self.approval = r.approval;
            paths.push("agent.approval");
        }
        if let Some(peers) = r.peers {
            self.peers = peers
                .into_iter()
                .map(|p| (p.name().to_owned(), Arc::new(p)))
                .collect();
            paths.push("a2a.peers");
        }
        if paths.is_empty() {
            tracing::info!("configuration reloaded: no reloadable key changed");
            return;
        }
        let _ = inst.push_event(
            FeedEvent::Other {
                kind: "config",
                data: json!({"paths": paths, "source": "reload"}),
                owner: None,
            },
            now,
        );
        tracing::info!(paths = %paths.join(", "), "configuration reloaded");
    }

    fn next_timer(&self) -> Duration {
        if self.draining.is_some()
            || self.runs.values().any(|r| {
                matches!(
                    r.waiting,
                    Waiting::Signal {
                        until_mono: Some(_),
                        ..
                    }
                )
            })
        {
            Duration::from_millis(50)
        } else {
            Duration::from_secs(3600)
        }
    }

    fn on_effect(&mut self, inst: &mut Inst<'_>, effect: Effect, now: Now) {
        match effect {
            Effect::Turn {
                task_id,
                context_id,
                context_name,
                message,
                owner,
                trace,
                ..
            } => {
                if let Some(run_id) = self.gates.remove(&task_id) {
                    self.answer_gate(inst, &run_id, &message, now);
                    return;
                }
                // The answer to a subagent's question goes back to that subagent.
                if let Some(AgentTask::Subagent(handle)) = self.agent_tasks.get(&task_id).cloned() {
                    let turn = TurnIn {
                        task: task_id.clone(),
                        context: context_id,
                        principal: owner.id.clone(),
                        parts: message.parts.clone(),
                        trace,
                    };
                    let sent = match self.subagents.get(&handle) {
                        Some(s) => s.process.turn(turn).map_err(|e| e.to_string()),
                        None => Err(format!("subagent {handle} is gone")),
                    };
                    if let Err(e) = sent {
                        status(inst, &task_id, TaskState::Failed, e, now);
                    }
                    return;
                }
                if self.conversation.is_none() {
                    complete(
                        inst,
                        Completion::Status {
                            task_id,
                            state: TaskState::Rejected,
                            message: Some(vec![Part::text(NO_AGENT)]),
                        },
                        now,
                    );
                    return;
                }
                if inst.is_paused() {
                    self.held_turns.push(Effect::Turn {
                        task_id,
                        context_id,
                        context_name,
                        message,
                        owner,
                        trace,
                    });
                    return;
                }
                let context = (context_id.as_str(), context_name.as_str());
                self.record_turn(inst, &owner, context, &task_id, &message, now);
                let key = (owner.id.clone(), context_id.clone());
                let turn = TurnIn {
                    task: task_id.clone(),
                    context: context_id,
                    principal: owner.id,
                    parts: message.parts,
                    trace,
                };
                let sent = self
                    .conversation
                    .as_ref()
                    .map(|a| a.turn(turn).map_err(|e| e.to_string()))
                    .unwrap_or(Ok(()));
                match sent {
                    Ok(()) => {
                        self.agent_tasks
                            .insert(task_id, AgentTask::Conversation(key));
                    }
                    Err(e) => status(inst, &task_id, TaskState::Failed, e, now),
                }
            }
            Effect::Cancel { task_id } => {
                // A turn held while paused is never sent once its task is canceled.
                self.held_turns
                    .retain(|e| !matches!(e, Effect::Turn { task_id: t, .. } if *t == task_id));
                match self.agent_tasks.remove(&task_id) {
                    Some(AgentTask::Conversation(_)) => {
                        if let Some(a) = &self.conversation {
                            a.cancel(&task_id);
                        }
                    }
                    Some(AgentTask::Subagent(h)) => {
                        if let Some(s) = self.subagents.get(&h) {
                            s.process.cancel(&task_id);
                        }
                    }
                    None => {}
                }
                if let Some(run_id) = self.task_runs.get(&task_id).cloned() {
                    // The core already moved the task to canceled.
                    self.cancel_run(inst, &run_id, "the task was canceled", false, now);
                }
            }
            Effect::Deliver {
                task_id,
                config_id,
                url,
                headers,
                body,
                trace,
                ..
            } => {
                let d = super::push::Delivery {
                    task_id,
                    config_id,
                    url,
                    headers,
                    body,
                    trace,
                };
                self.push.submit(d);
            }
            Effect::Command {
                call,
                op,
                args,
                principal,
                sid,
                context_id,
                context_name,
                task_id,
                trace,
                ..
            } => {
                let name = op.name().to_owned();
                let answer = self.command(
                    inst,
                    Call {
                        id: call,
                        op: &name,
                        principal: &principal,
                        context_id: &context_id,
                        context_name: &context_name,
                        task_id: task_id.as_deref(),
                        trace: trace.as_ref(),
                    },
                    op,
                    now,
                );
                let who = (&principal, sid.as_deref());
                self.audit(inst, who, &name, &args, answer.as_ref().err(), now);
                if let Err(err) = answer {
                    complete(
                        inst,
                        Completion::CommandResult {
                            call,
                            answer: CommandAnswer::Refused(err),
                        },
                        now,
                    );
                }
            }
            // A kind of work a newer core asks for and this runtime does not do yet.
            other => {
                tracing::warn!(effect = ?other, "an effect this runtime does not know: ignored")
            }
        }
    }
}

/// One command call, as the runtime reads it; its typed op comes beside it.
struct Call<'a> {
    id: CallId,
    /// The op's name, for refusals and the run it starts.
    op: &'a str,
    principal: &'a Principal,
    /// The conversation's internal key.
    context_id: &'a str,
    /// The caller's own name for it.
    context_name: &'a str,
    task_id: Option<&'a str>,
    /// The trace of the request that made the call: a run it starts carries it.
    trace: Option<&'a agentd_core::trace::TraceContext>,
}

/// Agent processes get their shutdown line and a moment (one for all of them), then are
/// killed: none outlives the daemon. Waits up to the grace.
fn shut_down_agents<'a>(
    conversation: Option<&AgentProcess>,
    subagents: impl Iterator<Item = &'a Subagent>,
) {
    let procs = conversation
        .into_iter()
        .chain(subagents.map(|s| &s.process));
    agent::shutdown_together(procs, Duration::from_secs(2));
}

fn complete(inst: &mut Inst<'_>, c: Completion, now: Now) {
    let adds_artifact = match &c {
        Completion::Artifact { task_id, .. } | Completion::CommandDone { task_id, .. } => {
            Some(task_id.clone())
        }
        _ => None,
    };
    if let Err(e) = inst.handle_completion(c, now) {
        // An artifact past a task's bounds: the task ends saying which bound, rather than
        // going on with output silently missing (or, for a result, working for ever).
        let bound = match e {
            CompletionError::ArtifactsTooLarge => Some(format!(
                "the task's artifacts would exceed limits.task_artifact_bytes ({} bytes)",
                inst.config().tasks.artifact_bytes
            )),
            CompletionError::TasksOverBudget => Some(format!(
                "the tasks held would exceed limits.tasks_bytes ({} bytes) and none of them \
                 is finished",
                inst.config().tasks.total_bytes
            )),
            CompletionError::TooManyArtifacts => Some(format!(
                "the task would hold more than {} artifacts",
                inst.config().tasks.max_artifacts
            )),
            _ => None,
        };
        if let (Some(task_id), Some(why)) = (adds_artifact, bound) {
            tracing::warn!(task = %task_id, "{why}; the task fails");
            let _ = inst.handle_completion(
                Completion::Status {
                    task_id,
                    state: TaskState::Failed,
                    message: Some(vec![Part::text(why)]),
                },
                now,
            );
            return;
        }
        // A task the client canceled, or a call whose client left: nothing to report to.
        if !matches!(
            e,
            CompletionError::TaskTerminal(_) | CompletionError::UnknownCall
        ) {
            tracing::warn!(error = ?e, "completion refused");
        }
    }
}

fn answer(inst: &mut Inst<'_>, call: CallId, doc: Value, now: Now) {
    complete(
        inst,
        Completion::CommandResult {
            call,
            answer: CommandAnswer::Document(doc),
        },
        now,
    );
}

fn done(
    inst: &mut Inst<'_>,
    task_id: Option<&str>,
    result: Option<Value>,
    message: Option<String>,
    now: Now,
) {
    if let Some(task_id) = task_id {
        complete(
            inst,
            Completion::CommandDone {
                task_id: task_id.to_owned(),
                result,
                message,
            },
            now,
        );
    }
}

fn status(inst: &mut Inst<'_>, task_id: &str, state: TaskState, text: String, now: Now) {
    complete(
        inst,
        Completion::Status {
            task_id: task_id.to_owned(),
            state,
            message: Some(vec![Part::text(text)]),
        },
        now,
    );
}

fn push(inst: &mut Inst<'_>, kind: &'static str, data: Value, owner: Option<String>, now: Now) {
    if let Err(e) = inst.push_event(FeedEvent::Other { kind, data, owner }, now) {
        tracing::warn!(error = ?e, kind, "feed event refused");
    }
}

fn parse_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) if s == "true" => Some(true),
        Value::String(s) if s == "false" => Some(false),
        _ => None,
    }
}

fn not_found(what: &str) -> RpcError {
    RpcError::new(ErrorKind::TaskNotFound, format!("no such {what}"))
}

fn invalid_args(op: &str, field: &str, why: impl Into<String>) -> RpcError {
    let why = why.into();
    let mut e = RpcError::new(
        ErrorKind::InvalidCommandArgs,
        format!("invalid arguments for {op}: {field}: {why}"),
    )
    .with_meta("op", op);
    // Relative to the command's arguments: the core names the part that carried them.
    e.violations.push(agentd_core::errors::FieldViolation {
        field: field.to_owned(),
        description: why,
    });
    e
}

fn check_against(schema: &Value, value: &Value, op: &str, field: &str) -> Result<(), RpcError> {
    let Ok(v) = jsonschema::draft202012::new(schema) else {
        return Ok(());
    };
    let problems: Vec<String> = v
        .iter_errors(value)
        .take(4)
        .map(|e| e.to_string())
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(invalid_args(op, field, problems.join("; ")))
    }
}

fn cut_strings(v: &Value, max: usize) -> Value {
    match v {
        Value::String(s) if s.len() > max => {
            let mut end = max;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            Value::String(s[..end].to_owned())
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| cut_strings(x, max)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), cut_strings(x, max)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

fn parts_text(parts: &[Part]) -> String {
    parts
        .iter()
        .map(|p| match &p.content {
            PartContent::Text(t) => t.clone(),
            PartContent::Data(d) => d.to_string(),
            _ => String::new(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
