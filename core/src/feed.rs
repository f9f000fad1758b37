//! The events extension's feed: one bounded ring of instance-wide events, and the typed API
//! that is the only way onto it.
//!
//! Every event is `{seq, ts, kind, data}` with `seq` strictly increasing. The ring's capacity
//! is fixed when the instance is built, and pushing never grows it: the oldest event leaves.
//! A subscriber holds nothing but its cursor into the ring, so a slow reader costs no memory:
//! it either keeps up, or the ring overwrites past its cursor and its stream ends (without a
//! `goodbye`), and its reconnect with `fromSeq` gets `resync: true`.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::a2a::types::Task;
use crate::auth::Principal;
use crate::ext::events_schema::{self, Audience};
use crate::ext::registry::TASK_ANNOTATIONS_URI;

/// Messages and bytes of history a `task` event carries.
const TASK_EVENT_HISTORY: usize = 4;
const TASK_EVENT_HISTORY_BYTES: usize = 32 * 1024;

/// One event on the ring.
#[derive(Debug)]
pub struct FeedEntry {
    pub(crate) seq: u64,
    /// The event's kind, one of the closed vocabulary ([`crate::ext::events_schema`]).
    pub kind: &'static str,
    /// Who receives it besides operators: everyone, or the owning principal's id.
    pub(crate) audience: Audience,
    pub(crate) owner: Option<String>,
    /// The event's SSE frame from the JSON-RPC request id on, encoded once when it was
    /// pushed and shared by every subscriber's output (see [`encode_frame`]).
    pub(crate) frame: Arc<[u8]>,
    /// For a `task` event, the same frame without task annotations.
    pub(crate) frame_plain: Option<Arc<[u8]>>,
    /// Where the `data` document starts in `frame`.
    data_at: usize,
}

impl FeedEntry {
    /// Whether `p` receives this event: an operator receives every event; anyone else what
    /// its principal owns and what is addressed to every subscriber.
    pub(crate) fn visible_to(&self, p: &Principal) -> bool {
        match self.audience {
            _ if p.is_operator() => true,
            Audience::All => p.role != crate::auth::Role::Anonymous,
            Audience::Owner => self.owner.as_deref().is_some_and(|o| o == p.id),
            Audience::Operator => false,
        }
    }

    /// The frame a subscriber receives: without task annotations unless it activated that
    /// extension. Encoded once at push time and shared by every subscriber.
    pub(crate) fn frame_for(&self, annotate: bool) -> &Arc<[u8]> {
        match (&self.frame_plain, annotate) {
            (Some(plain), false) => plain,
            _ => &self.frame,
        }
    }

    /// The `data` document as JSON text (with task annotations, for a `task` event).
    pub fn data(&self) -> &str {
        let end = self.frame.len().saturating_sub(FRAME_END.len());
        let bytes = self.frame.get(self.data_at..end).unwrap_or_default();
        std::str::from_utf8(bytes).unwrap_or_default()
    }
}

/// What follows an event's `data` document in its frame: the `event`, `result` and response
/// objects close, and the SSE event ends.
const FRAME_END: &[u8] = b"}}}\n\n";

/// What comes before the request id in an event's SSE frame.
pub(crate) const FRAME_HEAD: &[u8] = b"data: {\"id\":";

