//! The task model: records, lifecycle rules, history bounds, listing order and page tokens.

use serde_json::value::RawValue;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use crate::a2a::types::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};
use crate::auth::Principal;
use crate::time::rfc3339_ms;

pub mod index;
mod listed;
pub mod persist;
pub mod replay;
use index::Adding;
pub use index::{TaskCounts, ALL_STATES};
pub(crate) use listed::Listed;
pub use persist::TASK_KIND;

/// Bounds on what one task keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLimits {
    /// Messages kept in a task's history; the oldest are dropped past it.
    pub history_messages: usize,
    /// Serialized bytes of history kept; the oldest are dropped past it.
    pub history_bytes: usize,
    /// Tasks the in-memory store holds. Past it the oldest terminal task is evicted; when
    /// none is terminal, new tasks are refused.
    pub max_tasks: usize,
    /// Artifacts one task may hold.
    pub max_artifacts: usize,
    /// Serialized bytes of one task's artifacts together. With `history_bytes` it bounds
    /// the largest task, so the largest record the host must persist.
    pub artifact_bytes: usize,
    /// Parts one message may carry.
    pub max_message_parts: usize,
    /// Bytes of all tasks together (each task's history and artifacts, as counted against
    /// its own bounds). Past it the oldest finished tasks are dropped; when none is
    /// finished, a new task is refused.
    pub total_bytes: usize,
}

/// What a part costs in memory beyond its serialized text (its `Part` value, the `String`
/// and `Vec` headers), counted against `history_bytes` with it: 100,000 one-letter parts
/// serialize to 1.3 MB but take about 20 MB as values.
pub const PART_COST: usize = 96;

/// The longest message (its JSON text, in bytes) a finished task packs (`HeldMessage`).
/// Packing saves a message's value overhead, a few hundred bytes whatever its length, so it
/// pays for short messages, which most are; a longer one stays a shared value, so the
/// readers of a large finished task share it, where each would parse its own copy of the
/// text (24 stalled readers of a 1.8 MB message would hold 24 copies).
pub const PACKED_MESSAGE_MAX: usize = 4096;

impl TaskLimits {
    /// The limits the daemon uses when its configuration sets none.
    pub const DEFAULT: TaskLimits = TaskLimits {
        history_messages: 64,
        history_bytes: 256 * 1024,
        max_tasks: 10_000,
        max_artifacts: 64,
        artifact_bytes: 4 * 1024 * 1024,
        max_message_parts: 256,
        total_bytes: 512 * 1024 * 1024,
    };
}

/// The conversation a task belongs to, under both of its names (§7.6 "contextId
/// namespace"): `name` is the owner's own `contextId`, the only one the wire ever shows for
/// the task; `key` is the internal key the host keys the conversation by (`ctx-<32 hex>`
/// for a non-operator's, the name itself for an operator's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextIds {
    /// The owner's own `contextId`: what the wire shows.
    pub name: String,
    /// The internal key the host keys the conversation by: what keeps two owners' same-named
    /// contexts apart.
    pub key: String,
}

impl ContextIds {
    /// A context whose internal key is its name (an operator's).
    pub fn plain(name: impl Into<String>) -> Self {
        let name = name.into();
        ContextIds {
            key: name.clone(),
            name,
        }
    }
}

/// Everything the instance knows about one task.
#[derive(Clone, Debug)]
pub struct TaskRecord {
    /// The task's id, unique in the store: one allocation shared by every map of the store
    /// that names the task.
    pub(crate) id: Arc<str>,
    /// The owner's own name for the task's context: what `Task.contextId` shows. One
    /// allocation per context, shared with the store's namespace and indexes.
    pub context_id: Arc<str>,
    /// The internal key of the task's conversation: what the host sees. Shared like the
    /// name (and is the name's own allocation when they are equal).
    pub context_key: Arc<str>,
    /// Who created the task: access to it is checked against them.
    /// One allocation per principal, shared by all its held tasks ([`TaskStore::principals`]).
    pub(crate) owner: Arc<Principal>,
    /// The task's current state.
    pub(crate) state: TaskState,
    /// The agent message that came with the current status, if any.
    status_message: Option<StatusMessage>,
    /// Epoch milliseconds of the current status.
    pub status_ms: u64,
    /// The store's update counter when the status last changed: orders tasks whose status
    /// changed in the same millisecond.
    pub status_seq: u64,
    pub(crate) created_ms: u64,
    /// The messages of the conversation so far, oldest first, each with its weight.
    history: VecDeque<(HeldMessage, usize)>,
    history_bytes: usize,
    /// The task's artifacts in the order they were first produced; shared with the snapshots
    /// that carry them.
    pub(crate) artifacts: Vec<Arc<Artifact>>,
    /// Serialized bytes of `artifacts`, kept as they change (an appended part adds its own
    /// size and a separator), so a bound check never reserializes them.
    artifact_bytes: usize,
    /// How many agent status messages this task has had; names the next one.
    status_count: u64,
    /// Every state the task has been in, oldest first, with when it entered it.
    pub status_history: Vec<(TaskState, u64)>,
    /// The command that started the task and what it tracks; `None` for the common task, a
    /// conversation turn that tracks itself. Boxed, as what few tasks have.
    origin: Option<Box<Origin>>,
    /// The question of the input-required gate the task waits at, if any. Boxed likewise.
    gate: Option<Box<Gate>>,
    /// The client messages this task accepted (it was created by or continued with them),
    /// oldest first, each with its serialized size: what recognizes a retried SendMessage.
    /// Bounded like the history.
    accepted: VecDeque<(Accepted, usize)>,
    /// Serialized bytes of `accepted`, counted in the task's weight.
    accepted_bytes: usize,
}

/// Where a task started by a command came from.
#[derive(Clone, Debug)]
struct Origin {
    /// What the task tracks (task annotations' `link`).
    link: Link,
    /// The command op that started it.
    command: Option<String>,
}

/// The question of an input-required gate: the answer it asks for and who may give it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gate {
    /// The JSON Schema of the answer.
    pub schema: Option<serde_json::Value>,
    /// Where the gate is also announced.
    pub channel: Option<String>,
    /// Only an operator may answer (an exec step's approval): the owner of the run must not
    /// approve its own program. Not persisted: a gate does not outlive a restart (its run
    /// ends FAILED).
    pub operator_only: bool,
}

/// A message of a task's history, as the task holds it: live while the task can still
/// change, then packed as its JSON text when the task ends. A finished task is read
/// seldom and never changes again, and a store holds mostly finished tasks: as text, a
/// short message costs its own bytes and one allocation instead of a message value, a
/// parts vector and a string per field (about 340 bytes more for a one-line message).
/// Shown, a packed message is read back into a value. Only a message of at most
/// [`PACKED_MESSAGE_MAX`] bytes is packed.
#[derive(Clone, Debug)]
enum HeldMessage {
    Live(Arc<Message>),
    Packed(Box<str>),
}

impl HeldMessage {
    /// The message as a value.
    fn message(&self) -> Arc<Message> {
        match self {
            HeldMessage::Live(m) => m.clone(),
            // Packed text is written by `pack` or checked when a record is restored
            // (`from_task_doc`), so it reads back; an unreadable one would show empty
            // rather than stop the daemon.
            HeldMessage::Packed(text) => Arc::new(serde_json::from_str(text).unwrap_or_default()),
        }
    }

    /// The message as a stored record carries it.
    fn doc(&self) -> persist::HistoryDoc<'_> {
        match self {
            HeldMessage::Live(m) => persist::HistoryDoc::Live(m.clone()),
            HeldMessage::Packed(text) => {
                persist::HistoryDoc::Packed(serde_json::from_str(text).ok())
            }
        }
    }
}

/// A task's current agent status message: whole while the task can change (shared with the
/// events that carry it). The store makes every one itself
/// ([`TaskRecord::made_status_message`]):
/// its ids are the task's and its `messageId` is `<task id>.status.<status count>`, so once
/// the task has ended only its parts are kept, packed as their JSON text like its history
/// ([`HeldMessage`]), and the message is made whole again when shown. That spares a
/// finished task a message value, a parts vector and three strings, about 500 bytes. A
/// restored status message of any other shape (a record written by hand) stays whole.
#[derive(Clone, Debug)]
enum StatusMessage {
    Whole(Arc<Message>),
    /// The parts' JSON text, written by [`TaskRecord::pack`]: a page refers to it as it
    /// is, neither copied under the lock nor parsed again to be shown.
    PackedParts(Arc<RawValue>),
}

/// One message a task accepted: who sent it, its `messageId`, and the digest of its content
/// ([`message_digest`]), so a retry is told from a different message under the same id.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Accepted {
    /// The sender's principal id (not always the owner: an operator answers others' gates);
    /// one allocation per sender, shared with the store's `by_message` key.
    pub(crate) by: Arc<str>,
    /// Shared with the store's `by_message` key.
    pub(crate) message_id: Arc<str>,
    pub(crate) digest: MessageDigest,
}

/// The sha256 of a message as the client sent it ([`message_digest`]): held as its 32
/// bytes, written (in a stored record, in a debug print) as 64 hex digits.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MessageDigest([u8; 32]);

impl MessageDigest {
    /// A digest of these bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        MessageDigest(bytes)
    }

    /// Its 64 hex digits.
    pub fn to_hex(&self) -> String {
        crate::ids::hex(&self.0)
    }

    /// A digest from its 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        let text = text.as_bytes();
        if text.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
            let digit = |c: u8| (c as char).to_digit(16);
            *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Some(MessageDigest(out))
    }
}

impl core::fmt::Debug for MessageDigest {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl serde::Serialize for MessageDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for MessageDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        MessageDigest::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("a digest is 64 hex digits"))
    }
}

/// The sha256 of a message as the client sent it. Its serialization is canonical: the
/// fields in declaration order, object keys sorted (serde_json's map is ordered).
pub fn message_digest(message: &Message) -> MessageDigest {
    let bytes = serde_json::to_vec(message).unwrap_or_default();
    MessageDigest(crate::digest::sha256(&bytes))
}

impl TaskRecord {
    /// The task as the wire shows it. `history_length`: `None` all, `Some(n)` the newest n.
    pub fn to_task(&self, history_length: Option<usize>, include_artifacts: bool) -> Task {
        self.task_with(history_length, include_artifacts, self.status_message())
    }

    /// The task as a list page shows it: a packed status message stays its parts' text,
    /// written from it as the page is serialized ([`Listed`]).
    pub(crate) fn to_listed(
        &self,
        history_length: Option<usize>,
        include_artifacts: bool,
    ) -> Listed {
        match &self.status_message {
            Some(StatusMessage::PackedParts(parts)) => Listed::made(
                self.task_with(history_length, include_artifacts, None),
                parts.clone(),
                self.status_count,
            ),
            _ => self.to_task(history_length, include_artifacts).into(),
        }
    }

    fn task_with(
        &self,
        history_length: Option<usize>,
        include_artifacts: bool,
        status_message: Option<Arc<Message>>,
    ) -> Task {
        let keep = history_length.unwrap_or(usize::MAX).min(self.history.len());
        Task {
            artifacts: if include_artifacts {
                self.artifacts.clone()
            } else {
                Vec::new()
            },
            // `String::from`, not `to_string`: an `Arc<str>` would go through `Display`.
            context_id: String::from(&*self.context_id),
            history: self
                .history
                .iter()
                .skip(self.history.len() - keep)
                .map(|(m, _)| m.message())
                .collect(),
            id: String::from(&*self.id),
            metadata: None,
            status: self.status_with(status_message),
        }
    }

