//! The daemon's shared state: configuration, the cards, the task store and who is watching
//! which task. What the instance needs the outside world to do leaves as an [`Effect`]
//! ([`Instance::poll_effect`]); what the outside world did comes back as a [`Completion`]
//! ([`Instance::handle_completion`]). An integrator embeds agentd by implementing those two
//! in their own event loop.

use crate::errors::RecordError;
use std::collections::{HashMap, VecDeque};
use std::task::Waker;

use crate::ready::{ConnKey, Ready};

use crate::a2a::card::{AgentCapabilities, AgentCard, AgentInterface};
use crate::a2a::types::{
    Artifact, Message, Part, StreamResponse, TaskArtifactUpdateEvent, TaskState,
    TaskStatusUpdateEvent,
};
use crate::a2a::PROTOCOL_VERSION;
use crate::auth::Principal;
use crate::errors::RpcError;
use crate::ext::annotations::Link;
use crate::ext::command::table::ReplyKind;
use crate::ext::command::{Commands, DeclaredCommand, RegisterError, Switches};
use crate::ext::registry::UNIX_BINDING_URI;
use crate::http::HttpLimits;
use crate::ids::Entropy;
use crate::tasks::{ContextIds, StoreError, TaskLimits, TaskStore};
use crate::time::Now;

/// What kind of socket a listener serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenerKind {
    /// A TCP listener, plain or TLS: the only kind that can declare an authentication scheme
    /// and so serve an extended card.
    Tcp,
    /// A unix domain socket at this path.
    Unix(String),
}

/// One listener as the core sees it: what its card advertises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerInfo {
    /// The socket kind: decides whether the listener can be loopback-trusted or advertise a
    /// scheme.
    pub kind: ListenerKind,
    /// The URL the card's interface names: `http://127.0.0.1:8420/` or `unix:///path`.
    pub url: String,
    /// A TCP listener bound to a loopback address: with no credential configured, its local
    /// callers are the operator.
    pub loopback: bool,
}

impl ListenerInfo {
    /// The origin the listener advertises: its URL without the trailing slash.
    pub fn origin(&self) -> &str {
        self.url.trim_end_matches('/')
    }
}

/// Deadlines and bounds of one connection, in milliseconds where they are times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Bounds of the HTTP/1.1 parser (head and body sizes) applied to every request on the
    /// connection.
    pub http: HttpLimits,
    /// A keep-alive connection with no request in progress closes after this.
    pub idle_timeout_ms: u64,
    /// A request head must arrive within this of its first byte (slowloris): else 408.
    pub header_timeout_ms: u64,
    /// A body must arrive within this of its head: else 408.
    pub body_timeout_ms: u64,
    /// A blocking SendMessage answers with the task as it stands after this.
    pub request_timeout_ms: u64,
    /// Output the peer has not read for this long closes the connection.
    pub write_timeout_ms: u64,
    /// A comment is sent on an SSE stream quiet for this long.
    pub sse_keepalive_ms: u64,
    /// Stream events queued for one slow reader before its stream is ended.
    pub stream_queue: usize,
    /// Output bytes buffered before the connection stops taking new work.
    pub max_output_bytes: usize,
    /// Unsent bytes of answers larger than `max_output_bytes` (a large task), over all
    /// connections: past it such an answer is refused LIMIT_REACHED, so slow readers of
    /// large tasks cannot take the daemon's memory. One such answer is always admitted when
    /// none is held, however large.
    pub large_answers_bytes: usize,
}

impl ConnLimits {
    /// The limits the daemon uses when its configuration sets none; a `const` so other defaults
    /// can be built from it.
    pub const DEFAULT: ConnLimits = ConnLimits {
        http: HttpLimits::DEFAULT,
        idle_timeout_ms: 60_000,
        header_timeout_ms: 10_000,
        body_timeout_ms: 30_000,
        request_timeout_ms: 120_000,
        write_timeout_ms: 30_000,
        sse_keepalive_ms: 15_000,
        stream_queue: 256,
        max_output_bytes: 256 * 1024,
        large_answers_bytes: 64 << 20,
    };
}

/// How an instance is set up.
#[derive(Clone, Debug)]
pub struct InstanceConfig {
    /// The card's `name`.
    pub name: String,
    /// The card's `description`: what callers are told the agent does.
    pub description: String,
    /// The build, as the card's `version`.
    pub version: String,
    /// Every listener the driver serves, by the index a driver passes to
    /// [`crate::Connection::new`]: each is an interface on the card.
    pub listeners: Vec<ListenerInfo>,
    /// Deadlines and bounds the driver passes to each [`crate::Connection::new`].
    pub conn: ConnLimits,
    /// Bounds of the task store: history, artifacts, task count and total bytes.
    pub tasks: TaskLimits,
    /// Stream events kept for SSE reconnection (`Last-Event-ID`).
    pub replay: crate::tasks::replay::ReplayLimits,
    /// `a2a.events.enabled`: declares the events extension.
    pub events_enabled: bool,
    /// `a2a.introspection.enabled`: serves the introspection ops.
    pub introspection_enabled: bool,
    /// `a2a.console.enabled`: the files served under `/console/`, which the host compiles
    /// in (empty: no console, and `/console` is 404 like any unknown path).
    pub console: &'static [crate::statics::StaticFile],
    /// `a2a.device_grant`: sign-in by the device authorization grant, and the
    /// `auth.device.*` ops.
    pub device_grant: crate::sessions::DeviceGrantConfig,
    /// The effective configuration, secrets redacted, as the `config` op reports it.
    pub config_document: serde_json::Value,
    /// Events the feed keeps for a reconnecting subscriber (`a2a.events.ring`).
    pub events_ring: usize,
    /// A feed stream ends with `goodbye` `deadline` after this long.
    pub events_stream_deadline_ms: u64,
    /// Under a steady flow of events, a feed subscriber takes them at most once per this
    /// many ms, or sooner once a batch waits (`a2a.events.batch_ms`; 0: at every event).
    pub events_batch_ms: u64,
    /// Credentials and rules: who callers are.
    pub auth: crate::auth::AuthConfig,
    /// `a2a.cors.origins`: the browser origins served.
    pub cors: crate::http::cors::CorsPolicy,
    /// TLS of the `https://` listeners, by listener index.
    pub tls: HashMap<usize, crate::tls::TlsListener>,
    /// `a2a.push`: push notifications and where webhooks may point.
    pub push: crate::push::PushPolicy,
    /// What the host serves: the host-served command ops it answers (any other is refused
    /// at once and is not on the card) and the card's skills. The default serves no op and
    /// lists no skill.
    pub host: crate::host::HostCapabilities,
    /// The card's `documentationUrl` (`agent.documentation_url`).
    pub documentation_url: Option<String>,
    /// The card's `iconUrl` (`agent.icon_url`).
    pub icon_url: Option<String>,
    /// The card's `provider` (`[agent.provider]`).
    pub provider: Option<crate::a2a::card::AgentProvider>,
    /// `Strict-Transport-Security: max-age=N` on every answer of a TLS listener; 0 sends
    /// none. Default one year.
    pub hsts_max_age_s: u64,
    /// Listeners behind a TLS-terminating proxy, and the proxies whose `X-Forwarded-For`
    /// names the client the limiters count against.
    pub proxy: crate::proxy::ProxyTrust,
}

/// `InstanceConfig::hsts_max_age_s` by default: a year.
pub const DEFAULT_HSTS_MAX_AGE_S: u64 = 31_536_000;

impl InstanceConfig {
    /// Whether a listener declares an authentication scheme (so has an extended card): a
    /// bearer, the device grant, or mutual TLS; never a unix socket.
    pub fn declares_scheme(&self, listener: usize) -> bool {
        let Some(l) = self.listeners.get(listener) else {
            return false;
        };
        l.kind == ListenerKind::Tcp
            && (self.auth.has_bearer() || self.device_grant.enabled || self.mtls(listener))
    }

    /// Whether a listener requires client certificates.
    pub fn mtls(&self, listener: usize) -> bool {
        self.tls.get(&listener).is_some_and(|t| t.client_auth)
    }
}

impl InstanceConfig {
    /// A configuration with the daemon's defaults for the given listeners: no credentials, no
    /// extensions enabled, no host ops; a driver then overrides what its configuration sets.
    pub fn new(listeners: Vec<ListenerInfo>) -> Self {
        InstanceConfig {
            name: "agentd".into(),
            description: "An A2A 1.0 agent daemon".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            listeners,
            conn: ConnLimits::DEFAULT,
            tasks: TaskLimits::DEFAULT,
            replay: crate::tasks::replay::ReplayLimits::DEFAULT,
            events_enabled: false,
            introspection_enabled: false,
            console: &[],
            device_grant: crate::sessions::DeviceGrantConfig::default(),
            config_document: serde_json::json!({}),
            events_ring: 1024,
            events_stream_deadline_ms: 600_000,
            events_batch_ms: 10,
            auth: crate::auth::AuthConfig::default(),
            cors: crate::http::cors::CorsPolicy::default(),
            tls: HashMap::new(),
            push: crate::push::PushPolicy::default(),
            host: crate::host::HostCapabilities::default(),
            documentation_url: None,
            icon_url: None,
            provider: None,
            hsts_max_age_s: DEFAULT_HSTS_MAX_AGE_S,
            proxy: crate::proxy::ProxyTrust::default(),
        }
    }
}