/// Encodes the part of an event's frame that is the same for every subscriber: everything
/// after the JSON-RPC request id, `,"jsonrpc":"2.0","result":{"event":{"kind":…,"seq":…,
/// "ts":…,"data":…}}}` and the blank line that ends the SSE event. A subscriber's frame is
/// [`FRAME_HEAD`], its request id, then these bytes (inside one chunk when chunked).
/// Returns the bytes and where `data` starts in them.
fn encode_frame(kind: &str, seq: u64, ts: u64, data: &Value) -> (Arc<[u8]>, usize) {
    use std::io::Write as _;
    let mut out = Vec::with_capacity(160);
    let _ = write!(
        out,
        ",\"jsonrpc\":\"2.0\",\"result\":{{\"event\":{{\"kind\":\"{kind}\",\"seq\":{seq},\"ts\":{ts},\"data\":"
    );
    let data_at = out.len();
    if serde_json::to_writer(&mut out, data).is_err() {
        out.truncate(data_at);
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(FRAME_END);
    (Arc::from(out), data_at)
}

/// What may be pushed: the closed vocabulary, one variant per family of kinds.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedEvent {
    /// A task changed (created, status, artifact). Carries the Task, stored annotated.
    Task {
        /// The task as it now stands.
        task: Box<Task>,
        /// The id of the principal that owns it: who receives the event beside operators.
        owner: String,
    },
    /// A task left the store.
    TaskRemoved {
        /// The removed task's id.
        id: String,
        /// The id of the principal that owned it.
        owner: String,
    },
    /// Any other kind of the vocabulary, with its document; `owner` for owner-audience kinds.
    Other {
        /// The kind, which must be in the vocabulary and not `task` or `task.removed`.
        kind: &'static str,
        /// The event's `data` document, which must match the kind's schema.
        data: Value,
        /// The receiving principal's id, for a kind whose audience is the owner.
        owner: Option<String>,
    },
}

/// Why a push was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PushError {
    /// Not a kind of the closed vocabulary.
    UnknownKind(String),
    /// `task` and `task.removed` are pushed by the instance itself, from the task store.
    Reserved(&'static str),
    /// The document does not match the kind's schema (checked in debug builds).
    Invalid {
        /// The kind pushed.
        kind: &'static str,
        /// What the schema validator said, one line each.
        errors: Vec<String>,
    },
}

impl std::fmt::Display for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PushError::UnknownKind(kind) => write!(f, "{kind:?} is not an event kind"),
            PushError::Reserved(kind) => write!(f, "{kind:?} events are pushed by the instance"),
            PushError::Invalid { kind, errors } => {
                write!(
                    f,
                    "the {kind} event's data is invalid: {}",
                    errors.join("; ")
                )
            }
        }
    }
}

impl std::error::Error for PushError {}

/// The ring and its bookkeeping.
#[derive(Debug)]
pub struct Ring {
    capacity: usize,
    entries: VecDeque<FeedEntry>,
    /// The seq of the newest event; 0 before the first.
    newest: u64,
    /// Events that left the ring.
    dropped: u64,
}

impl Ring {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Ring {
            capacity,
            entries: VecDeque::with_capacity(capacity),
            newest: 0,
            dropped: 0,
        }
    }

    /// Numbers the next event `base + 1`, as if `base` events had come and gone: a cursor
    /// at or below `base` is then answered with resync. Only before the first event.
    pub(crate) fn start_after(&mut self, base: u64) {
        if self.entries.is_empty() && self.newest == 0 {
            self.newest = base;
            self.dropped = base;
        }
    }

    pub(crate) fn newest(&self) -> u64 {
        self.newest
    }

    /// The seq of the oldest event still held (newest + 1 when empty).
    pub(crate) fn oldest(&self) -> u64 {
        self.entries.front().map_or(self.newest + 1, |e| e.seq)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a cursor (the last seq a client read) cannot be honoured: events past it have
    /// left the ring, or it is ahead of the feed (it comes from before a restart).
    pub(crate) fn needs_resync(&self, after: u64) -> bool {
        // Saturating: a cursor is the client's number, up to u64::MAX.
        let evicted = after > 0 && self.dropped > 0 && after.saturating_add(1) < self.oldest();
        evicted || after > self.newest
    }

    /// Whether a live reader at `cursor` has been overrun: the next event it needs is gone.
    pub(crate) fn overran(&self, cursor: u64) -> bool {
        self.dropped > 0 && cursor.saturating_add(1) < self.oldest()
    }

    /// Events after `cursor`, oldest first.
    pub fn after(&self, cursor: u64) -> impl Iterator<Item = &FeedEntry> {
        let skip = cursor.saturating_add(1).saturating_sub(self.oldest()) as usize;
        self.entries.iter().skip(skip)
    }

    /// The only way onto the ring (see [`crate::instance::Instance::push_event`]): numbers
    /// the event and encodes its frames, once for every subscriber.
    fn push_entry(
        &mut self,
        ts: u64,
        kind: &'static str,
        audience: Audience,
        owner: Option<String>,
        data: &Value,
        data_plain: Option<&Value>,
    ) -> u64 {
        let seq = self.newest + 1;
        let (frame, data_at) = encode_frame(kind, seq, ts, data);
        let frame_plain = data_plain.map(|d| encode_frame(kind, seq, ts, d).0);
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.newest = seq;
        self.entries.push_back(FeedEntry {
            seq,
            kind,
            audience,
            owner,
            frame,
            frame_plain,
            data_at,
        });
        seq
    }
}