    /// What the task tracks (task annotations' `link`): for most tasks, their own turn.
    pub fn link(&self) -> (LinkKind, &str) {
        match &self.origin {
            Some(o) => (o.link.kind, &o.link.id),
            None => (LinkKind::Turn, &self.id),
        }
    }

    /// The command op that started the task, if one did.
    pub fn command(&self) -> Option<&str> {
        self.origin.as_ref()?.command.as_deref()
    }

    /// The question of the gate the task waits at, if any.
    pub fn gate(&self) -> Option<&Gate> {
        self.gate.as_deref()
    }

    /// Sets (or, with `None` or an empty question, clears) the gate's question.
    pub(crate) fn set_gate(&mut self, gate: Option<Gate>) {
        self.gate = gate.filter(|g| *g != Gate::default()).map(Box::new);
    }

    /// Sets what the task tracks and the command that started it.
    fn set_origin(&mut self, link: Link, command: Option<String>) {
        let own_turn = link.kind == LinkKind::Turn && *link.id == *self.id && command.is_none();
        self.origin = (!own_turn).then(|| Box::new(Origin { link, command }));
    }

    /// The task's current status as the wire shows it: state, status message and RFC 3339
    /// timestamp.
    pub(crate) fn status(&self) -> TaskStatus {
        self.status_with(self.status_message())
    }

    fn status_with(&self, message: Option<Arc<Message>>) -> TaskStatus {
        TaskStatus {
            message,
            state: self.state,
            timestamp: rfc3339_ms(self.status_ms),
        }
    }

    /// What the store's indexes file the task under.
    fn entry(&self) -> index::Entry<'_> {
        index::Entry {
            owner: &self.owner.id,
            name: &self.context_id,
            key: &self.context_key,
            state: self.state,
            at: (self.status_ms, self.status_seq),
        }
    }

    /// How many messages the task's history keeps: the unit tests check its bound.
    #[cfg(test)]
    fn history_len(&self) -> usize {
        self.history.len()
    }

    /// About the bytes of the task's JSON: its weight and its status message, which the
    /// weight does not count. What decides whether an answer is written in slices.
    pub(crate) fn answer_weight(&self) -> usize {
        self.weight()
            + match &self.status_message {
                None => 0,
                Some(StatusMessage::Whole(m)) => serialized_len(&**m),
                // Counted from the text: a listing weighs every task it shows this way.
                Some(StatusMessage::PackedParts(parts)) => {
                    listed::made_status_len(&self.id, &self.context_id, parts, self.status_count)
                }
            }
    }

    /// The agent message of the current status, made whole.
    pub(crate) fn status_message(&self) -> Option<Arc<Message>> {
        match self.status_message.as_ref()? {
            StatusMessage::Whole(m) => Some(m.clone()),
            // Written by `pack` from parts, so it reads back.
            StatusMessage::PackedParts(text) => Some(Arc::new(
                self.made_status_message(serde_json::from_str(text.get()).unwrap_or_default()),
            )),
        }
    }

    /// The current agent status message as the store makes it from `parts`: the task's
    /// ids, and a `messageId` named after the task's status count.
    fn made_status_message(&self, parts: Vec<Part>) -> Message {
        Message {
            context_id: String::from(&*self.context_id),
            message_id: status_message_id(&self.id, self.status_count),
            parts,
            role: Role::Agent,
            task_id: String::from(&*self.id),
            ..Message::default()
        }
    }

    /// Whether `m` has the shape [`TaskRecord::made_status_message`] gives, so its parts alone
    /// say it all.
    fn made_here(&self, m: &Message) -> bool {
        m.task_id == *self.id
            && m.context_id == *self.context_id
            && m.role == Role::Agent
            && m.message_id == status_message_id(&self.id, self.status_count)
            && m.extensions.is_empty()
            && m.metadata.is_none()
            && m.reference_task_ids.is_empty()
    }

    /// Moves the current status message, if any, into the history.
    fn retire_status_message(&mut self, limits: &TaskLimits) {
        if let Some(prev) = self.status_message() {
            self.status_message = None;
            self.push_history(prev, limits);
        }
    }

    /// What the task counts against [`TaskLimits::total_bytes`].
    pub(crate) fn weight(&self) -> usize {
        self.history_bytes + self.artifact_bytes + self.accepted_bytes
    }

    /// Where the task stands in the listing order: its status time and sequence.
    pub(crate) fn position(&self) -> (u64, u64) {
        (self.status_ms, self.status_seq)
    }

    /// A cheap guess, from sizes already kept, at the bytes of this task's view with its
    /// newest `history` messages (and its artifacts when asked): what bounds how much of a
    /// list page is built under the instance before the page is cut exactly, outside it.
    pub(crate) fn view_weight(&self, history: usize, include_artifacts: bool) -> usize {
        let keep = history.min(self.history.len());
        let shown: usize = self
            .history
            .iter()
            .skip(self.history.len() - keep)
            .map(|(_, size)| size)
            .sum();
        let status = match &self.status_message {
            None => 0,
            Some(StatusMessage::Whole(m)) => serialized_len(&**m),
            Some(StatusMessage::PackedParts(text)) => text.get().len(),
        };
        let artifacts = if include_artifacts {
            self.artifact_bytes
        } else {
            0
        };
        crate::a2a::piecewise::TASK_ENVELOPE + shown + status + artifacts
    }

    /// The messages this task accepted, oldest first.
    pub(crate) fn accepted(&self) -> impl Iterator<Item = &Accepted> {
        self.accepted.iter().map(|(a, _)| a)
    }

    fn push_history(&mut self, message: Arc<Message>, limits: &TaskLimits) {
        let size = serialized_len(&message) + message.parts.len() * PART_COST;
        // Most tasks hold one or two messages: the first is given room for itself alone,
        // not the four a growing deque starts with.
        if self.history.capacity() == 0 {
            self.history.reserve_exact(1);
        }
        self.history.push_back((HeldMessage::Live(message), size));
        self.history_bytes += size;
        while self.history.len() > limits.history_messages
            || (self.history_bytes > limits.history_bytes && self.history.len() > 1)
        {
            if let Some((_, s)) = self.history.pop_front() {
                self.history_bytes -= s;
            }
        }
    }

    /// Packs the history and the status message's parts as JSON text, once the task has
    /// ended: a history message's weight becomes its text's length, which is all it now
    /// takes.
    fn pack(&mut self) {
        if let Some(StatusMessage::Whole(m)) = &self.status_message {
            if self.made_here(m) {
                // Serialized here, so valid JSON: not parsed again.
                if let Ok(text) = serde_json::value::to_raw_value(&m.parts) {
                    if text.get().len() <= PACKED_MESSAGE_MAX {
                        self.status_message = Some(StatusMessage::PackedParts(Arc::from(text)));
                    }
                }
            }
        }
        for (m, size) in self.history.iter_mut() {
            if let HeldMessage::Live(live) = m {
                let len = *size - live.parts.len() * PART_COST;
                if len > PACKED_MESSAGE_MAX {
                    continue;
                }
                let text = json_text(&**live, len);
                self.history_bytes = self.history_bytes - *size + text.len();
                *size = text.len();
                *m = HeldMessage::Packed(text);
            }
        }
    }

    /// Makes `parts` the task's new agent status message, which names itself after the
    /// task's status count.
    fn agent_message(&mut self, parts: Vec<Part>) {
        self.status_count += 1;
        let made = self.made_status_message(parts);
        self.status_message = Some(StatusMessage::Whole(Arc::new(made)));
    }
}

/// `value`'s JSON text, written into one allocation of `len` bytes, its known length:
/// packing runs under the driver's shared lock, where `to_string`'s growing buffer and
/// final shrink would copy the text up to three times.
fn json_text(value: &impl serde::Serialize, len: usize) -> Box<str> {
    let mut buf = Vec::with_capacity(len);
    let _ = serde_json::to_writer(&mut buf, value);
    // serde_json writes UTF-8 only.
    String::from_utf8(buf).unwrap_or_default().into_boxed_str()
}

/// The `messageId` of a task's `n`th agent status message, `<task id>.status.<n>`: as a
/// string, or written straight into a listing's page ([`listed`]).
struct StatusId<'a>(&'a str, u64);

impl std::fmt::Display for StatusId<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.status.{}", self.0, self.1)
    }
}

impl serde::Serialize for StatusId<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn status_message_id(task_id: &str, n: u64) -> String {
    StatusId(task_id, n).to_string()
}

/// Why the store refused a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// No task of that id is in the store.
    NotFound,
    /// The task is in this terminal state, and a terminal task never changes again.
    Terminal(TaskState),
    /// The store holds `max_tasks` tasks and none is finished, so none can be dropped for a new
    /// one.
    Full,
    /// The task already holds `max_artifacts` artifacts and the artifact is a new one.
    TooManyArtifacts,
    /// The task's artifacts would exceed [`TaskLimits::artifact_bytes`].
    ArtifactsTooLarge,
    /// A new task would take the tasks past [`TaskLimits::total_bytes`], and no finished
    /// task is left to drop.
    OverBudget,
}

/// The length of a value's JSON, counted as it is serialized.
pub(crate) use crate::a2a::piecewise::json_len as serialized_len;

/// Entries a task's `statusHistory` keeps: the first (its submission) and the newest.
pub const STATUS_HISTORY_KEPT: usize = 256;

/// Adds a state to a task's `statusHistory`: only a change of state is an entry (an agent's
/// progress updates in WORKING are one stay in WORKING), and past [`STATUS_HISTORY_KEPT`]
/// the oldest entry after the first is dropped, so a long-lived task cannot grow it, nor
/// every feed event and stored record that carries it, without end.
fn record_transition(history: &mut Vec<(TaskState, u64)>, state: TaskState, at_ms: u64) {
    if history.last().is_some_and(|(s, _)| *s == state) {
        return;
    }
    if history.len() >= STATUS_HISTORY_KEPT {
        history.remove(1);
    }
    if history.capacity() == history.len() && history.len() < 4 {
        // A task passes through a handful of states: grow one at a time until four.
        history.reserve_exact(1);
    }
    history.push((state, at_ms));
}

