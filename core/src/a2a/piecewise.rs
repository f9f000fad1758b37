//! A task's JSON written a piece at a time, as the peer reads it.
//!
//! A task may be megabytes (its history and artifacts), and a small request (GetTask, one
//! page of ListTasks, a subscription's first frame) asks for all of it. Serialized whole, the
//! answer sits in the connection's buffer for as long as the peer takes to read it, so a
//! hundred readers that do not read would hold a hundred copies. [`TaskJson`] instead writes
//! the task from a snapshot whose messages and artifacts are shared with the store (cloning
//! a [`Task`] copies pointers, not content), a little at a time as room frees in the
//! connection's output: what a connection holds of the answer is its output bound.
//!
//! The bytes are exactly what `serde_json` writes for the same document (a test holds them
//! equal): small structures (a message's ids, a part's filename) go through `serde_json`
//! whole, a part's text, raw bytes or URL is escaped here a slice at a time, and a part's
//! `data` value is written through a window that skips what was already sent (it is
//! serialized again for each slice, which costs time only for a data value larger than a
//! slice).

use std::collections::VecDeque;

use serde::Serialize;

use super::types::{Artifact, Message, Part, PartContent, Role, Struct, Task};

/// A task's JSON between a prefix and a suffix (the JSON-RPC envelope, a page's other
/// members, an SSE event's framing), written in slices by [`TaskJson::fill`].
#[derive(Clone, Debug)]
pub struct TaskJson {
    task: Task,
    /// What comes before the task's opening brace.
    prefix: Vec<u8>,
    /// Where the writer is in the task's document.
    at: At,
    /// Fragments made and not yet written, with how much of the first was written.
    queue: VecDeque<Fragment>,
    written: usize,
    /// What follows the task's closing brace.
    suffix: Vec<u8>,
    /// How much the store counts this task as weighing: a cheap guess at its size.
    weight: usize,
}

/// One message or artifact of the task.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Unit {
    Artifact(usize),
    History(usize),
    StatusMessage,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum At {
    /// Nothing made yet.
    Start,
    /// Inside `unit`, its head written: `part` is the next part to make.
    Unit { unit: Unit, part: usize },
    /// Every fragment made (the queue may still hold some).
    Done,
}

#[derive(Clone, Debug)]
enum Fragment {
    Bytes(Vec<u8>),
    /// The string content of one part, escaped as it is written.
    Text {
        unit: Unit,
        part: usize,
    },
    /// The whole JSON of one part with a `data` value.
    Data {
        unit: Unit,
        part: usize,
    },
}

/// A guess at a task's JSON beyond its messages and artifacts: ids, state, timestamp, the
/// status message's envelope, annotations. Added to a weight to size a task's answer.
pub const TASK_ENVELOPE: usize = 512;

impl TaskJson {
    /// `prefix`, then `task`, then `suffix`. `weight` is the store's count of the task's
    /// bytes, which decides whether the answer is worth writing piecewise.
    pub fn new(task: Task, prefix: Vec<u8>, suffix: Vec<u8>, weight: usize) -> Self {
        TaskJson {
            task,
            prefix,
            at: At::Start,
            queue: VecDeque::new(),
            written: 0,
            suffix,
            weight,
        }
    }

    /// Puts `prefix` before everything not yet written and `suffix` after everything.
    /// Only before the first [`TaskJson::fill`].
    pub(crate) fn wrap(&mut self, prefix: &[u8], suffix: &[u8]) {
        debug_assert_eq!(self.at, At::Start);
        self.prefix.splice(0..0, prefix.iter().copied());
        self.suffix.extend_from_slice(suffix);
    }

    /// Whether the answer may be larger than `bound` bytes (so it is worth writing in
    /// slices): the store's weight of the task is close to its JSON size.
    pub(crate) fn likely_large(&self, bound: usize) -> bool {
        self.weight.saturating_add(self.suffix.len()) > bound / 2
    }

    /// The task being written.
    pub(crate) fn task(&self) -> &Task {
        &self.task
    }