/// The keys a reload (SIGHUP) applies to a running instance: one value, swapped in one step
/// by [`Instance::reload`], so no request sees half of it.
#[derive(Clone, Debug)]
pub struct Reloadable {
    /// `a2a.principals` (and the credentials they reference): rules and posture together.
    pub auth: crate::auth::AuthConfig,
    /// `a2a.cors.origins`.
    pub cors: crate::http::cors::CorsPolicy,
    /// `a2a.introspection.enabled`: overwrites what `admin.set` made of it.
    pub introspection_enabled: bool,
    /// The effective configuration the `config` op reports from now on.
    pub config_document: serde_json::Value,
}

/// Work the instance asks the host to do. New kinds of work may be added: a host ignores
/// (and should log) an effect it does not know.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Effect {
    /// A conversation turn: answer `message` on task `task_id` with completions.
    Turn {
        /// The task the turn belongs to; the completions must name it.
        task_id: String,
        /// The conversation's internal key (§7.6): `ctx-<32 hex>` for a non-operator's, so
        /// two owners' same-named contexts never meet. `message.contextId` carries it too.
        context_id: String,
        /// The owner's own name for the context, for showing back to the owner.
        context_name: String,
        /// The caller's message to answer, as stored in the task's history.
        message: Box<Message>,
        /// Who sent it: the host acts on their behalf and may scope what it does by it.
        owner: Principal,
        /// The trace the turn belongs to: the request's server span as parent while the
        /// instance traces requests, else the caller's `traceparent` as sent; `None` when
        /// neither. The host passes it on (the agent's turn line, its outbound calls).
        trace: Option<crate::trace::TraceContext>,
    },
    /// The task was canceled: stop working on it. Completions for it are refused from now.
    Cancel {
        /// The task to stop.
        task_id: String,
    },
    /// POST `body` to a task's webhook. The host resolves the URL's host, connects only to
    /// an address [`crate::push::check_address`] admits, retries with backoff and gives up
    /// after a bound. The body never carries task annotations or history.
    Deliver {
        /// The task whose change the delivery reports.
        task_id: String,
        /// The id of the push notification config that asked for the delivery.
        config_id: String,
        /// The webhook URL as registration judged it (WHATWG host rules, explicit port): dial
        /// exactly this address.
        url: String,
        /// Headers to send: the content type, and the configured `authorization` and
        /// notification token if any.
        headers: Vec<(String, String)>,
        /// The JSON body to POST, already serialized.
        body: Vec<u8>,
        /// The trace of the request that last handed the task out (a turn or a command),
        /// for the delivery's `traceparent`; `None` when it had none, or it is forgotten
        /// (the instance remembers the latest [`TASK_TRACES`] tasks' traces).
        trace: Option<crate::trace::TraceContext>,
    },
    /// A command that passed every check: run it and answer with
    /// [`Completion::CommandResult`] (a message op, or a refusal of any op) or
    /// [`Completion::CommandStarted`] (a task op whose task now exists as `task_id`).
    ///
    /// Only an op the host declared ([`InstanceConfig::host`]) or a workflow-declared
    /// command it registered comes here; any other is refused before it is handed out.
    Command {
        /// Names the call in the host's [`Completion::CommandResult`] or
        /// [`Completion::CommandStarted`].
        call: CallId,
        /// The op with its typed arguments.
        op: crate::host::Op,
        /// The envelope without `op`, validated against the op's schema, as sent: for the
        /// audit trail (its target) and for logging.
        args: serde_json::Map<String, serde_json::Value>,
        /// Whether the op answers with a message or starts a task: decides which completion the
        /// host must send.
        reply: ReplyKind,
        /// Who called: the host authorizes and audits the op by it.
        principal: Principal,
        /// The caller's session, if it called with a session token: the host's audit event
        /// of the command carries it.
        sid: Option<String>,
        /// The conversation's internal key (§7.6), as for [`Effect::Turn`].
        context_id: String,
        /// The caller's own name for the context.
        context_name: String,
        /// The id the task gets if the host starts it (task ops only).
        task_id: Option<String>,
        /// The trace the command belongs to, as for [`Effect::Turn`]: a run it starts
        /// carries it into its steps.
        trace: Option<crate::trace::TraceContext>,
    },
}

/// Tasks whose trace the instance remembers for their webhook deliveries (the latest ones
/// handed out with a trace); an older task's deliveries carry none.
pub const TASK_TRACES: usize = 1024;

/// What the host did, reported back.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Completion {
    /// The task moved to `state`, optionally with an agent message explaining it.
    Status {
        /// The task that moved.
        task_id: String,
        /// Its new state; never unspecified or submitted ([`CompletionError::InvalidState`]).
        state: TaskState,
        /// The parts of an agent message to make the task's status message, if any.
        message: Option<Vec<Part>>,
    },
    /// The answer to a command call.
    CommandResult {
        /// The call answered, as [`Effect::Command`] named it.
        call: CallId,
        /// The result document or the refusal.
        answer: CommandAnswer,
    },
    /// A task op was accepted: its task exists from now, tracking `link`.
    CommandStarted {
        /// The call answered, as [`Effect::Command`] named it.
        call: CallId,
        /// The work the new task follows.
        link: Link,
    },
    /// An input-required gate's facts, for task annotations (set before the status).
    Ask {
        /// The task waiting on the gate.
        task_id: String,
        /// The JSON Schema an answer must satisfy; clients see it as the task's `askSchema`
        /// annotation.
        schema: Option<serde_json::Value>,
        /// The channel the question was also asked on; clients see it as the `askChannel`
        /// annotation, so they know where else it may be answered.
        channel: Option<String>,
        /// Only an operator may answer (an approval the owner must not give itself).
        operator_only: bool,
    },
    /// A task op finished: the task gets its `<taskId>.result` artifact as §3.6 of the
    /// command extension says (an object is a DataPart marked with the command URI, a string
    /// a text part; `None` or `null` leaves no artifact) and completes, with `message` as
    /// its status message.
    CommandDone {
        /// The task the op started.
        task_id: String,
        /// The op's result, made the task's result artifact.
        result: Option<serde_json::Value>,
        /// Text of the task's final status message.
        message: Option<String>,
    },
    /// The task produced (a chunk of) an artifact.
    Artifact {
        /// The task the artifact belongs to.
        task_id: String,
        /// The artifact, or the chunk of it to add.
        artifact: Artifact,
        /// Whether the parts extend the artifact of the same id rather than replace it.
        append: bool,
        /// Whether this is the artifact's last chunk: streams tell their readers so.
        last_chunk: bool,
    },
}

/// Identifies a command call waiting for the host.
pub type CallId = u64;

/// The host's answer to a command, and what the task it started tracks.
#[derive(Clone, Debug, PartialEq)]
pub enum CommandAnswer {
    /// A message op's result document.
    Document(serde_json::Value),
    /// Refused: the request gets this error and no task is created. A field violation the
    /// host names relative to the command's arguments (`label`, `args.path`: anything not
    /// starting with `message.`) is given the full path of the part that carried the
    /// command, `message.parts[<i>].data.agentd.<field>`, as the core's own refusals name it.
    Refused(RpcError),
}

/// Why a completion was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompletionError {
    /// No task of that id is in the store (never made, or dropped as the oldest finished).
    UnknownTask,
    /// A terminal task never changes again.
    TaskTerminal(TaskState),
    /// `TASK_STATE_UNSPECIFIED` and `TASK_STATE_SUBMITTED` are not states a host moves to.
    InvalidState(TaskState),
    /// The task already holds `limits.max_artifacts` artifacts and the artifact is a new one.
    TooManyArtifacts,
    /// The task's artifacts would exceed `limits.task_artifact_bytes` together.
    ArtifactsTooLarge,
    /// The artifact would take all tasks together past `limits.tasks_bytes`, and no
    /// finished task is left to drop.
    TasksOverBudget,
    /// No command call of that id is waiting (answered already, or its client left).
    UnknownCall,
    /// A document for a task op, or a start for a message op.
    WrongReplyKind,
}