/// The in-memory task store, with the order ListTasks pages through.
#[derive(Debug)]
pub struct TaskStore {
    limits: TaskLimits,
    /// Boxed, so the map's spare capacity costs a pointer per slot rather than a record.
    tasks: HashMap<Arc<str>, Box<TaskRecord>>,
    /// (status time, update sequence) of every task, to its id: newest last.
    order: BTreeMap<(u64, u64), Arc<str>>,
    /// Counts status changes; never repeats.
    seq: u64,
    /// (created time, id) of terminal tasks: the eviction order.
    terminal: BTreeSet<(u64, Arc<str>)>,
    /// Tasks evicted to make room, not yet reported: (id, owner).
    evicted: Vec<(String, Principal)>,
    /// Write-ahead: tasks changed (or removed) since the host last drained them. Off for a
    /// memory-only instance, where nobody drains it.
    track: bool,
    dirty: BTreeSet<String>,
    /// Counts changes while tracking; part of the instance's record sequence.
    changes: u64,
    /// The sum of every held task's weight ([`TaskLimits::total_bytes`]).
    bytes: usize,
    /// (sender's principal id, messageId) of every message a held task still lists as
    /// accepted, to that task: bounded by the tasks held times the history bound.
    /// Keyed by sender, then messageId, so a lookup borrows both strings and each is held
    /// once, shared with the task's own list.
    by_message: HashMap<Arc<str>, HashMap<Arc<str>, Arc<str>>>,
    /// The listing's indexes: by owner, state, owner and state, and context, with counts;
    /// and the contextId namespace, (owner id, the owner's name) to its internal key, whose
    /// entries are the owner's context buckets. Rebuilt from the tasks at restore.
    index: index::TaskIndex,
    /// The owners of held tasks, by id: each held once, whatever number of tasks it owns.
    /// With each, how many held tasks that principal id owns: the entry goes with the last.
    principals: HashMap<String, (Arc<Principal>, usize)>,
    /// Tasks that ended and are not packed yet ([`TaskRecord::pack`]): packed when the store
    /// next creates a task or changes one's status (so it holds one at most), so the answer
    /// and events of the change that ended a task are made from its live values, not read
    /// back from the text just written. While tracking, they wait for the next drain of
    /// records instead ([`TaskStore::pack_before_change`]): the tasks ended since the last,
    /// packed sooner only when the budget needs their room ([`TaskStore::shed`]). Packing reads its text back exactly because serde_json's `float_roundtrip` is on (the
    /// workspace's Cargo.toml).
    unpacked: Vec<Arc<str>>,
}

impl TaskStore {
    /// An empty store bounded by `limits`.
    pub fn new(limits: TaskLimits) -> Self {
        TaskStore {
            limits,
            tasks: HashMap::new(),
            order: BTreeMap::new(),
            seq: 0,
            evicted: Vec::new(),
            terminal: BTreeSet::new(),
            track: false,
            dirty: BTreeSet::new(),
            changes: 0,
            bytes: 0,
            by_message: HashMap::new(),
            index: index::TaskIndex::default(),
            principals: HashMap::new(),
            unpacked: Vec::new(),
        }
    }

    /// Room for `n` more tasks in the map of tasks by id and in the operator's map of
    /// contexts (each may have its own); the owners' maps grow with what the tasks share.
    /// [`TaskStore::enforce_bound`] gives back what the restore did not use.
    pub(crate) fn reserve(&mut self, n: usize) {
        let n = n.min(self.limits.max_tasks);
        self.tasks.reserve(n);
        self.index.reserve(n);
    }

    /// The task that accepted `by`'s message `message_id`, with that message's digest.
    pub fn accepted_by(&self, by: &str, message_id: &str) -> Option<(&TaskRecord, MessageDigest)> {
        let id = self.by_message.get(by)?.get(message_id)?;
        let t = self.tasks.get(id)?;
        let a = t
            .accepted()
            .find(|a| &*a.by == by && &*a.message_id == message_id)?;
        Some((t, a.digest))
    }

    /// Records that task `id` accepted `by`'s message `message_id` (of digest `digest`), so
    /// a retry of it finds the task. Past the history bound the oldest entry is forgotten.
    pub fn accept_message(&mut self, id: &str, by: &str, message_id: &str, digest: MessageDigest) {
        let keep = self.limits.history_messages.max(1);
        let Some(t) = self.tasks.get_mut(id) else {
            return;
        };
        let before = t.weight();
        let task = t.id.clone();
        let by = match self.by_message.get_key_value(by) {
            Some((k, _)) => k.clone(),
            None => Arc::from(by),
        };
        let message_id: Arc<str> = Arc::from(message_id);
        let entry = Accepted {
            by: by.clone(),
            message_id: message_id.clone(),
            digest,
        };
        let size = serialized_len(&entry);
        if t.accepted.capacity() == 0 {
            t.accepted.reserve_exact(1);
        }
        t.accepted.push_back((entry, size));
        t.accepted_bytes += size;
        let mut dropped = Vec::new();
        while t.accepted.len() > keep {
            if let Some((old, s)) = t.accepted.pop_front() {
                t.accepted_bytes -= s;
                dropped.push(old);
            }
        }
        let after = t.weight();
        self.bytes = self.bytes - before + after;
        for old in &dropped {
            self.unindex(id, old);
        }
        self.by_message
            .entry(by)
            .or_default()
            .insert(message_id, task);
        self.touch(id);
        if after > before {
            self.shed(id, 0);
        }
    }

    /// Forgets an index entry, if it still names task `id`.
    fn unindex(&mut self, id: &str, a: &Accepted) {
        let Some(sent) = self.by_message.get_mut(&*a.by) else {
            return;
        };
        if sent.get(&*a.message_id).is_some_and(|t| &**t == id) {
            sent.remove(&*a.message_id);
            if sent.is_empty() {
                self.by_message.remove(&*a.by);
            }
        }
    }

    /// What all held tasks weigh together.
    pub fn total_bytes(&self) -> usize {
        self.bytes
    }

    /// Drops the oldest finished tasks (never `keep`) while the tasks weigh more than
    /// [`TaskLimits::total_bytes`] with `incoming` more bytes. Whether they then fit.
    fn shed(&mut self, keep: &str, incoming: usize) -> bool {
        if self.bytes + incoming > self.limits.total_bytes && !self.unpacked.is_empty() {
            // Finished tasks waiting for the drain take less room packed: no task is
            // dropped for room they would give.
            self.pack_finished();
        }
        while self.bytes + incoming > self.limits.total_bytes {
            let Some(oldest) = self
                .terminal
                .iter()
                .find(|(_, id)| &**id != keep)
                .map(|(_, id)| id.clone())
            else {
                return false;
            };
            self.evict(&oldest);
        }
        true
    }

    /// Runs `change` on a live task and keeps the total weight in step with it; past the
    /// budget, finished tasks make room. Client messages and artifacts are checked against
    /// the budget before they are taken ([`TaskStore::append_message`],
    /// [`TaskStore::put_artifact`]); a state change never is (a task must always be able to
    /// end), so if its status message finds no room, the task's own oldest history goes.
    fn reweigh<T>(
        &mut self,
        id: &str,
        change: impl FnOnce(&mut TaskRecord) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let t = self.live_mut(id)?;
        let before = t.weight();
        let out = change(t);
        let after = t.weight();
        self.bytes = self.bytes - before + after;
        if after > before && !self.shed(id, 0) {
            if let Some(t) = self.tasks.get_mut(id) {
                while self.bytes > self.limits.total_bytes && t.history.len() > 1 {
                    if let Some((_, s)) = t.history.pop_front() {
                        t.history_bytes -= s;
                        self.bytes -= s;
                    }
                }
            }
        }
        out
    }

    /// Makes room for a live task to grow by `growth` bytes: finished tasks go first;
    /// `Err(OverBudget)` when none is left to go.
    fn room_to_grow(&mut self, id: &str, growth: usize) -> Result<(), StoreError> {
        self.live_mut(id)?;
        match growth == 0 || self.shed(id, growth) {
            true => Ok(()),
            false => Err(StoreError::OverBudget),
        }
    }

    /// The internal key `owner` has bound to its context name `name`, if any.
    pub fn context_key(&self, owner: &str, name: &str) -> Option<&str> {
        self.index.context_key(owner, name).map(|k| &**k)
    }

    /// Binds `owner`'s context name `name` to `key` before any task uses it. Names held tasks
    /// use are kept as long as those tasks; unused ones up to `max_tasks` of them, past which
    /// the one unused the longest is forgotten.
    pub fn bind_context(&mut self, owner: &str, name: &str, key: &str) {
        self.index.bind(owner, name, key, self.limits.max_tasks);
    }

    /// The shared allocation of `owner`: the one held tasks already share when it is the
    /// same principal (a reload can change a principal's grants: new tasks then share the
    /// new one).
    /// Call once for each task the store takes in (its `release_owner` when it goes).
    fn intern_owner(&mut self, owner: Principal) -> Arc<Principal> {
        if let Some((held, tasks)) = self.principals.get_mut(&owner.id) {
            if **held != owner {
                *held = Arc::new(owner);
            }
            *tasks += 1;
            return held.clone();
        }
        let held = Arc::new(owner);
        self.principals.insert(held.id.clone(), (held.clone(), 1));
        held
    }

    /// Counts out a task going: its owner's entry goes with the owner's last held task.
    fn release_owner(&mut self, rec: &TaskRecord) {
        if let Some((_, tasks)) = self.principals.get_mut(&rec.owner.id) {
            *tasks = tasks.saturating_sub(1);
            if *tasks == 0 {
                self.principals.remove(&rec.owner.id);
            }
        }
    }

    /// How many context names the namespace holds (used and unused).
    pub fn context_count(&self) -> usize {
        self.index.context_count()
    }

    /// Starts (or stops) remembering which tasks changed, for [`TaskStore::take_dirty`].
    pub(crate) fn set_tracking(&mut self, on: bool) {
        self.track = on;
        if !on {
            self.dirty.clear();
        }
    }

    fn touch(&mut self, id: &str) {
        if self.track {
            self.changes += 1;
            if !self.dirty.contains(id) {
                self.dirty.insert(id.to_owned());
            }
        }
    }

    /// Marks every task changed, for a drain of the whole state.
    pub(crate) fn mark_all_dirty(&mut self) {
        if self.track {
            self.dirty
                .extend(self.tasks.keys().map(|id| id.to_string()));
        }
    }