    /// The whole document at once (prefix, task, suffix), as `serde_json` writes it.
    pub fn to_vec(&self) -> Vec<u8> {
        // Sized for the whole document up front, rather than grown from the prefix's length
        // by doubling: five reallocations for a one-message task's 700 bytes.
        let size = self.prefix.len() + self.weight + TASK_ENVELOPE + self.suffix.len();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&self.prefix);
        json(&mut out, &self.task);
        out.extend_from_slice(&self.suffix);
        out
    }

    /// The document's length in bytes, counted without writing it (a data value is
    /// serialized once into a counter).
    pub fn measure(&self) -> usize {
        let mut copy = self.clone();
        let mut total = 0;
        loop {
            if copy.queue.is_empty() && !copy.make() {
                return total;
            }
            total += match copy.queue.pop_front() {
                Some(Fragment::Bytes(b)) => b.len(),
                Some(Fragment::Text { unit, part }) => {
                    escaped_len(content_str(&parts(&copy.task, unit)[part]).as_bytes())
                }
                Some(Fragment::Data { unit, part }) => json_len(&parts(&copy.task, unit)[part]),
                None => 0,
            };
        }
    }

    /// Whether everything was written.
    pub(crate) fn is_done(&self) -> bool {
        self.at == At::Done && self.queue.is_empty()
    }

    /// Appends the next bytes of the document to `out`: `room` bytes, or a few more (an
    /// escape sequence is not split), or fewer at the end. True when the document is
    /// complete.
    pub fn fill(&mut self, out: &mut Vec<u8>, room: usize) -> bool {
        let goal = out.len().saturating_add(room);
        while out.len() < goal {
            if self.queue.is_empty() && !self.make() {
                return true;
            }
            let left = goal - out.len();
            let finished = match self.queue.front() {
                None => continue,
                Some(Fragment::Bytes(b)) => {
                    let take = left.min(b.len() - self.written);
                    out.extend_from_slice(&b[self.written..self.written + take]);
                    self.written += take;
                    self.written == b.len()
                }
                Some(Fragment::Text { unit, part }) => {
                    let s = content_str(&parts(&self.task, *unit)[*part]).as_bytes();
                    self.written = escape_into(out, s, self.written, left);
                    self.written == s.len()
                }
                Some(Fragment::Data { unit, part }) => {
                    let mut window = Window {
                        out: &mut *out,
                        skip: self.written,
                        room: left,
                        wrote: 0,
                    };
                    let complete =
                        serde_json::to_writer(&mut window, &parts(&self.task, *unit)[*part])
                            .is_ok();
                    self.written += window.wrote;
                    complete
                }
            };
            if finished {
                self.queue.pop_front();
                self.written = 0;
            }
        }
        self.is_done()
    }

    /// Queues the next fragments. False when there are none left.
    fn make(&mut self) -> bool {
        let mut b = Vec::new();
        match self.at {
            At::Done => return false,
            At::Start => {
                b = std::mem::take(&mut self.prefix);
                b.push(b'{');
                if self.task.artifacts.is_empty() {
                    self.after_artifacts(&mut b);
                } else {
                    b.extend_from_slice(b"\"artifacts\":[");
                    self.open(Unit::Artifact(0), &mut b);
                }
            }
            At::Unit { unit, part } => {
                if let Some(p) = parts(&self.task, unit).get(part) {
                    if part > 0 {
                        b.push(b',');
                    }
                    self.at = At::Unit {
                        unit,
                        part: part + 1,
                    };
                    if matches!(p.content, PartContent::Data(_)) {
                        self.push_bytes(b);
                        self.queue.push_back(Fragment::Data { unit, part });
                        return true;
                    }
                    write_part_head(&mut b, p);
                    self.push_bytes(b);
                    self.queue.push_back(Fragment::Text { unit, part });
                    self.queue.push_back(Fragment::Bytes(b"\"}".to_vec()));
                    return true;
                }
                match unit {
                    Unit::Artifact(i) => {
                        b.extend_from_slice(b"]}");
                        if i + 1 < self.task.artifacts.len() {
                            b.push(b',');
                            self.open(Unit::Artifact(i + 1), &mut b);
                        } else {
                            b.extend_from_slice(b"],");
                            self.after_artifacts(&mut b);
                        }
                    }
                    Unit::History(i) => {
                        write_message_tail(&mut b, &self.task.history[i]);
                        if i + 1 < self.task.history.len() {
                            b.push(b',');
                            self.open(Unit::History(i + 1), &mut b);
                        } else {
                            b.extend_from_slice(b"],");
                            self.after_history(&mut b);
                        }
                    }
                    Unit::StatusMessage => {
                        if let Some(m) = &self.task.status.message {
                            write_message_tail(&mut b, m);
                        }
                        b.push(b',');
                        self.close_status(&mut b);
                    }
                }
            }
        }
        self.push_bytes(b);
        true
    }

    fn push_bytes(&mut self, b: Vec<u8>) {
        if !b.is_empty() {
            self.queue.push_back(Fragment::Bytes(b));
        }
    }

    /// Writes the head of `unit` (up to its `"parts":[`) and moves into it.
    fn open(&mut self, unit: Unit, b: &mut Vec<u8>) {
        match unit {
            Unit::Artifact(i) => write_artifact_head(b, &self.task.artifacts[i]),
            Unit::History(i) => write_message_head(b, &self.task.history[i]),
            Unit::StatusMessage => {
                if let Some(m) = &self.task.status.message {
                    write_message_head(b, m);
                }
            }
        }
        self.at = At::Unit { unit, part: 0 };
    }

    /// `"contextId":…,` and on.
    fn after_artifacts(&mut self, b: &mut Vec<u8>) {
        b.extend_from_slice(b"\"contextId\":");
        json(b, &self.task.context_id);
        b.push(b',');
        if self.task.history.is_empty() {
            self.after_history(b);
        } else {
            b.extend_from_slice(b"\"history\":[");
            self.open(Unit::History(0), b);
        }
    }

    /// `"id":…,` and on.
    fn after_history(&mut self, b: &mut Vec<u8>) {
        b.extend_from_slice(b"\"id\":");
        json(b, &self.task.id);
        b.push(b',');
        if let Some(meta) = &self.task.metadata {
            b.extend_from_slice(b"\"metadata\":");
            json(b, meta);
            b.push(b',');
        }
        b.extend_from_slice(b"\"status\":{");
        if self.task.status.message.is_some() {
            b.extend_from_slice(b"\"message\":");
            self.open(Unit::StatusMessage, b);
        } else {
            self.close_status(b);
        }
    }

    /// The status's state and timestamp, the task's closing brace and the suffix.
    fn close_status(&mut self, b: &mut Vec<u8>) {
        b.extend_from_slice(b"\"state\":");
        json(b, &self.task.status.state);
        b.extend_from_slice(b",\"timestamp\":");
        json(b, &self.task.status.timestamp);
        b.extend_from_slice(b"}}");
        b.extend_from_slice(&std::mem::take(&mut self.suffix));
        self.at = At::Done;
    }
}

