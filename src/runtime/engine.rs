//! The runtime thread: runs, gates, operator controls and introspection.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::thread;
use std::time::Duration;

use agentd_core::a2a::types::{Message, Part, TaskState};
use agentd_core::auth::Principal;
use agentd_core::errors::{ErrorKind, RpcError};
use agentd_core::ext::annotations::{Link, LinkKind};
use agentd_core::feed::FeedEvent;
use agentd_core::view::{ViewItem, WorkflowEntry};
use agentd_core::{CallId, CommandAnswer, Completion, CompletionError, Effect, Instance, Now};
use agentd_io_std::Clock;
use serde_json::{json, Map, Value};

use super::agent::{self, AgentEvent, AgentEventKind, AgentProcess, AgentSpec, TurnIn};
use super::exec::{self, ExecJob};
use super::logring;
use super::peer::{OutboundSend, PeerClient, PeerError, PeerOutcome};
use super::workflow::{self, StepKind, Workflow};
use super::NO_AGENT;

/// Finished runs kept for `workflow.status` and `run.get`; older ones are forgotten (and
/// their departure is a `run.removed` event).
const FINISHED_RUNS_KEPT: usize = 1000;
/// Step output strings `run.get` shows are cut at this many bytes.
const RUN_GET_OUTPUT_BYTES: usize = 2048;
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
    tx: Sender<Msg>,
    pub exit: Receiver<Exit>,
}

impl RuntimeHandle {
    /// A graceful drain, as `admin.drain` does (SIGTERM sends this).
    pub fn drain(&self, reason: &str) {
        let _ = self.tx.send(Msg::Drain(reason.to_owned()));
    }

    /// A handle that only asks for a drain, for another thread.
    pub fn drain_handle(&self) -> DrainHandle {
        DrainHandle(Mutex::new(self.tx.clone()))
    }
}

/// Asks the runtime for a graceful drain.
pub struct DrainHandle(Mutex<Sender<Msg>>);

impl DrainHandle {
    pub fn drain(&self, reason: &str) {
        let _ = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Msg::Drain(reason.to_owned()));
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
    /// An agent process spoke, or its process changed.
    Agent(AgentEvent),
}

/// Starts the runtime on its own thread.
pub fn spawn(
    instance: Arc<Mutex<Instance>>,
    clock: Clock,
    settings: Settings,
) -> std::io::Result<RuntimeHandle> {
    let (tx, rx) = channel();
    let (exit_tx, exit_rx) = channel();
    {
        let mut inst = instance.lock().unwrap_or_else(|p| p.into_inner());
        inst.view.workflows = settings
            .workflows
            .iter()
            .map(|w| WorkflowEntry {
                name: w.name.clone(),
                doc: w.status_doc(),
                roles: w.roles(),
            })
            .collect();
        logring::set_recording(inst.config().introspection_enabled);
    }
    let (agent_tx, agent_rx) = channel::<AgentEvent>();
    {
        // Agent events join the runtime's one queue.
        let tx = tx.clone();
        thread::Builder::new()
            .name("agentd-agent-events".into())
            .spawn(move || {
                for ev in agent_rx {
                    if tx.send(Msg::Agent(ev)).is_err() {
                        break;
                    }
                }
            })?;
    }
    let conversation = match settings.agent {
        Some(spec) => Some(
            AgentProcess::new(spec, agent_tx.clone())
                .map_err(|e| std::io::Error::other(e.to_string()))?,
        ),
        None => None,
    };
    if let Some(a) = &conversation {
        let mut inst = instance.lock().unwrap_or_else(|p| p.into_inner());
        inst.view.model = a.spec().command.first().cloned().unwrap_or_default();
    }
    let mut rt = Runtime {
        inst: instance,
        push: Arc::new(settings.push),
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
        agent_tasks: HashMap::new(),
        held_turns: Vec::new(),
        clock,
        workflows: settings
            .workflows
            .into_iter()
            .map(|w| (w.name.clone(), Arc::new(w)))
            .collect(),
        approval: settings.approval,
        runs: HashMap::new(),
        finished: VecDeque::new(),
        task_runs: HashMap::new(),
        gates: HashMap::new(),
        conversations: BTreeMap::new(),
        next_run: 1,
        tx: tx.clone(),
        draining: None,
        exit: exit_tx,
    };
    thread::Builder::new()
        .name("agentd-runtime".into())
        .spawn(move || rt.run(rx))?;
    Ok(RuntimeHandle { tx, exit: exit_rx })
}

/// Wakes the runtime thread when the instance queues an effect.
struct EffectWake(Mutex<Sender<Msg>>);

impl Wake for EffectWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Msg::Wake);
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
    context_id: String,
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

/// A conversation: the turns one principal sent under one contextId.
struct Conversation {
    context_id: String,
    owner: Principal,
    messages: VecDeque<Value>,
    total_messages: u64,
    turns: u64,
    version: u64,
    task: Option<String>,
    updated: u64,
}

const CONVERSATION_MESSAGES_KEPT: usize = 1000;

/// Who answers an agent task.
#[derive(Clone, Debug, PartialEq, Eq)]
enum AgentTask {
    Conversation,
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
    push: Arc<super::push::DeliveryOptions>,
    peers: HashMap<String, Arc<PeerClient>>,
    conversation: Option<AgentProcess>,
    subagent_kinds: HashMap<String, AgentSpec>,
    /// Handle → the subagent.
    subagents: BTreeMap<String, Subagent>,
    agent_tx: Sender<AgentEvent>,
    /// Task id → what answers it: the conversation agent or a subagent's handle.
    agent_tasks: HashMap<String, AgentTask>,
    /// Turns that arrived while the instance was paused.
    held_turns: Vec<Effect>,
    clock: Clock,
    workflows: HashMap<String, Arc<Workflow>>,
    approval: Approval,
    runs: HashMap<String, Run>,
    /// Finished run ids, oldest first.
    finished: VecDeque<String>,
    /// Task id → the run it tracks.
    task_runs: HashMap<String, String>,
    /// Task id → the run whose gate it is.
    gates: HashMap<String, String>,
    /// (owner id, contextId) → conversation.
    conversations: BTreeMap<(String, String), Conversation>,
    next_run: u64,
    tx: Sender<Msg>,
    /// The drain's reason, once one started.
    draining: Option<(String, Option<u64>)>,
    exit: Sender<Exit>,
}

type Inst<'a> = std::sync::MutexGuard<'a, Instance>;