    /// Changes made while tracking.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// The tasks changed since the last call: each as it stands now, or `None` if it is gone.
    pub(crate) fn take_dirty(&mut self) -> Vec<(String, Option<Box<serde_json::value::RawValue>>)> {
        let records = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|id| {
                let body = self.tasks.get(id.as_str()).map(|t| t.to_doc_json());
                (id, body)
            })
            .collect();
        // The finished tasks that waited for their records (`pack_before_change`).
        self.pack_finished();
        records
    }

    /// Puts back a task read from the durable store, with its place in the listing order.
    /// A task already held (the same key twice) is replaced.
    pub fn restore(&mut self, mut rec: TaskRecord) {
        if let Some(old) = self.remove(&rec.id) {
            drop(old);
        }
        rec.owner = self.intern_owner(Arc::unwrap_or_clone(rec.owner));
        // The bound may have shrunk since the record was written.
        while rec.accepted.len() > self.limits.history_messages.max(1) {
            if let Some((_, s)) = rec.accepted.pop_front() {
                rec.accepted_bytes -= s;
            }
        }
        self.bytes += rec.weight();
        // Two records at one listing position happen only in a store written by hand: the
        // later one moves after everything held, so every held task has its own position.
        // So does a sequence past any the store counts to (by hand too): the sequence goes
        // on counting from the largest restored, and must never wrap.
        if rec.status_seq > MAX_RESTORED_SEQ
            || self.order.contains_key(&(rec.status_ms, rec.status_seq))
        {
            rec.status_seq = self.seq + 1;
        }
        self.seq = self.seq.max(rec.status_seq);
        self.order
            .insert((rec.status_ms, rec.status_seq), rec.id.clone());
        // The context's name and key are held once, whichever tasks use them.
        self.index.add(
            &rec.owner.id,
            &mut rec.context_id,
            &mut rec.context_key,
            rec.state,
            (rec.status_ms, rec.status_seq),
            Adding::Restored,
        );
        if rec.state.is_terminal() {
            self.terminal.insert((rec.created_ms, rec.id.clone()));
        }
        for (a, _) in rec.accepted.iter_mut() {
            // The sender's id is held once, whichever task names it.
            let by = self.by_message.entry(a.by.clone());
            a.by = by.key().clone();
            by.or_default().insert(a.message_id.clone(), rec.id.clone());
        }
        self.tasks.insert(rec.id.clone(), Box::new(rec));
    }

    /// After a restore: evicts the oldest terminal tasks while more are held than
    /// `max_tasks` allows (the bound may have shrunk since they were written), and gives
    /// back the room `TaskStore::reserve` made for tasks that did not come.
    pub fn enforce_bound(&mut self) {
        while self.tasks.len() > self.limits.max_tasks || self.bytes > self.limits.total_bytes {
            let Some((_, id)) = self.terminal.iter().next().cloned() else {
                break;
            };
            // Not reported as evicted: nothing of this run saw the task yet (the caller
            // drops its push configs).
            self.remove(&id);
            self.touch(&id);
        }
        self.tasks.shrink_to_fit();
        self.index.shrink_to_fit();
    }

    /// How many tasks the store holds, finished ones included.
    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    /// The task of that id, whoever owns it: the caller checks access.
    pub fn get(&self, id: &str) -> Option<&TaskRecord> {
        self.tasks.get(id).map(|t| &**t)
    }

    /// Counts a task as changed without changing it: its record is written again, and an
    /// answer about it waits until that write is durable.
    pub(crate) fn mark_changed(&mut self, id: &str) {
        if self.tasks.contains_key(id) {
            self.touch(id);
        }
    }

    /// Counted as a change: the caller is about to write to the task.
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut TaskRecord> {
        if self.tasks.contains_key(id) {
            self.touch(id);
        }
        self.tasks.get_mut(id).map(|t| &mut **t)
    }

    /// A task `principal` may see.
    pub fn visible(&self, id: &str, principal: &Principal) -> Option<&TaskRecord> {
        self.tasks
            .get(id)
            .map(|t| &**t)
            .filter(|t| principal.may_see(&t.owner))
    }

    /// Creates a task in SUBMITTED holding the client's first message.
    pub fn create(
        &mut self,
        id: String,
        context: ContextIds,
        owner: Principal,
        mut first: Message,
        now_ms: u64,
    ) -> Result<&TaskRecord, StoreError> {
        self.pack_before_change();
        if self.tasks.len() >= self.limits.max_tasks {
            let oldest = self
                .terminal
                .iter()
                .next()
                .cloned()
                .ok_or(StoreError::Full)?;
            self.evict(&oldest.1);
        }
        // Room for the first message within the bytes of all tasks, finished ones dropped
        // for it if need be.
        let incoming = serialized_len(&first) + first.parts.len() * PART_COST;
        if !self.shed("", incoming) {
            return Err(StoreError::OverBudget);
        }
        first.task_id = id.clone();
        first.context_id = context.name.clone();
        // The context's name and key as the namespace holds them, or held once from here on.
        let (name, key) = self.index.shared(&owner.id, &context.name, &context.key);
        let name = name.unwrap_or_else(|| context.name.into());
        let key = key.unwrap_or_else(|| match *context.key == *name {
            true => name.clone(),
            false => context.key.into(),
        });
        let id: Arc<str> = id.into();
        let owner = self.intern_owner(owner);
        let mut rec = TaskRecord {
            id: id.clone(),
            context_id: name,
            context_key: key,
            owner,
            state: TaskState::Submitted,
            status_message: None,
            status_ms: now_ms,
            status_seq: self.next_seq(),
            created_ms: now_ms,
            history: VecDeque::new(),
            history_bytes: 0,
            artifacts: Vec::new(),
            artifact_bytes: 0,
            status_count: 0,
            status_history: vec![(TaskState::Submitted, now_ms)],
            origin: None,
            gate: None,
            accepted: VecDeque::new(),
            accepted_bytes: 0,
        };
        rec.push_history(Arc::new(first), &self.limits);
        self.bytes += rec.weight();
        self.order.insert((now_ms, rec.status_seq), id.clone());
        self.index.insert(rec.entry());
        self.touch(&id);
        Ok(self.tasks.entry(id).or_insert(Box::new(rec)))
    }

    /// Packs the finished tasks not packed yet (`TaskStore::unpacked`).
    pub fn pack_finished(&mut self) {
        while let Some(id) = self.unpacked.pop() {
            if let Some(t) = self.tasks.get_mut(&id) {
                if t.state.is_terminal() {
                    let before = t.weight();
                    t.pack();
                    self.bytes = self.bytes - before + t.weight();
                }
            }
        }
    }

    /// What a change does first: packs the tasks that ended before it, unless the host
    /// drains records. Then each waits for [`TaskStore::take_dirty`], which packs it once it
    /// has made its record from the task's live values: packed, its messages would be
    /// parsed back from their text for that record, under the driver's lock.
    fn pack_before_change(&mut self) {
        if !self.track {
            self.pack_finished();
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn remove(&mut self, id: &str) -> Option<Box<TaskRecord>> {
        let t = self.tasks.remove(id)?;
        self.bytes -= t.weight();
        self.order.remove(&(t.status_ms, t.status_seq));
        self.index.remove(t.entry(), self.limits.max_tasks);
        self.terminal.remove(&(t.created_ms, t.id.clone()));
        self.release_owner(&t);
        for a in t.accepted() {
            self.unindex(id, a);
        }
        Some(t)
    }

    /// Drops a terminal task to make room. The instance learns of it through
    /// [`TaskStore::take_evicted`] and forgets what it keeps per task (stream events for
    /// reconnection, push configs), and the feed reports it (`task.removed`).
    fn evict(&mut self, id: &str) {
        if let Some(t) = self.remove(id) {
            self.touch(id);
            self.evicted
                .push((t.id.to_string(), Principal::clone(&t.owner)));
        }
    }

    /// Tasks evicted since the last call, oldest first.
    pub(crate) fn take_evicted(&mut self) -> Vec<(String, Principal)> {
        std::mem::take(&mut self.evicted)
    }

    fn live_mut(&mut self, id: &str) -> Result<&mut TaskRecord, StoreError> {
        let t = &mut **self.tasks.get_mut(id).ok_or(StoreError::NotFound)?;
        if t.state.is_terminal() {
            return Err(StoreError::Terminal(t.state));
        }
        Ok(t)
    }

    /// Sets what a task tracks and which command started it (a host's answer to a command).
    pub fn set_origin(&mut self, id: &str, link: Link, command: Option<String>) {
        if let Some(t) = self.tasks.get_mut(id) {
            t.set_origin(link, command);
            self.touch(id);
        }
    }

    /// Appends a client message to a live task; refused (`OverBudget`) when it would take
    /// the tasks past [`TaskLimits::total_bytes`] and no finished task is left to drop.
    pub fn append_message(&mut self, id: &str, mut message: Message) -> Result<(), StoreError> {
        let limits = self.limits;
        let growth = {
            let t = self.live_mut(id)?;
            let pending = t
                .status_message()
                .map_or(0, |m| serialized_len(&*m) + m.parts.len() * PART_COST);
            let size = serialized_len(&message) + message.parts.len() * PART_COST + pending;
            // The task's own history bound drops its oldest first: it grows at most to it.
            (t.history_bytes + size)
                .min(limits.history_bytes.max(size))
                .saturating_sub(t.history_bytes)
        };
        self.room_to_grow(id, growth)?;
        self.reweigh(id, |t| {
            message.task_id = t.id.to_string();
            message.context_id = t.context_id.to_string();
            // The agent's question came before this answer: keep the history in that order.
            t.retire_status_message(&limits);
            t.push_history(Arc::new(message), &limits);
            Ok(())
        })?;
        self.touch(id);
        Ok(())
    }

    /// Moves a live task to `state`. An agent status message (from `parts`) replaces the
    /// current one, which moves into history.
    pub fn set_status(
        &mut self,
        id: &str,
        state: TaskState,
        parts: Option<Vec<Part>>,
        now_ms: u64,
    ) -> Result<&TaskRecord, StoreError> {
        self.pack_before_change();
        let limits = self.limits;
        let seq = self.seq + 1;
        let (old_key, old_state, new_key, terminal_key) = self.reweigh(id, |t| {
            let old_key = (t.status_ms, t.status_seq);
            let old_state = t.state;
            t.retire_status_message(&limits);
            if let Some(parts) = parts {
                t.agent_message(parts);
            }
            t.state = state;
            // Status times never go backwards, so the listing order stays a total order.
            t.status_ms = now_ms.max(t.status_ms);
            t.status_seq = seq;
            record_transition(&mut t.status_history, state, t.status_ms);

            let new_key = (t.status_ms, t.status_seq);
            let terminal_key = state.is_terminal().then(|| (t.created_ms, t.id.clone()));
            Ok((old_key, old_state, new_key, terminal_key))
        })?;
        self.seq = seq;
        self.order.remove(&old_key);
        if let Some(t) = self.tasks.get(id) {
            self.order.insert(new_key, t.id.clone());
        }
        if let Some(t) = self.tasks.get(id) {
            self.index.moved(t.entry(), old_state, old_key);
        }
        if let Some(k) = terminal_key {
            self.unpacked.push(k.1.clone());
            self.terminal.insert(k);
        }
        self.touch(id);
        Ok(&self.tasks[id])
    }

    /// Adds or extends an artifact of a live task.
    pub fn put_artifact(
        &mut self,
        id: &str,
        artifact: Artifact,
        append: bool,
    ) -> Result<(), StoreError> {
        let max = self.limits.max_artifacts;
        let budget = self.limits.artifact_bytes;
        let plan = plan_artifact(self.live_mut(id)?, &artifact, append, max, budget)?;
        self.room_to_grow(id, plan.growth)?;
        self.reweigh(id, |t| {
            put_artifact(t, artifact, plan);
            Ok(())
        })?;
        self.touch(id);
        Ok(())
    }
}

/// What an artifact change will do to a task, decided before anything changes, so a
/// refused artifact leaves the task as it was.
#[derive(Clone, Copy)]
struct ArtifactPlan {
    /// The task's artifact bytes once the change is made.
    bytes: usize,
    /// How much that is above what they are now.
    growth: usize,
    /// The artifact of the same id, if any.
    at: Option<usize>,
    /// Whether the change replaces it (rather than appending parts to it).
    replaces: bool,
}

fn plan_artifact(
    t: &TaskRecord,
    artifact: &Artifact,
    append: bool,
    max: usize,
    budget: usize,
) -> Result<ArtifactPlan, StoreError> {
    let at = t
        .artifacts
        .iter()
        .position(|a| a.artifact_id == artifact.artifact_id);
    let bytes = match at {
        Some(_) if append => {
            let added: usize = artifact.parts.iter().map(|p| serialized_len(p) + 1).sum();
            t.artifact_bytes + added
        }
        Some(i) => {
            let old = serialized_len(&t.artifacts[i]);
            t.artifact_bytes.saturating_sub(old) + serialized_len(artifact)
        }
        None if t.artifacts.len() >= max => return Err(StoreError::TooManyArtifacts),
        None => t.artifact_bytes + serialized_len(artifact) + 1,
    };
    if bytes > budget {
        return Err(StoreError::ArtifactsTooLarge);
    }
    Ok(ArtifactPlan {
        bytes,
        growth: bytes.saturating_sub(t.artifact_bytes),
        at,
        replaces: at.is_some() && !append,
    })
}

/// Makes the change [`plan_artifact`] planned.
fn put_artifact(t: &mut TaskRecord, artifact: Artifact, plan: ArtifactPlan) {
    t.artifact_bytes = plan.bytes;
    match plan.at {
        Some(i) if plan.replaces => t.artifacts[i] = Arc::new(artifact),
        // An answer still being written from a snapshot keeps the parts it had.
        Some(i) => Arc::make_mut(&mut t.artifacts[i])
            .parts
            .extend(artifact.parts),
        None => t.artifacts.push(Arc::new(artifact)),
    }
}

/// The largest status sequence a restored task keeps (half of `u64`: a store counting one a
/// nanosecond would take 292 years to reach it); a larger one, written by hand, is renumbered.
const MAX_RESTORED_SEQ: u64 = u64::MAX / 2;

impl TaskStore {
    /// The ids of the tasks not in a terminal state, newest first: read from the index's
    /// state buckets, so a restart among many finished tasks does not visit them all.
    pub(crate) fn in_flight(&mut self) -> Vec<Arc<str>> {
        self.index.settle();
        let operator = Principal::operator();
        let mut held: Vec<&TaskRecord> = ALL_STATES
            .into_iter()
            .filter(|s| !s.is_terminal())
            .flat_map(|state| {
                let filter = ListFilter {
                    principal: &operator,
                    context_id: "",
                    state: Some(state),
                    since_ms: None,
                };
                self.listed(&filter, None).collect::<Vec<_>>()
            })
            .collect();
        held.sort_unstable_by_key(|t| std::cmp::Reverse(t.position()));
        held.into_iter().map(|t| t.id.clone()).collect()
    }

    /// Tasks newest first, starting strictly after `after` (a page token's position).
    pub fn newest_first(
        &self,
        after: Option<(u64, u64)>,
    ) -> impl Iterator<Item = &TaskRecord> + '_ {
        let upper = match after {
            Some(k) => std::ops::Bound::Excluded(k),
            None => std::ops::Bound::Unbounded,
        };
        self.order
            .range((std::ops::Bound::Unbounded, upper))
            .rev()
            .filter_map(|(_, id)| self.tasks.get(id).map(|t| &**t))
    }
}

