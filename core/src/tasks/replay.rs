//! Recent stream events of each task, kept for SSE reconnection (`Last-Event-ID`).
//!
//! Every event published for a task (a `statusUpdate` or an `artifactUpdate`) gets the next
//! number of that task's sequence, starting at 1. A stream frame's SSE id is
//! `<taskId>:<run>:<n>`:
//! - `run` is this daemon process's start time in hexadecimal epoch milliseconds: the
//!   numbering restarts with the process, and an id from an earlier run is recognised as
//!   such;
//! - `n` is the number of the event the frame carries. A `{task}` snapshot frame carries the
//!   number of the newest event it already reflects (0 before the first event).
//!
//! A client that has read the frame with id `<taskId>:<run>:<n>` has seen everything up to
//! event `n`; reconnecting with that id replays the events after it. The events are kept
//! in memory only, with a bound per task and a global bound (oldest dropped first). When the
//! events after the id are no longer all kept (dropped, or from an earlier run), the
//! reconnect gets a fresh `{task}` snapshot instead, which stands in for every event up to its
//! own id.
//!
//! Events are shared (`Arc`) between this store and the streams' queues, so neither a
//! replay nor many readers copy them.

use crate::errors::EventIdError;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::serialized_len;
use crate::a2a::types::StreamResponse;

/// Bounds on the kept events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayLimits {
    /// Events kept per task; the oldest are dropped past it.
    pub per_task: usize,
    /// Events kept over all tasks; the oldest (whichever task) are dropped past it.
    pub events: usize,
    /// Serialized bytes of the kept events over all tasks; the oldest are dropped past it.
    pub bytes: usize,
}

impl ReplayLimits {
    pub(crate) const DEFAULT: ReplayLimits = ReplayLimits {
        per_task: 64,
        events: 4096,
        bytes: 4 * 1024 * 1024,
    };
}

/// One task's sequence.
#[derive(Debug, Default)]
struct Log {
    /// The newest event's number (0: none yet).
    last: u64,
    /// Kept events, oldest first: (number, serialized size, event).
    kept: VecDeque<(u64, usize, Arc<StreamResponse>)>,
}

/// Where a `Last-Event-ID` points in its task's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// After event `n` of this run.
    After(u64),
    /// An id from an earlier run of the daemon: its events are gone.
    EarlierRun,
}

/// The kept events of every task.
#[derive(Debug)]
pub struct Replay {
    limits: ReplayLimits,
    run: String,
    logs: HashMap<Arc<str>, Log>,
    /// Every kept event in the order it was recorded (entries for events already dropped
    /// through the per-task bound or a forgotten task are skipped, and compacted away).
    order: VecDeque<(Arc<str>, u64)>,
    events: usize,
    bytes: usize,
}

impl Replay {
    /// `started_ms`: the process's start, epoch milliseconds (names the run).
    pub fn new(limits: ReplayLimits, started_ms: u64) -> Self {
        Replay {
            limits,
            run: format!("{started_ms:x}"),
            logs: HashMap::new(),
            order: VecDeque::new(),
            events: 0,
            bytes: 0,
        }
    }

    /// Numbers and keeps one event of `task_id`; returns its number.
    pub fn record(&mut self, task_id: &str, event: &Arc<StreamResponse>) -> u64 {
        let size = serialized_len(&**event);
        let key: Arc<str> = match self.logs.get_key_value(task_id) {
            Some((k, _)) => k.clone(),
            None => Arc::from(task_id),
        };
        let log = self.logs.entry(key.clone()).or_default();
        log.last += 1;
        let n = log.last;
        if self.limits.per_task == 0 || size > self.limits.bytes {
            // Not kept: what is kept must run without a gap up to the newest event, and the
            // older ones could only serve a resume that needs this one.
            for (_, s, _) in log.kept.drain(..) {
                self.events -= 1;
                self.bytes -= s;
            }
            return n;
        }
        log.kept.push_back((n, size, event.clone()));
        self.events += 1;
        self.bytes += size;
        if log.kept.len() > self.limits.per_task {
            if let Some((_, s, _)) = log.kept.pop_front() {
                self.events -= 1;
                self.bytes -= s;
            }
        }
        self.order.push_back((key, n));
        while self.events > self.limits.events || self.bytes > self.limits.bytes {
            let Some((task, n)) = self.order.pop_front() else {
                break;
            };
            let Some(log) = self.logs.get_mut(&task) else {
                continue;
            };
            if log.kept.front().is_some_and(|(m, _, _)| *m == n) {
                let (_, s, _) = log.kept.pop_front().expect("front checked");
                self.events -= 1;
                self.bytes -= s;
            }
        }
        if self.order.len() > 2 * self.events + 64 {
            self.compact();
        }
        n
    }

    /// Drops the order entries of events no longer kept.
    fn compact(&mut self) {
        let logs = &self.logs;
        self.order.retain(|(task, n)| {
            logs.get(task)
                .and_then(|l| l.kept.front())
                .is_some_and(|(first, _, _)| n >= first)
        });
    }

    /// The newest event's number of a task (0: none yet).
    pub fn last(&self, task_id: &str) -> u64 {
        self.logs.get(task_id).map_or(0, |l| l.last)
    }

    /// The SSE id of event `n` of a task.
    pub fn event_id(&self, task_id: &str, n: u64) -> String {
        format!("{task_id}:{}:{n}", self.run)
    }