impl Runtime {
    fn run(&mut self, rx: Receiver<Msg>) {
        let waker = Waker::from(Arc::new(EffectWake(Mutex::new(self.tx.clone()))));
        loop {
            {
                let inst_arc = self.inst.clone();
                let mut inst = inst_arc.lock().unwrap_or_else(|p| p.into_inner());
                let now = self.clock.now();
                while let Some(effect) = inst.poll_effect() {
                    self.on_effect(&mut inst, effect, now);
                }
                self.on_timers(&mut inst, now);
                if self.drain_done(&mut inst, now) {
                    drop(inst);
                    tracing::info!("drained: every piece of in-flight work ended; exiting");
                    let _ = self.exit.send(Exit::Drained);
                    return;
                }
                // Registered under the lock: an effect queued after it wakes us.
                inst.register_effect_waker(&waker);
            }
            let wait = self.next_timer();
            let msg = match rx.recv_timeout(wait) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let inst_arc = self.inst.clone();
            let mut inst = inst_arc.lock().unwrap_or_else(|p| p.into_inner());
            let now = self.clock.now();
            match msg {
                Msg::Wake => {}
                Msg::StepDone {
                    run,
                    step,
                    attempt,
                    result,
                } => self.on_step_done(&mut inst, &run, step, attempt, result, now),
                Msg::Drain(reason) => self.start_drain(&mut inst, &reason, now),
                Msg::Agent(ev) => self.on_agent_event(&mut inst, ev, now),
            }
        }
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

    // -----------------------------------------------------------------------------------
    // Effects

    fn on_effect(&mut self, inst: &mut Inst<'_>, effect: Effect, now: Now) {
        match effect {
            Effect::Turn {
                task_id,
                context_id,
                message,
                owner,
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
                if inst.paused {
                    self.held_turns.push(Effect::Turn {
                        task_id,
                        context_id,
                        message,
                        owner,
                    });
                    return;
                }
                self.record_turn(inst, &owner, &context_id, &task_id, &message, now);
                let turn = TurnIn {
                    task: task_id.clone(),
                    context: context_id,
                    principal: owner.id.clone(),
                    parts: message.parts.clone(),
                };
                let sent = self
                    .conversation
                    .as_ref()
                    .map(|a| a.turn(turn).map_err(|e| e.to_string()))
                    .unwrap_or(Ok(()));
                match sent {
                    Ok(()) => {
                        self.agent_tasks.insert(task_id, AgentTask::Conversation);
                    }
                    Err(e) => status(inst, &task_id, TaskState::Failed, e, now),
                }
            }
            Effect::Cancel { task_id } => {
                match self.agent_tasks.remove(&task_id) {
                    Some(AgentTask::Conversation) => {
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
            } => {
                let d = super::push::Delivery {
                    task_id,
                    config_id,
                    url,
                    headers,
                    body,
                };
                let opts = self.push.clone();
                let spawned = thread::Builder::new()
                    .name("agentd-push".into())
                    .spawn(move || match super::push::deliver(&d, &opts) {
                        super::push::Outcome::Delivered { attempts, status } => {
                            tracing::info!(task = %d.task_id, config = %d.config_id, attempts, status, "a2a.push.delivered");
                        }
                        super::push::Outcome::Failed { attempts, error } => {
                            tracing::warn!(task = %d.task_id, config = %d.config_id, url = %d.url, attempts, %error, "a2a.push.failed");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "a2a.push.failed: no worker thread");
                }
            }
            Effect::Command {
                call,
                op,
                args,
                workflow,
                principal,
                context_id,
                task_id,
                ..
            } => {
                let answer = self.command(
                    inst,
                    Call {
                        id: call,
                        op: &op,
                        args: &args,
                        principal: &principal,
                        context_id: &context_id,
                        task_id: task_id.as_deref(),
                        workflow: workflow.as_deref(),
                    },
                    now,
                );
                self.audit(inst, &principal, &op, &args, answer.as_ref().err(), now);
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
        }
    }

    /// An `audit` event for a command, while introspection is on: every refusal and every
    /// op that changes something (successful reads are not mirrored).
    fn audit(
        &self,
        inst: &mut Inst<'_>,
        p: &Principal,
        op: &str,
        args: &Map<String, Value>,
        refused: Option<&RpcError>,
        now: Now,
    ) {
        if !inst.config().introspection_enabled {
            return;
        }
        let read = agentd_core::ext::command::table::find(op)
            .is_some_and(|s| s.reply == agentd_core::ext::command::table::ReplyKind::Message);
        if read && refused.is_none() {
            return;
        }
        let target = ["run", "handle", "workflow", "path", "id"]
            .iter()
            .find_map(|k| args.get(*k).cloned())
            .unwrap_or(Value::Null);
        let outcome = match refused {
            None => "ok".to_owned(),
            Some(e) => format!("refused {}", e.code()),
        };
        let _ = inst.push_event(
            FeedEvent::Other {
                kind: "audit",
                data: json!({"ts": now.epoch_ms, "principal": p.id, "role": p.role.as_str(),
                             "action": op, "target": target, "outcome": outcome}),
                owner: None,
            },
            now,
        );
    }

    fn record_turn(
        &mut self,
        inst: &mut Inst<'_>,
        owner: &Principal,
        context_id: &str,
        task_id: &str,
        message: &Message,
        now: Now,
    ) {
        let key = (owner.id.clone(), context_id.to_owned());
        let c = self
            .conversations
            .entry(key)
            .or_insert_with(|| Conversation {
                context_id: context_id.to_owned(),
                owner: owner.clone(),
                messages: VecDeque::new(),
                total_messages: 0,
                turns: 0,
                version: 0,
                task: None,
                updated: now.epoch_ms,
            });
        let text: Vec<String> = message
            .parts
            .iter()
            .map(|p| match serde_json::to_value(p) {
                Ok(Value::Object(o)) => o
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| Value::Object(o).to_string()),
                _ => String::new(),
            })
            .collect();
        if c.messages.len() == CONVERSATION_MESSAGES_KEPT {
            c.messages.pop_front();
        }
        c.messages.push_back(
            json!({"role": "user", "task": task_id, "text": text.join("\n"), "ts": now.epoch_ms}),
        );
        c.total_messages += 1;
        c.turns += 1;
        c.version += 1;
        c.task = Some(task_id.to_owned());
        c.updated = now.epoch_ms;
        let doc = conversation_doc(c);
        let id = conversation_key(&c.owner, &c.context_id);
        inst.view.conversations.insert(
            id,
            ViewItem {
                owner: Some(c.owner.id.clone()),
                doc: doc.clone(),
            },
        );
        let _ = inst.push_event(
            FeedEvent::Other {
                kind: "conversation",
                data: doc,
                owner: Some(c.owner.id.clone()),
            },
            now,
        );
    }

    // -----------------------------------------------------------------------------------
    // Commands

    fn command(&mut self, inst: &mut Inst<'_>, call: Call<'_>, now: Now) -> Result<(), RpcError> {
        if let Some(name) = call.workflow {
            let wf = self.workflows.get(name).cloned().ok_or_else(|| {
                RpcError::new(
                    ErrorKind::OpNotServed,
                    format!("workflow {name:?} is not loaded"),
                )
            })?;
            let inputs = Value::Object(call.args.clone());
            return self.start_run(inst, &call, wf, inputs, call.op.to_owned(), now);
        }
        match call.op {
            "workflow.run" => {
                let name = str_arg(call.args, "workflow").unwrap_or_default();
                let wf = self.workflows.get(name).cloned();
                let roles = wf.as_ref().map(|w| w.roles()).unwrap_or_default();
                // Whether the caller may run it comes first: a caller that may not is told
                // so, never whether the workflow exists.
                if !agentd_core::view::may_run(call.principal, name, &roles) {
                    return Err(RpcError::new(
                        ErrorKind::PermissionDenied,
                        format!("{} may not run workflow {name:?}", call.principal.id),
                    )
                    .with_meta("workflow", name));
                }
                let wf = wf.ok_or_else(|| {
                    invalid_args(
                        call.op,
                        "workflow",
                        format!("no workflow named {name:?} (the workflows are listed by the status op)"),
                    )
                })?;
                let inputs = call.args.get("inputs").cloned().unwrap_or(json!({}));
                if let Some(schema) = &wf.inputs_schema {
                    check_against(schema, &inputs, call.op, "inputs")?;
                }
                self.start_run(inst, &call, wf, inputs, "workflow.run".into(), now)
            }
            "workflow.status" => {
                let ids: Vec<String> = match str_arg(call.args, "run") {
                    Some(id) => vec![self.visible_run(id, call.principal)?],
                    None => {
                        let mut v: Vec<&Run> = self
                            .runs
                            .values()
                            .filter(|r| call.principal.may_see(&r.owner))
                            .collect();
                        v.sort_by_key(|r| (r.created, r.id.clone()));
                        v.into_iter().map(|r| r.id.clone()).collect()
                    }
                };
                let runs: Vec<Value> = ids
                    .iter()
                    .filter_map(|id| self.runs.get(id))
                    .map(|r| json!({"run": r.id, "workflow": r.workflow.name, "status": r.status.as_str(), "output": r.output, "error": r.error}))
                    .collect();
                answer(inst, call.id, json!({ "runs": runs }), now);
                Ok(())
            }
            "workflow.cancel" => {
                let id =
                    self.visible_run(str_arg(call.args, "run").unwrap_or(""), call.principal)?;
                self.refuse_final(&id)?;
                self.started(inst, &call, LinkKind::Run, &id, now)?;
                self.cancel_run(
                    inst,
                    &id,
                    &format!("cancelled by {}", call.principal.id),
                    true,
                    now,
                );
                done(
                    inst,
                    call.task_id,
                    None,
                    Some(format!("run {id} cancelled")),
                    now,
                );
                Ok(())
            }
            "workflow.signal" => {
                let name = str_arg(call.args, "name").unwrap_or("").to_owned();
                let payload = call.args.get("payload").cloned().unwrap_or(Value::Null);
                let targets: Vec<String> = match str_arg(call.args, "run") {
                    Some(id) => vec![self.visible_run(id, call.principal)?],
                    None => self
                        .runs
                        .values()
                        .filter(|r| r.owner.id == call.principal.id)
                        .map(|r| r.id.clone())
                        .collect(),
                };
                let waiting: Vec<String> = targets
                    .into_iter()
                    .filter(|id| {
                        self.runs.get(id).is_some_and(
                            |r| matches!(&r.waiting, Waiting::Signal { name: n, .. } if *n == name),
                        )
                    })
                    .collect();
                let link = waiting.first().cloned().unwrap_or_else(|| name.clone());
                self.started(inst, &call, LinkKind::Run, &link, now)?;
                for id in &waiting {
                    self.step_finished(inst, id, Ok(payload.clone()), now);
                }
                done(
                    inst,
                    call.task_id,
                    Some(json!({"signal": name, "delivered": waiting.len()})),
                    None,
                    now,
                );
                Ok(())
            }
            "plan.get" => {
                let p = call.principal;
                let run = match str_arg(call.args, "id") {
                    Some(ctx) => self
                        .runs
                        .values()
                        .filter(|r| r.context_id == ctx && p.may_see(&r.owner))
                        .max_by_key(|r| r.created),
                    None => self
                        .runs
                        .values()
                        .filter(|r| r.owner.id == p.id)
                        .max_by_key(|r| r.created),
                };
                let doc = match (run, str_arg(call.args, "id")) {
                    (Some(r), _) => {
                        json!({"conversation": r.context_id, "plan": r.plan(), "progress": r.progress()})
                    }
                    (None, Some(ctx)) => {
                        if !self
                            .conversations
                            .contains_key(&(p.id.clone(), ctx.to_owned()))
                            && !p.is_operator()
                        {
                            return Err(not_found("conversation"));
                        }
                        json!({"conversation": ctx, "plan": null, "progress": null})
                    }
                    (None, None) => json!({"conversation": "", "plan": null, "progress": null}),
                };
                answer(inst, call.id, doc, now);
                Ok(())
            }
            "run.get" => {
                let id =
                    self.visible_run(str_arg(call.args, "run").unwrap_or(""), call.principal)?;
                let r = &self.runs[&id];
                let mut doc = r.doc();
                let steps: Map<String, Value> = r
                    .workflow
                    .steps
                    .iter()
                    .zip(&r.steps)
                    .map(|(d, s)| {
                        (
                            d.id.clone(),
                            json!({"status": s.status, "attempt": s.attempt, "started": s.started,
                                   "finished": s.finished, "error": s.error, "wait": s.wait,
                                   "output": cut_strings(&s.output, RUN_GET_OUTPUT_BYTES)}),
                        )
                    })
                    .collect();
                doc["steps"] = Value::Object(steps);
                doc["vars"] = json!({"inputs": r.inputs});
                answer(inst, call.id, json!({ "run": doc }), now);
                Ok(())
            }
            "conversation.get" => {
                let id = str_arg(call.args, "id").unwrap_or("");
                let limit = call
                    .args
                    .get("limit")
                    .and_then(Value::as_u64)
                    .unwrap_or(200)
                    .min(1000) as usize;
                let p = call.principal;
                let c = self
                    .conversations
                    .values()
                    .find(|c| {
                        (c.context_id == id || conversation_key(&c.owner, &c.context_id) == id)
                            && p.may_see(&c.owner)
                    })
                    .ok_or_else(|| not_found("conversation"))?;
                let skip = c.messages.len().saturating_sub(limit);
                let messages: Vec<Value> = c
                    .messages
                    .iter()
                    .skip(skip)
                    .map(|m| cut_strings(m, 4096))
                    .collect();
                let doc = json!({"conversation": {
                    "id": conversation_key(&c.owner, &c.context_id),
                    "kind": "a2a",
                    "version": c.version,
                    "turns": c.turns,
                    "est_tokens": 0,
                    "principal": c.owner.id,
                    "task": c.task,
                    "skills": [],
                    "plan": null,
                    "summary": null,
                    "total_messages": c.total_messages,
                    "messages": messages,
                    "updated": c.updated,
                }});
                answer(inst, call.id, doc, now);
                Ok(())
            }
            "debug.events" => {
                let after = call.args.get("after").and_then(Value::as_u64).unwrap_or(0);
                let limit = call
                    .args
                    .get("limit")
                    .and_then(Value::as_u64)
                    .map(|l| l as usize)
                    .unwrap_or(logring::DEFAULT_LIMIT);
                let doc = logring::read(
                    after,
                    limit,
                    str_arg(call.args, "level"),
                    str_arg(call.args, "prefix"),
                );
                answer(inst, call.id, doc, now);
                Ok(())
            }
            "admin.drain" => {
                let reason = str_arg(call.args, "reason")
                    .unwrap_or("admin.drain")
                    .to_owned();
                self.started(inst, &call, LinkKind::Run, "instance", now)?;
                done(
                    inst,
                    call.task_id,
                    Some(json!({"ok": true, "state": "draining", "reason": reason})),
                    None,
                    now,
                );
                self.start_drain(inst, &reason, now);
                Ok(())
            }
            "admin.pause" => {
                let reason = str_arg(call.args, "reason")
                    .unwrap_or("admin.pause")
                    .to_owned();
                if let Some(id) = str_arg(call.args, "run") {
                    let id = self.any_run(id)?;
                    self.refuse_final(&id)?;
                    self.started(inst, &call, LinkKind::Run, &id, now)?;
                    if let Some(r) = self.runs.get_mut(&id) {
                        r.held = true;
                        if r.waiting == Waiting::None {
                            r.status = RunStatus::Paused;
                        }
                    }
                    self.run_changed(inst, &id, now);
                    done(
                        inst,
                        call.task_id,
                        Some(json!({"ok": true, "paused": id})),
                        None,
                        now,
                    );
                } else {
                    self.started(inst, &call, LinkKind::Run, "instance", now)?;
                    inst.set_paused(true, &reason, now);
                    tracing::info!(%reason, "instance paused");
                    done(
                        inst,
                        call.task_id,
                        Some(json!({"ok": true, "state": "paused", "reason": reason})),
                        None,
                        now,
                    );
                }
                Ok(())
            }
            "admin.resume" => {
                if let Some(id) = str_arg(call.args, "run") {
                    let id = self.any_run(id)?;
                    self.refuse_final(&id)?;
                    self.started(inst, &call, LinkKind::Run, &id, now)?;
                    if let Some(r) = self.runs.get_mut(&id) {
                        r.held = false;
                    }
                    self.advance(inst, &id, now);
                    done(
                        inst,
                        call.task_id,
                        Some(json!({"ok": true, "resumed": id})),
                        None,
                        now,
                    );
                } else {
                    self.started(inst, &call, LinkKind::Run, "instance", now)?;
                    inst.set_paused(false, "", now);
                    tracing::info!("instance resumed");
                    let held: Vec<String> = self
                        .runs
                        .values()
                        .filter(|r| r.status == RunStatus::Paused && !r.held)
                        .map(|r| r.id.clone())
                        .collect();
                    for id in held {
                        self.advance(inst, &id, now);
                    }
                    for turn in std::mem::take(&mut self.held_turns) {
                        self.on_effect(inst, turn, now);
                    }
                    done(
                        inst,
                        call.task_id,
                        Some(json!({"ok": true, "state": "running"})),
                        None,
                        now,
                    );
                }
                Ok(())
            }
            "admin.cancel" => {
                let target = str_arg(call.args, "run").unwrap_or("");
                let reason = str_arg(call.args, "reason")
                    .unwrap_or("admin.cancel")
                    .to_owned();
                // An agent's task (a turn or a subagent send), by its id: canceled, and
                // its agent told to stop.
                if let Some(who) = self.agent_tasks.get(target).cloned() {
                    self.started(inst, &call, LinkKind::Turn, target, now)?;
                    match &who {
                        AgentTask::Conversation => {
                            if let Some(a) = &self.conversation {
                                a.cancel(target);
                            }
                        }
                        AgentTask::Subagent(h) => {
                            if let Some(s) = self.subagents.get(h) {
                                s.process.cancel(target);
                            }
                        }
                    }
                    self.agent_tasks.remove(target);
                    let why = format!("cancelled by the operator: {reason}");
                    status(inst, target, TaskState::Canceled, why, now);
                    done(
                        inst,
                        call.task_id,
                        Some(json!({"ok": true, "cancelled": target})),
                        None,
                        now,
                    );
                    return Ok(());
                }
                // A run by its id, or by the task that tracks it.
                let id = self
                    .runs
                    .contains_key(target)
                    .then(|| target.to_owned())
                    .or_else(|| self.task_runs.get(target).cloned())
                    .ok_or_else(|| not_found("run"))?;
                self.refuse_final(&id)?;
                self.started(inst, &call, LinkKind::Run, &id, now)?;
                self.cancel_run(
                    inst,
                    &id,
                    &format!("cancelled by the operator: {reason}"),
                    true,
                    now,
                );
                done(
                    inst,
                    call.task_id,
                    Some(json!({"ok": true, "cancelled": id})),
                    None,
                    now,
                );
                Ok(())
            }
            "admin.set" => {
                let path = str_arg(call.args, "path").unwrap_or("");
                let value = call.args.get("value").cloned().unwrap_or(Value::Null);
                let parsed = match path {
                    "a2a.introspection.enabled" => json!(parse_bool(&value).ok_or_else(|| {
                        invalid_args(
                            call.op,
                            "value",
                            "a2a.introspection.enabled takes true or false",
                        )
                    })?),
                    "agent.approval" => {
                        let a = value.as_str().and_then(Approval::parse).ok_or_else(|| {
                            invalid_args(
                                call.op,
                                "value",
                                "agent.approval takes \"auto\", \"ask\" or \"deny\"",
                            )
                        })?;
                        json!(a.as_str())
                    }
                    other => {
                        return Err(invalid_args(
                            call.op,
                            "path",
                            format!(
                                "{other:?} is not settable at run time; the settable paths are {}",
                                agentd_core::ext::command::table::SETTABLE_PATHS.join(", ")
                            ),
                        ))
                    }
                };
                self.started(inst, &call, LinkKind::Run, "instance", now)?;
                match path {
                    "a2a.introspection.enabled" => {
                        let on = parsed == json!(true);
                        inst.set_introspection(on, "admin.set", now);
                        logring::set_recording(on);
                    }
                    _ => {
                        self.approval =
                            Approval::parse(parsed.as_str().unwrap_or("auto")).unwrap_or_default();
                        let _ = inst.push_event(
                            FeedEvent::Other {
                                kind: "config",
                                data: json!({"paths": [path], "source": "admin.set"}),
                                owner: None,
                            },
                            now,
                        );
                    }
                }
                tracing::info!(path, value = %parsed, by = %call.principal.id, "admin.set");
                done(
                    inst,
                    call.task_id,
                    Some(json!({"path": path, "value": parsed})),
                    None,
                    now,
                );
                Ok(())
            }
            "subagent.send" => {
                let handle = str_arg(call.args, "handle").unwrap_or("").to_owned();
                let text = str_arg(call.args, "message").unwrap_or("").to_owned();
                self.ensure_subagent(&handle, call.principal, &text, now)?;
                self.started(inst, &call, LinkKind::Subagent, &handle, now)?;
                let task_id = call.task_id.unwrap_or_default().to_owned();
                let turn = TurnIn {
                    task: task_id.clone(),
                    context: call.context_id.to_owned(),
                    principal: call.principal.id.clone(),
                    parts: vec![Part::text(text.clone())],
                };
                let sub = self.subagents.get_mut(&handle).expect("ensured above");
                sub.attempt += 1;
                sub.instruction = json!(text);
                sub.status = "working";
                sub.updated = now.epoch_ms;
                match sub.process.turn(turn) {
                    Ok(()) => {
                        self.agent_tasks
                            .insert(task_id, AgentTask::Subagent(handle.clone()));
                    }
                    Err(e) => status(inst, &task_id, TaskState::Failed, e.to_string(), now),
                }
                self.subagent_changed(inst, &handle, now);
                Ok(())
            }
            "subagent.kill" => {
                let handle = self
                    .visible_subagent(str_arg(call.args, "handle").unwrap_or(""), call.principal)?;
                let reason = str_arg(call.args, "reason")
                    .unwrap_or("subagent.kill")
                    .to_owned();
                self.started(inst, &call, LinkKind::Subagent, &handle, now)?;
                let sub = self.subagents.get_mut(&handle).expect("visible above");
                sub.process.kill(&call.principal.id, &reason);
                sub.status = "killed";
                sub.error = Some(format!("killed by {}: {reason}", call.principal.id));
                sub.updated = now.epoch_ms;
                self.subagent_changed(inst, &handle, now);
                done(
                    inst,
                    call.task_id,
                    Some(json!({"ok": true, "handle": handle})),
                    None,
                    now,
                );
                Ok(())
            }
            "subagent.status" => {
                let handle = self
                    .visible_subagent(str_arg(call.args, "handle").unwrap_or(""), call.principal)?;
                let s = &self.subagents[&handle];
                let mut doc = json!({"handle": s.handle, "status": s.status, "mode": "process", "result": s.result});
                if let Some(e) = &s.error {
                    doc["error"] = json!(e);
                }
                answer(inst, call.id, doc, now);
                Ok(())
            }
            "subagent.get" => {
                let handle = self
                    .visible_subagent(str_arg(call.args, "handle").unwrap_or(""), call.principal)?;
                let s = &self.subagents[&handle];
                let doc = json!({"subagent": {
                    "handle": s.handle, "mode": "process", "status": s.status, "attempt": s.attempt,
                    "tokens": 0, "instruction": s.instruction, "result": s.result, "error": s.error,
                    "requested_by": s.requested_by, "created": s.created, "updated": s.updated,
                    "node": null,
                }});
                answer(inst, call.id, doc, now);
                Ok(())
            }
            other => Err(RpcError::new(
                ErrorKind::OpNotServed,
                format!("command {other:?} is not served by this instance's runtime"),
            )
            .with_meta("op", other)),
        }
    }

    /// Creates the call's task, tracking `link`. A client that already left has no task to
    /// start: the work is not done either.
    fn started(
        &self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        kind: LinkKind,
        id: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        match inst.handle_completion(
            Completion::CommandStarted {
                call: call.id,
                link: Link {
                    kind,
                    id: id.to_owned(),
                },
            },
            now,
        ) {
            Ok(()) => Ok(()),
            Err(e) => Err(RpcError::new(
                ErrorKind::Internal,
                format!("the task could not be started: {e:?}"),
            )),
        }
    }

    fn visible_run(&self, id: &str, p: &Principal) -> Result<String, RpcError> {
        match self.runs.get(id) {
            Some(r) if p.may_see(&r.owner) => Ok(r.id.clone()),
            _ => Err(not_found("run")),
        }
    }

    fn any_run(&self, id: &str) -> Result<String, RpcError> {
        self.runs
            .get(id)
            .map(|r| r.id.clone())
            .ok_or_else(|| not_found("run"))
    }

    fn refuse_final(&self, id: &str) -> Result<(), RpcError> {
        let r = &self.runs[id];
        if r.status.is_final() {
            return Err(RpcError::new(
                ErrorKind::TaskNotCancelable,
                format!("run {id} is already {}", r.status.as_str()),
            )
            .with_meta("run", id));
        }
        Ok(())
    }

    /// The subagent a handle names for this caller, starting its process on first use.
    /// A handle is `<kind>` or `<kind>:<label>`, where the kind is a `[[subagents]]` name;
    /// a handle another principal holds is "no such subagent" to everyone else.
    fn ensure_subagent(
        &mut self,
        handle: &str,
        p: &Principal,
        text: &str,
        now: Now,
    ) -> Result<(), RpcError> {
        if let Some(s) = self.subagents.get(handle) {
            return if p.may_see(&s.owner) {
                Ok(())
            } else {
                Err(not_found("subagent"))
            };
        }
        let kind = handle.split(':').next().unwrap_or("");
        let Some(spec) = self.subagent_kinds.get(kind) else {
            let kinds: Vec<&str> = self.subagent_kinds.keys().map(String::as_str).collect();
            return Err(invalid_args(
                "subagent.send",
                "handle",
                if kinds.is_empty() {
                    "no subagents are configured on this instance ([[subagents]])".to_owned()
                } else {
                    format!("{kind:?} is not a subagent kind; a handle is <kind> or <kind>:<label>, and the kinds are {}", kinds.join(", "))
                },
            ));
        };
        if handle.len() > 128 || handle.chars().any(|c| c.is_control() || c == '/') {
            return Err(invalid_args(
                "subagent.send",
                "handle",
                "at most 128 characters, no control characters or slashes",
            ));
        }
        let mut spec = spec.clone();
        spec.name = handle.to_owned();
        let process = AgentProcess::new(spec, self.agent_tx.clone()).map_err(|e| {
            RpcError::new(
                ErrorKind::Internal,
                format!("subagent {handle} cannot start: {e}"),
            )
        })?;
        tracing::info!(%handle, owner = %p.id, "subagent created");
        self.subagents.insert(
            handle.to_owned(),
            Subagent {
                handle: handle.to_owned(),
                owner: p.clone(),
                process,
                status: "idle",
                attempt: 0,
                instruction: json!(text),
                result: Value::Null,
                error: None,
                requested_by: p.id.clone(),
                created: now.epoch_ms,
                updated: now.epoch_ms,
            },
        );
        Ok(())
    }

    fn visible_subagent(&self, handle: &str, p: &Principal) -> Result<String, RpcError> {
        match self.subagents.get(handle) {
            Some(s) if p.may_see(&s.owner) => Ok(s.handle.clone()),
            _ => Err(not_found("subagent")),
        }
    }

    fn subagent_changed(&self, inst: &mut Inst<'_>, handle: &str, now: Now) {
        if let Some(s) = self.subagents.get(handle) {
            push(inst, "subagent", s.feed_doc(), None, now);
        }
    }

    /// What an agent process said, applied to its task (and to its subagent's state).
    fn on_agent_event(&mut self, inst: &mut Inst<'_>, ev: AgentEvent, now: Now) {
        let subagent = (ev.agent != CONVERSATION_AGENT && self.subagents.contains_key(&ev.agent))
            .then(|| ev.agent.clone());
        match &ev.kind {
            AgentEventKind::Started { pid, restarts } => {
                tracing::info!(agent = %ev.agent, pid, restarts, "agent process started");
            }
            AgentEventKind::StartFailed { error, .. } => {
                tracing::warn!(agent = %ev.agent, %error, "agent process could not start");
                if let Some(h) = &subagent {
                    self.set_subagent(inst, h, "crashed", Some(error.clone()), None, now);
                }
            }
            AgentEventKind::Exited {
                description,
                in_flight,
            } => {
                tracing::warn!(agent = %ev.agent, %description, in_flight = in_flight.len(), "agent process ended");
                if let Some(h) = &subagent {
                    let killed = self.subagents.get(h).is_some_and(|s| s.status == "killed");
                    if !killed {
                        self.set_subagent(
                            inst,
                            h,
                            "crashed",
                            Some(format!("agent process {h} {description}")),
                            None,
                            now,
                        );
                    }
                }
            }
            _ => {}
        }
        let Some(task_id) = ev.task.clone() else {
            return;
        };
        let is_sub_task = matches!(self.agent_tasks.get(&task_id), Some(AgentTask::Subagent(_)));
        match &ev.kind {
            AgentEventKind::Reply { parts } if is_sub_task => {
                // A subagent's answer completes its subagent.send task with the op's result.
                let text = parts_text(parts);
                let handle = subagent.clone().unwrap_or_default();
                self.agent_tasks.remove(&task_id);
                done(
                    inst,
                    Some(&task_id),
                    Some(json!({"ok": true, "handle": handle, "reply": text})),
                    Some(text.clone()),
                    now,
                );
                self.set_subagent(inst, &handle, "idle", None, Some(json!(text)), now);
                return;
            }
            AgentEventKind::Reply { parts } => {
                self.record_reply(inst, &task_id, parts, now);
                self.agent_tasks.remove(&task_id);
            }
            AgentEventKind::Fail { error } => {
                self.agent_tasks.remove(&task_id);
                if let Some(h) = &subagent {
                    // A process that ended keeps saying so; only a turn that failed on its
                    // own leaves the subagent merely "failed".
                    let now_status = self.subagents.get(h).map_or("failed", |s| s.status);
                    let state = if matches!(now_status, "killed" | "crashed") {
                        now_status
                    } else {
                        "failed"
                    };
                    self.set_subagent(inst, h, state, Some(error.clone()), None, now);
                }
            }
            _ => {}
        }
        for c in agent::to_completions(&ev) {
            complete(inst, c, now);
        }
    }

    fn set_subagent(
        &mut self,
        inst: &mut Inst<'_>,
        handle: &str,
        state: &'static str,
        error: Option<String>,
        result: Option<Value>,
        now: Now,
    ) {
        if let Some(s) = self.subagents.get_mut(handle) {
            s.status = state;
            if error.is_some() {
                s.error = error;
            }
            if let Some(r) = result {
                s.result = r;
                s.error = None;
            }
            s.updated = now.epoch_ms;
        }
        self.subagent_changed(inst, handle, now);
    }

    /// The conversation agent's answer, kept in its conversation.
    fn record_reply(&mut self, inst: &mut Inst<'_>, task_id: &str, parts: &[Part], now: Now) {
        let Some(c) = self
            .conversations
            .values_mut()
            .find(|c| c.task.as_deref() == Some(task_id))
        else {
            return;
        };
        if c.messages.len() == CONVERSATION_MESSAGES_KEPT {
            c.messages.pop_front();
        }
        c.messages.push_back(json!({"role": "agent", "task": task_id, "text": parts_text(parts), "ts": now.epoch_ms}));
        c.total_messages += 1;
        c.version += 1;
        c.updated = now.epoch_ms;
        let doc = conversation_doc(c);
        let owner = c.owner.id.clone();
        let id = conversation_key(&c.owner, &c.context_id);
        inst.view.conversations.insert(
            id,
            ViewItem {
                owner: Some(owner.clone()),
                doc: doc.clone(),
            },
        );
        push(inst, "conversation", doc, Some(owner), now);
    }

    // -----------------------------------------------------------------------------------
    // Runs

    fn start_run(
        &mut self,
        inst: &mut Inst<'_>,
        call: &Call<'_>,
        wf: Arc<Workflow>,
        inputs: Value,
        start: String,
        now: Now,
    ) -> Result<(), RpcError> {
        let id = format!("run-{}-{}", base36(now.epoch_ms), self.next_run);
        self.next_run += 1;
        let task_id = call.task_id.unwrap_or_default().to_owned();
        self.started(inst, call, LinkKind::Run, &id, now)?;
        let run = Run {
            id: id.clone(),
            steps: vec![
                StepState {
                    status: "pending",
                    wait: Value::Null,
                    output: Value::Null,
                    ..Default::default()
                };
                wf.steps.len()
            ],
            workflow: wf,
            owner: call.principal.clone(),
            task_id: task_id.clone(),
            context_id: call.context_id.to_owned(),
            start,
            inputs,
            status: RunStatus::Running,
            held: false,
            current: Some(0),
            waiting: Waiting::None,
            cancel: Arc::new(AtomicBool::new(false)),
            created: now.epoch_ms,
            updated: now.epoch_ms,
            finished: None,
            output: Value::Null,
            error: None,
        };
        tracing::info!(run = %id, workflow = %run.workflow.name, principal = %run.owner.id, "run started");
        self.runs.insert(id.clone(), run);
        self.task_runs.insert(task_id, id.clone());
        self.advance(inst, &id, now);
        Ok(())
    }

    /// Takes the run as far as it goes without waiting: starts its current step, and keeps
    /// going through steps that finish at once.
    fn advance(&mut self, inst: &mut Inst<'_>, id: &str, now: Now) {
        loop {
            let paused = inst.paused;
            let Some(r) = self.runs.get_mut(id) else {
                return;
            };
            if r.status.is_final() || r.waiting != Waiting::None {
                return;
            }
            if paused || r.held {
                r.status = RunStatus::Paused;
                self.run_changed(inst, id, now);
                return;
            }
            let Some(i) = r.current else {
                let output = r
                    .workflow
                    .steps
                    .iter()
                    .zip(&r.steps)
                    .rev()
                    .find(|(_, s)| s.finished.is_some())
                    .map(|(_, s)| s.output.clone())
                    .unwrap_or(Value::Null);
                self.finish(inst, id, Ok(output), now);
                return;
            };
            r.status = RunStatus::Running;
            let step = r.workflow.steps[i].clone();
            let vars = r.vars();
            let approved = r.steps[i].wait.get("approved").is_some();
            let st = &mut r.steps[i];
            st.attempt += 1;
            st.status = "running";
            st.started = Some(now.epoch_ms);
            let attempt = st.attempt;
            r.updated = now.epoch_ms;
            let task_id = r.task_id.clone();
            push(
                inst,
                "step",
                json!({"run": id, "step": step.id, "kind": step.kind.name(), "phase": "start", "attempt": attempt}),
                None,
                now,
            );
            status(
                inst,
                &task_id,
                TaskState::Working,
                format!("step {} ({}) started", step.id, step.kind.name()),
                now,
            );
            match &step.kind {
                StepKind::Start => {
                    let args = self.runs[id].inputs.clone();
                    self.step_finished(inst, id, Ok(json!({ "args": args })), now);
                }
                StepKind::Exec {
                    program,
                    args,
                    env,
                    timeout_ms,
                    output,
                } => {
                    let rendered = args
                        .iter()
                        .map(|a| workflow::render(a, &vars))
                        .collect::<Result<Vec<_>, _>>()
                        .and_then(|args| {
                            let env = env
                                .iter()
                                .map(|(k, v)| Ok((k.clone(), workflow::render(v, &vars)?)))
                                .collect::<Result<Vec<_>, String>>()?;
                            Ok((args, env))
                        });
                    let (args, env) = match rendered {
                        Ok(x) => x,
                        Err(e) => {
                            self.step_finished(inst, id, Err(e), now);
                            continue;
                        }
                    };
                    let job = ExecJob {
                        program: program.clone(),
                        args,
                        env,
                        timeout: Duration::from_millis(*timeout_ms),
                        output: *output,
                    };
                    match self.approval {
                        Approval::Deny => {
                            let e = format!(
                                "exec steps are refused here (agent.approval = deny): {}",
                                job.program
                            );
                            self.step_finished(inst, id, Err(e), now);
                            continue;
                        }
                        Approval::Ask if !approved => {
                            let prompt = format!(
                                "Approve running {} {}? Answer {{\"approve\": true}} or {{\"approve\": false}}.",
                                job.program,
                                job.args.join(" ")
                            );
                            let schema = json!({"type": "object", "properties": {"approve": {"type": "boolean"}}, "required": ["approve"]});
                            if let Some(r) = self.runs.get_mut(id) {
                                r.steps[i].wait =
                                    json!({"approval": {"program": job.program, "args": job.args}});
                                r.waiting = Waiting::Gate { approval: true };
                            }
                            self.open_gate(
                                inst,
                                id,
                                prompt,
                                Some(schema),
                                Some("operator".into()),
                                now,
                            );
                            return;
                        }
                        _ => {}
                    }
                    let Some(r) = self.runs.get_mut(id) else {
                        return;
                    };
                    r.waiting = Waiting::Worker;
                    let cancel = r.cancel.clone();
                    let tx = self.tx.clone();
                    let run = id.to_owned();
                    let spawned =
                        thread::Builder::new()
                            .name(format!("exec-{run}"))
                            .spawn(move || {
                                let result = exec::run(&job, &cancel);
                                let _ = tx.send(Msg::StepDone {
                                    run,
                                    step: i,
                                    attempt,
                                    result,
                                });
                            });
                    if let Err(e) = spawned {
                        r.waiting = Waiting::None;
                        self.step_finished(
                            inst,
                            id,
                            Err(format!("cannot start a worker: {e}")),
                            now,
                        );
                        continue;
                    }
                    self.run_changed(inst, id, now);
                    return;
                }
                StepKind::Human {
                    prompt,
                    schema,
                    channel,
                } => {
                    let text = match workflow::render(prompt, &vars) {
                        Ok(t) => t,
                        Err(e) => {
                            self.step_finished(inst, id, Err(e), now);
                            continue;
                        }
                    };
                    if let Some(r) = self.runs.get_mut(id) {
                        r.waiting = Waiting::Gate { approval: false };
                        r.steps[i].wait = json!({ "question": text });
                    }
                    self.open_gate(inst, id, text, schema.clone(), channel.clone(), now);
                    return;
                }
                StepKind::Signal { name, timeout_ms } => {
                    if let Some(r) = self.runs.get_mut(id) {
                        r.waiting = Waiting::Signal {
                            name: name.clone(),
                            until_mono: timeout_ms.map(|t| now.mono_ms + t),
                        };
                        r.status = RunStatus::Waiting;
                        r.steps[i].status = "waiting";
                        r.steps[i].wait = json!({ "signal": name });
                    }
                    self.run_changed(inst, id, now);
                    return;
                }
                StepKind::Send { .. } | StepKind::Delegate { .. } => {
                    if !self.start_peer_step(id, i, attempt, &step.kind, &vars) {
                        continue;
                    }
                    self.run_changed(inst, id, now);
                    return;
                }
            }
        }
    }

    /// Starts an `a2a.send` or `a2a.delegate` step on a worker; false when it failed at once
    /// (the failure is already reported to the run).
    fn start_peer_step(
        &mut self,
        id: &str,
        i: usize,
        attempt: u32,
        kind: &StepKind,
        vars: &Value,
    ) -> bool {
        let built = (|| -> Result<(Arc<PeerClient>, OutboundSend, u64), String> {
            let (peer, send, timeout_ms) = match kind {
                StepKind::Send {
                    peer,
                    text,
                    timeout_ms,
                } => {
                    let text = workflow::render(text, vars)?;
                    (
                        peer,
                        OutboundSend::message(vec![Part::text(text)]),
                        *timeout_ms,
                    )
                }
                StepKind::Delegate {
                    peer,
                    target,
                    timeout_ms,
                } => {
                    let send = match target {
                        workflow::DelegateTarget::Objective(o) => {
                            OutboundSend::message(vec![Part::text(workflow::render(o, vars)?)])
                        }
                        workflow::DelegateTarget::Command { op, args } => {
                            let Value::Object(args) = workflow::render_value(args, vars)? else {
                                return Err("the command's arguments are not an object".into());
                            };
                            OutboundSend::command(op.clone(), args)
                        }
                    };
                    (peer, send, *timeout_ms)
                }
                _ => return Err("not a peer step".into()),
            };
            let client = self
                .peers
                .get(peer)
                .cloned()
                .ok_or_else(|| format!("peer {peer:?} is not configured"))?;
            Ok((client, send, timeout_ms))
        })();
        let (client, mut send, timeout_ms) = match built {
            Ok(x) => x,
            Err(e) => {
                let _ = self.tx.send(Msg::StepDone {
                    run: id.to_owned(),
                    step: i,
                    attempt,
                    result: Err(e),
                });
                if let Some(r) = self.runs.get_mut(id) {
                    r.waiting = Waiting::Worker;
                }
                return true;
            }
        };
        let Some(r) = self.runs.get_mut(id) else {
            return false;
        };
        // The same message id for the same step of the same run: a peer can tell a repeat.
        send.message_id = Some(format!("{}.{}.{attempt}", r.id, r.workflow.steps[i].id));
        r.waiting = Waiting::Worker;
        let cancel = r.cancel.clone();
        let tx = self.tx.clone();
        let run = id.to_owned();
        let spawned = thread::Builder::new()
            .name(format!("peer-{run}"))
            .spawn(move || {
                let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms);
                let result = client
                    .send(send, deadline, &cancel)
                    .map_err(|e| peer_failure(client.name(), &e))
                    .and_then(|o| peer_output(client.name(), o));
                let _ = tx.send(Msg::StepDone {
                    run,
                    step: i,
                    attempt,
                    result,
                });
            });
        if let Err(e) = spawned {
            let _ = self.tx.send(Msg::StepDone {
                run: id.to_owned(),
                step: i,
                attempt,
                result: Err(format!("cannot start a worker: {e}")),
            });
        }
        true
    }

    /// Puts the run's task in `input-required` with the question, its schema and channel.
    fn open_gate(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        question: String,
        schema: Option<Value>,
        channel: Option<String>,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        r.status = RunStatus::Waiting;
        if let Some(i) = r.current {
            r.steps[i].status = "waiting";
        }
        let task_id = r.task_id.clone();
        self.gates.insert(task_id.clone(), id.to_owned());
        complete(
            inst,
            Completion::Ask {
                task_id: task_id.clone(),
                schema,
                channel,
            },
            now,
        );
        status(inst, &task_id, TaskState::InputRequired, question, now);
        self.run_changed(inst, id, now);
    }

    /// The gate's task was answered (the core held the answer to the gate's schema).
    fn answer_gate(&mut self, inst: &mut Inst<'_>, id: &str, message: &Message, now: Now) {
        let answer = agentd_core::rpc::gate_answer(message);
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        let approval = matches!(r.waiting, Waiting::Gate { approval: true });
        r.waiting = Waiting::None;
        r.status = RunStatus::Running;
        if approval {
            let Some(i) = r.current else { return };
            if answer.get("approve") == Some(&Value::Bool(true)) {
                r.steps[i].wait["approved"] = json!(true);
                // The exec step starts over, now approved: its attempt is not counted twice.
                r.steps[i].attempt = r.steps[i].attempt.saturating_sub(1);
                self.advance(inst, id, now);
            } else {
                self.step_finished(
                    inst,
                    id,
                    Err("the operator did not approve running it".into()),
                    now,
                );
            }
            return;
        }
        self.step_finished(inst, id, Ok(answer), now);
    }

    fn on_step_done(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        step: usize,
        attempt: u32,
        result: Result<Value, String>,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        // A late report for a step the run left (cancelled, or a new attempt) changes nothing.
        if r.status.is_final() || r.current != Some(step) || r.steps[step].attempt != attempt {
            return;
        }
        r.waiting = Waiting::None;
        self.step_finished(inst, id, result, now);
    }

    /// Records the current step's end and moves on: to the next step, or to the run's end.
    fn step_finished(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        result: Result<Value, String>,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        let Some(i) = r.current else { return };
        let step = r.workflow.steps[i].clone();
        r.waiting = Waiting::None;
        let st = &mut r.steps[i];
        st.finished = Some(now.epoch_ms);
        let (state, err) = match &result {
            Ok(v) => {
                st.status = "done";
                st.output = v.clone();
                ("done", None)
            }
            Err(e) => {
                st.status = "failed";
                st.error = Some(e.clone());
                ("failed", Some(e.clone()))
            }
        };
        let attempt = st.attempt;
        r.updated = now.epoch_ms;
        let (run_id, task_id) = (r.id.clone(), r.task_id.clone());
        push(
            inst,
            "step",
            json!({"run": run_id, "step": step.id, "phase": "done", "status": state, "attempt": attempt, "tokens": 0, "err": err}),
            None,
            now,
        );
        match result {
            Ok(_) => {
                r.current = step.next;
                if r.status != RunStatus::Paused {
                    r.status = RunStatus::Running;
                }
                status(
                    inst,
                    &task_id,
                    TaskState::Working,
                    format!("step {} done", step.id),
                    now,
                );
                self.run_changed(inst, id, now);
                self.advance(inst, id, now);
            }
            Err(e) => {
                tracing::info!(run = %id, step = %step.id, error = %e, "step failed");
                self.finish(inst, id, Err(format!("step {} failed: {e}", step.id)), now);
            }
        }
    }

    fn finish(&mut self, inst: &mut Inst<'_>, id: &str, result: Result<Value, String>, now: Now) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        r.finished = Some(now.epoch_ms);
        r.updated = now.epoch_ms;
        r.waiting = Waiting::None;
        let task_id = r.task_id.clone();
        let name = r.workflow.name.clone();
        match result {
            Ok(output) => {
                r.status = RunStatus::Completed;
                r.output = output.clone();
                done(
                    inst,
                    Some(&task_id),
                    Some(output),
                    Some(format!("workflow {name} completed")),
                    now,
                );
            }
            Err(e) => {
                r.status = RunStatus::Failed;
                r.error = Some(e.clone());
                status(inst, &task_id, TaskState::Failed, e, now);
            }
        }
        tracing::info!(run = %id, status = r.status.as_str(), "run finished");
        self.gates.remove(&task_id);
        self.run_changed(inst, id, now);
        self.retire(inst, id, now);
    }

    fn cancel_run(
        &mut self,
        inst: &mut Inst<'_>,
        id: &str,
        reason: &str,
        cancel_task: bool,
        now: Now,
    ) {
        let Some(r) = self.runs.get_mut(id) else {
            return;
        };
        if r.status.is_final() {
            return;
        }
        r.cancel.store(true, Ordering::Relaxed);
        r.status = RunStatus::Cancelled;
        r.error = Some(reason.to_owned());
        r.finished = Some(now.epoch_ms);
        r.updated = now.epoch_ms;
        r.waiting = Waiting::None;
        if let Some(i) = r.current {
            if r.steps[i].status == "running" || r.steps[i].status == "waiting" {
                r.steps[i].status = "cancelled";
                r.steps[i].finished = Some(now.epoch_ms);
            }
        }
        let task_id = r.task_id.clone();
        self.gates.remove(&task_id);
        if cancel_task {
            status(inst, &task_id, TaskState::Canceled, reason.to_owned(), now);
        }
        tracing::info!(run = %id, %reason, "run cancelled");
        self.run_changed(inst, id, now);
        self.retire(inst, id, now);
    }

    /// Publishes the run's state: the status view and a `run` feed event.
    fn run_changed(&self, inst: &mut Inst<'_>, id: &str, now: Now) {
        let Some(r) = self.runs.get(id) else { return };
        let doc = r.doc();
        inst.view.runs.insert(
            id.to_owned(),
            ViewItem {
                owner: Some(r.owner.id.clone()),
                doc: doc.clone(),
            },
        );
        push(inst, "run", doc, Some(r.owner.id.clone()), now);
    }

    /// Keeps finished runs bounded.
    fn retire(&mut self, inst: &mut Inst<'_>, id: &str, now: Now) {
        self.finished.push_back(id.to_owned());
        while self.finished.len() > FINISHED_RUNS_KEPT {
            let Some(old) = self.finished.pop_front() else {
                break;
            };
            if let Some(r) = self.runs.remove(&old) {
                self.task_runs.remove(&r.task_id);
                inst.view.runs.remove(&old);
                push(
                    inst,
                    "run.removed",
                    json!({"id": old}),
                    Some(r.owner.id.clone()),
                    now,
                );
            }
        }
    }

    fn on_timers(&mut self, inst: &mut Inst<'_>, now: Now) {
        let expired: Vec<(String, String)> = self
            .runs
            .values()
            .filter_map(|r| match &r.waiting {
                Waiting::Signal {
                    name,
                    until_mono: Some(t),
                } if now.mono_ms >= *t => Some((r.id.clone(), name.clone())),
                _ => None,
            })
            .collect();
        for (id, name) in expired {
            self.step_finished(
                inst,
                &id,
                Err(format!("no {name:?} signal arrived in time")),
                now,
            );
        }
    }

    // -----------------------------------------------------------------------------------
    // Drain

    fn start_drain(&mut self, inst: &mut Inst<'_>, reason: &str, now: Now) {
        if self.draining.is_some() {
            return;
        }
        tracing::info!(%reason, "draining: finishing the work in flight, accepting no new work");
        inst.set_draining(reason, now);
        self.draining = Some((reason.to_owned(), None));
    }

    /// Whether the drain is over: nothing runs any more (runs parked at a gate or waiting
    /// for a signal cannot finish on their own and are reported), and the last answers left
    /// or the grace period passed.
    fn drain_done(&mut self, inst: &mut Inst<'_>, now: Now) -> bool {
        let Some((_, quiet_since)) = &mut self.draining else {
            return false;
        };
        // Work that cannot end on its own while it waits: a run waiting for a signal or
        // held by a pause, and turns held by a pause. Their tasks count as working, so they
        // are taken off the count. (A gate's task is input-required: not counted at all.)
        let parked: Vec<&String> = self
            .runs
            .values()
            .filter(|r| {
                !r.status.is_final()
                    && (matches!(r.waiting, Waiting::Signal { .. })
                        || (r.status == RunStatus::Paused && r.waiting == Waiting::None))
            })
            .map(|r| &r.task_id)
            .chain(self.held_turns.iter().filter_map(|e| match e {
                Effect::Turn { task_id, .. } => Some(task_id),
                _ => None,
            }))
            .collect();
        let busy = inst.tasks_in_flight().saturating_sub(parked.len());
        if busy > 0 {
            *quiet_since = None;
            return false;
        }
        let since = *quiet_since.get_or_insert(now.mono_ms);
        if inst.waiters() > 0 && now.mono_ms - since < DRAIN_GRACE.as_millis() as u64 {
            return false;
        }
        if !parked.is_empty() {
            tracing::warn!(
                parked = parked.len(),
                "runs still wait at a gate or for a signal; the memory store does not keep them"
            );
        }
        true
    }
}

/// One command call, as the runtime reads it.
struct Call<'a> {
    id: CallId,
    op: &'a str,
    args: &'a Map<String, Value>,
    principal: &'a Principal,
    context_id: &'a str,
    task_id: Option<&'a str>,
    workflow: Option<&'a str>,
}

fn complete(inst: &mut Inst<'_>, c: Completion, now: Now) {
    if let Err(e) = inst.handle_completion(c, now) {
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

fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
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
    e.violations.push(agentd_core::errors::FieldViolation {
        field: format!("message.parts.data.agentd.{field}"),
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

fn conversation_key(owner: &Principal, context_id: &str) -> String {
    format!("{}/{}", owner.id, context_id)
}

fn conversation_doc(c: &Conversation) -> Value {
    json!({
        "id": conversation_key(&c.owner, &c.context_id),
        "contextId": c.context_id,
        "kind": "a2a",
        "version": c.version,
        "messages": c.total_messages,
        "est_tokens": 0,
        "turns": c.turns,
        "principal": c.owner.id,
        "skills": [],
        "plan": null,
        "updated": c.updated,
    })
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
            agentd_core::a2a::types::PartContent::Text(t) => t.clone(),
            agentd_core::a2a::types::PartContent::Data(d) => d.to_string(),
            _ => String::new(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Why a peer step failed, in words that name the peer.
fn peer_failure(peer: &str, e: &PeerError) -> String {
    format!("peer {peer}: {e}")
}

/// A peer's answer as the step's output: a Message's content; a task's `<id>.result`
/// artifact if it has one, else its artifacts (one data part as the data, text as text).
/// A task that stops to ask something cannot be answered from here, so the step fails.
fn peer_output(peer: &str, outcome: PeerOutcome) -> Result<Value, String> {
    fn content(parts: &[Part]) -> Value {
        if let [p] = parts {
            if let agentd_core::a2a::types::PartContent::Data(d) = &p.content {
                return d.clone();
            }
        }
        Value::String(parts_text(parts))
    }
    match outcome {
        PeerOutcome::Message(m) => Ok(content(&m.parts)),
        PeerOutcome::Task(t) => {
            if t.status.state != TaskState::Completed {
                let asks = t
                    .status
                    .message
                    .as_ref()
                    .map(|m| parts_text(&m.parts))
                    .unwrap_or_default();
                return Err(format!(
                    "peer {peer}: its task {} stopped in {}: {asks}",
                    t.id,
                    t.status.state.as_str()
                ));
            }
            let result = format!("{}.result", t.id);
            if let Some(a) = t.artifacts.iter().find(|a| a.artifact_id == result) {
                return Ok(content(&a.parts));
            }
            Ok(match t.artifacts.as_slice() {
                [] => t
                    .status
                    .message
                    .as_ref()
                    .map(|m| content(&m.parts))
                    .unwrap_or(Value::Null),
                [a] => content(&a.parts),
                many => Value::Array(
                    many.iter()
                        .map(|a| json!({"name": a.name, "output": content(&a.parts)}))
                        .collect(),
                ),
            })
        }
    }
}