/// What a ListTasks call asks for, as the store answers it: the tasks `principal` may see
/// ([`Principal::may_see`]), in `context_id` if it is not empty (the owner's name for the
/// context; for an operator also an internal key), in `state` if given, whose status is no
/// older than `since_ms` if given.
#[derive(Clone, Copy, Debug)]
pub struct ListFilter<'a> {
    /// Who asks.
    pub principal: &'a Principal,
    /// A context name (or, for an operator, key); empty: any.
    pub context_id: &'a str,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks whose status time is at or after this (epoch milliseconds).
    pub since_ms: Option<u64>,
}

impl ListFilter<'_> {
    /// Whether a task passes the filter: what [`TaskStore::list`] answers, task by task.
    pub fn matches(&self, t: &TaskRecord) -> bool {
        self.principal.may_see(&t.owner)
            && (self.context_id.is_empty()
                || *t.context_id == *self.context_id
                || (self.principal.is_operator() && *t.context_key == *self.context_id))
            && self.state.is_none_or(|s| t.state == s)
            && self.since_ms.is_none_or(|ms| t.status_ms >= ms)
    }
}

impl TaskStore {
    /// The tasks `filter` selects, newest first, starting strictly after `after` (a page
    /// token's position). Walks the narrowest index bucket from `after`, never past
    /// `since_ms`: a page of n tasks costs O(n + log N), each task looked up once.
    pub fn list<'s>(
        &'s mut self,
        filter: &ListFilter<'_>,
        after: Option<index::At>,
    ) -> impl Iterator<Item = &'s TaskRecord> + 's {
        self.index.settle();
        let this: &'s TaskStore = self;
        this.listed(filter, after)
    }

    /// [`TaskStore::list`] of a settled index.
    fn listed<'s>(
        &'s self,
        filter: &ListFilter<'_>,
        after: Option<index::At>,
    ) -> impl Iterator<Item = &'s TaskRecord> + 's {
        let plan = self
            .index
            .plan(filter.principal, filter.context_id, filter.state);
        let since = filter.since_ms.unwrap_or(0);
        let keys: Box<dyn Iterator<Item = index::At> + 's> = match plan.source {
            index::Source::Nothing => Box::new(std::iter::empty()),
            index::Source::Everything => Box::new(self.all_after(after, since)),
            index::Source::Bucket { id, .. } => Box::new(
                self.index
                    .walk(id, after, since)
                    .filter(move |(_, s)| plan.state.is_none_or(|want| *s == want))
                    .map(|(at, _)| at),
            ),
        };
        keys.filter_map(|at| self.order.get(&at))
            .filter_map(|id| self.tasks.get(id).map(|t| &**t))
    }

    /// How many tasks `filter` selects (ListTasks' `totalSize`): a bucket's count when the
    /// bucket is exactly the answer, else a walk of the bucket's entries alone (no task is
    /// looked up).
    pub fn count(&mut self, filter: &ListFilter<'_>) -> usize {
        self.index.settle();
        self.counted(filter)
    }

    /// [`TaskStore::count`] of a settled index.
    fn counted(&self, filter: &ListFilter<'_>) -> usize {
        let plan = self
            .index
            .plan(filter.principal, filter.context_id, filter.state);
        let since = filter.since_ms.unwrap_or(0);
        match plan.source {
            index::Source::Nothing => 0,
            index::Source::Everything if since == 0 => self.order.len(),
            index::Source::Everything => self.all_after(None, since).count(),
            index::Source::Bucket { n, .. } if since == 0 && plan.state.is_none() => n,
            index::Source::Bucket { id, .. } => self
                .index
                .walk(id, None, since)
                .filter(|(_, s)| plan.state.is_none_or(|want| *s == want))
                .count(),
        }
    }

    /// How many tasks `principal` may see, in all and in each state, from the counters.
    pub fn counts(&self, principal: &Principal) -> TaskCounts {
        self.index.counts(principal)
    }

    /// How many held tasks are in `state`, from the counters.
    pub fn in_state(&self, state: TaskState) -> usize {
        self.index.in_state(state)
    }

    /// Every task's position at or after `since_ms`, newest first, strictly before `after`.
    fn all_after(
        &self,
        after: Option<index::At>,
        since_ms: u64,
    ) -> impl Iterator<Item = index::At> + '_ {
        let lo = (since_ms, 0);
        let hi = match after {
            Some(at) => std::ops::Bound::Excluded(at),
            None => std::ops::Bound::Unbounded,
        };
        let range = match hi {
            std::ops::Bound::Excluded(h) if h < lo => self
                .order
                .range((std::ops::Bound::Excluded(lo), std::ops::Bound::Included(lo))),
            _ => self.order.range((std::ops::Bound::Included(lo), hi)),
        };
        range.rev().map(|(at, _)| *at)
    }
}

/// A ListTasks page token: the listing position of the last task of the previous page.
/// Opaque to clients; a token this server could not have issued is refused.
pub fn encode_page_token(task: &TaskRecord) -> String {
    encode_position(task.position())
}

/// The page token after the task at listing position `(status_ms, status_seq)`.
pub(crate) fn encode_position((status_ms, status_seq): (u64, u64)) -> String {
    crate::ids::hex(format!("{status_ms}.{status_seq}").as_bytes())
}

pub(crate) fn decode_page_token(token: &str) -> Option<(u64, u64)> {
    if token.len() % 2 != 0 || token.len() > 80 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (ms, seq) = text.split_once('.')?;
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    Some((number(ms)?, number(seq)?))
}

/// What a task tracks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// What kind of work the task follows.
    pub kind: LinkKind,
    /// That work's id within its kind (a run id, a subagent handle).
    pub id: String,
}

/// The kinds of work a task can track: a command's task follows one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// A workflow run.
    Run,
    /// A subagent handle.
    Subagent,
    /// A conversation turn.
    Turn,
}

impl LinkKind {
    /// The kind's name as task annotations and store records spell it.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            LinkKind::Run => "run",
            LinkKind::Subagent => "subagent",
            LinkKind::Turn => "turn",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::types::Part;

    fn msg(id: &str) -> Message {
        Message {
            message_id: id.into(),
            role: Role::User,
            parts: vec![Part::text("hi")],
            ..Message::default()
        }
    }

    fn artifact(id: &str, text: &str) -> Artifact {
        Artifact {
            artifact_id: id.into(),
            description: String::new(),
            extensions: Vec::new(),
            metadata: None,
            name: id.into(),
            parts: vec![Part::text(text)],
        }
    }

    /// A store holding one operator's task `t`, in context `c`, made at 1 from message `m`.
    fn store_with_one_task() -> TaskStore {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        s.create(
            "t".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("m"),
            1,
        )
        .unwrap();
        s
    }

    /// Adds the operator's task `id`, made from message `x` at `at` and REJECTED at once:
    /// a finished task as a conversation turn with no agent leaves it.
    fn rejected_task(s: &mut TaskStore, id: &str, at: u64) {
        s.create(
            id.into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("x"),
            at,
        )
        .unwrap();
        s.set_status(id, TaskState::Rejected, None, at).unwrap();
    }

    fn big(id: &str, len: usize) -> Message {
        Message {
            message_id: id.into(),
            role: Role::User,
            parts: vec![Part::text("x".repeat(len))],
            ..Message::default()
        }
    }

    #[test]
    fn all_tasks_are_bounded_in_bytes_finished_ones_dropped_first() {
        let mut s = TaskStore::new(TaskLimits {
            total_bytes: 10_000,
            ..TaskLimits::DEFAULT
        });
        let create = |s: &mut TaskStore, id: &str| {
            s.create(
                id.into(),
                ContextIds::plain("c"),
                Principal::operator(),
                big(id, 3_000),
                10,
            )
            .map(|_| ())
        };
        create(&mut s, "a").unwrap();
        create(&mut s, "b").unwrap();
        create(&mut s, "c").unwrap();
        assert!(s.total_bytes() <= 10_000, "{}", s.total_bytes());
        // Nothing is finished: a fourth does not fit, and nothing was dropped.
        assert_eq!(create(&mut s, "d"), Err(StoreError::OverBudget));
        assert_eq!(s.len(), 3);
        // Once one is finished, it makes room.
        s.set_status("a", TaskState::Completed, None, 11).unwrap();
        create(&mut s, "d").unwrap();
        assert!(s.get("a").is_none(), "the finished task was dropped");
        assert_eq!(s.take_evicted().len(), 1, "and reported");
        // The count follows every change, down to nothing.
        for id in ["b", "c", "d"] {
            s.set_status(id, TaskState::Completed, None, 12).unwrap();
        }
        let weights: usize = s.tasks.values().map(|t| t.weight()).sum();
        assert_eq!(s.total_bytes(), weights);
    }