impl std::fmt::Display for CompletionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompletionError::UnknownTask => f.write_str("no such task"),
            CompletionError::TaskTerminal(s) => {
                write!(f, "the task is {} and never changes again", s.as_str())
            }
            CompletionError::InvalidState(s) => {
                write!(f, "{} is not a state a host moves a task to", s.as_str())
            }
            CompletionError::TooManyArtifacts => f.write_str("the task holds its most artifacts"),
            CompletionError::ArtifactsTooLarge => {
                f.write_str("the task's artifacts would exceed limits.task_artifact_bytes")
            }
            CompletionError::TasksOverBudget => {
                f.write_str("the tasks held would exceed limits.tasks_bytes")
            }
            CompletionError::UnknownCall => f.write_str("no command call of that id is waiting"),
            CompletionError::WrongReplyKind => {
                f.write_str("the answer does not match the op's reply kind")
            }
        }
    }
}

impl std::error::Error for CompletionError {}

/// A pre-serialized card and its entity tag. Shared (`Arc`) so that an answer can take it
/// under the lock and copy its bytes into the connection's output outside it.
#[derive(Clone, Debug)]
pub struct CachedCard {
    /// The card's JSON, as served.
    pub body: Vec<u8>,
    /// Its strong entity tag, quoted, for `ETag` and `If-None-Match`.
    pub etag: String,
}

/// Identifies one subscription of a connection to a task.
pub type SubId = u64;

#[derive(Debug)]
pub(crate) struct Subscription {
    pub(crate) task_id: String,
    /// Events not yet written, each with its number in the task's sequence; bounded by
    /// `ConnLimits::stream_queue`.
    pub(crate) queue: VecDeque<(u64, std::sync::Arc<StreamResponse>)>,
    /// The queue overflowed: the reader is too slow and its stream ends.
    pub(crate) overflowed: bool,
    /// The task reached a terminal or interrupted state.
    pub(crate) settled: bool,
    /// Only `settled` matters (a blocking send), not the events.
    pub(crate) wait_only: bool,
    /// The connection to wake when an event comes.
    pub(crate) conn: Option<ConnKey>,
}

/// How a command call's client waits for its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallMode {
    Stream,
    Wait,
    Immediate,
}

/// What became of a command call.
#[derive(Debug)]
pub(crate) enum CallOutcome {
    Answered(CommandAnswer),
    /// The task exists; `sub` watches it for a streaming or blocking client, and `first` is
    /// the task as it was created, so a stream replays everything since.
    Started {
        task_id: String,
        sub: Option<SubId>,
        first: Box<crate::a2a::types::Task>,
        /// The number of the newest event `first` reflects.
        first_seq: u64,
    },
}

#[derive(Debug)]
pub(crate) struct PendingCall {
    pub(crate) op: String,
    pub(crate) reply: ReplyKind,
    pub(crate) mode: CallMode,
    pub(crate) principal: Principal,
    pub(crate) context: ContextIds,
    pub(crate) task_id: Option<String>,
    pub(crate) message: Message,
    /// The request activated task annotations.
    pub(crate) annotate: bool,
    pub(crate) history: Option<usize>,
    /// The connection to wake when the host answers.
    pub(crate) conn: Option<ConnKey>,
    pub(crate) outcome: Option<CallOutcome>,
    /// The message's digest, for a task op: its task records the message as accepted, so
    /// a retry finds the task.
    pub(crate) digest: Option<crate::tasks::MessageDigest>,
}

/// The shared state of one daemon.
pub struct Instance {
    pub(crate) config: InstanceConfig,
    pub(crate) cards: Vec<std::sync::Arc<CachedCard>>,
    pub(crate) tasks: TaskStore,
    /// Recent stream events per task, for reconnecting streams.
    pub(crate) replay: crate::tasks::replay::Replay,
    pub(crate) entropy: Box<dyn Entropy>,
    subs: HashMap<SubId, Subscription>,
    watchers: HashMap<String, Vec<SubId>>,
    next_sub: SubId,
    effects: VecDeque<Effect>,
    effect_waker: Option<Waker>,
    started: Now,
    /// Requests read so far: the number in a request id the instance makes up.
    requests: u64,
    /// Whether A2A requests get server spans ([`Instance::set_trace_requests`]).
    trace_requests: bool,
    /// The traces of the latest tasks handed out with one, newest last, at most
    /// [`TASK_TRACES`]: their webhook deliveries carry them.
    task_traces: VecDeque<(String, crate::trace::TraceContext)>,
    pub(crate) commands: Commands,
    calls: HashMap<CallId, PendingCall>,
    next_call: CallId,
    /// The events feed, while the events extension is declared.
    pub(crate) feed: Option<crate::feed::Ring>,
    /// Pending device codes and open sessions.
    pub(crate) sessions: crate::sessions::Sessions,
    /// The connections streaming the feed.
    /// The connections streaming the feed, each with the seq whose push wakes it
    /// ([`Instance::arm_feed`]; `u64::MAX`: woken already, not again until it asks).
    feed_watchers: HashMap<ConnKey, u64>,
    /// The connections' wakers: the one registry every wake-up of a connection goes
    /// through.
    pub(crate) ready: Ready,
    /// Stops accepting new work ([`Instance::set_draining`]).
    pub(crate) draining: bool,
    /// Holds new work ([`Instance::set_paused`]).
    pub(crate) paused: bool,
    /// Why the instance drains or is paused, for `status` and the feed.
    pub(crate) lifecycle_reason: String,
    /// The host's objects as `status` shows them ([`Instance::publish_object`]).
    pub(crate) view: crate::view::RuntimeView,
    /// Webhooks registered per task.
    pub(crate) push_configs: crate::push::PushConfigs,
    /// Write-ahead durability (see [`Instance::set_write_ahead`]).
    wal: WriteAhead,
    /// Why the host's store cannot write now (see [`Instance::set_store_unavailable`]).
    store_unavailable: Option<String>,
    /// Unsent bytes of large answers over all connections
    /// ([`ConnLimits::large_answers_bytes`]); shared, so a connection gives its bytes back
    /// as the peer reads them, without the instance.
    pub(crate) large_answers: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The failure limiter and the per-principal rates (§7.5).
    pub(crate) limits: crate::limits::Limits,
    /// The core's counters for `/metrics`, shared with every connection.
    pub(crate) metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The host's parts of `/metrics` ([`Instance::add_metrics_source`]).
    pub(crate) metric_sources: Vec<std::sync::Arc<dyn crate::metrics::MetricsSource>>,
}

/// The instance's side of write-ahead durability: what the host has confirmed durable, and
/// who waits for it.
#[derive(Default)]
struct WriteAhead {
    on: bool,
    /// Every change up to this record sequence is durable.
    durable: u64,
    /// The record sequence the host was last woken for.
    announced: u64,
    /// Changes up to this sequence were handed to the host.
    drained: u64,
    waker: Option<Waker>,
    /// Connections holding an answer until the sequence is durable.
    waiters: Vec<(u64, ConnKey)>,
    /// Connections with held output: a drain waits for them as for any other answer.
    holding: usize,
    /// Changes up to this sequence are wanted on disk promptly: an answer waits for them,
    /// or a webhook was asked to report them ([`Instance::records_awaited`]).
    urgent: u64,
}

/// A record's body: JSON text, serialized once from the instance's own state (a
/// `serde_json::Value` tree built and then written cost a send turn about a tenth of the
/// daemon's CPU, most of it under the driver's lock). Serializing it writes the text as is;
/// `serde_json::from_str(body.get())` reads it.
pub type RecordBody = Box<serde_json::value::RawValue>;

/// One record the host must make durable: the state of `(kind, key)` as it stands now, or
/// its removal (`None`).
#[derive(Clone, Debug)]
pub struct Record {
    /// The kind of state (`task`, `session`, `push`, ...): the table the host keeps it in.
    pub kind: &'static str,
    /// The key of that state within its kind, such as a task id.
    pub key: String,
    /// The state to keep under the key, or `None` to remove it.
    pub body: Option<RecordBody>,
}

impl Record {
    /// The body parsed into a JSON value (`None` for a removal): for a host that inspects
    /// records rather than writing them as they are.
    pub fn value(&self) -> Option<serde_json::Value> {
        self.body
            .as_ref()
            .and_then(|b| serde_json::from_str(b.get()).ok())
    }
}

/// Equal when the kind, the key and the body's text are.
impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.key == other.key
            && self.body.as_ref().map(|b| b.get()) == other.body.as_ref().map(|b| b.get())
    }
}

/// What [`Instance::poll_records`] drains: every change up to record sequence `upto`, one
/// record per changed key.
#[derive(Clone, Debug, PartialEq)]
pub struct Records {
    /// The record sequence these records bring the host to: report it through
    /// [`Instance::records_durable`] once they are written.
    pub upto: u64,
    /// The records to write: each changed key once, at its latest state.
    pub records: Vec<Record>,
}