    /// The events after `n`, oldest first, when every one of them is still kept.
    pub fn after(&self, task_id: &str, n: u64) -> Option<Vec<(u64, Arc<StreamResponse>)>> {
        let Some(log) = self.logs.get(task_id) else {
            return (n == 0).then(Vec::new);
        };
        if n >= log.last {
            return Some(Vec::new());
        }
        match log.kept.front() {
            Some((first, _, _)) if *first <= n + 1 => Some(
                log.kept
                    .iter()
                    .filter(|(m, _, _)| *m > n)
                    .map(|(m, _, e)| (*m, e.clone()))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// Reads a `Last-Event-ID` sent to resume `task_id`. The refusal says why it is not one
    /// of this task's ids.
    pub fn parse(&self, task_id: &str, header: &str) -> Result<Resume, EventIdError> {
        let shape = || {
            format!("{header:?} is not an event id of this daemon (expected <taskId>:<run>:<n>)")
        };
        let (rest, n) = header.rsplit_once(':').ok_or_else(shape)?;
        let (task, run) = rest.rsplit_once(':').ok_or_else(shape)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(shape().into());
        }
        let n: u64 = n.parse().map_err(|_| shape())?;
        if run.is_empty() || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(shape().into());
        }
        if task != task_id {
            return Err(
                format!("{header:?} is an event id of another task, not of {task_id}").into(),
            );
        }
        if run != self.run {
            return Ok(Resume::EarlierRun);
        }
        let last = self.last(task_id);
        if n > last {
            return Err(
                format!("{header:?} is past the newest event of task {task_id} ({last})").into(),
            );
        }
        Ok(Resume::After(n))
    }

    /// Forgets a task that left the store.
    pub fn forget(&mut self, task_id: &str) {
        if let Some(log) = self.logs.remove(task_id) {
            for (_, s, _) in log.kept {
                self.events -= 1;
                self.bytes -= s;
            }
        }
    }

    /// Tasks with a sequence (held tasks that published an event).
    pub fn tasks(&self) -> usize {
        self.logs.len()
    }

    /// Events kept over all tasks.
    pub fn kept_events(&self) -> usize {
        self.events
    }

    /// Serialized bytes kept over all tasks.
    pub fn kept_bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::types::{TaskState, TaskStatusUpdateEvent};

    fn ev(task: &str) -> Arc<StreamResponse> {
        Arc::new(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            context_id: "c".into(),
            metadata: None,
            status: crate::a2a::types::TaskStatus {
                state: TaskState::Working,
                message: None,
                timestamp: String::new(),
            },
            task_id: task.into(),
        }))
    }

    #[test]
    fn bounds_per_task_and_global_drop_the_oldest() {
        let mut r = Replay::new(
            ReplayLimits {
                per_task: 3,
                events: 5,
                bytes: 1 << 20,
            },
            0x10,
        );
        for _ in 0..4 {
            r.record("a", &ev("a"));
        }
        assert_eq!(r.last("a"), 4);
        assert_eq!(r.kept_events(), 3);
        // Event 1 was dropped: resuming after 0 cannot be complete; after 1 can.
        assert!(r.after("a", 0).is_none());
        let after1: Vec<u64> = r.after("a", 1).unwrap().iter().map(|e| e.0).collect();
        assert_eq!(after1, vec![2, 3, 4]);
        for _ in 0..3 {
            r.record("b", &ev("b"));
        }
        // Global bound 5: a's oldest kept event (2) went first.
        assert_eq!(r.kept_events(), 5);
        assert!(r.after("a", 1).is_none());
        assert_eq!(r.after("a", 2).unwrap().len(), 2);
        assert_eq!(r.after("b", 0).unwrap().len(), 3);
        r.forget("a");
        assert_eq!(r.kept_events(), 3);
        assert_eq!(r.last("a"), 0);
        for _ in 0..200 {
            r.record("c", &ev("c"));
        }
        assert!(r.kept_events() <= 5);
        assert!(r.order.len() <= 2 * 5 + 64 + 1);
    }

    #[test]
    fn sizes_are_the_serialized_lengths() {
        let e = ev("t");
        assert_eq!(serialized_len(&*e), serde_json::to_vec(&*e).unwrap().len());
    }

    #[test]
    fn the_byte_bound_holds() {
        let size = serde_json::to_vec(&*ev("a")).unwrap().len();
        let mut r = Replay::new(
            ReplayLimits {
                per_task: 100,
                events: 100,
                bytes: size * 2 + 1,
            },
            1,
        );
        for _ in 0..5 {
            r.record("a", &ev("a"));
        }
        assert_eq!(r.kept_events(), 2);
        assert!(r.kept_bytes() <= size * 2 + 1);
    }

    #[test]
    fn ids_parse_back_and_foreign_ones_are_refused() {
        let mut r = Replay::new(ReplayLimits::DEFAULT, 0xabc);
        r.record("t:1", &ev("t:1"));
        r.record("t:1", &ev("t:1"));
        let id = r.event_id("t:1", 1);
        assert_eq!(id, "t:1:abc:1");
        assert_eq!(r.parse("t:1", &id), Ok(Resume::After(1)));
        assert_eq!(r.parse("t:1", "t:1:abd:9"), Ok(Resume::EarlierRun));
        assert!(r.parse("t:1", "t:1:abc:3").unwrap_err().0.contains("past"));
        assert!(r
            .parse("t:1", "u:abc:1")
            .unwrap_err()
            .0
            .contains("another task"));
        for bad in [
            "",
            "7",
            "t:1:abc:",
            "t:1:abc:-1",
            "t:1:xyz:1",
            "t:1::1",
            "t:1:abc:+1",
        ] {
            assert!(r.parse("t:1", bad).is_err(), "{bad:?}");
        }
    }
}
