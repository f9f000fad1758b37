//! The events feed (`agentd.events/SubscribeToEvents`) on the real binary, both drivers:
//! `hello`, replay, live events and the deadline `goodbye`; reconnecting from a cursor;
//! `resync` after a ring overflow, a daemon restart or a subscriber too slow for the ring;
//! task annotations only when activated; every refusal; many subscribers at once.
//!
//! The daemons are `common::Daemon`s with an `[a2a.events]` table ([`FeedDaemon`]); this file
//! has its own incremental reader ([`Conn`]) that takes an SSE stream frame by frame while it
//! is still open. Every read is bounded by [`common::READ_TIMEOUT`].

mod common;

use std::io::{self, Read, Write};
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Setup, Transport, Via, READ_TIMEOUT};
use serde_json::{json, Value};

const EVENTS_URI: &str = "https://agentd.dev/a2a/ext/events";
const ANNOTATIONS_URI: &str = "https://agentd.dev/a2a/ext/task-annotations";
const METHOD: &str = "agentd.events/SubscribeToEvents";
/// The `id` of every feed request, echoed in every frame.
const FEED_ID: u64 = 7;
/// `a2a.events.stream_deadline_ms` of the daemons here.
const DEADLINE_MS: u64 = 1500;
/// `a2a.events.ring` of the daemons here.
const RING: usize = 8;

// ---------------------------------------------------------------------------------------
// The launcher.

/// A [`common::Daemon`] with the events feed enabled: its config gets an `[a2a.events]`
/// table. Derefs to the daemon (`assert_alive`, `kill`, `stderr`, ...); [`FeedDaemon::connect`]
/// hands out this file's incremental [`Conn`] instead of a [`common::Client`].
struct FeedDaemon(common::Daemon);

impl FeedDaemon {
    /// `ring` and `deadline_ms` go to `[a2a.events]`.
    fn start(driver: &str, ring: usize, deadline_ms: u64) -> FeedDaemon {
        let setup = Setup {
            sections: format!(
                "[a2a.events]\nenabled = true\nring = {ring}\nstream_deadline_ms = {deadline_ms}\n"
            ),
            ..Setup::default()
        };
        FeedDaemon(common::Daemon::start_setup(driver, &setup))
    }

    /// A connection over either listener.
    fn connect(&self, via: Via) -> Conn {
        let label = format!("{} {via:?}", self.0.driver);
        Conn::new(self.0.connect(via).stream, label)
    }
}

impl Deref for FeedDaemon {
    type Target = common::Daemon;
    fn deref(&self) -> &common::Daemon {
        &self.0
    }
}

impl DerefMut for FeedDaemon {
    fn deref_mut(&mut self) -> &mut common::Daemon {
        &mut self.0
    }
}

// ---------------------------------------------------------------------------------------
// The incremental client.