impl Instance {
    /// An instance with empty stores, started at `now`, drawing task ids and tokens from
    /// `entropy` (the core has no randomness of its own).
    pub fn new(config: InstanceConfig, entropy: Box<dyn Entropy>, now: Now) -> Self {
        let cards = build_cards(&config);
        let feed = config
            .events_enabled
            .then(|| crate::feed::Ring::new(config.events_ring));
        Instance {
            tasks: TaskStore::new(config.tasks),
            replay: crate::tasks::replay::Replay::new(config.replay, now.epoch_ms),
            feed,
            config,
            cards,
            entropy,
            subs: HashMap::new(),
            watchers: HashMap::new(),
            next_sub: 1,
            effects: VecDeque::new(),
            effect_waker: None,
            started: now,
            requests: 0,
            trace_requests: false,
            task_traces: VecDeque::new(),
            sessions: crate::sessions::Sessions::default(),
            feed_watchers: Default::default(),
            ready: Ready::default(),
            commands: Commands::new(),
            calls: HashMap::new(),
            next_call: 1,
            draining: false,
            paused: false,
            lifecycle_reason: String::new(),
            view: crate::view::RuntimeView::default(),
            push_configs: crate::push::PushConfigs::default(),
            wal: WriteAhead::default(),
            store_unavailable: None,
            large_answers: Default::default(),
            limits: crate::limits::Limits::default(),
            metrics: Default::default(),
            metric_sources: Vec::new(),
        }
    }

    /// Adds a host's part to `GET /metrics` (the store, the runtime, the process): it writes
    /// its families after the core's, outside the instance lock, each time `/metrics` is
    /// answered.
    pub fn add_metrics_source(
        &mut self,
        source: std::sync::Arc<dyn crate::metrics::MetricsSource>,
    ) {
        self.metric_sources.push(source);
    }

    /// The core's counters (requests, latencies, refusals, connections, streams).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// Turns write-ahead durability on: from now on every change to a task or session is
    /// queued as a record ([`Instance::poll_records`]), and an answer that acknowledges a
    /// change is held until the host reports the change durable
    /// ([`Instance::records_durable`]). Off (the default, a memory store) nothing is queued
    /// and nothing is held.
    pub fn set_write_ahead(&mut self, on: bool) {
        self.wal.on = on;
        self.tasks.set_tracking(on);
        self.sessions.set_tracking(on);
        self.push_configs.set_tracking(on);
        self.wal.durable = self.record_seq();
        self.wal.announced = self.wal.durable;
        self.wal.drained = self.wal.durable;
    }

    /// A new request's number, and the epoch millisecond the instance started: together
    /// the request id the log names a request by when it carries no `X-Request-Id`.
    pub(crate) fn next_request(&mut self) -> (u64, u64) {
        self.requests += 1;
        (self.started.epoch_ms, self.requests)
    }

    /// The sequence number of the latest change: monotonic, bumped by every change that
    /// makes a record. Always 0 without write-ahead.
    pub fn record_seq(&self) -> u64 {
        self.tasks.changes() + self.sessions.changes() + self.push_configs.changes()
    }

    /// Every change up to this sequence is durable.
    pub fn durable_seq(&self) -> u64 {
        self.wal.durable
    }

    /// The host's store cannot write (`Some(why)`: a full disk, an I/O error), or can again
    /// (`None`, once it healed and [`Instance::records_durable`] covered what it wrote).
    /// While it cannot, requests that would change something are refused with
    /// STORE_UNAVAILABLE before they change anything, reads are answered as ever, and every
    /// held answer whose change is not durable is given up: its connection answers
    /// STORE_UNAVAILABLE instead, since nothing may acknowledge what is not durable.
    pub fn set_store_unavailable(&mut self, why: Option<String>) {
        let failing = why.is_some() && self.store_unavailable.is_none();
        self.store_unavailable = why;
        if failing {
            for (_, conn) in std::mem::take(&mut self.wal.waiters) {
                self.ready.wake(conn);
            }
        }
    }

    /// Why the store cannot write, while it cannot.
    pub fn store_unavailable(&self) -> Option<&str> {
        self.store_unavailable.as_deref()
    }

    /// Every record the instance holds, as it stands now, for a host that must write its
    /// whole state again: a store healing after a failed write, since what it wrote after
    /// its last good fsync cannot be trusted. Counts as a drain: once the records are
    /// durable, the host calls [`Instance::records_durable`] with `upto`.
    pub fn all_records(&mut self) -> Records {
        self.tasks.mark_all_dirty();
        self.sessions.mark_all_dirty();
        self.push_configs.mark_all_dirty();
        let upto = self.record_seq();
        self.wal.drained = upto;
        self.wal.announced = self.wal.announced.max(upto);
        Records {
            upto,
            records: self.take_dirty_records(),
        }
    }

    /// Whether an answer depending on change `seq` must still wait.
    pub(crate) fn must_hold(&self, seq: u64) -> bool {
        self.wal.on && seq > self.wal.durable
    }

    /// A connection started (`true`) or stopped holding output.
    pub(crate) fn set_holding(&mut self, holding: bool) {
        if holding {
            self.wal.holding += 1;
        } else {
            self.wal.holding = self.wal.holding.saturating_sub(1);
        }
    }

    /// A connection holds output until `seq` is durable: it is woken when it is.
    pub(crate) fn wait_durable(&mut self, seq: u64, conn: ConnKey) {
        self.announce_records();
        self.wal.waiters.push((seq, conn));
        self.wanted_soon(seq);
    }

    /// Changes up to `seq` are wanted on disk promptly. The host may be letting changes
    /// nobody waited for gather before it drains them ([`Instance::records_awaited`]): it
    /// is woken to drain them now.
    fn wanted_soon(&mut self, seq: u64) {
        self.wal.urgent = self.wal.urgent.max(seq);
        if self.wal.on && seq > self.wal.drained {
            if let Some(w) = &self.wal.waker {
                w.wake_by_ref();
            }
        }
    }

    /// Whether a change not drained yet is wanted on disk promptly: an answer waits for it,
    /// or a webhook was asked to report the state it made. A host drains at once when one
    /// is; otherwise it may let the changes gather for a moment before draining them, so a
    /// task's start and its end soon after are written as one record. A change becoming
    /// wanted wakes the records waker again.
    pub fn records_awaited(&self) -> bool {
        self.wal.on && self.wal.urgent > self.wal.drained
    }

    /// Drains what changed since the last call: one record per changed key, as it stands
    /// now (a task changed ten times is written once). `None` when nothing changed. The host
    /// appends them in the order drained and, once they are durable, calls
    /// [`Instance::records_durable`] with `upto`.
    pub fn poll_records(&mut self) -> Option<Records> {
        let upto = self.record_seq();
        if !self.wal.on || upto == self.wal.drained {
            return None;
        }
        self.wal.drained = upto;
        self.wal.announced = self.wal.announced.max(upto);
        Some(Records {
            upto,
            records: self.take_dirty_records(),
        })
    }

    /// One record per key changed since the last drain, as it stands now.
    fn take_dirty_records(&mut self) -> Vec<Record> {
        let mut records: Vec<Record> = self
            .tasks
            .take_dirty()
            .into_iter()
            .map(|(key, body)| Record {
                kind: crate::tasks::TASK_KIND,
                key,
                body,
            })
            .collect();
        records.extend(
            self.sessions
                .take_dirty()
                .into_iter()
                .map(|(kind, key, body)| Record { kind, key, body }),
        );
        records.extend(
            self.push_configs
                .take_dirty()
                .into_iter()
                .map(|(key, body)| Record {
                    kind: crate::push::PUSH_KIND,
                    key,
                    body,
                }),
        );
        records
    }

    /// Wakes `waker` when changes are waiting to be drained by [`Instance::poll_records`]:
    /// now if some are, then once for the first change after a drain, and again whenever an
    /// undrained change becomes wanted promptly (an answer or frame waits for it, a webhook
    /// will report it: [`Instance::records_awaited`]).
    pub fn register_records_waker(&mut self, waker: &Waker) {
        self.wal.waker = Some(waker.clone());
        if self.record_seq() > self.wal.drained {
            waker.wake_by_ref();
        }
    }

    /// Tells the host's records waker that changes wait. Called wherever state changes.
    /// Once per round: a host told of changes it has not drained yet drains these with them,
    /// so it is not woken again for them until it drains. Changes that become wanted promptly
    /// wake it regardless ([`Instance::records_awaited`]: each answer or frame that waits,
    /// each webhook delivery), so a host letting changes gather is woken for the round's
    /// first change and for each waiter, not for each change (a wake-up is a thread hop on
    /// the changer's path).
    pub(crate) fn announce_records(&mut self) {
        let seq = self.record_seq();
        if self.wal.on && seq > self.wal.announced {
            let told = self.wal.announced > self.wal.drained;
            self.wal.announced = seq;
            if !told {
                if let Some(w) = &self.wal.waker {
                    w.wake_by_ref();
                }
            }
        }
    }

    /// The digest of a task op this caller sent under `message_id` that the host has not
    /// started yet (its task does not exist, so the task index cannot know the id yet).
    pub(crate) fn pending_task_op(
        &self,
        principal: &str,
        message_id: &str,
    ) -> Option<crate::tasks::MessageDigest> {
        self.calls
            .values()
            .filter(|c| c.outcome.is_none() && c.principal.id == principal)
            .filter(|c| c.message.message_id == message_id)
            .find_map(|c| c.digest)
    }