/// The parts of one message or artifact of `task`.
fn parts(task: &Task, unit: Unit) -> &[Part] {
    match unit {
        Unit::Artifact(i) => &task.artifacts[i].parts,
        Unit::History(i) => &task.history[i].parts,
        Unit::StatusMessage => match &task.status.message {
            Some(m) => &m.parts,
            None => &[],
        },
    }
}

fn json<T: Serialize + ?Sized>(b: &mut Vec<u8>, value: &T) {
    if serde_json::to_writer(&mut *b, value).is_err() {
        // Our own types always serialize; this only keeps the document well-formed.
        b.extend_from_slice(b"null");
    }
}

/// Writes `value` (an object) without its closing brace: the head of a larger object.
fn json_open<T: Serialize>(b: &mut Vec<u8>, value: &T) {
    json(b, value);
    if b.last() == Some(&b'}') {
        b.pop();
    }
}

/// A message's members before `parts` (as `Message`'s own serialization orders them), then
/// `"parts":[`.
fn write_message_head(b: &mut Vec<u8>, m: &Message) {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Head<'a> {
        #[serde(skip_serializing_if = "str::is_empty")]
        context_id: &'a str,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        extensions: &'a [String],
        message_id: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<&'a Struct>,
    }
    json_open(
        b,
        &Head {
            context_id: &m.context_id,
            extensions: &m.extensions,
            message_id: &m.message_id,
            metadata: m.metadata.as_ref(),
        },
    );
    // `messageId` is always written, so the head is never empty.
    b.extend_from_slice(b",\"parts\":[");
}

/// `]` and a message's members after `parts`, and its closing brace.
fn write_message_tail(b: &mut Vec<u8>, m: &Message) {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Tail<'a> {
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        reference_task_ids: &'a [String],
        role: Role,
        #[serde(skip_serializing_if = "str::is_empty")]
        task_id: &'a str,
    }
    let start = b.len();
    json(
        b,
        &Tail {
            reference_task_ids: &m.reference_task_ids,
            role: m.role,
            task_id: &m.task_id,
        },
    );
    // `role` is always written: `{…}` becomes `],…}`.
    b[start] = b',';
    b.insert(start, b']');
}

/// An artifact's members before `parts` (its last member), then `"parts":[`.
fn write_artifact_head(b: &mut Vec<u8>, a: &Artifact) {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Head<'a> {
        artifact_id: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        description: &'a str,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        extensions: &'a [String],
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<&'a Struct>,
        #[serde(skip_serializing_if = "str::is_empty")]
        name: &'a str,
    }
    json_open(
        b,
        &Head {
            artifact_id: &a.artifact_id,
            description: &a.description,
            extensions: &a.extensions,
            metadata: a.metadata.as_ref(),
            name: &a.name,
        },
    );
    b.extend_from_slice(b",\"parts\":[");
}