/// A response head.
#[derive(Debug)]
struct Head {
    status: u16,
    /// Names lower-cased, values trimmed.
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A plain (non-streaming) response.
#[derive(Debug)]
struct Plain {
    head: Head,
    body: Vec<u8>,
    chunked: bool,
}

/// One `result` of the feed.
#[derive(Debug)]
enum Frame {
    Hello(Value),
    Event(Value),
    Goodbye(Value),
}

/// What came next on a feed stream.
#[derive(Debug)]
enum Next {
    Frame(Frame),
    /// The chunked stream ended (its last chunk arrived).
    End,
    /// The connection closed before the stream ended.
    Eof,
}

/// One connection, read byte-exactly: plain responses and SSE streams frame by frame.
struct Conn {
    stream: Box<dyn Transport>,
    buf: Vec<u8>,
    /// De-chunked SSE text of the open stream not yet split into events.
    sse: Vec<u8>,
    /// A stream's head was read and its last chunk not yet.
    streaming: bool,
    label: String,
}

impl Conn {
    fn new(stream: Box<dyn Transport>, label: String) -> Conn {
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
        Conn {
            stream,
            buf: Vec::new(),
            sse: Vec::new(),
            streaming: false,
            label,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .and_then(|()| self.stream.flush())
            .unwrap_or_else(|e| panic!("[{}] expected to write the request: {e}", self.label));
    }

    /// Reads once into the buffer; 0 at EOF (a reset counts). Panics on a timeout.
    fn fill(&mut self, what: &str) -> usize {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    return 0
                }
                Err(e) => panic!(
                    "[{}] nothing arrived within {READ_TIMEOUT:?} while reading {what} ({e}); \
                     buffered {:?}",
                    self.label,
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
    }

    /// One CRLF-terminated line; `None` at EOF.
    fn line(&mut self, what: &str) -> Option<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..i + 2).take(i).collect();
                return Some(String::from_utf8_lossy(&line).into_owned());
            }
            if self.fill(what) == 0 {
                return None;
            }
        }
    }

    fn exact(&mut self, n: usize, what: &str) -> Vec<u8> {
        while self.buf.len() < n {
            if self.fill(what) == 0 {
                panic!(
                    "[{}] the connection closed while reading {what}; buffered {:?}",
                    self.label,
                    String::from_utf8_lossy(&self.buf)
                );
            }
        }
        self.buf.drain(..n).collect()
    }

    fn head(&mut self) -> Head {
        let label = self.label.clone();
        let status_line = self
            .line("a status line")
            .unwrap_or_else(|| panic!("[{label}] expected a response, the connection closed"));
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|r| r.get(..3))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("[{label}] not an HTTP/1.1 status line: {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let line = self
                .line("the headers")
                .unwrap_or_else(|| panic!("[{label}] the connection closed in the headers"));
            if line.is_empty() {
                break;
            }
            let (n, v) = line
                .split_once(':')
                .unwrap_or_else(|| panic!("[{label}] malformed header line {line:?}"));
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        Head { status, headers }
    }

    /// One chunk of a chunked body; `None` for the last (0-length) chunk, trailers read.
    fn chunk(&mut self) -> Option<Option<Vec<u8>>> {
        let size_line = self.line("a chunk size")?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or_else(|_| panic!("[{}] malformed chunk size {size_line:?}", self.label));
        if size == 0 {
            loop {
                match self.line("the trailer") {
                    Some(l) if l.is_empty() => return Some(None),
                    Some(_) => {}
                    None => return None,
                }
            }
        }
        let data = self.exact(size, "chunk data");
        let crlf = self.exact(2, "a chunk's CRLF");
        assert_eq!(crlf, b"\r\n", "[{}] chunk data ends in CRLF", self.label);
        Some(Some(data))
    }

    /// Reads a whole non-streaming response.
    fn plain(&mut self) -> Plain {
        assert!(!self.streaming, "[{}] a stream is still open", self.label);
        let head = self.head();
        let mut body = Vec::new();
        let chunked = head
            .header("transfer-encoding")
            .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
        if chunked {
            loop {
                match self.chunk() {
                    Some(Some(data)) => body.extend_from_slice(&data),
                    Some(None) => break,
                    None => panic!("[{}] the connection closed mid-body", self.label),
                }
            }
        } else {
            let len: usize = head
                .header("content-length")
                .unwrap_or_else(|| panic!("[{}] no content-length: {head:?}", self.label))
                .parse()
                .unwrap();
            body = self.exact(len, "the body");
        }
        Plain {
            head,
            body,
            chunked,
        }
    }

    /// A JSON-RPC call with the standard headers; asserts 200 JSON; the whole document.
    fn rpc(&mut self, method: &str, params: Value) -> Value {
        self.send(&common::rpc_request("1", method, &params));
        let r = self.plain();
        assert_eq!(r.head.status, 200, "[{}] {method}: {r:?}", self.label);
        serde_json::from_slice(&r.body).unwrap_or_else(|e| {
            panic!(
                "[{}] {method}: expected a JSON body ({e}): {:?}",
                self.label,
                String::from_utf8_lossy(&r.body)
            )
        })
    }

    /// Sends a feed request and reads its head, which must open an SSE stream.
    fn subscribe(&mut self, params: Option<&str>, extensions: &str) -> Head {
        self.send(&feed_request(params, extensions));
        self.open_stream(&format!(
            "{METHOD} params {params:?} extensions {extensions:?}"
        ))
    }

    fn open_stream(&mut self, what: &str) -> Head {
        let head = self.head();
        let label = &self.label;
        assert_eq!(head.status, 200, "[{label}] {what}: {head:?}");
        assert!(
            head.header("content-type")
                .is_some_and(|c| c.starts_with("text/event-stream")),
            "[{label}] expected {what} to open an SSE stream: {head:?}"
        );
        assert!(
            head.header("transfer-encoding")
                .is_some_and(|t| t.eq_ignore_ascii_case("chunked")),
            "[{label}] expected {what} to stream chunked on HTTP/1.1: {head:?}"
        );
        assert!(
            head.header("content-length").is_none(),
            "[{label}] {what}: {head:?}"
        );
        self.streaming = true;
        self.sse.clear();
        head
    }

    /// The next frame, the end of the stream, or EOF.
    fn next(&mut self) -> Next {
        loop {
            if let Some(i) = self.sse.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.sse.drain(..i + 2).collect();
                let block = String::from_utf8(block).expect("SSE text is UTF-8");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(d) = line.strip_prefix("data:") {
                        if !data.is_empty() {
                            data.push('\n');
                        }
                        data.push_str(d.strip_prefix(' ').unwrap_or(d));
                    } else {
                        assert!(
                            line.is_empty() || line.starts_with(':'),
                            "[{}] unexpected SSE line {line:?}",
                            self.label
                        );
                    }
                }
                if data.is_empty() {
                    continue; // a comment (keep-alive)
                }
                return Next::Frame(self.parse_frame(&data));
            }
            if !self.streaming {
                assert!(
                    self.sse.is_empty(),
                    "[{}] the stream ended inside an SSE event: {:?}",
                    self.label,
                    String::from_utf8_lossy(&self.sse)
                );
                return Next::End;
            }
            match self.chunk() {
                Some(Some(data)) => self.sse.extend_from_slice(&data),
                Some(None) => self.streaming = false,
                None => {
                    self.streaming = false;
                    return Next::Eof;
                }
            }
        }
    }

    fn parse_frame(&self, data: &str) -> Frame {
        let label = &self.label;
        let doc: Value = serde_json::from_str(data)
            .unwrap_or_else(|e| panic!("[{label}] SSE data is not JSON ({e}): {data:?}"));
        assert_eq!(doc["jsonrpc"], "2.0", "[{label}] {doc}");
        assert_eq!(
            doc["id"], FEED_ID,
            "[{label}] every frame carries the request id: {doc}"
        );
        assert!(doc.get("error").is_none(), "[{label}] {doc}");
        let result = doc["result"]
            .as_object()
            .unwrap_or_else(|| panic!("[{label}] a frame's result is an object: {doc}"));
        assert_eq!(
            result.len(),
            1,
            "[{label}] exactly one frame per result: {doc}"
        );
        let (k, v) = result.iter().next().unwrap();
        match k.as_str() {
            "hello" => Frame::Hello(v.clone()),
            "event" => Frame::Event(v.clone()),
            "goodbye" => Frame::Goodbye(v.clone()),
            other => panic!("[{label}] unknown frame {other:?}: {doc}"),
        }
    }

    fn frame(&mut self, what: &str) -> Frame {
        match self.next() {
            Next::Frame(f) => f,
            other => panic!("[{}] expected {what}, got {other:?}", self.label),
        }
    }

    fn hello(&mut self) -> Value {
        match self.frame("hello") {
            Frame::Hello(h) => h,
            other => panic!("[{}] expected hello first, got {other:?}", self.label),
        }
    }

    fn event(&mut self, what: &str) -> Value {
        match self.frame(what) {
            Frame::Event(e) => e,
            other => panic!("[{}] expected {what}, got {other:?}", self.label),
        }
    }

    /// Event frames with exactly the seqs `from..=to`, in order.
    fn events(&mut self, from: u64, to: u64) -> Vec<Value> {
        (from..=to)
            .map(|seq| {
                let e = self.event(&format!("event seq {seq}"));
                assert_eq!(
                    e["seq"].as_u64(),
                    Some(seq),
                    "[{}] expected seqs {from}..={to} in order: {e}",
                    self.label
                );
                e
            })
            .collect()
    }

    /// The `goodbye` frame, after which the chunked stream ends. Returns its member.
    fn goodbye(&mut self) -> Value {
        let g = match self.frame("goodbye") {
            Frame::Goodbye(g) => g,
            other => panic!("[{}] expected goodbye, got {other:?}", self.label),
        };
        match self.next() {
            Next::End => {}
            other => panic!(
                "[{}] expected the chunked stream to end right after goodbye, got {other:?}",
                self.label
            ),
        }
        g
    }
}