    #[test]
    fn artifacts_are_bounded_in_bytes_and_a_refusal_changes_nothing() {
        let mut s = TaskStore::new(TaskLimits {
            artifact_bytes: 1000,
            ..TaskLimits::DEFAULT
        });
        s.create(
            "t".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("m0"),
            10,
        )
        .unwrap();
        let text = "x".repeat(300);
        // Appended chunks count as they come: three fit, the fourth would not.
        s.put_artifact("t", artifact("a", &text), false).unwrap();
        s.put_artifact("t", artifact("a", &text), true).unwrap();
        s.put_artifact("t", artifact("a", &text), true).unwrap();
        assert_eq!(
            s.put_artifact("t", artifact("a", &text), true),
            Err(StoreError::ArtifactsTooLarge)
        );
        assert_eq!(
            s.put_artifact("t", artifact("b", &text), false),
            Err(StoreError::ArtifactsTooLarge)
        );
        let t = s.get("t").unwrap();
        assert_eq!(t.artifacts.len(), 1);
        assert_eq!(
            t.artifacts[0].parts.len(),
            3,
            "the refused chunk was not kept"
        );
        // The count never falls behind the serialized size it stands for.
        assert!(
            t.artifact_bytes >= serialized_len(&t.artifacts[0]),
            "{}",
            t.artifact_bytes
        );
        // Replacing the artifact frees what it held.
        s.put_artifact("t", artifact("a", "small"), false).unwrap();
        s.put_artifact("t", artifact("b", &text), false).unwrap();
        assert_eq!(s.get("t").unwrap().artifacts.len(), 2);
    }

    /// Live tasks cannot grow past the budget for all tasks: an artifact or a client message
    /// that finds no finished task to drop is refused and changes nothing; a state change is
    /// always taken, its status message paid for with the task's own oldest history.
    #[test]
    fn live_growth_is_held_to_the_budget_for_all_tasks() {
        let mut s = TaskStore::new(TaskLimits {
            total_bytes: 4_000,
            ..TaskLimits::DEFAULT
        });
        for id in ["a", "b"] {
            s.create(
                id.into(),
                ContextIds::plain("c"),
                Principal::operator(),
                msg("m0"),
                10,
            )
            .unwrap();
        }
        let text = "x".repeat(1_000);
        s.put_artifact("a", artifact("a1", &text), false).unwrap();
        s.put_artifact("b", artifact("b1", &text), false).unwrap();
        s.put_artifact("a", artifact("a2", &text), false).unwrap();
        let before = s.total_bytes();
        assert_eq!(
            s.put_artifact("b", artifact("b2", &text), false),
            Err(StoreError::OverBudget)
        );
        assert_eq!(s.get("b").unwrap().artifacts.len(), 1, "nothing changed");
        assert_eq!(s.total_bytes(), before);
        assert_eq!(
            s.append_message("b", msg(&"y".repeat(1_500))),
            Err(StoreError::OverBudget)
        );
        assert_eq!(s.get("b").unwrap().history_len(), 1, "nothing changed");
        // A state change with a large message is taken; the budget holds.
        s.set_status(
            "b",
            TaskState::InputRequired,
            Some(vec![Part::text(&text)]),
            11,
        )
        .unwrap();
        assert!(s.total_bytes() <= 4_000, "{}", s.total_bytes());
        // Once a task finishes, it makes room for the other's growth.
        s.set_status("a", TaskState::Completed, None, 12).unwrap();
        s.put_artifact("b", artifact("b2", &text), false).unwrap();
        assert!(s.get("a").is_none(), "the finished task was dropped");
    }

    #[test]
    fn accepted_messages_are_indexed_bounded_weighed_and_forgotten_with_their_task() {
        let mut s = TaskStore::new(TaskLimits {
            history_messages: 2,
            max_tasks: 1,
            ..TaskLimits::DEFAULT
        });
        let op = Principal::operator();
        s.create("t".into(), ContextIds::plain("c"), op.clone(), msg("a"), 1)
            .unwrap();
        let bare = s.total_bytes();
        let d = |id: &str| MessageDigest::from_bytes([id.as_bytes()[0]; 32]);
        for id in ["a", "b", "c"] {
            s.accept_message("t", &op.id, id, d(id));
        }
        // The oldest past the bound is forgotten, in the list and the index.
        assert!(s.accepted_by(&op.id, "a").is_none());
        let (t, digest) = s.accepted_by(&op.id, "c").unwrap();
        assert_eq!((&*t.id, digest), ("t", d("c")));
        assert!(s.accepted_by("user:other", "c").is_none());
        // Counted in the task's weight, and in its record.
        assert!(s.total_bytes() > bare);
        let weights: usize = s.tasks.values().map(|t| t.weight()).sum();
        assert_eq!(s.total_bytes(), weights);
        let back = TaskRecord::from_doc(s.get("t").unwrap().to_doc()).unwrap();
        assert_eq!(back.weight(), s.get("t").unwrap().weight());
        // Read from the record's text (as a restart reads it), the same record.
        let doc = s.get("t").unwrap().to_doc();
        let from_text = TaskRecord::from_json(&doc.to_string()).unwrap();
        assert_eq!(from_text.to_doc(), doc);
        assert_eq!(from_text.weight(), back.weight());
        assert!(TaskRecord::from_json("{\"v\":2}").is_err());
        // Evicted: its ids name nothing any more.
        s.set_status("t", TaskState::Completed, None, 2).unwrap();
        s.create("u".into(), ContextIds::plain("c"), op.clone(), msg("x"), 3)
            .unwrap();
        assert!(s.accepted_by(&op.id, "c").is_none());
        assert!(s.by_message.is_empty());
        // Restored: indexed again.
        s.restore(back);
        assert_eq!(s.accepted_by(&op.id, "b").unwrap().1, d("b"));
    }

    #[test]
    fn a_restored_sequence_past_any_the_store_counts_to_is_renumbered_not_wrapped() {
        // Records written by hand with the largest sequence there is, twice: the store goes
        // on counting after them, and every task keeps a position of its own.
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        for (id, ms) in [("a", 5), ("b", 5), ("c", 6)] {
            let mut doc = store_with_one_task().get("t").unwrap().to_doc();
            doc["id"] = id.into();
            doc["statusMs"] = ms.into();
            doc["statusSeq"] = u64::MAX.into();
            s.restore(TaskRecord::from_doc(doc).unwrap());
        }
        let seqs: Vec<u64> = ["a", "b", "c"]
            .iter()
            .map(|id| s.get(id).unwrap().status_seq)
            .collect();
        assert!(seqs.iter().all(|q| *q <= MAX_RESTORED_SEQ), "{seqs:?}");
        rejected_task(&mut s, "d", 7);
        s.set_status("a", TaskState::Canceled, None, 8).unwrap();
        let mut positions: Vec<(u64, u64)> = s.tasks.values().map(|t| t.position()).collect();
        positions.sort_unstable();
        positions.dedup();
        assert_eq!(positions.len(), 4);
        let operator = Principal::operator();
        let all = ListFilter {
            principal: &operator,
            context_id: "",
            state: None,
            since_ms: None,
        };
        let listed: Vec<&str> = s.list(&all, None).map(|t| &*t.id).collect();
        assert_eq!(listed, ["a", "d", "c", "b"]);
    }

    /// A message with every field and kind of part, to read back from packed text.
    fn rich(id: &str) -> Message {
        let mut file = Part::text("");
        file.content = crate::a2a::types::PartContent::Url("https://example.com/a.png".into());
        file.filename = "a.png".into();
        file.media_type = "image/png".into();
        let mut raw = Part::text("");
        raw.content = crate::a2a::types::PartContent::Raw("aGk=".into());
        let mut meta = serde_json::Map::new();
        meta.insert("n".into(), serde_json::json!(0.1));
        meta.insert("nested".into(), serde_json::json!({"a": [1, "é", null]}));
        let mut text = Part::text("line\n\"quoted\" \u{1F600}");
        text.metadata = Some(meta.clone());
        Message {
            message_id: id.into(),
            role: Role::User,
            parts: vec![
                text,
                Part::data(serde_json::json!({"k": [true, 2]})),
                file,
                raw,
            ],
            extensions: vec!["https://example.com/ext".into()],
            metadata: Some(meta),
            reference_task_ids: vec!["other".into()],
            ..Message::default()
        }
    }