    /// The host made every change up to `seq` durable (the fsync returned): answers held for
    /// them are released, and their connections woken.
    pub fn records_durable(&mut self, seq: u64) {
        if seq <= self.wal.durable {
            return;
        }
        self.wal.durable = seq;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.wal.waiters)
            .into_iter()
            .partition(|(s, _)| *s <= seq);
        self.wal.waiters = waiting;
        for (_, conn) in ready {
            self.ready.wake(conn);
        }
    }

    /// Puts back one record read from the durable store at start. Unknown kinds are refused
    /// (the caller logs them). Nothing restored is queued again as a change.
    pub fn restore_record(
        &mut self,
        kind: &str,
        key: &str,
        body: serde_json::Value,
        now: Now,
    ) -> Result<(), RecordError> {
        match kind {
            crate::tasks::TASK_KIND => {
                self.restore_task(key, crate::tasks::TaskRecord::from_doc(body)?)
            }
            crate::sessions::SESSION_KIND | crate::sessions::SESSION_NAME_KIND => {
                self.sessions.restore(kind, key, body, now.epoch_ms)
            }
            crate::push::PUSH_KIND => self.push_configs.restore(key, body),
            other => Err(format!("unknown record kind {other:?}").into()),
        }
    }

    /// Makes room for `tasks` task records about to be restored, so the store's maps are
    /// sized once rather than rehashed at every doubling as they fill.
    pub fn reserve_tasks(&mut self, tasks: usize) {
        self.tasks.reserve(tasks);
    }

    /// [`Instance::restore_record`] from the record's JSON text, as the store keeps it: a
    /// task is read straight into its record (the bulk of a large store, read faster so);
    /// other kinds through a JSON tree.
    pub fn restore_record_json(
        &mut self,
        kind: &str,
        key: &str,
        text: &str,
        now: Now,
    ) -> Result<(), RecordError> {
        if kind != crate::tasks::TASK_KIND {
            let body = serde_json::from_str(text).map_err(|e| e.to_string())?;
            return self.restore_record(kind, key, body, now);
        }
        self.restore_task(key, crate::tasks::TaskRecord::from_json(text)?)
    }

    /// Puts back a task record already read with [`crate::tasks::TaskRecord::from_json`]
    /// (which needs no instance, so a host may read many at once on other threads); `key`
    /// is the store's key for it, which must be its id.
    pub fn restore_task(
        &mut self,
        key: &str,
        rec: crate::tasks::TaskRecord,
    ) -> Result<(), RecordError> {
        if &*rec.id != key {
            return Err(format!("task record {key} holds task {}", rec.id).into());
        }
        self.tasks.restore(rec);
        Ok(())
    }

    /// After a restore: tasks whose run or turn lived in the previous process's memory
    /// (submitted, working, input- or auth-required) can never finish; they fail with
    /// `reason` rather than stay working forever. Also applies the task bound. Returns how
    /// many tasks were ended.
    pub fn end_in_flight(&mut self, reason: &str, now: Now) -> usize {
        self.tasks.enforce_bound();
        let tasks = &self.tasks;
        self.push_configs.retain_tasks(|id| tasks.get(id).is_some());
        let stuck = self.tasks.in_flight();
        for id in &stuck {
            let _ = self.set_status(id, TaskState::Failed, Some(vec![Part::text(reason)]), now);
        }
        stuck.len()
    }

    /// Starts the feed's sequence numbers after `base`, so that a cursor a subscriber kept
    /// from before a restart (always at most `base`) is answered with `resync`, never with
    /// events it did not see.
    pub fn set_feed_base(&mut self, base: u64) {
        if let Some(ring) = self.feed.as_mut() {
            ring.start_after(base);
        }
    }

    /// Pushes an event of the host's kinds (runs, steps, subagents, lifecycle, config, ...)
    /// onto the feed: the one typed way onto it. `task` and `task.removed` are the instance's
    /// own, pushed from the task store. Without the events extension this is a no-op.
    pub fn push_event(
        &mut self,
        event: crate::feed::FeedEvent,
        now: Now,
    ) -> Result<u64, crate::feed::PushError> {
        if let crate::feed::FeedEvent::Task { .. } = event {
            return Err(crate::feed::PushError::Reserved("task"));
        }
        if let crate::feed::FeedEvent::TaskRemoved { .. } = event {
            return Err(crate::feed::PushError::Reserved("task.removed"));
        }
        self.push_feed(event, now)
    }

    pub(crate) fn push_feed(
        &mut self,
        event: crate::feed::FeedEvent,
        now: Now,
    ) -> Result<u64, crate::feed::PushError> {
        let introspection = self.config.introspection_enabled;
        let Some(ring) = self.feed.as_mut() else {
            return Ok(0);
        };
        let seq = crate::feed::push(ring, event, now.epoch_ms, introspection)?;
        let newest = ring.newest();
        for (conn, wake_at) in self.feed_watchers.iter_mut() {
            // One wake-up per poll: a subscriber already woken (or taking a batch) is not
            // woken again by every event.
            if newest >= *wake_at {
                *wake_at = u64::MAX;
                self.ready.wake(*conn);
            }
        }
        Ok(seq)
    }

    /// A task changed: tell the feed (and, for tasks evicted to make room, that they left).
    pub(crate) fn task_changed(&mut self, task_id: &str, now: Now) {
        self.announce_records();
        for (id, owner) in self.tasks.take_evicted() {
            self.push_configs.forget_task(&id);
            self.replay.forget(&id);
            let _ = self.push_feed(
                crate::feed::FeedEvent::TaskRemoved {
                    id,
                    owner: owner.id,
                },
                now,
            );
        }
        if self.feed.is_none() {
            return;
        }
        if let Some(t) = self.tasks.get(task_id) {
            let event = crate::feed::FeedEvent::Task {
                task: Box::new(t.view(None, true, true)),
                owner: t.owner.id.clone(),
            };
            let pushed = self.push_feed(event, now);
            debug_assert!(pushed.is_ok(), "task events match their schema: {pushed:?}");
        }
    }

    /// Sessions ended (revoked, or their token revoked): tell the feed, and wake every feed
    /// stream so a revoked one ends within one tick with nothing past the revocation.
    pub(crate) fn sessions_revoked(&mut self, gone: Vec<crate::sessions::Session>, now: Now) {
        for s in &gone {
            let _ = self.push_feed(
                crate::feed::FeedEvent::Other {
                    kind: "auth",
                    data: serde_json::json!({"event": "revoked", "client_id": s.client_id, "scope": s.scope.as_str(),
                                             "sid": s.sid, "name": s.name}),
                    owner: None,
                },
                now,
            );
        }
        for conn in self.feed_watchers.keys() {
            self.ready.wake(*conn);
        }
    }

    /// The failure limiter and the per-principal rates, for inspection.
    pub fn limits(&self) -> &crate::limits::Limits {
        &self.limits
    }

    /// Whether a session is still open.
    pub fn session_live(&self, sid: &str, now: Now) -> bool {
        self.sessions.is_live(sid, now.epoch_ms)
    }

    /// The feed, while the events extension is declared.
    pub fn feed(&self) -> Option<&crate::feed::Ring> {
        self.feed.as_ref()
    }

    /// Connection `conn` streams the feed: the next event pushed wakes it ([`Instance::arm_feed`]
    /// says which one later).
    pub(crate) fn watch_feed(&mut self, conn: ConnKey) {
        self.feed_watchers.insert(conn, 0);
    }

    /// Feed connection `conn` is woken once the feed's newest seq reaches `seq` (its next
    /// event, or a batch's worth), and then not again until it asks anew.
    pub(crate) fn arm_feed(&mut self, conn: ConnKey, seq: u64) {
        if let Some(wake_at) = self.feed_watchers.get_mut(&conn) {
            *wake_at = seq;
        }
    }

    pub(crate) fn unwatch_feed(&mut self, conn: ConnKey) {
        self.feed_watchers.remove(&conn);
    }

    /// Registers a connection's waker in the one registry ([`crate::ready`]).
    pub(crate) fn register_conn(&mut self, waker: &Waker) -> ConnKey {
        self.ready.register(waker)
    }

    /// A connection closed: it is woken no more.
    pub(crate) fn forget_conn(&mut self, conn: ConnKey) {
        self.feed_watchers.remove(&conn);
        self.ready.forget(conn);
    }

    /// Connections registered to be woken: each waits, or has waited, on something here (a
    /// task, a host's answer, the feed, durability) and is forgotten when it closes.
    pub fn registered_connections(&self) -> usize {
        self.ready.len()
    }

    /// Connections streaming the feed.
    pub fn feed_subscribers(&self) -> usize {
        self.feed_watchers.len()
    }

    /// Registers a workflow-declared command op. Built-in op names are reserved.
    pub fn register_command(&mut self, decl: DeclaredCommand) -> Result<(), RegisterError> {
        self.commands.register(decl)
    }

    /// The switches that gate ops, as seen from a listener.
    pub(crate) fn switches(&self, listener: usize) -> Switches {
        Switches {
            introspection: self.config.introspection_enabled,
            device_grant: self.config.device_grant.enabled,
            tcp_listener: self
                .config
                .listeners
                .get(listener)
                .is_some_and(|l| l.kind == ListenerKind::Tcp),
            host_ops: self.config.host.ops,
        }
    }

    /// Command calls waiting for the host.
    pub fn pending_calls(&self) -> usize {
        self.calls.len()
    }

    pub(crate) fn start_call(
        &mut self,
        call: PendingCall,
        effect: impl FnOnce(CallId) -> Effect,
    ) -> CallId {
        let id = self.next_call;
        self.next_call += 1;
        self.calls.insert(id, call);
        self.push_effect(effect(id));
        id
    }

    pub(crate) fn call(&mut self, id: CallId) -> Option<&mut PendingCall> {
        self.calls.get_mut(&id)
    }

    /// Forgets a call; its client got the answer or left.
    pub(crate) fn end_call(&mut self, id: CallId) -> Option<PendingCall> {
        self.calls.remove(&id)
    }

    fn answer_call(&mut self, id: CallId, answer: CommandAnswer) -> Result<(), CompletionError> {
        let call = self
            .calls
            .get_mut(&id)
            .ok_or(CompletionError::UnknownCall)?;
        if call.outcome.is_some() {
            return Err(CompletionError::UnknownCall);
        }
        if call.reply == ReplyKind::Task && matches!(answer, CommandAnswer::Document(_)) {
            return Err(CompletionError::WrongReplyKind);
        }
        let mut answer = answer;
        if let CommandAnswer::Refused(err) = &mut answer {
            let envelope = crate::ext::command::envelope_path(&call.message);
            for v in &mut err.violations {
                if !v.field.starts_with("message.") {
                    v.field = format!("{envelope}.{}", v.field);
                }
            }
        }
        call.outcome = Some(CallOutcome::Answered(answer));
        if let Some(conn) = call.conn {
            self.ready.wake(conn);
        }
        Ok(())
    }

    fn start_call_task(&mut self, id: CallId, link: Link, now: Now) -> Result<(), CompletionError> {
        let call = self.calls.get(&id).ok_or(CompletionError::UnknownCall)?;
        if call.outcome.is_some() {
            return Err(CompletionError::UnknownCall);
        }
        if call.reply != ReplyKind::Task {
            return Err(CompletionError::WrongReplyKind);
        }
        let task_id = call
            .task_id
            .clone()
            .ok_or(CompletionError::WrongReplyKind)?;
        let (context, principal, message, op, mode, annotate, history, digest) = (
            call.context.clone(),
            call.principal.clone(),
            call.message.clone(),
            call.op.clone(),
            call.mode,
            call.annotate,
            call.history,
            call.digest,
        );
        let (by, message_id) = (principal.id.clone(), message.message_id.clone());
        self.tasks
            .create(task_id.clone(), context, principal, message, now.epoch_ms)
            .map_err(|_| CompletionError::UnknownTask)?;
        if let Some(digest) = digest {
            self.tasks
                .accept_message(&task_id, &by, &message_id, digest);
        }
        self.tasks.set_origin(&task_id, link, Some(op));
        self.task_changed(&task_id, now);
        let first = Box::new(
            self.tasks
                .get(&task_id)
                .map(|t| t.view(history, true, annotate))
                .ok_or(CompletionError::UnknownTask)?,
        );
        let first_seq = self.replay.last(&task_id);
        let sub = match mode {
            CallMode::Stream => Some(self.subscribe(&task_id, false)),
            CallMode::Wait => Some(self.subscribe(&task_id, true)),
            CallMode::Immediate => None,
        };
        let call = self.calls.get_mut(&id).expect("checked above");
        if let (Some(sub), Some(conn)) = (sub, call.conn) {
            if let Some(s) = self.subs.get_mut(&sub) {
                s.conn = Some(conn);
            }
        }
        call.outcome = Some(CallOutcome::Started {
            task_id,
            sub,
            first,
            first_seq,
        });
        if let Some(conn) = call.conn {
            self.ready.wake(conn);
        }
        Ok(())
    }

    /// Whether the instance drains: new work is refused ([`Instance::set_draining`]).
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Whether the instance is paused: the host holds its work ([`Instance::set_paused`]).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Why the instance last began to drain, paused or resumed (empty: never).
    pub fn lifecycle_reason(&self) -> &str {
        &self.lifecycle_reason
    }

    /// Publishes the latest document of one of the host's objects (a run, a conversation, an
    /// activity) for `status`, held by `owner` (`None`: the operator's alone); it replaces
    /// the object's earlier document and becomes the newest of its kind. `doc` is the kind's
    /// feed `data` (§4.4). The host withdraws what it forgets, so the view stays as bounded
    /// as the host's own tables. O(log n).
    ///
    /// This does not tell the feed: the host pushes the same document as a `kind` event with
    /// [`Instance::push_event`] (and a `kind.removed` event when it withdraws it).
    pub fn publish_object(
        &mut self,
        kind: crate::view::ObjectKind,
        id: &str,
        owner: Option<&str>,
        doc: serde_json::Value,
    ) {
        self.view.publish(kind, id, owner, doc);
    }

    /// Forgets one of the host's objects; whether it was published. O(log n).
    pub fn withdraw_object(&mut self, kind: crate::view::ObjectKind, id: &str) -> bool {
        self.view.withdraw(kind, id)
    }

    /// The host's workflows, as `status` and the extended card list them.
    pub fn set_workflows(&mut self, workflows: Vec<crate::view::WorkflowEntry>) {
        self.view.set_workflows(workflows);
    }

    /// The conversation agent `status.model` names (empty: none).
    pub fn set_model(&mut self, model: impl Into<String>) {
        self.view.set_model(model.into());
    }

    /// What the host has published, to read.
    pub fn view(&self) -> &crate::view::RuntimeView {
        &self.view
    }

    /// Starts draining: new work is refused with DRAINING from now on, and every feed
    /// subscriber hears it.
    pub fn set_draining(&mut self, reason: &str, now: Now) {
        self.draining = true;
        self.lifecycle_reason = reason.to_owned();
        let _ = self.push_feed(
            crate::feed::FeedEvent::Other {
                kind: "lifecycle",
                data: serde_json::json!({"draining": true, "reason": reason}),
                owner: None,
            },
            now,
        );
    }

    /// Pauses or resumes the whole instance (the host holds its work while paused).
    pub fn set_paused(&mut self, paused: bool, reason: &str, now: Now) {
        self.paused = paused;
        self.lifecycle_reason = reason.to_owned();
        let data = if paused {
            serde_json::json!({"paused": true, "reason": reason})
        } else {
            serde_json::json!({"paused": false})
        };
        let _ = self.push_feed(
            crate::feed::FeedEvent::Other {
                kind: "lifecycle",
                data,
                owner: None,
            },
            now,
        );
    }

    /// Turns `a2a.introspection.enabled` on or off at run time (`admin.set`); the feed hears
    /// it as a `config` event.
    pub fn set_introspection(&mut self, on: bool, source: &'static str, now: Now) {
        self.config.introspection_enabled = on;
        let _ = self.push_feed(
            crate::feed::FeedEvent::Other {
                kind: "config",
                data: serde_json::json!({"paths": ["a2a.introspection.enabled"], "source": source}),
                owner: None,
            },
            now,
        );
    }

    /// Applies a reload: rules, posture, CORS origins and introspection are swapped together
    /// and the cards rebuilt, under the one lock the caller holds, so a request is resolved
    /// entirely under the old value or entirely under the new one. Returns the configuration
    /// paths whose value changed (empty: nothing did). The host announces them (a `config`
    /// feed event with `source: "reload"`), together with its own reloaded paths.
    pub fn reload(&mut self, new: Reloadable) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if new.auth != self.config.auth {
            changed.push("a2a.principals");
        }
        if new.cors != self.config.cors {
            changed.push("a2a.cors.origins");
        }
        if new.introspection_enabled != self.config.introspection_enabled {
            changed.push("a2a.introspection.enabled");
        }
        self.config.auth = new.auth;
        self.config.cors = new.cors;
        self.config.introspection_enabled = new.introspection_enabled;
        self.config.config_document = new.config_document;
        // The card's security fields follow the rules (a first bearer rule declares `bearer`).
        self.cards = build_cards(&self.config);
        changed
    }

    /// Tasks still being worked on (submitted or working): what a drain waits for.
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks.in_state(TaskState::Submitted) + self.tasks.in_state(TaskState::Working)
    }

    /// Connections still waiting on the instance: blocking sends, streams, command calls,
    /// answers held until durable.
    pub fn waiters(&self) -> usize {
        self.subs.len() + self.calls.len() + self.wal.holding
    }

    /// The configuration the instance runs with now, reloads included: a driver reads its
    /// limits for new connections here.
    pub fn config(&self) -> &InstanceConfig {
        &self.config
    }

    /// The public card of a listener.
    pub fn card(&self, listener: usize) -> Option<&std::sync::Arc<CachedCard>> {
        self.cards.get(listener)
    }

    /// The state of a held task (`None`: unknown, or evicted).
    pub fn task_state(&self, task_id: &str) -> Option<TaskState> {
        self.tasks.get(task_id).map(|t| t.state)
    }

    /// Tasks held.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// Open task subscriptions (streams and blocking sends).
    pub fn subscription_count(&self) -> usize {
        self.subs.len()
    }

    /// When the instance was created, as the driver reported it.
    pub fn started(&self) -> Now {
        self.started
    }

    /// The next piece of work for the host, if any.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Wakes `waker` the next time an effect is queued.
    pub fn register_effect_waker(&mut self, waker: &Waker) {
        if !self
            .effect_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(waker))
        {
            self.effect_waker = Some(waker.clone());
        }
    }

    pub(crate) fn push_effect(&mut self, effect: Effect) {
        self.effects.push_back(effect);
        if let Some(w) = self.effect_waker.take() {
            w.wake();
        }
    }

    /// Applies what the host did to a task and tells everyone watching it.
    pub fn handle_completion(
        &mut self,
        completion: Completion,
        now: Now,
    ) -> Result<(), CompletionError> {
        let result = self.apply_completion(completion, now);
        self.announce_records();
        result
    }

    fn apply_completion(
        &mut self,
        completion: Completion,
        now: Now,
    ) -> Result<(), CompletionError> {
        let map_err = |e| match e {
            StoreError::NotFound | StoreError::Full => CompletionError::UnknownTask,
            StoreError::OverBudget => CompletionError::TasksOverBudget,
            StoreError::Terminal(s) => CompletionError::TaskTerminal(s),
            StoreError::TooManyArtifacts => CompletionError::TooManyArtifacts,
            StoreError::ArtifactsTooLarge => CompletionError::ArtifactsTooLarge,
        };
        match completion {
            Completion::Status {
                task_id,
                state,
                message,
            } => {
                if matches!(state, TaskState::Unspecified | TaskState::Submitted) {
                    return Err(CompletionError::InvalidState(state));
                }
                self.set_status(&task_id, state, message, now)
                    .map_err(map_err)
            }
            Completion::CommandResult { call, answer } => self.answer_call(call, answer),
            Completion::CommandDone {
                task_id,
                result,
                message,
            } => {
                let state = self
                    .tasks
                    .get(&task_id)
                    .ok_or(CompletionError::UnknownTask)?
                    .state;
                if state.is_terminal() {
                    return Err(CompletionError::TaskTerminal(state));
                }
                if let Some(artifact) = result.and_then(|r| result_artifact(&task_id, r)) {
                    self.handle_completion(
                        Completion::Artifact {
                            task_id: task_id.clone(),
                            artifact,
                            append: false,
                            last_chunk: true,
                        },
                        now,
                    )?;
                }
                self.set_status(
                    &task_id,
                    TaskState::Completed,
                    message.map(|m| vec![Part::text(m)]),
                    now,
                )
                .map_err(map_err)
            }
            Completion::CommandStarted { call, link } => self.start_call_task(call, link, now),
            Completion::Ask {
                task_id,
                schema,
                channel,
                operator_only,
            } => {
                let t = self
                    .tasks
                    .get_mut(&task_id)
                    .ok_or(CompletionError::UnknownTask)?;
                if t.state.is_terminal() {
                    return Err(CompletionError::TaskTerminal(t.state));
                }
                t.set_gate(Some(crate::tasks::Gate {
                    schema,
                    channel,
                    operator_only,
                }));
                Ok(())
            }
            Completion::Artifact {
                task_id,
                artifact,
                append,
                last_chunk,
            } => {
                self.tasks
                    .put_artifact(&task_id, artifact.clone(), append)
                    .map_err(map_err)?;
                let t = &self
                    .tasks
                    .get(&task_id)
                    .expect("artifact stored on a live task");
                let event = StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                    append,
                    artifact,
                    context_id: t.context_id.to_string(),
                    last_chunk,
                    metadata: None,
                    task_id: task_id.clone(),
                });
                self.publish(&task_id, event, false);
                self.task_changed(&task_id, now);
                Ok(())
            }
        }
    }

    /// Moves a task to a new state and publishes the status update.
    pub(crate) fn set_status(
        &mut self,
        task_id: &str,
        state: TaskState,
        message: Option<Vec<Part>>,
        now: Now,
    ) -> Result<(), StoreError> {
        let t = self
            .tasks
            .set_status(task_id, state, message, now.epoch_ms)?;
        let event = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            context_id: t.context_id.to_string(),
            metadata: None,
            status: t.status(),
            task_id: t.id.to_string(),
        });
        self.publish(task_id, event, state.ends_a_turn());
        self.task_changed(task_id, now);
        if state.ends_a_turn() {
            self.deliver_pushes(task_id);
        }
        Ok(())
    }

    /// Asks the host to tell the task's webhooks where it stands (a terminal or interrupted
    /// state): the task with its status and artifacts, no history, no annotations.
    fn deliver_pushes(&mut self, task_id: &str) {
        let configs = self.push_configs.list(task_id).to_vec();
        if configs.is_empty() {
            return;
        }
        let Some(t) = self.tasks.get(task_id) else {
            return;
        };
        let body = serde_json::to_vec(&StreamResponse::Task(t.view(Some(0), true, false)))
            .unwrap_or_default();
        let trace = self.trace_of_task(task_id);
        for c in configs {
            self.push_effect(Effect::Deliver {
                task_id: task_id.to_owned(),
                config_id: c.id.clone(),
                // The URL as registration judged it (WHATWG host rules, explicit port): delivery
                // dials exactly the address the policy passed.
                url: crate::push::parse_url(&c.url)
                    .map(|u| u.endpoint())
                    .unwrap_or_else(|_| c.url.clone()),
                headers: crate::push::delivery_headers(&c),
                body: body.clone(),
                trace: trace.clone(),
            });
        }
        // The webhook reports what the task is now: that is not left to gather.
        let seq = self.record_seq();
        self.wanted_soon(seq);
    }

    /// Numbers a task's event, keeps it for reconnecting streams, and queues it for every
    /// stream of the task.
    fn publish(&mut self, task_id: &str, event: StreamResponse, settles: bool) {
        let event = std::sync::Arc::new(event);
        let seq = self.replay.record(task_id, &event);
        let Some(ids) = self.watchers.get(task_id) else {
            return;
        };
        let cap = self.config.conn.stream_queue;
        for id in ids {
            let Some(sub) = self.subs.get_mut(id) else {
                continue;
            };
            if settles {
                sub.settled = true;
            }
            if !sub.wait_only {
                if sub.queue.len() >= cap {
                    sub.overflowed = true;
                } else {
                    sub.queue.push_back((seq, event.clone()));
                }
            }
            // A blocking send has nothing to do before the task settles: waking it for each
            // status and artifact on the way would be a wake-up of its connection for nothing.
            if let Some(conn) = sub.conn.filter(|_| settles || !sub.wait_only) {
                self.ready.wake(conn);
            }
        }
    }

    pub(crate) fn subscribe(&mut self, task_id: &str, wait_only: bool) -> SubId {
        let id = self.next_sub;
        self.next_sub += 1;
        self.subs.insert(
            id,
            Subscription {
                task_id: task_id.to_owned(),
                queue: VecDeque::new(),
                overflowed: false,
                settled: false,
                wait_only,
                conn: None,
            },
        );
        self.watchers
            .entry(task_id.to_owned())
            .or_default()
            .push(id);
        id
    }

    pub(crate) fn subscription(&mut self, id: SubId) -> Option<&mut Subscription> {
        self.subs.get_mut(&id)
    }

    /// Ends a subscription; the connection that held it is done with it or gone.
    pub(crate) fn unsubscribe(&mut self, id: SubId) {
        if let Some(sub) = self.subs.remove(&id) {
            if let Some(list) = self.watchers.get_mut(&sub.task_id) {
                list.retain(|s| *s != id);
                if list.is_empty() {
                    self.watchers.remove(&sub.task_id);
                }
            }
        }
    }

    /// The SSE id of event `n` of a task's stream (see [`crate::tasks::replay`]).
    pub fn stream_event_id(&self, task_id: &str, n: u64) -> String {
        self.replay.event_id(task_id, n)
    }

    /// Stream events kept for reconnection, over all tasks: (events, serialized bytes).
    pub fn replay_kept(&self) -> (usize, usize) {
        (self.replay.kept_events(), self.replay.kept_bytes())
    }

    /// Tasks whose stream sequence the instance keeps: never more than the held tasks, as an
    /// evicted task's sequence goes with it.
    pub fn replay_tasks(&self) -> usize {
        self.replay.tasks()
    }

    pub(crate) fn new_id(&mut self) -> String {
        crate::ids::uuid_v4(self.entropy.as_mut())
    }

    /// Gives every A2A request a server span (on), or none (off, the default). On, each
    /// request's record carries its span's ids ([`crate::reqlog::RequestRecord::span`]), a
    /// request without a valid `traceparent` starts a new trace, and the work it hands out
    /// names its server span as parent. Off, the work carries the caller's `traceparent` as
    /// sent, and nothing is drawn from the entropy. See [`crate::trace`].
    pub fn set_trace_requests(&mut self, on: bool) {
        self.trace_requests = on;
    }

    /// The trace of an A2A request with this inbound context, and its server span's ids
    /// while the instance traces requests.
    pub(crate) fn request_trace(
        &mut self,
        inbound: Option<crate::trace::TraceContext>,
    ) -> (
        Option<crate::trace::TraceContext>,
        Option<crate::trace::SpanIds>,
    ) {
        use crate::trace::{new_span_id, new_trace_id, SpanIds, TraceContext};
        if !self.trace_requests {
            return (inbound, None);
        }
        let span_id = new_span_id(self.entropy.as_mut());
        let ctx = match &inbound {
            Some(c) => c.child(span_id),
            None => TraceContext::root(new_trace_id(self.entropy.as_mut()), span_id),
        };
        let ids = SpanIds {
            trace_id: ctx.trace_id,
            span_id,
            parent_span_id: inbound.map(|c| c.span_id),
            flags: ctx.flags,
        };
        (Some(ctx), Some(ids))
    }

    /// Remembers the trace a task was handed out with, for its webhook deliveries.
    pub(crate) fn remember_trace(&mut self, task_id: &str, trace: &crate::trace::TraceContext) {
        // No search for an older entry of the task: the newest is found first, and the
        // ring forgets the oldest.
        if self.task_traces.len() >= TASK_TRACES {
            self.task_traces.pop_front();
        }
        self.task_traces
            .push_back((task_id.to_owned(), trace.clone()));
    }

    /// The trace a task was last handed out with, if remembered.
    fn trace_of_task(&self, task_id: &str) -> Option<crate::trace::TraceContext> {
        self.task_traces
            .iter()
            .rev()
            .find(|(t, _)| t == task_id)
            .map(|(_, c)| c.clone())
    }

    /// The conversation a caller's `contextId` names (§7.6 "contextId namespace"). An
    /// operator's is taken as the internal key as is. A non-operator's is mapped, per
    /// principal, to an internal key `ctx-<32 hex>` minted on first use, so two callers who
    /// choose the same name get separate conversations. A missing one gets a UUIDv4 name,
    /// bound the same way.
    pub(crate) fn resolve_context(&mut self, principal: &Principal, name: &str) -> ContextIds {
        let name = if name.is_empty() {
            self.new_id()
        } else {
            name.to_owned()
        };
        if principal.is_operator() {
            return ContextIds::plain(name);
        }
        if let Some(key) = self.tasks.context_key(&principal.id, &name) {
            return ContextIds {
                key: key.to_owned(),
                name,
            };
        }
        let mut bytes = [0u8; 16];
        self.entropy.fill(&mut bytes);
        let key = format!("ctx-{}", crate::ids::hex(&bytes));
        self.tasks.bind_context(&principal.id, &name, &key);
        ContextIds { name, key }
    }
}

