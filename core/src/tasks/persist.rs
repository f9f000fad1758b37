//! A task record as the durable store keeps it: everything the instance knows about the
//! task, so a restart restores it exactly (history, artifacts, status history, owner, its
//! place in the listing order). Its own shape, versioned, rather than the wire `Task`: the
//! wire form omits the owner, the link and the counters.

use crate::errors::RecordError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

use super::{Accepted, HeldMessage, TaskRecord};
use super::{Link, LinkKind};
use crate::a2a::types::{Artifact, Message, TaskState};
use crate::auth::PrincipalDoc;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The record kind of tasks in the durable store.
pub const TASK_KIND: &str = "task";

/// `H`: how the history's messages are carried: written from values or packed text
/// ([`HistoryDoc`]), read as raw JSON text (so a finished task's messages are kept as the
/// text they were stored as). `S`: the strings, borrowed both ways (from the record when
/// written, from the JSON text when read, where it has no escapes).
#[derive(Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    bound(deserialize = "H: Deserialize<'de>, S: Deserialize<'de>")
)]
struct TaskDoc<H, S> {
    v: u32,
    id: S,
    context_id: S,
    /// The internal key of the task's conversation (§7.6); absent in records written before
    /// the namespace existed, whose context ids were used as keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    context_key: Option<S>,
    owner: PrincipalDoc,
    state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status_message: Option<Arc<Message>>,
    status_ms: u64,
    status_seq: u64,
    created_ms: u64,
    history: Vec<H>,
    artifacts: Vec<Arc<Artifact>>,
    status_count: u64,
    status_history: Vec<(TaskState, u64)>,
    link_kind: S,
    link_id: S,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ask_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ask_channel: Option<String>,
    /// The messages the task accepted, so a retried SendMessage is recognized after a
    /// restart; absent in records written before idempotent sends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    accepted: Vec<Accepted>,
}

/// A string of a record being read: borrowed from the JSON text unless it has escapes.
/// (serde's own `Cow<str>` always copies.)
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A task record as read: borrowed from its JSON text.
type TaskRead<'a> = TaskDoc<&'a RawValue, Text<'a>>;

impl TaskRecord {
    /// The record's durable form, as the JSON text the host writes: serialized once,
    /// straight from the record (no `Value` tree between).
    pub fn to_doc_json(&self) -> Box<RawValue> {
        serde_json::value::to_raw_value(&self.doc()).expect("a task record serialises")
    }

    /// The record's durable form as a JSON value (tests and tools; the host gets
    /// [`TaskRecord::to_doc_json`]).
    pub fn to_doc(&self) -> Value {
        serde_json::to_value(self.doc()).expect("a task record serialises")
    }

    fn doc(&self) -> TaskDoc<HistoryDoc<'_>, &str> {
        TaskDoc {
            v: 1,
            id: &*self.id,
            context_id: &*self.context_id,
            context_key: Some(&*self.context_key),
            owner: PrincipalDoc::from(&self.owner),
            state: self.state,
            status_message: self.status_message(),
            status_ms: self.status_ms,
            status_seq: self.status_seq,
            created_ms: self.created_ms,
            history: self.history.iter().map(|(m, _)| m.doc()).collect(),
            artifacts: self.artifacts.clone(),
            status_count: self.status_count,
            status_history: self.status_history.clone(),
            link_kind: self.link().0.as_str(),
            link_id: self.link().1,
            command: self.command().map(str::to_owned),
            ask_schema: self.gate().and_then(|g| g.schema.clone()),
            ask_channel: self.gate().and_then(|g| g.channel.clone()),
            accepted: self.accepted().cloned().collect(),
        }
    }

    /// A record from its durable form.
    pub fn from_doc(body: Value) -> Result<TaskRecord, RecordError> {
        // Read as text, as the store hands records over: a finished task keeps its
        // messages' text.
        Self::from_json(&body.to_string())
    }

    /// A record from its durable form's JSON text, read straight into the record's shape:
    /// at start a store of 100,000 tasks is read this way, with no JSON tree built per
    /// record first, its strings borrowed from the text until the record takes them.
    pub fn from_json(text: &str) -> Result<TaskRecord, RecordError> {
        let d: TaskRead<'_> = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if d.v != 1 {
            return Err(format!("task record version {} is not known", d.v).into());
        }
        let kind = match &*d.link_kind.0 {
            "run" => LinkKind::Run,
            "subagent" => LinkKind::Subagent,
            "turn" => LinkKind::Turn,
            other => return Err(format!("unknown link kind {other:?}").into()),
        };
        let packed = d.state.is_terminal();
        let history = d
            .history
            .into_iter()
            .map(|raw| {
                let m: Message = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
                Ok(if packed && raw.get().len() <= super::PACKED_MESSAGE_MAX {
                    // Checked above, so it reads back when shown.
                    let text: Box<str> = raw.get().into();
                    let len = text.len();
                    (HeldMessage::Packed(text), len)
                } else {
                    let size = super::serialized_len(&m) + m.parts.len() * super::PART_COST;
                    (HeldMessage::Live(Arc::new(m)), size)
                })
            })
            .collect::<Result<std::collections::VecDeque<_>, RecordError>>()?;
        let accepted: std::collections::VecDeque<(Accepted, usize)> = d
            .accepted
            .into_iter()
            .map(|a| {
                let size = super::serialized_len(&a);
                (a, size)
            })
            .collect();
        // An operator's context: its key is its name, one allocation for both.
        let context_id: Arc<str> = Arc::from(&*d.context_id.0);
        let context_key = match d.context_key {
            Some(k) if *k.0 != *context_id => Arc::from(&*k.0),
            _ => context_id.clone(),
        };
        let mut rec = TaskRecord {
            accepted_bytes: accepted.iter().map(|(_, s)| s).sum(),
            accepted,
            artifact_bytes: d
                .artifacts
                .iter()
                .map(|a| super::serialized_len(a) + 1)
                .sum(),
            history_bytes: history.iter().map(|(_, s)| s).sum(),
            history,
            id: Arc::from(&*d.id.0),
            context_key,
            context_id,
            owner: Arc::new(d.owner.into_principal()?),
            state: d.state,
            status_message: None,
            status_ms: d.status_ms,
            status_seq: d.status_seq,
            created_ms: d.created_ms,
            artifacts: d.artifacts,
            status_count: d.status_count,
            status_history: d.status_history,
            origin: None,
            gate: None,
        };
        rec.set_origin(
            Link {
                kind,
                id: d.link_id.0.into_owned(),
            },
            d.command,
        );
        rec.set_gate(Some(super::Gate {
            schema: d.ask_schema,
            channel: d.ask_channel,
            operator_only: false,
        }));
        rec.status_message = d.status_message.map(super::StatusMessage::Whole);
        if packed {
            rec.pack();
        }
        Ok(rec)
    }
}

/// A history message as a record is written: a live message from its value, a packed one
/// as its text (checked to be JSON, not parsed into a tree; `None`, written as `null`, if
/// it were not).
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum HistoryDoc<'a> {
    Live(Arc<Message>),
    Packed(Option<&'a RawValue>),
}