/// A feed request: `params` is raw JSON text (`None` leaves `params` out); `extensions` is
/// the `A2A-Extensions` value (empty: no such header).
fn feed_request(params: Option<&str>, extensions: &str) -> Vec<u8> {
    let body = match params {
        Some(p) => {
            format!(r#"{{"jsonrpc":"2.0","id":{FEED_ID},"method":"{METHOD}","params":{p}}}"#)
        }
        None => format!(r#"{{"jsonrpc":"2.0","id":{FEED_ID},"method":"{METHOD}"}}"#),
    };
    let ext = format!("A2A-Extensions: {extensions}");
    let mut headers = common::RPC_HEADERS.to_vec();
    if !extensions.is_empty() {
        headers.push(&ext);
    }
    common::post(&headers, body.as_bytes())
}

fn from_seq(n: u64) -> String {
    format!(r#"{{"fromSeq":{n}}}"#)
}

fn hello_doc(resume: u64, resync: bool, seq: u64) -> Value {
    json!({
        "introspection": false,
        "resume": resume,
        "resync": resync,
        "seq": seq,
        "version": env!("CARGO_PKG_VERSION"),
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `n` SendMessages with a text part on one fresh connection: each makes a task that goes
/// SUBMITTED then REJECTED (no agent is configured), so two `task` events. Returns the ids.
fn create_tasks(d: &FeedDaemon, via: Via, n: usize, tag: &str) -> Vec<String> {
    create_tasks_with(d, via, n, tag, "hello")
}

fn create_tasks_with(d: &FeedDaemon, via: Via, n: usize, tag: &str, text: &str) -> Vec<String> {
    let mut c = d.connect(via);
    (0..n)
        .map(|i| {
            let doc = c.rpc(
                "SendMessage",
                common::text_message(&format!("{tag}-{i}"), text),
            );
            let task = &doc["result"]["task"];
            assert_eq!(
                task["status"]["state"], "TASK_STATE_REJECTED",
                "[{} {via:?}] a conversation turn without an agent is rejected at once: {doc}",
                d.driver
            );
            task["id"].as_str().expect("a task id").to_owned()
        })
        .collect()
}

/// Checks a `task` event: its seq, time, task and state, and whether annotations ride along.
fn check_task_event(ev: &Value, seq: u64, task_id: &str, state: &str, annotated: bool, since: u64) {
    assert_eq!(ev["kind"], "task", "{ev}");
    assert_eq!(ev["seq"].as_u64(), Some(seq), "{ev}");
    let ts = ev["ts"]
        .as_u64()
        .unwrap_or_else(|| panic!("ts is epoch ms: {ev}"));
    assert!(
        ts + 1000 >= since && ts <= now_ms() + 1000,
        "ts {ts} is an epoch-ms time of this test (since {since}): {ev}"
    );
    let obj = ev.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["data", "kind", "seq", "ts"], "{ev}");
    let task = &ev["data"]["task"];
    assert_eq!(
        task["id"], task_id,
        "event {seq} is about task {task_id}: {ev}"
    );
    assert_eq!(task["status"]["state"], state, "event {seq}: {ev}");
    assert!(task["contextId"].is_string(), "{ev}");
    let ann = &task["metadata"][ANNOTATIONS_URI];
    if annotated {
        assert!(ann.is_object(), "expected annotations on event {seq}: {ev}");
        assert_eq!(ann["link"]["kind"], "turn", "{ev}");
        assert_eq!(ann["link"]["id"], task_id, "{ev}");
        let history = ann["statusHistory"].as_array().expect("statusHistory");
        assert_eq!(
            history.last().map(|h| &h["state"]),
            Some(&json!(state)),
            "the status history ends in the event's state: {ev}"
        );
    } else {
        assert!(
            task.get("metadata").is_none(),
            "expected no metadata without the task-annotations extension: {ev}"
        );
    }
}

/// The `(seq, task id, state)` of task events, to compare what subscribers saw.
fn digest(events: &[Value]) -> Vec<(u64, String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["data"]["task"]["id"].as_str().unwrap_or("").to_owned(),
                e["data"]["task"]["status"]["state"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect()
}

macro_rules! both_drivers {
    ($check:ident ( $($arg:expr),* ) => $smol:ident, $std:ident) => {
        #[test]
        fn $smol() {
            $check("smol" $(, $arg)*)
        }
        #[test]
        fn $std() {
            $check("std" $(, $arg)*)
        }
    };
}

// ---------------------------------------------------------------------------------------
// 1. hello, replay, live events, the deadline goodbye, and keep-alive afterwards.

fn hello_replay_live(driver: &str, via: Via) {
    let mut d = FeedDaemon::start(driver, RING, DEADLINE_MS);
    let since = now_ms();
    let before = create_tasks(&d, via, 2, "before");

    let mut c = d.connect(via);
    let opened = Instant::now();
    let head = c.subscribe(Some(&from_seq(0)), EVENTS_URI);
    assert_eq!(
        head.header("a2a-extensions"),
        Some(EVENTS_URI),
        "[{driver} {via:?}] the answer echoes the events URI: {head:?}"
    );
    assert_eq!(
        c.hello(),
        hello_doc(0, false, 4),
        "[{driver} {via:?}] hello"
    );
    let replay = c.events(1, 4);
    check_task_event(
        &replay[0],
        1,
        &before[0],
        "TASK_STATE_SUBMITTED",
        false,
        since,
    );
    check_task_event(
        &replay[1],
        2,
        &before[0],
        "TASK_STATE_REJECTED",
        false,
        since,
    );
    check_task_event(
        &replay[2],
        3,
        &before[1],
        "TASK_STATE_SUBMITTED",
        false,
        since,
    );
    check_task_event(
        &replay[3],
        4,
        &before[1],
        "TASK_STATE_REJECTED",
        false,
        since,
    );

    // Live: a task made on another connection while this stream is open.
    let live = create_tasks(&d, via, 1, "live");
    let live_events = c.events(5, 6);
    check_task_event(
        &live_events[0],
        5,
        &live[0],
        "TASK_STATE_SUBMITTED",
        false,
        since,
    );
    check_task_event(
        &live_events[1],
        6,
        &live[0],
        "TASK_STATE_REJECTED",
        false,
        since,
    );

    // Nothing more happens: the deadline ends the stream with goodbye at the last seq read.
    let goodbye = c.goodbye();
    let elapsed = opened.elapsed();
    assert_eq!(
        goodbye,
        json!({"reason": "deadline", "seq": 6}),
        "[{driver} {via:?}] goodbye"
    );
    assert!(
        elapsed >= Duration::from_millis(DEADLINE_MS - 100)
            && elapsed < Duration::from_millis(DEADLINE_MS + 3000),
        "[{driver} {via:?}] goodbye came after {elapsed:?}, the deadline is {DEADLINE_MS} ms"
    );

    // Keep-alive: the same connection takes another request.
    let doc = c.rpc("GetTask", json!({"id": live[0]}));
    assert_eq!(
        doc["result"]["id"], live[0],
        "[{driver} {via:?}] GetTask after the feed on the same connection: {doc}"
    );
    d.assert_alive();
}

both_drivers!(hello_replay_live(Via::Tcp) => hello_replay_live_smol_tcp, hello_replay_live_std_tcp);
both_drivers!(hello_replay_live(Via::Unix) => hello_replay_live_smol_unix, hello_replay_live_std_unix);

// ---------------------------------------------------------------------------------------
// 2. Reconnecting from goodbye's seq: no resync, only newer events. The first stream also
// has a request pipelined behind it, answered once the stream ends.

fn reconnect_from_goodbye(driver: &str, via: Via) {
    let mut d = FeedDaemon::start(driver, RING, DEADLINE_MS);
    let since = now_ms();
    let first = create_tasks(&d, via, 1, "first");

    let mut c = d.connect(via);
    let mut bytes = feed_request(Some(&from_seq(0)), EVENTS_URI);
    bytes.extend_from_slice(&common::get(common::CARD, &[]));
    c.send(&bytes);
    c.open_stream("a feed request with a GET pipelined behind it");
    assert_eq!(c.hello(), hello_doc(0, false, 2));
    c.events(1, 2);
    let goodbye = c.goodbye();
    assert_eq!(goodbye, json!({"reason": "deadline", "seq": 2}));
    let card = c.plain();
    assert_eq!(
        card.head.status, 200,
        "[{driver} {via:?}] the GET pipelined behind the feed is answered after it: {card:?}"
    );
    let card: Value = serde_json::from_slice(&card.body).expect("the card is JSON");
    assert!(card["name"].is_string(), "{card}");

    let second = create_tasks(&d, via, 1, "second");
    let cursor = goodbye["seq"].as_u64().unwrap();
    let mut c = d.connect(via);
    c.subscribe(Some(&from_seq(cursor)), EVENTS_URI);
    assert_eq!(
        c.hello(),
        hello_doc(cursor, false, 4),
        "[{driver} {via:?}] a cursor from goodbye is honoured"
    );
    let newer = c.events(3, 4);
    check_task_event(
        &newer[0],
        3,
        &second[0],
        "TASK_STATE_SUBMITTED",
        false,
        since,
    );
    check_task_event(
        &newer[1],
        4,
        &second[0],
        "TASK_STATE_REJECTED",
        false,
        since,
    );
    assert_ne!(first[0], second[0]);
    // And it stays live.
    let third = create_tasks(&d, via, 1, "third");
    let live = c.events(5, 6);
    check_task_event(&live[1], 6, &third[0], "TASK_STATE_REJECTED", false, since);
    d.assert_alive();
}

both_drivers!(reconnect_from_goodbye(Via::Unix) => reconnect_from_goodbye_smol_unix, reconnect_from_goodbye_std_unix);
both_drivers!(reconnect_from_goodbye(Via::Tcp) => reconnect_from_goodbye_smol_tcp, reconnect_from_goodbye_std_tcp);

// ---------------------------------------------------------------------------------------
// 3. Ring overflow: a cursor whose next event left the ring gets resync and the replay
// starts at the oldest event held; "from the start" never resyncs.

fn ring_overflow(driver: &str) {
    let mut d = FeedDaemon::start(driver, RING, DEADLINE_MS);
    let since = now_ms();
    let ids = create_tasks(&d, Via::Tcp, 6, "overflow"); // 12 events; the ring holds 5..=12
    let subscribe = |params: Option<&str>| {
        let mut c = d.connect(Via::Tcp);
        c.subscribe(params, EVENTS_URI);
        let hello = c.hello();
        (c, hello)
    };

    let (mut c, hello) = subscribe(Some(&from_seq(2)));
    assert_eq!(
        hello,
        hello_doc(2, true, 12),
        "[{driver}] events 3 and 4 left the ring: resync"
    );
    let replay = c.events(5, 12);
    for (i, ev) in replay.iter().enumerate() {
        let seq = 5 + i as u64;
        let state = if seq % 2 == 1 {
            "TASK_STATE_SUBMITTED"
        } else {
            "TASK_STATE_REJECTED"
        };
        check_task_event(ev, seq, &ids[(seq as usize - 1) / 2], state, false, since);
    }

    // The next event of cursor 4 is 5, still held: honoured.
    let (mut c, hello) = subscribe(Some(&from_seq(4)));
    assert_eq!(hello, hello_doc(4, false, 12), "[{driver}] cursor 4");
    c.events(5, 12);

    // From the start, however asked: never resync, the replay is what the ring holds.
    for params in [
        Some(from_seq(0)),
        None,
        Some("null".to_owned()),
        Some("{}".to_owned()),
        Some(r#"{"fromSeq":null}"#.to_owned()),
    ] {
        let (mut c, hello) = subscribe(params.as_deref());
        assert_eq!(
            hello,
            hello_doc(0, false, 12),
            "[{driver}] params {params:?}"
        );
        c.events(5, 12);
    }

    // Up to date: nothing replayed, the next events are live.
    let (mut c, hello) = subscribe(Some(&from_seq(12)));
    assert_eq!(hello, hello_doc(12, false, 12), "[{driver}] cursor 12");
    let live = create_tasks(&d, Via::Tcp, 1, "after");
    let ev = c.events(13, 14);
    check_task_event(&ev[1], 14, &live[0], "TASK_STATE_REJECTED", false, since);

    // Ahead of the feed: resync, from the oldest held (now 7).
    let (mut c, hello) = subscribe(Some(&from_seq(15)));
    assert_eq!(
        hello,
        hello_doc(15, true, 14),
        "[{driver}] cursor 15 is ahead"
    );
    c.events(7, 14);
    d.assert_alive();
}

both_drivers!(ring_overflow() => ring_overflow_smol, ring_overflow_std);

// ---------------------------------------------------------------------------------------
// 4. A restart: the feed is in memory, so an old cursor is ahead of the new feed.

fn restart_forces_resync(driver: &str) {
    let mut old = FeedDaemon::start(driver, RING, DEADLINE_MS);
    create_tasks(&old, Via::Tcp, 2, "old");
    let mut c = old.connect(Via::Tcp);
    c.subscribe(Some(&from_seq(0)), EVENTS_URI);
    assert_eq!(c.hello(), hello_doc(0, false, 4));
    let read = c.events(1, 4);
    let cursor = read.last().unwrap()["seq"].as_u64().unwrap();
    old.assert_alive();
    old.kill();
    // The open stream ends with the process: no goodbye, the connection just closes.
    match c.next() {
        Next::Eof => {}
        other => panic!("[{driver}] expected the killed daemon's stream to close, got {other:?}"),
    }
    drop(old);

    let mut new = FeedDaemon::start(driver, RING, DEADLINE_MS);
    let since = now_ms();
    let fresh = create_tasks(&new, Via::Tcp, 1, "new");
    let mut c = new.connect(Via::Tcp);
    c.subscribe(Some(&from_seq(cursor)), EVENTS_URI);
    assert_eq!(
        c.hello(),
        hello_doc(cursor, true, 2),
        "[{driver}] cursor {cursor} from before the restart is ahead of the new feed"
    );
    let replay = c.events(1, 2);
    check_task_event(
        &replay[0],
        1,
        &fresh[0],
        "TASK_STATE_SUBMITTED",
        false,
        since,
    );
    check_task_event(
        &replay[1],
        2,
        &fresh[0],
        "TASK_STATE_REJECTED",
        false,
        since,
    );

    // The new feed's own cursor is honoured.
    let mut c = new.connect(Via::Unix);
    c.subscribe(Some(&from_seq(2)), EVENTS_URI);
    assert_eq!(c.hello(), hello_doc(2, false, 2));
    new.assert_alive();
}

both_drivers!(restart_forces_resync() => restart_forces_resync_smol, restart_forces_resync_std);

// ---------------------------------------------------------------------------------------
// 5. Task annotations ride along only when the request activates them.

fn annotations_only_when_activated(driver: &str) {
    let mut d = FeedDaemon::start(driver, RING, DEADLINE_MS);
    let since = now_ms();
    let first = create_tasks(&d, Via::Tcp, 1, "ann");

    let both = format!("{EVENTS_URI}, {ANNOTATIONS_URI}");
    let reversed = format!("{ANNOTATIONS_URI},{EVENTS_URI}");
    let mut annotated = Vec::new();
    for ext in [&both, &reversed] {
        let mut c = d.connect(Via::Tcp);
        let head = c.subscribe(Some(&from_seq(0)), ext);
        assert_eq!(
            head.header("a2a-extensions"),
            Some(both.as_str()),
            "[{driver}] the echo names both, in registry order: {head:?}"
        );
        assert_eq!(c.hello(), hello_doc(0, false, 2));
        let ev = c.events(1, 2);
        check_task_event(&ev[0], 1, &first[0], "TASK_STATE_SUBMITTED", true, since);
        check_task_event(&ev[1], 2, &first[0], "TASK_STATE_REJECTED", true, since);
        let hist = ev[1]["data"]["task"]["metadata"][ANNOTATIONS_URI]["statusHistory"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["state"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>();
        assert_eq!(
            hist,
            ["TASK_STATE_SUBMITTED", "TASK_STATE_REJECTED"],
            "[{driver}]"
        );
        annotated.push(c);
    }

    let mut plain = d.connect(Via::Unix);
    let head = plain.subscribe(Some(&from_seq(0)), EVENTS_URI);
    assert_eq!(head.header("a2a-extensions"), Some(EVENTS_URI));
    plain.hello();
    let ev = plain.events(1, 2);
    check_task_event(&ev[0], 1, &first[0], "TASK_STATE_SUBMITTED", false, since);
    check_task_event(&ev[1], 2, &first[0], "TASK_STATE_REJECTED", false, since);

    // Live events too: each subscriber gets its own rendering of the same events.
    let live = create_tasks(&d, Via::Tcp, 1, "ann-live");
    for c in &mut annotated {
        let ev = c.events(3, 4);
        check_task_event(&ev[0], 3, &live[0], "TASK_STATE_SUBMITTED", true, since);
        check_task_event(&ev[1], 4, &live[0], "TASK_STATE_REJECTED", true, since);
    }
    let ev = plain.events(3, 4);
    check_task_event(&ev[0], 3, &live[0], "TASK_STATE_SUBMITTED", false, since);
    check_task_event(&ev[1], 4, &live[0], "TASK_STATE_REJECTED", false, since);
    d.assert_alive();
}

both_drivers!(annotations_only_when_activated() => annotations_only_when_activated_smol, annotations_only_when_activated_std);

// ---------------------------------------------------------------------------------------
// 6. Refusals: plain JSON at 200, never a stream, and the connection stays usable.

/// Sends a feed request that must be refused; returns the `error` member.
fn refused(c: &mut Conn, params: Option<&str>, extensions: &str, code: i64) -> Value {
    let what = format!("params {params:?} extensions {extensions:?}");
    c.send(&feed_request(params, extensions));
    let r = c.plain();
    let label = &c.label;
    assert_eq!(r.head.status, 200, "[{label}] {what}: {r:?}");
    assert_eq!(
        r.head.header("content-type"),
        Some("application/json"),
        "[{label}] a refusal is plain JSON, no SSE: {what}: {r:?}"
    );
    assert!(
        !r.chunked,
        "[{label}] a refusal is not streamed: {what}: {r:?}"
    );
    assert!(
        r.head.header("a2a-extensions").is_none(),
        "[{label}] a refused request echoes nothing: {what}: {r:?}"
    );
    let doc: Value = serde_json::from_slice(&r.body).expect("a JSON body");
    assert_eq!(doc["jsonrpc"], "2.0", "{doc}");
    assert_eq!(doc["id"], FEED_ID, "{doc}");
    assert!(doc.get("result").is_none(), "[{label}] {what}: {doc}");
    assert_eq!(
        doc["error"]["code"].as_i64(),
        Some(code),
        "[{label}] {what}: {doc}"
    );
    doc["error"].clone()
}

fn detail<'a>(err: &'a Value, ty: &str) -> &'a Value {
    let full = format!("type.googleapis.com/google.rpc.{ty}");
    err["data"]
        .as_array()
        .and_then(|d| d.iter().find(|x| x["@type"] == full.as_str()))
        .unwrap_or_else(|| panic!("expected a {ty} detail: {err}"))
}

fn bad_field(err: &Value) -> String {
    let v = &detail(err, "BadRequest")["fieldViolations"];
    assert_eq!(v.as_array().map(Vec::len), Some(1), "one violation: {err}");
    v[0]["field"].as_str().unwrap_or("").to_owned()
}

fn refusals(driver: &str) {
    let mut d = FeedDaemon::start(driver, RING, DEADLINE_MS);
    create_tasks(&d, Via::Tcp, 1, "refusals");
    let mut c = d.connect(Via::Tcp);

    // Params other than fromSeq.
    for (params, field) in [
        (r#"{"fromSeq":0,"cursor":1}"#, "params.cursor"),
        (r#"{"from":1}"#, "params.from"),
        (r#"{"fromSeq":1,"FromSeq":1}"#, "params.FromSeq"),
        ("[0]", "params"),
        ("3", "params"),
        (r#""x""#, "params"),
    ] {
        let err = refused(&mut c, Some(params), EVENTS_URI, -32602);
        assert_eq!(bad_field(&err), field, "[{driver}] params {params}: {err}");
    }
    // A fromSeq that is not a u64.
    for bad in [
        "-1",
        "2.0",
        "1.5",
        r#""3""#,
        "true",
        "[]",
        "{}",
        "18446744073709551616",
        "1e3",
    ] {
        let params = format!(r#"{{"fromSeq":{bad}}}"#);
        let err = refused(&mut c, Some(&params), EVENTS_URI, -32602);
        assert_eq!(
            bad_field(&err),
            "params.fromSeq",
            "[{driver}] fromSeq {bad}: {err}"
        );
    }

    // The events URI not activated.
    for ext in [
        "",
        ANNOTATIONS_URI,
        "https://agentd.dev/a2a/ext/command",
        "https://agentd.dev/a2a/ext/events/",
        "HTTPS://AGENTD.DEV/A2A/EXT/EVENTS",
    ] {
        let err = refused(&mut c, Some(&from_seq(0)), ext, -32601);
        let info = detail(&err, "ErrorInfo");
        assert_eq!(
            info["reason"], "EXTENSION_NOT_ACTIVATED",
            "[{driver}] {ext:?}: {err}"
        );
        assert_eq!(info["domain"], "agentd.dev", "{err}");
        assert_eq!(info["metadata"]["extension"], EVENTS_URI, "{err}");
        assert_eq!(info["metadata"]["method"], METHOD, "{err}");
    }

    // After all that, the same connection still serves, the feed included.
    let doc = c.rpc("ListTasks", json!({}));
    assert!(
        doc["result"].is_object(),
        "[{driver}] ListTasks after refusals: {doc}"
    );
    c.subscribe(Some(&from_seq(0)), EVENTS_URI);
    assert_eq!(c.hello(), hello_doc(0, false, 2));
    d.assert_alive();

    // An instance without [a2a.events] does not declare the extension.
    let plain = common::Daemon::start(driver);
    for via in Via::ALL {
        let c = plain.connect(via);
        let mut c = Conn::new(c.stream, format!("{driver} {via:?} events off"));
        for ext in [EVENTS_URI, "", &format!("{EVENTS_URI}, {ANNOTATIONS_URI}")] {
            let err = refused(&mut c, Some(&from_seq(0)), ext, -32601);
            let info = detail(&err, "ErrorInfo");
            assert_eq!(
                info["reason"], "EXTENSION_NOT_DECLARED",
                "[{driver}] {ext:?}: {err}"
            );
            assert_eq!(info["domain"], "agentd.dev", "{err}");
            assert_eq!(info["metadata"]["extension"], EVENTS_URI, "{err}");
        }
        let doc = c.rpc("ListTasks", json!({}));
        assert!(doc["result"].is_object(), "{doc}");
    }
}

both_drivers!(refusals() => refusals_smol, refusals_std);

// ---------------------------------------------------------------------------------------
// 7. Twenty subscribers at once get the same events in the same order.

fn many_subscribers(driver: &str) {
    const N: usize = 20;
    let mut d = FeedDaemon::start(driver, RING, DEADLINE_MS);
    create_tasks(&d, Via::Tcp, 1, "many-before");
    let mut subs: Vec<Conn> = (0..N)
        .map(|i| {
            let via = if i % 2 == 0 { Via::Tcp } else { Via::Unix };
            let mut c = d.connect(via);
            c.label = format!("{driver} {via:?} subscriber {i}");
            c.subscribe(Some(&from_seq(0)), EVENTS_URI);
            c
        })
        .collect();
    // Every subscriber is open (its hello read) before anything live happens.
    let mut seen: Vec<Vec<Value>> = Vec::new();
    for c in &mut subs {
        assert_eq!(c.hello(), hello_doc(0, false, 2), "[{}]", c.label);
        seen.push(c.events(1, 2));
    }
    create_tasks(&d, Via::Tcp, 1, "many-live-a");
    create_tasks(&d, Via::Unix, 1, "many-live-b");

    let readers: Vec<_> = subs
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || {
                let mut events = Vec::new();
                let goodbye = loop {
                    match c.frame("an event or goodbye") {
                        Frame::Event(e) => events.push(e),
                        Frame::Goodbye(g) => break g,
                        Frame::Hello(h) => panic!("[{}] a second hello: {h}", c.label),
                    }
                    assert!(events.len() <= 10, "[{}] too many events", c.label);
                };
                assert!(
                    matches!(c.next(), Next::End),
                    "[{}] ends after goodbye",
                    c.label
                );
                (c.label.clone(), events, goodbye)
            })
        })
        .collect();
    let mut reference: Option<Vec<(u64, String, String)>> = None;
    for (i, r) in readers.into_iter().enumerate() {
        let (label, live, goodbye) = match r.join() {
            Ok(x) => x,
            Err(p) => std::panic::resume_unwind(p),
        };
        let mut all = std::mem::take(&mut seen[i]);
        all.extend(live);
        let got = digest(&all);
        let seqs: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "[{label}] seqs");
        assert_eq!(
            goodbye,
            json!({"reason": "deadline", "seq": 6}),
            "[{label}]"
        );
        match &reference {
            None => reference = Some(got),
            Some(r) => assert_eq!(&got, r, "[{label}] the same events as subscriber 0"),
        }
    }
    d.assert_alive();
}

both_drivers!(many_subscribers() => many_subscribers_smol, many_subscribers_std);

// ---------------------------------------------------------------------------------------
// 8. A subscriber too slow for the ring is cut off without goodbye; its reconnect from the
// last seq it read gets resync. Over the unix socket, whose buffering is bounded and small.

fn slow_subscriber_is_cut_off(driver: &str) {
    // A long deadline: the stream must end because the reader fell behind, not by time.
    let mut d = FeedDaemon::start(driver, RING, 20_000);
    let mut slow = d.connect(Via::Unix);
    slow.subscribe(Some(&from_seq(0)), EVENTS_URI);
    assert_eq!(slow.hello(), hello_doc(0, false, 0));

    // Not reading: each event carries a ~16 KiB message (a task event keeps up to 32 KiB of
    // history; a bigger message would be cut from it), so 128 events are far more than the
    // socket buffer, the connection's output bound (256 KiB) and the ring (8) hold together.
    const MESSAGES: usize = 64;
    let big = "x".repeat(16 * 1024);
    create_tasks_with(&d, Via::Unix, MESSAGES, "big", &big);
    let total = 2 * MESSAGES as u64;

    let mut last = 0;
    loop {
        match slow.next() {
            Next::Frame(Frame::Event(e)) => {
                let seq = e["seq"].as_u64().unwrap();
                assert_eq!(
                    seq,
                    last + 1,
                    "[{driver}] no gaps before the cut: {}",
                    e["seq"]
                );
                last = seq;
                slow.label =
                    format!("{driver} Unix slow subscriber, read seq 1..={last} of {total}");
            }
            Next::Frame(other) => {
                panic!("[{driver}] expected the slow stream to end without goodbye, got {other:?}")
            }
            Next::End => break,
            Next::Eof => panic!(
                "[{driver}] the slow subscriber's connection closed instead of its stream ending"
            ),
        }
        assert!(last <= total);
    }
    assert!(
        last < total - RING as u64,
        "[{driver}] expected the slow subscriber to be cut off, it read {last} of {total}"
    );

    // Reconnect on the same (kept-alive) connection from the last seq read: resync.
    slow.subscribe(Some(&from_seq(last)), EVENTS_URI);
    assert_eq!(
        slow.hello(),
        hello_doc(last, true, total),
        "[{driver}] the cut-off subscriber's reconnect"
    );
    slow.events(total - RING as u64 + 1, total);
    d.assert_alive();
}

both_drivers!(slow_subscriber_is_cut_off() => slow_subscriber_is_cut_off_smol, slow_subscriber_is_cut_off_std);

// ---------------------------------------------------------------------------------------
// 9. The largest cursor: ahead of any feed, so resync, on a ring that has dropped events.

fn largest_cursor_is_a_resync(driver: &str) {
    let mut d = FeedDaemon::start(driver, RING, DEADLINE_MS);
    create_tasks(&d, Via::Tcp, 5, "max"); // 10 events: the ring has dropped 2
    let mut c = d.connect(Via::Tcp);
    c.send(&feed_request(Some(&from_seq(u64::MAX)), EVENTS_URI));
    if c.fill("the answer to fromSeq u64::MAX") == 0 {
        let stderr = d.stderr();
        let panic = stderr
            .lines()
            .skip_while(|l| !l.contains("panicked"))
            .take(2)
            .collect::<Vec<_>>()
            .join("\n");
        panic!(
            "[{driver}] expected fromSeq {} (a valid u64) on a ring that dropped events to be \
             answered with resync; the daemon closed the connection without an answer. Its \
             stderr says:\n{panic}",
            u64::MAX
        );
    }
    c.open_stream("fromSeq u64::MAX");
    assert_eq!(c.hello(), hello_doc(u64::MAX, true, 10), "[{driver}]");
    c.events(3, 10);
    // The daemon still serves feeds.
    let mut c = d.connect(Via::Tcp);
    c.subscribe(Some(&from_seq(10)), EVENTS_URI);
    assert_eq!(c.hello(), hello_doc(10, false, 10));
    d.assert_alive();
}

both_drivers!(largest_cursor_is_a_resync() => largest_cursor_is_a_resync_smol, largest_cursor_is_a_resync_std);

// ---------------------------------------------------------------------------------------
// 10. A conversation turn with an agent: its conversation is an event at the turn and at
// the reply, beside the task's own events.

fn a_turn_is_a_conversation_event(driver: &str) {
    let echo = format!(
        "{}/examples/agents/echo_agent.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let setup = Setup {
        sections: format!(
            "[a2a.events]\nenabled = true\nring = 64\nstream_deadline_ms = {DEADLINE_MS}\n\
             [agent]\ncommand = [\"python3\", {echo:?}]\n"
        ),
        ..Setup::default()
    };
    let mut d = FeedDaemon(common::Daemon::start_setup(driver, &setup));
    let mut c = d.connect(Via::Tcp);
    let doc = c.rpc("SendMessage", common::text_message("conv-1", "hello"));
    let task = &doc["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "[{driver}] {doc}"
    );
    let context = task["contextId"].as_str().expect("a context id");
    let mut f = d.connect(Via::Tcp);
    f.subscribe(Some(&from_seq(0)), EVENTS_URI);
    let newest = f.hello()["seq"].as_u64().expect("hello's seq");
    let conversations: Vec<Value> = f
        .events(1, newest)
        .into_iter()
        .filter(|e| e["kind"] == "conversation")
        .collect();
    let seen: Vec<(&Value, &Value, &Value)> = conversations
        .iter()
        .map(|e| {
            (
                &e["data"]["contextId"],
                &e["data"]["version"],
                &e["data"]["turns"],
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (&json!(context), &json!(1), &json!(1)),
            (&json!(context), &json!(2), &json!(1))
        ],
        "[{driver}] the turn, then the reply: {conversations:?}"
    );
    d.assert_alive();
}

both_drivers!(a_turn_is_a_conversation_event() => a_turn_is_a_conversation_event_smol, a_turn_is_a_conversation_event_std);

/// bench/events_reader.rs, the events benchmark's subscriber client, compiled as run.sh
/// compiles it and run against a real feed: it counts what the feed sent (every seq, in
/// order, none missing, none cut off or lagging). A benchmark whose client miscounts would
/// report wrongly whether the daemon keeps up.
#[test]
fn bench_events_reader_counts_what_the_feed_sent() {
    let dir = common::TempDir::new("events-reader");
    let bin = dir.path().join("events_reader");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/events_reader.rs");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let built = std::process::Command::new(rustc)
        .args(["-O", "--edition", "2021", src, "-o"])
        .arg(&bin)
        .output()
        .expect("rustc runs");
    assert!(
        built.status.success(),
        "bench/events_reader.rs compiles: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    // A ring of 1024 holds all 40 events, so every subscriber is owed every seq.
    let mut d = FeedDaemon::start("smol", 1024, 60_000);
    let (ready, stop, out) = (
        dir.path().join("ready"),
        dir.path().join("stop"),
        dir.path().join("out"),
    );
    let reader = std::process::Command::new(&bin)
        .args(["--port", &d.tcp.port().to_string(), "--subs", "3"])
        .arg("--ready-file")
        .arg(&ready)
        .arg("--stop-file")
        .arg(&stop)
        .arg("--out")
        .arg(&out)
        .args(["--drain", "10", "--max-seconds", "30"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the reader starts");
    // Killed and reaped however the test ends (it also bounds itself: --max-seconds).
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut reader = Reaped(reader);
    let until = Instant::now() + Duration::from_secs(15);
    while !ready.exists() {
        assert!(Instant::now() < until, "the reader's subscribers say hello");
        std::thread::sleep(Duration::from_millis(20));
    }
    create_tasks(&d, Via::Tcp, 20, "bench");
    std::fs::write(&stop, "").unwrap();
    let status = reader.0.wait().expect("the reader ends");
    let line = std::fs::read_to_string(&out).expect("the reader writes its result");
    assert!(status.success(), "{line}");
    let field = |k: &str| -> String {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .to_owned()
    };
    assert_eq!(field("status"), "ok", "{line}");
    assert_eq!(field("newest"), "40", "20 tasks, 2 events each: {line}");
    assert_eq!(field("frames"), "120", "3 subscribers read 40 each: {line}");
    assert_eq!(field("complete"), "3", "{line}");
    for k in ["gaps", "dups", "cutoffs", "eofs", "lagging", "missed_tail"] {
        assert_eq!(field(k), "0", "{k}: {line}");
    }
    d.assert_alive();
}