    #[test]
    fn a_long_message_stays_a_shared_value_when_its_task_ends() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let long = |id: &str| Message {
            message_id: id.into(),
            role: Role::User,
            parts: vec![Part::text("y".repeat(PACKED_MESSAGE_MAX))],
            ..Message::default()
        };
        s.create(
            "t".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            long("m0"),
            1,
        )
        .unwrap();
        s.append_message("t", msg("short")).unwrap();
        let long_parts = long("s").parts;
        s.set_status("t", TaskState::Completed, Some(long_parts.clone()), 2)
            .unwrap();
        s.pack_finished();
        let t = s.get("t").unwrap();
        let held: Vec<bool> = t
            .history
            .iter()
            .map(|(m, _)| matches!(m, HeldMessage::Packed(_)))
            .collect();
        assert_eq!(
            held,
            [false, true],
            "the long message live, the short one packed"
        );
        assert!(matches!(t.status_message, Some(StatusMessage::Whole(_))));
        // Readers of it share the one value.
        let (a, b) = (t.to_task(None, true), t.to_task(None, true));
        assert!(Arc::ptr_eq(&a.history[0], &b.history[0]));
        assert_eq!(t.status().message.unwrap().parts, long_parts);
        // As a restart reads it: the same.
        let back = TaskRecord::from_json(&t.to_doc().to_string()).unwrap();
        let held: Vec<bool> = back
            .history
            .iter()
            .map(|(m, _)| matches!(m, HeldMessage::Packed(_)))
            .collect();
        assert_eq!(held, [false, true]);
        assert_eq!(back.to_task(None, true).history, a.history);
    }

    #[test]
    fn a_finished_task_packs_its_history_and_shows_it_unchanged() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let op = Principal::operator();
        s.create("t".into(), ContextIds::plain("c"), op, rich("m0"), 1)
            .unwrap();
        s.set_status(
            "t",
            TaskState::InputRequired,
            Some(vec![Part::text("?")]),
            2,
        )
        .unwrap();
        s.append_message("t", rich("m1")).unwrap();
        let live = s.get("t").unwrap().to_task(None, true);
        let live_doc = s.get("t").unwrap().to_doc();
        let live_weight = s.get("t").unwrap().weight();
        assert!(s
            .get("t")
            .unwrap()
            .history
            .iter()
            .all(|(m, _)| matches!(m, HeldMessage::Live(_))));
        let done_parts = rich("s").parts;
        s.set_status("t", TaskState::Completed, Some(done_parts.clone()), 3)
            .unwrap();
        // The change that ended it answers from its live values; the next one packs it.
        let t = s.get("t").unwrap();
        assert!(matches!(t.status_message, Some(StatusMessage::Whole(_))));
        assert!(t
            .history
            .iter()
            .all(|(m, _)| matches!(m, HeldMessage::Live(_))));
        s.pack_finished();
        let t = s.get("t").unwrap();
        assert!(matches!(
            t.status_message,
            Some(StatusMessage::PackedParts(_))
        ));
        assert_eq!(t.status().message.unwrap().parts, done_parts);
        // However many tasks end, at most one waits to be packed.
        let mut more = TaskStore::new(TaskLimits::DEFAULT);
        for i in 0..100 {
            let id = format!("u{i}");
            rejected_task(&mut more, &id, 4);
            assert!(more.unpacked.len() <= 1);
        }
        // With a write-ahead host, a finished task stays live until its record is drained
        // (made from its values, not parsed back from its text), and is packed then.
        let mut drained = TaskStore::new(TaskLimits::DEFAULT);
        drained.set_tracking(true);
        for i in 0..3 {
            rejected_task(&mut drained, &format!("w{i}"), 5);
        }
        let is_live = |s: &TaskStore, id: &str| {
            s.get(id)
                .unwrap()
                .history
                .iter()
                .all(|(m, _)| matches!(m, HeldMessage::Live(_)))
        };
        assert!((0..3).all(|i| is_live(&drained, &format!("w{i}"))));
        let records = drained.take_dirty();
        assert_eq!(records.len(), 3);
        assert!(drained.unpacked.is_empty());
        assert!((0..3).all(|i| !is_live(&drained, &format!("w{i}"))));
        // A task waiting for the drain is packed, not dropped, when a new one needs its room.
        let (unpacked_w, packed_w) = {
            let mut probe = TaskStore::new(TaskLimits::DEFAULT);
            rejected_task(&mut probe, "p", 6);
            let live = probe.total_bytes();
            probe.pack_finished();
            (live, probe.total_bytes())
        };
        assert!(packed_w < unpacked_w);
        let incoming = serialized_len(&msg("x")) + PART_COST;
        let mut tight = TaskStore::new(TaskLimits {
            total_bytes: unpacked_w.max(packed_w + incoming),
            ..TaskLimits::DEFAULT
        });
        tight.set_tracking(true);
        rejected_task(&mut tight, "a", 6);
        assert!(is_live(&tight, "a"));
        rejected_task(&mut tight, "b", 7);
        assert!(tight.get("a").is_some(), "packed to make room, not dropped");
        assert!(!is_live(&tight, "a"));
        assert!(t
            .history
            .iter()
            .all(|(m, _)| matches!(m, HeldMessage::Packed(_))));
        // Shown, the same messages; in the record, the same history.
        let done = t.to_task(None, true);
        assert_eq!(done.history, live.history);
        assert_eq!(t.to_doc()["history"], live_doc["history"]);
        // Packed, a message weighs its text alone, and the store's total follows.
        assert!(t.weight() < live_weight);
        assert_eq!(s.total_bytes(), t.weight());
        // The record the host writes is that document, its packed messages copied as text;
        // a restart reads a finished task's messages back as text, checked.
        let written = t.to_doc_json();
        let parsed: serde_json::Value = serde_json::from_str(written.get()).unwrap();
        assert_eq!(parsed, t.to_doc());
        let back = TaskRecord::from_json(written.get()).unwrap();
        assert!(back
            .history
            .iter()
            .all(|(m, _)| matches!(m, HeldMessage::Packed(_))));
        assert_eq!(back.to_task(None, true), done);
        assert!(matches!(
            back.status_message,
            Some(StatusMessage::PackedParts(_))
        ));
        assert_eq!(back.weight(), t.weight());
        let mut doc = t.to_doc();
        doc["history"][0]["parts"] = serde_json::json!("not parts");
        assert!(TaskRecord::from_doc(doc).is_err());
        // A live task's read back live.
        let mut doc = live_doc.clone();
        doc["state"] = serde_json::json!(TaskState::Working);
        let back = TaskRecord::from_doc(doc).unwrap();
        assert!(back
            .history
            .iter()
            .all(|(m, _)| matches!(m, HeldMessage::Live(_))));
        assert_eq!(back.to_task(None, true).history, live.history);
    }

    #[test]
    fn a_finished_tasks_status_message_is_held_as_its_parts() {
        let mut s = store_with_one_task();
        s.set_status("t", TaskState::Working, Some(vec![Part::text("a")]), 2)
            .unwrap();
        let t = s.get("t").unwrap();
        assert!(matches!(t.status_message, Some(StatusMessage::Whole(_))));
        let first = t.status().message.unwrap();
        assert_eq!(
            (
                &*first.message_id,
                &*first.task_id,
                &*first.context_id,
                first.role
            ),
            ("t.status.1", "t", "c", Role::Agent)
        );
        // The next status moves it into the history, whole.
        s.set_status("t", TaskState::Failed, Some(vec![Part::text("b")]), 3)
            .unwrap();
        let whole = s.get("t").unwrap().status();
        s.pack_finished();
        let t = s.get("t").unwrap();
        assert!(matches!(
            t.status_message,
            Some(StatusMessage::PackedParts(_))
        ));
        assert_eq!(t.status(), whole);
        assert_eq!(whole.message.as_ref().unwrap().message_id, "t.status.2");
        assert_eq!(t.to_task(None, false).history[1], first);
        // Read back from a record: packed again; a message of another shape stays whole.
        let back = TaskRecord::from_doc(t.to_doc()).unwrap();
        assert!(matches!(
            back.status_message,
            Some(StatusMessage::PackedParts(_))
        ));
        assert_eq!(back.status(), whole);
        let mut doc = t.to_doc();
        doc["statusMessage"]["messageId"] = serde_json::json!("chosen");
        let back = TaskRecord::from_doc(doc).unwrap();
        assert!(matches!(back.status_message, Some(StatusMessage::Whole(_))));
        assert_eq!(back.status().message.unwrap().message_id, "chosen");
        // Whichever field differs from the made shape, the message stays whole and as
        // written; spelled another way (an alias, an empty list), it is still packed.
        for (field, value) in [
            ("taskId", serde_json::json!("u")),
            ("contextId", serde_json::json!("d")),
            ("role", serde_json::json!("ROLE_USER")),
            ("referenceTaskIds", serde_json::json!(["x"])),
        ] {
            let mut doc = t.to_doc();
            doc["statusMessage"][field] = value.clone();
            let back = TaskRecord::from_doc(doc).unwrap();
            assert!(matches!(back.status_message, Some(StatusMessage::Whole(_))));
            let shown = serde_json::to_value(back.status().message.unwrap()).unwrap();
            assert_eq!(shown[field], value, "{field}");
        }
        for (field, value) in [
            ("extensions", serde_json::json!([])),
            ("context_id", serde_json::json!("c")),
        ] {
            let mut doc = t.to_doc();
            doc["statusMessage"][field] = value;
            if field == "context_id" {
                doc["statusMessage"]
                    .as_object_mut()
                    .unwrap()
                    .remove("contextId");
            }
            let back = TaskRecord::from_doc(doc).unwrap();
            assert!(
                matches!(back.status_message, Some(StatusMessage::PackedParts(_))),
                "{field}"
            );
            assert_eq!(back.status(), whole, "{field}");
        }
        // Strings with escapes (not borrowed from the text) read the same.
        let mut doc = t.to_doc();
        let odd = "c\"\\\u{e9}";
        for field in ["contextId", "contextKey"] {
            doc[field] = serde_json::json!(odd);
        }
        doc["statusMessage"]["contextId"] = serde_json::json!(odd);
        let back = TaskRecord::from_json(&serde_json::to_string(&doc).unwrap()).unwrap();
        assert_eq!((&*back.context_id, &*back.context_key), (odd, odd));
        assert!(matches!(
            back.status_message,
            Some(StatusMessage::PackedParts(_))
        ));
        assert_eq!(back.status().message.unwrap().context_id, odd);
        // Parts that would not read back refuse the record, in the made shape or not.
        for id in ["t.status.2", "chosen"] {
            let mut doc = t.to_doc();
            doc["statusMessage"]["messageId"] = serde_json::json!(id);
            doc["statusMessage"]["parts"] = serde_json::json!([{"nothing": 1}]);
            assert!(TaskRecord::from_doc(doc).is_err(), "{id}");
        }
    }

    #[test]
    fn the_tasks_in_flight_are_found_newest_first_among_finished_ones() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let alice = Principal::new("user:alice", crate::auth::Role::User, vec![]);
        let states = [
            ("a", TaskState::Working),
            ("b", TaskState::Completed),
            ("c", TaskState::InputRequired),
            ("d", TaskState::Submitted),
            ("e", TaskState::Rejected),
            ("f", TaskState::AuthRequired),
            ("g", TaskState::Working),
        ];
        for (at, (id, state)) in (1..).zip(states) {
            let owner = if at % 2 == 0 {
                alice.clone()
            } else {
                Principal::operator()
            };
            s.create(id.into(), ContextIds::plain(id), owner, msg(id), at)
                .unwrap();
            if state != TaskState::Submitted {
                s.set_status(id, state, None, at).unwrap();
            }
        }
        // "a" changes last, so it is the newest.
        s.set_status("a", TaskState::InputRequired, None, 20)
            .unwrap();
        let ids: Vec<String> = s.in_flight().iter().map(|id| id.to_string()).collect();
        assert_eq!(ids, ["a", "g", "f", "d", "c"]);
    }

    #[test]
    fn a_listed_task_writes_what_the_whole_task_writes() {
        let mut s = store_with_one_task();
        s.put_artifact("t", artifact("a", "out"), false).unwrap();
        s.set_status("t", TaskState::Working, Some(vec![Part::text("a")]), 2)
            .unwrap();
        let parts = vec![
            Part::text("b \"quoted\" \u{e9}\n"),
            Part::data(serde_json::json!({"k": [1, 2.5, null]})),
        ];
        s.set_status("t", TaskState::Completed, Some(parts), 3)
            .unwrap();
        let live = s.get("t").unwrap().to_listed(None, true).to_json().unwrap();
        s.pack_finished();
        let t = s.get("t").unwrap();
        assert!(matches!(
            t.status_message,
            Some(StatusMessage::PackedParts(_))
        ));
        for history in [None, Some(0), Some(1)] {
            for artifacts in [false, true] {
                for annotate in [false, true] {
                    let whole = t.view(history, artifacts, annotate);
                    let listed = t.listed_view(history, artifacts, annotate);
                    let text = serde_json::to_string(&whole).unwrap();
                    assert_eq!(listed.to_json().unwrap().get(), text);
                }
            }
        }
        assert_eq!(
            live.get(),
            serde_json::to_string(&t.to_task(None, true)).unwrap()
        );
        // A listing weighs the packed message as the whole one would write.
        let whole_len = |t: &TaskRecord| serialized_len(&*t.status_message().unwrap());
        assert_eq!(t.answer_weight(), t.weight() + whole_len(t));
        // Parts stored in another spelling (an alias, an empty field, spaces) are listed as
        // they are shown anywhere else.
        let mut doc = t.to_doc();
        doc["statusMessage"]["parts"] =
            serde_json::json!([{"text": "hi", "media_type": "text/plain", "filename": ""}]);
        let text = serde_json::to_string(&doc)
            .unwrap()
            .replace("\"parts\":[{", "\"parts\" : [ {");
        let back = TaskRecord::from_json(&text).unwrap();
        assert!(matches!(
            back.status_message,
            Some(StatusMessage::PackedParts(_))
        ));
        let whole = serde_json::to_string(&back.to_task(None, true)).unwrap();
        assert!(
            whole.contains(r#"[{"mediaType":"text/plain","text":"hi"}]"#),
            "{whole}"
        );
        assert_eq!(back.to_listed(None, true).to_json().unwrap().get(), whole);
        assert_eq!(back.answer_weight(), back.weight() + whole_len(&back));
        // A status message the store did not make stays whole, written as it is.
        let mut doc = t.to_doc();
        doc["statusMessage"]["messageId"] = serde_json::json!("chosen");
        let back = TaskRecord::from_doc(doc).unwrap();
        let listed = back.to_listed(None, true).to_json().unwrap();
        assert_eq!(
            listed.get(),
            serde_json::to_string(&back.to_task(None, true)).unwrap()
        );
        assert!(listed.get().contains("\"chosen\""));
    }

    #[test]
    fn tasks_of_one_principal_share_it_until_the_last_goes() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let alice = Principal::new("user:alice", crate::auth::Role::User, vec![]);
        for id in ["a", "b"] {
            s.create(
                id.into(),
                ContextIds::plain("c"),
                alice.clone(),
                msg("m"),
                1,
            )
            .unwrap();
        }
        assert!(Arc::ptr_eq(
            &s.get("a").unwrap().owner,
            &s.get("b").unwrap().owner
        ));
        // Given new grants (a reload), new tasks share the new principal.
        let granted = Principal::new("user:alice", crate::auth::Role::User, vec!["*".into()]);
        s.create(
            "c".into(),
            ContextIds::plain("c"),
            granted.clone(),
            msg("m"),
            1,
        )
        .unwrap();
        assert_eq!(*s.get("c").unwrap().owner, granted);
        assert_eq!(*s.get("a").unwrap().owner, alice);
        // Restored tasks share it too; the last task gone, it is forgotten.
        let back = TaskRecord::from_doc(s.get("c").unwrap().to_doc()).unwrap();
        s.restore(back);
        // A copy of a record held elsewhere keeps nothing in the table.
        let copy = s.get("a").unwrap().clone();
        for id in ["a", "b"] {
            s.remove(id);
        }
        assert_eq!(s.principals.len(), 1);
        s.remove("c");
        assert!(s.principals.is_empty());
        drop(copy);
    }

    #[test]
    fn digests_are_held_as_bytes_and_stored_as_hex() {
        let d = message_digest(&msg("m"));
        let hex = d.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(MessageDigest::from_hex(&hex), Some(d));
        assert_eq!(serde_json::to_value(d).unwrap(), serde_json::json!(hex));
        assert_eq!(MessageDigest::from_hex(&hex[1..]), None);
        assert_eq!(MessageDigest::from_hex(&"g".repeat(64)), None);
        assert!(serde_json::from_value::<MessageDigest>(serde_json::json!("00")).is_err());
        assert_ne!(message_digest(&msg("n")), d);
    }

    #[test]
    fn a_task_tracks_its_own_turn_unless_a_command_says_otherwise() {
        let mut s = store_with_one_task();
        let t = s.get("t").unwrap();
        assert!(t.origin.is_none() && t.gate.is_none());
        assert_eq!((t.link(), t.command()), ((LinkKind::Turn, "t"), None));
        let run = Link {
            kind: LinkKind::Run,
            id: "r1".into(),
        };
        s.set_origin("t", run, Some("release.start".into()));
        let t = s.get_mut("t").unwrap();
        assert_eq!(
            (t.link(), t.command()),
            ((LinkKind::Run, "r1"), Some("release.start"))
        );
        t.set_gate(Some(Gate {
            channel: Some("ops".into()),
            ..Gate::default()
        }));
        let back = TaskRecord::from_doc(t.to_doc()).unwrap();
        assert_eq!(back.link(), (LinkKind::Run, "r1"));
        assert_eq!(back.gate().unwrap().channel.as_deref(), Some("ops"));
        // An empty question is no gate.
        let t = s.get_mut("t").unwrap();
        t.set_gate(Some(Gate::default()));
        assert!(t.gate().is_none());
    }

    #[test]
    fn lifecycle_and_history() {
        let mut s = TaskStore::new(TaskLimits {
            history_messages: 3,
            ..TaskLimits::DEFAULT
        });
        s.create(
            "t".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("m0"),
            10,
        )
        .unwrap();
        s.set_status(
            "t",
            TaskState::InputRequired,
            Some(vec![Part::text("?")]),
            11,
        )
        .unwrap();
        s.append_message("t", msg("m1")).unwrap();
        s.set_status("t", TaskState::Working, None, 12).unwrap();
        let t = s
            .set_status(
                "t",
                TaskState::Completed,
                Some(vec![Part::text("done")]),
                13,
            )
            .unwrap();
        let task = t.to_task(None, false);
        let ids: Vec<_> = task.history.iter().map(|m| m.message_id.as_str()).collect();
        assert_eq!(ids, ["m0", "t.status.1", "m1"]);
        assert_eq!(task.status.message.unwrap().message_id, "t.status.2");
        assert_eq!(t.to_task(Some(1), false).history.len(), 1);
        assert!(t.to_task(Some(0), false).history.is_empty());
        assert_eq!(
            s.set_status("t", TaskState::Working, None, 14).unwrap_err(),
            StoreError::Terminal(TaskState::Completed)
        );
        assert_eq!(
            s.append_message("t", msg("x")).unwrap_err(),
            StoreError::Terminal(TaskState::Completed)
        );
        // History bound: m0 is dropped when a fourth message would be kept.
        let mut s = TaskStore::new(TaskLimits {
            history_messages: 2,
            ..TaskLimits::DEFAULT
        });
        s.create(
            "t".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("a"),
            1,
        )
        .unwrap();
        s.append_message("t", msg("b")).unwrap();
        s.append_message("t", msg("c")).unwrap();
        let ids: Vec<_> = s
            .get("t")
            .unwrap()
            .to_task(None, false)
            .history
            .into_iter()
            .map(|m| m.message_id.clone())
            .collect();
        assert_eq!(ids, ["b", "c"]);
    }

    #[test]
    fn full_store_evicts_the_oldest_terminal_task_or_refuses() {
        let mut s = TaskStore::new(TaskLimits {
            max_tasks: 2,
            ..TaskLimits::DEFAULT
        });
        s.create(
            "a".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("1"),
            1,
        )
        .unwrap();
        s.create(
            "b".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("2"),
            2,
        )
        .unwrap();
        assert_eq!(
            s.create(
                "c".into(),
                ContextIds::plain("c"),
                Principal::operator(),
                msg("3"),
                3
            )
            .unwrap_err(),
            StoreError::Full
        );
        s.set_status("b", TaskState::Rejected, None, 4).unwrap();
        s.create(
            "c".into(),
            ContextIds::plain("c"),
            Principal::operator(),
            msg("3"),
            5,
        )
        .unwrap();
        assert!(s.get("b").is_none());
        assert_eq!(s.len(), 2);
        // The instance hears of the eviction (to forget the task's stream events and push
        // configs, and to report it on the feed), once.
        let evicted: Vec<String> = s.take_evicted().into_iter().map(|(id, _)| id).collect();
        assert_eq!(evicted, ["b"]);
        assert!(s.take_evicted().is_empty());
    }

    #[test]
    fn the_context_namespace_lives_with_its_tasks_then_is_bounded() {
        let mut s = TaskStore::new(TaskLimits {
            max_tasks: 2,
            ..TaskLimits::DEFAULT
        });
        let alice = Principal::new("user:alice", crate::auth::Role::User, vec![]);
        let ctx = |name: &str, key: &str| ContextIds {
            name: name.into(),
            key: key.into(),
        };
        s.bind_context("user:alice", "a", "ctx-a");
        s.create("t1".into(), ctx("a", "ctx-a"), alice.clone(), msg("1"), 1)
            .unwrap();
        s.create("t2".into(), ctx("a", "ctx-a"), alice.clone(), msg("2"), 2)
            .unwrap();
        assert_eq!(s.context_key("user:alice", "a"), Some("ctx-a"));
        assert_eq!(s.context_key("user:bob", "a"), None);
        // Both tasks of `a` end and are evicted: the name is still remembered, unused.
        s.set_status("t1", TaskState::Completed, None, 3).unwrap();
        s.set_status("t2", TaskState::Completed, None, 4).unwrap();
        s.create("t3".into(), ctx("b", "ctx-b"), alice.clone(), msg("3"), 5)
            .unwrap();
        s.create("t4".into(), ctx("b", "ctx-b"), alice.clone(), msg("4"), 6)
            .unwrap();
        assert!(s.get("t1").is_none() && s.get("t2").is_none());
        assert_eq!(s.context_key("user:alice", "a"), Some("ctx-a"));
        // Unused names are bounded by max_tasks: the one unused longest goes first, and a
        // name in use is never forgotten.
        s.bind_context("user:alice", "c", "ctx-c");
        assert_eq!(s.context_key("user:alice", "a"), Some("ctx-a"));
        s.bind_context("user:alice", "d", "ctx-d");
        assert_eq!(s.context_key("user:alice", "a"), None);
        assert_eq!(s.context_key("user:alice", "b"), Some("ctx-b"));
        assert_eq!(s.context_count(), 3);
    }

    #[test]
    fn status_history_holds_changes_of_state_and_is_bounded() {
        let mut h = vec![(TaskState::Submitted, 1)];
        record_transition(&mut h, TaskState::Working, 2);
        record_transition(&mut h, TaskState::Working, 3);
        assert_eq!(h, [(TaskState::Submitted, 1), (TaskState::Working, 2)]);
        for i in 0..1000u64 {
            let s = if i % 2 == 0 {
                TaskState::InputRequired
            } else {
                TaskState::Working
            };
            record_transition(&mut h, s, 10 + i);
        }
        assert_eq!(h.len(), STATUS_HISTORY_KEPT);
        assert_eq!(h[0], (TaskState::Submitted, 1), "the submission stays");
        assert_eq!(
            h.last(),
            Some(&(TaskState::Working, 1009)),
            "the newest is kept"
        );
    }

    #[test]
    fn page_tokens_round_trip_and_refuse_garbage() {
        let mut s = TaskStore::new(TaskLimits::DEFAULT);
        let t = s
            .create(
                "t".into(),
                ContextIds::plain("c"),
                Principal::operator(),
                msg("m"),
                42,
            )
            .unwrap();
        assert_eq!(decode_page_token(&encode_page_token(t)), Some((42, 1)));
        for bad in [
            "",
            "zz",
            "abc",
            &crate::ids::hex(b"x.y"),
            &crate::ids::hex(b"12."),
            &crate::ids::hex(b"1.2.3"),
        ] {
            assert_eq!(decode_page_token(bad), None, "{bad}");
        }
    }
}