/// A part with string content: its other members (as `Part`'s serialization orders them:
/// the string is last), then the string's key and opening quote.
fn write_part_head(b: &mut Vec<u8>, p: &Part) {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Head<'a> {
        #[serde(skip_serializing_if = "str::is_empty")]
        filename: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        media_type: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<&'a Struct>,
    }
    json_open(
        b,
        &Head {
            filename: &p.filename,
            media_type: &p.media_type,
            metadata: p.metadata.as_ref(),
        },
    );
    if b.last() != Some(&b'{') {
        b.push(b',');
    }
    b.extend_from_slice(match p.content {
        PartContent::Raw(_) => b"\"raw\":\"",
        PartContent::Url(_) => b"\"url\":\"",
        _ => b"\"text\":\"",
    });
}

fn content_str(p: &Part) -> &str {
    match &p.content {
        PartContent::Text(s) | PartContent::Raw(s) | PartContent::Url(s) => s,
        PartContent::Data(_) => "",
    }
}

/// Escapes `s[from..]` into `out` as serde_json escapes a string's content, stopping once
/// `room` bytes were added (an escape sequence is finished, so up to 5 more). Returns where
/// it stopped in `s`. Only ASCII bytes are ever escaped, so any stopping point is exact.
fn escape_into(out: &mut Vec<u8>, s: &[u8], from: usize, room: usize) -> usize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let goal = out.len().saturating_add(room);
    let mut i = from;
    while i < s.len() && out.len() < goal {
        // The longest run that needs no escape, within the room.
        let limit = s.len().min(i + (goal - out.len()));
        let run = s[i..limit]
            .iter()
            .position(|&c| c < 0x20 || c == b'"' || c == b'\\')
            .map_or(limit, |k| i + k);
        out.extend_from_slice(&s[i..run]);
        i = run;
        if i == limit {
            continue;
        }
        let c = s[i];
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 0xf)],
            ]),
        }
        i += 1;
    }
    i
}