/// Builds, checks and appends one event. Returns its seq.
pub(crate) fn push(
    ring: &mut Ring,
    event: FeedEvent,
    ts: u64,
    introspection: bool,
) -> Result<u64, PushError> {
    let (kind, data, data_plain, owner) = match event {
        FeedEvent::Task { task, owner } => {
            let task = trim_history(*task);
            let annotated = json!({"task": task});
            let mut plain_task = task;
            if let Some(meta) = plain_task.metadata.as_mut() {
                meta.remove(TASK_ANNOTATIONS_URI);
                if meta.is_empty() {
                    plain_task.metadata = None;
                }
            }
            let plain = json!({"task": plain_task});
            ("task", annotated, Some(plain), Some(owner))
        }
        FeedEvent::TaskRemoved { id, owner } => {
            ("task.removed", json!({"id": id}), None, Some(owner))
        }
        FeedEvent::Other { kind, .. } if kind == "task" || kind == "task.removed" => {
            return Err(PushError::Reserved(kind))
        }
        FeedEvent::Other { kind, data, owner } => (kind, data, None, owner),
    };
    let spec = events_schema::kind(kind).ok_or_else(|| PushError::UnknownKind(kind.to_owned()))?;
    if spec.introspection_only && !introspection {
        // Audit events exist only while introspection is on.
        return Ok(ring.newest());
    }
    #[cfg(debug_assertions)]
    check_against_schema(spec.kind, &data)?;
    Ok(ring.push_entry(
        ts,
        spec.kind,
        spec.audience,
        owner,
        &data,
        data_plain.as_ref(),
    ))
}

/// A Task for the feed: its history cut to the newest few messages.
fn trim_history(mut task: Task) -> Task {
    let keep_from = task.history.len().saturating_sub(TASK_EVENT_HISTORY);
    task.history.drain(..keep_from);
    let mut bytes: usize = task
        .history
        .iter()
        .map(|m| serde_json::to_vec(m).map_or(0, |v| v.len()))
        .sum();
    while bytes > TASK_EVENT_HISTORY_BYTES && !task.history.is_empty() {
        let first = task.history.remove(0);
        bytes -= serde_json::to_vec(&first).map_or(0, |v| v.len());
    }
    task
}

#[cfg(debug_assertions)]
fn check_against_schema(kind: &'static str, data: &Value) -> Result<(), PushError> {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    static VALIDATORS: OnceLock<HashMap<&'static str, jsonschema::Validator>> = OnceLock::new();
    let validators = VALIDATORS.get_or_init(|| {
        events_schema::KINDS
            .iter()
            .map(|k| {
                let v = jsonschema::draft202012::new(&(k.data)()).unwrap_or_else(|e| {
                    panic!("the schema of feed kind {} is invalid: {e}", k.kind)
                });
                (k.kind, v)
            })
            .collect()
    });
    let Some(v) = validators.get(kind) else {
        return Ok(());
    };
    let errors: Vec<String> = v
        .iter_errors(data)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(PushError::Invalid { kind, errors })
    }
}

/// The `hello` frame's member.
pub(crate) fn hello(
    newest: u64,
    resume: u64,
    resync: bool,
    introspection: bool,
    version: &str,
) -> Value {
    json!({"introspection": introspection, "resume": resume, "resync": resync, "seq": newest, "version": version})
}

/// Why a feed stream ended with `goodbye`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Goodbye {
    /// The stream reached its longest life; the client reconnects with its cursor.
    Deadline,
    /// The caller's credential (a session) was revoked.
    Revoked,
}