/// The `<taskId>.result` artifact of a task op's result (§3.6): an object is one DataPart
/// marked with the command URI, a string a text part; anything else is wrapped as data, and
/// `null` leaves no artifact (a part-less artifact is never emitted).
pub(crate) fn result_artifact(task_id: &str, result: serde_json::Value) -> Option<Artifact> {
    let (part, extensions) = match result {
        serde_json::Value::Null | serde_json::Value::Bool(false) => return None,
        serde_json::Value::String(s) => (Part::text(s), Vec::new()),
        other => {
            let mut p = Part::data(other);
            p.media_type = "application/json".into();
            (p, vec![crate::ext::COMMAND_URI.to_owned()])
        }
    };
    Some(Artifact {
        artifact_id: format!("{task_id}.result"),
        description: String::new(),
        extensions,
        metadata: None,
        name: "result".into(),
        parts: vec![part],
    })
}

/// The pre-serialized card of every listener.
fn build_cards(config: &InstanceConfig) -> Vec<std::sync::Arc<CachedCard>> {
    (0..config.listeners.len())
        .map(|i| {
            let body = serde_json::to_vec(&build_card(config, i)).unwrap_or_default();
            let digest = crate::digest::sha256(&body);
            std::sync::Arc::new(CachedCard {
                etag: format!("\"{}\"", &crate::ids::hex(&digest)[..32]),
                body,
            })
        })
        .collect()
}