/// The length of `value`'s compact JSON, counted as it is serialized (nothing is kept): what
/// a bound on serialized bytes checks without writing the bytes.
pub fn json_len(value: &impl Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// How many bytes [`escape_into`] writes for `s`.
fn escaped_len(s: &[u8]) -> usize {
    s.iter()
        .map(|&c| match c {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

/// A writer that drops the first `skip` bytes, keeps the next `room`, and then fails (which
/// stops the serializer).
struct Window<'a> {
    out: &'a mut Vec<u8>,
    skip: usize,
    room: usize,
    wrote: usize,
}

impl std::io::Write for Window<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let skipped = self.skip.min(buf.len());
        self.skip -= skipped;
        let rest = &buf[skipped..];
        let take = rest.len().min(self.room - self.wrote);
        self.out.extend_from_slice(&rest[..take]);
        self.wrote += take;
        if take < rest.len() {
            return Err(std::io::Error::other("this slice is full"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::types::{TaskState, TaskStatus};
    use serde_json::json;
    use std::sync::Arc;

    fn message(i: usize, parts: Vec<Part>) -> Message {
        Message {
            context_id: if i % 2 == 0 {
                "ctx".into()
            } else {
                String::new()
            },
            extensions: if i % 3 == 0 {
                vec!["https://x/ext".into()]
            } else {
                vec![]
            },
            message_id: format!("m{i}"),
            metadata: (i % 4 == 1).then(|| {
                json!({"k": "v\"\n", "n": i})
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
            }),
            parts,
            reference_task_ids: if i % 5 == 2 {
                vec!["t0".into()]
            } else {
                vec![]
            },
            role: if i % 2 == 0 { Role::User } else { Role::Agent },
            task_id: if i % 3 == 1 {
                "t1".into()
            } else {
                String::new()
            },
        }
    }

    /// Every kind of part, and strings that need every kind of escape.
    fn parts(seed: usize) -> Vec<Part> {
        let tricky: String = (0u8..0x80)
            .map(char::from)
            .chain("é漢🙂".chars())
            .cycle()
            .skip(seed)
            .take(300 + seed * 37)
            .collect();
        let mut file = Part::text("");
        file.content = PartContent::Raw("aGVsbG8=".repeat(seed + 1));
        file.filename = "a.bin".into();
        file.media_type = "application/octet-stream".into();
        let mut url = Part::text("");
        url.content = PartContent::Url("https://example.com/x?a=\"b\"".into());
        url.metadata = json!({"m": [1, 2]}).as_object().cloned();
        let mut data = Part::data(json!({"big": tricky.clone(), "list": [1, 2.5, null, true]}));
        data.filename = "d.json".into();
        let mut v = vec![Part::text(tricky), file, url, data, Part::text("")];
        v.rotate_left(seed % 5);
        v
    }

    fn task(artifacts: usize, history: usize, status_message: bool) -> Task {
        Task {
            artifacts: (0..artifacts)
                .map(|i| {
                    Arc::new(Artifact {
                        artifact_id: format!("a{i}"),
                        description: if i % 2 == 0 {
                            "d".into()
                        } else {
                            String::new()
                        },
                        extensions: vec![],
                        metadata: (i == 1).then(|| json!({"x": 1}).as_object().cloned().unwrap()),
                        name: if i % 3 == 0 {
                            "n".into()
                        } else {
                            String::new()
                        },
                        parts: parts(i),
                    })
                })
                .collect(),
            context_id: "ctx\u{1}".into(),
            history: (0..history)
                .map(|i| Arc::new(message(i, parts(i + 7))))
                .collect(),
            id: "task-1".into(),
            metadata: (history % 2 == 1).then(|| json!({"a": "b"}).as_object().cloned().unwrap()),
            status: TaskStatus {
                message: status_message.then(|| Arc::new(message(9, parts(3)))),
                state: TaskState::Working,
                timestamp: "2026-12-03T00:00:00.000Z".into(),
            },
        }
    }

    fn written(mut w: TaskJson, room: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rounds = 0;
        loop {
            let before = out.len();
            let done = w.fill(&mut out, room);
            assert!(out.len() - before <= room + 5, "a slice overshot its room");
            rounds += 1;
            assert!(rounds < 1_000_000);
            if done {
                return out;
            }
        }
    }

    #[test]
    fn slices_join_to_what_serde_json_writes() {
        for (a, h, s) in [
            (0, 0, false),
            (0, 0, true),
            (1, 0, false),
            (0, 1, false),
            (3, 4, true),
            (2, 5, false),
        ] {
            let t = task(a, h, s);
            let expected = serde_json::to_vec(&t).unwrap();
            for room in [1, 2, 3, 7, 64, 1000, 1 << 20] {
                let got = written(TaskJson::new(t.clone(), Vec::new(), Vec::new(), 0), room);
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&expected),
                    "artifacts {a}, history {h}, status message {s}, room {room}"
                );
            }
            let w = TaskJson::new(t.clone(), Vec::new(), Vec::new(), 0);
            assert_eq!(w.measure(), expected.len());
            assert_eq!(w.to_vec(), expected);
        }
    }

    #[test]
    fn prefix_and_suffix_surround_the_task() {
        let t = task(1, 1, false);
        let mut w = TaskJson::new(t.clone(), b"{\"task\":".to_vec(), b"}".to_vec(), 0);
        w.wrap(b"{\"id\":1,\"result\":", b"}");
        let expected = format!(
            "{{\"id\":1,\"result\":{{\"task\":{}}}}}",
            serde_json::to_string(&t).unwrap()
        );
        assert_eq!(String::from_utf8(written(w.clone(), 5)).unwrap(), expected);
        assert_eq!(String::from_utf8(w.to_vec()).unwrap(), expected);
        assert_eq!(w.measure(), expected.len());
    }

    #[test]
    fn every_byte_escapes_as_serde_json_escapes_it() {
        let all: String = (0u32..0x800).filter_map(char::from_u32).collect();
        let expected = serde_json::to_string(&all).unwrap();
        for room in [1, 5, 100, usize::MAX / 2] {
            let mut out = b"\"".to_vec();
            let mut at = 0;
            while at < all.len() {
                at = escape_into(&mut out, all.as_bytes(), at, room);
            }
            out.push(b'"');
            assert_eq!(escaped_len(all.as_bytes()) + 2, expected.len());
            assert_eq!(String::from_utf8(out).unwrap(), expected, "room {room}");
        }
    }

    #[test]
    fn a_slice_holds_about_its_room() {
        // One 2 MB text part: no slice is much larger than asked.
        let mut t = task(0, 0, false);
        t.history = vec![Arc::new(message(
            0,
            vec![Part::text("x\"".repeat(1 << 20))],
        ))];
        let mut w = TaskJson::new(t.clone(), Vec::new(), Vec::new(), 0);
        let mut out = Vec::new();
        let mut total = 0;
        while !w.fill(&mut out, 4096) {
            assert!(out.len() <= 4096 + 5);
            total += out.len();
            out.clear();
        }
        total += out.len();
        assert_eq!(total, serde_json::to_vec(&t).unwrap().len());
    }
}