impl Goodbye {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Goodbye::Deadline => "deadline",
            Goodbye::Revoked => "revoked",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifecycle(paused: bool) -> FeedEvent {
        FeedEvent::Other {
            kind: "lifecycle",
            data: if paused {
                json!({"paused": true, "reason": "x"})
            } else {
                json!({"paused": false})
            },
            owner: None,
        }
    }

    #[test]
    fn the_ring_is_bounded_and_seq_strictly_increases() {
        let mut r = Ring::new(3);
        for i in 0..10 {
            let seq = push(&mut r, lifecycle(i % 2 == 0), 1000 + i, false).unwrap();
            assert_eq!(seq, i + 1);
            assert!(r.len() <= 3);
        }
        assert_eq!((r.oldest(), r.newest()), (8, 10));
        let seqs: Vec<u64> = r.after(0).map(|e| e.seq).collect();
        assert_eq!(seqs, [8, 9, 10]);
        assert_eq!(r.after(8).map(|e| e.seq).collect::<Vec<_>>(), [9, 10]);
        assert_eq!(r.after(10).count(), 0);
        // Resync: a cursor whose next event left, or one from before a restart.
        assert!(r.needs_resync(5));
        assert!(!r.needs_resync(7));
        assert!(!r.needs_resync(10));
        assert!(r.needs_resync(11));
        assert!(r.overran(6));
        assert!(!r.overran(7));
        assert!(
            r.needs_resync(u64::MAX),
            "the largest cursor is ahead, never an overflow"
        );
        assert!(!r.overran(u64::MAX));
        assert_eq!(r.after(u64::MAX).count(), 0);
        let fresh = Ring::new(3);
        assert!(!fresh.needs_resync(0));
        assert!(
            fresh.needs_resync(1),
            "the feed restarted below this cursor"
        );
    }

    #[test]
    fn only_the_vocabulary_gets_on_and_documents_are_checked() {
        let mut r = Ring::new(8);
        let bad = FeedEvent::Other {
            kind: "message",
            data: json!({}),
            owner: None,
        };
        assert_eq!(
            push(&mut r, bad, 1, false),
            Err(PushError::UnknownKind("message".into()))
        );
        let reserved = FeedEvent::Other {
            kind: "task",
            data: json!({}),
            owner: None,
        };
        assert_eq!(
            push(&mut r, reserved, 1, false),
            Err(PushError::Reserved("task"))
        );
        let wrong = FeedEvent::Other {
            kind: "config",
            data: json!({"paths": "x"}),
            owner: None,
        };
        if cfg!(debug_assertions) {
            assert!(matches!(
                push(&mut r, wrong, 1, false),
                Err(PushError::Invalid { kind: "config", .. })
            ));
        }
        // Audit exists only while introspection is on.
        let audit = FeedEvent::Other {
            kind: "audit",
            data: json!({"ts": 1, "principal": null, "role": null, "action": "a", "target": null, "outcome": "ok"}),
            owner: None,
        };
        push(&mut r, audit.clone(), 1, false).unwrap();
        assert!(r.is_empty());
        push(&mut r, audit, 1, true).unwrap();
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn visibility() {
        let mut r = Ring::new(8);
        push(&mut r, lifecycle(true), 1, false).unwrap();
        push(
            &mut r,
            FeedEvent::TaskRemoved {
                id: "t".into(),
                owner: "user:a".into(),
            },
            1,
            false,
        )
        .unwrap();
        push(
            &mut r,
            FeedEvent::Other {
                kind: "config",
                data: json!({"paths": ["a"], "source": "reload"}),
                owner: None,
            },
            1,
            false,
        )
        .unwrap();
        let alice = Principal::new("user:a", crate::auth::Role::User, vec![]);
        let bob = Principal::new("user:b", crate::auth::Role::User, vec![]);
        let seen = |p: &Principal| {
            r.after(0)
                .filter(|e| e.visible_to(p))
                .map(|e| e.seq)
                .collect::<Vec<_>>()
        };
        assert_eq!(seen(&Principal::operator()), [1, 2, 3]);
        assert_eq!(seen(&alice), [1, 2, 3]);
        assert_eq!(seen(&bob), [1, 3], "gaps where others' events were");
    }
}