/// The card of a listener as the public sees it.
pub(crate) fn build_card(config: &InstanceConfig, index: usize) -> AgentCard {
    let listener = &config.listeners[index];
    use crate::a2a::card::AgentExtension;
    use crate::ext::registry::{declared, Ext};
    let extensions = Ext::ALL
        .into_iter()
        .filter(|e| declared(*e, config.events_enabled))
        .map(|e| AgentExtension {
            description: e.description().into(),
            params: Some(match e {
                Ext::Command => crate::ext::command::public_params(&config.host),
                Ext::Events => serde_json::json!({
                    "method": crate::ext::registry::EVENTS_METHOD,
                    "schema": e.schema_url(),
                }),
                Ext::TaskAnnotations => serde_json::json!({"schema": e.schema_url()}),
            }),
            required: false,
            uri: e.uri().into(),
        })
        .collect();
    let binding = match listener.kind {
        ListenerKind::Tcp => "JSONRPC",
        ListenerKind::Unix(_) => UNIX_BINDING_URI,
    };
    let modes = || vec!["text/plain".to_owned(), "application/json".to_owned()];
    // The schemes the card declares are the ones this listener enforces.
    let security = config.declares_scheme(index).then(|| {
        let mut schemes = serde_json::Map::new();
        let mut requirements = Vec::new();
        let bearer = config.auth.has_bearer() || config.device_grant.enabled;
        if config.mtls(index) {
            schemes.insert("mtls".into(), serde_json::json!({"mtlsSecurityScheme": {}}));
            requirements.push(serde_json::json!({"schemes": {"mtls": {"list": []}}}));
            if bearer {
                requirements.push(
                    serde_json::json!({"schemes": {"mtls": {"list": []}, "bearer": {"list": []}}}),
                );
            }
        }
        if bearer {
            schemes.insert(
                "bearer".into(),
                serde_json::json!({"httpAuthSecurityScheme": {"scheme": "Bearer"}}),
            );
            if !config.mtls(index) {
                requirements.push(serde_json::json!({"schemes": {"bearer": {"list": []}}}));
            }
        }
        if config.device_grant.enabled {
            let origin = listener.origin();
            let scopes: serde_json::Map<String, serde_json::Value> = config
                .device_grant
                .scopes
                .iter()
                .map(|s| {
                    let what = match s {
                        crate::sessions::Scope::User => "act as a named user",
                        crate::sessions::Scope::Operator => "act as the operator",
                    };
                    (s.as_str().to_owned(), serde_json::json!(what))
                })
                .collect();
            schemes.insert(
                "device_code".into(),
                serde_json::json!({"oauth2SecurityScheme": {"flows": {"deviceCode": {
                    "deviceAuthorizationUrl": format!("{origin}/oauth2/device_authorization"),
                    "tokenUrl": format!("{origin}/oauth2/token"),
                    "scopes": scopes,
                }}}}),
            );
            requirements.push(serde_json::json!({"schemes": {"device_code": {"list": []}}}));
        }
        if config.auth.any.is_some() {
            // An `any` rule admits callers who present nothing: the empty alternative.
            requirements.push(serde_json::json!({"schemes": {}}));
        }
        (schemes, requirements)
    });
    AgentCard {
        capabilities: AgentCapabilities {
            extended_agent_card: Some(config.declares_scheme(index)),
            extensions,
            push_notifications: Some(config.push.enabled),
            streaming: Some(true),
        },
        default_input_modes: modes(),
        default_output_modes: modes(),
        description: config.description.clone(),
        documentation_url: config.documentation_url.clone(),
        icon_url: config.icon_url.clone(),
        name: config.name.clone(),
        provider: config.provider.clone(),
        security_requirements: security.as_ref().map(|(_, r)| r.clone()),
        security_schemes: security.map(|(s, _)| s),
        skills: config.host.skills.clone(),
        supported_interfaces: vec![AgentInterface {
            protocol_binding: binding.into(),
            protocol_version: PROTOCOL_VERSION.into(),
            url: listener.url.clone(),
        }],
        version: config.version.clone(),
    }
}
