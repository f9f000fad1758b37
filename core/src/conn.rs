//! One connection's state machine: bytes in, bytes out, timers. The same machine serves
//! TCP and unix sockets; the driver says what the transport proved (who the peer is) and
//! moves bytes:
//!
//! 1. [`Connection::handle_input`] with what it read (only while [`Connection::wants_read`]);
//! 2. write [`Connection::pending_output`], then [`Connection::consume_output`];
//! 3. when the connection's waker fires (a task it watches changed), [`Connection::poll`];
//! 4. at [`Connection::poll_timeout`], [`Connection::handle_timeout`];
//! 5. once [`Connection::is_finished`], close the socket and call [`Connection::close`].
//!
//! What needs the instance and what does not are separate calls, for a driver that shares
//! the instance behind a lock: [`Connection::receive`] (TLS, and the HTTP parser reading the
//! next request ahead), [`Connection::produce`] (framing the answer decided, a large
//! answer's slices, TLS) and the output calls take no instance; only
//! [`Connection::serve`], which decides the answers, does. `handle_input` and `poll` are
//! `receive`, `serve` and `produce` together.
//!
//! Responses leave in request order. While one is pending (a blocking send waiting for its
//! task, or an open stream) later pipelined requests wait in the parser's buffer.
//!
//! Write-ahead: an answer that acknowledges a change (a task created, canceled or settled,
//! a session opened) is written into the output buffer at once but *held*: the driver sees
//! only the bytes before it until the instance reports the change durable
//! ([`Instance::records_durable`]), which wakes the connection. Later output queues behind a
//! hold, so the order stays the request order. Reads change nothing and hold nothing.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Waker;

use crate::a2a::piecewise::TaskJson;
use crate::a2a::types::StreamResponse;
use crate::auth::{Peer, Principal, Unauthenticated};
use crate::errors::{ErrorKind, RpcError};
use crate::ext::negotiate::ExtSet;
use crate::http::response::{self, Head};
use crate::http::{Event, HttpError, Method, RequestHead, RequestParser};
use crate::instance::{CachedCard, ConnLimits, Instance, SubId};
use crate::instance::{CallId, CallOutcome, CommandAnswer};
use crate::jsonrpc::{self, RequestId};
use crate::ready::ConnKey;
use crate::reqlog::{self, Dropped, Keep, Label, Limiter, Phase, Refusal, RequestRecord};
use crate::rpc::{self, CallContext, Reply};
use crate::time::{http_date, Now};

/// The JSON-RPC endpoint.
pub const RPC_PATH: &str = "/";
/// The public agent card.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

const RPC_ALLOW: &str = "POST, OPTIONS";
const CARD_ALLOW: &str = "GET, HEAD, OPTIONS";
/// `OPTIONS *`: what the server as a whole answers.
const SERVER_ALLOW: &str = "GET, HEAD, POST, OPTIONS";

/// Where a request head sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    Card {
        head_only: bool,
    },
    /// A device-grant endpoint (only while the grant is enabled).
    OAuth(crate::oauth::Endpoint),
    Rpc,
    Options {
        allow: &'static str,
    },
    Refuse {
        status: u16,
        allow: Option<&'static str>,
    },
}

#[derive(Debug)]
enum State {
    /// Between requests, or reading one whose head has been routed.
    Reading {
        pending: Option<(RequestHead, Route)>,
    },
    /// A blocking SendMessage waits for its task to reach a terminal or interrupted state.
    Waiting {
        sub: SubId,
        id: RequestId,
        task_id: String,
        history: Option<usize>,
        deadline: u64,
        keep_alive: bool,
        minor_version: u8,
        annotate: bool,
        activated: ExtSet,
    },
    /// An SSE stream is open; without a subscription its first frame was the whole stream.
    Streaming {
        sub: Option<SubId>,
        /// The task whose events these are: frames carry SSE ids. None: a message reply.
        task_id: Option<String>,
        /// Frames of the answer not yet written (a replay), before the subscription's.
        pending: VecDeque<(u64, Arc<StreamResponse>)>,
        id: RequestId,
        chunked: bool,
        keep_alive: bool,
        last_write: u64,
    },
    /// The events feed is streaming.
    Feed {
        watcher: u64,
        /// Who reads it: decides which events it receives.
        principal: Principal,
        /// The session it reads under, if any: when it is revoked the stream ends.
        sid: Option<String>,
        id: RequestId,
        /// The last seq this subscriber has been shown or skipped.
        cursor: u64,
        chunked: bool,
        keep_alive: bool,
        deadline: u64,
        annotate: bool,
        last_write: u64,
    },
    /// A command waits for the host's answer.
    Calling {
        call: CallId,
        id: RequestId,
        streaming: bool,
        history: Option<usize>,
        deadline: u64,
        keep_alive: bool,
        minor_version: u8,
        activated: ExtSet,
        /// The record sequence when the call was made: if the host's answer comes with
        /// changes past it, the answer waits for them.
        since: u64,
    },
}

/// One HTTP/1.1 connection.
pub struct Connection {
    listener: usize,
    /// What the transport proved about the peer; each request is resolved from it.
    peer: Peer,
    /// The TCP peer's address as the failure limiter keys it (never `X-Forwarded-For`).
    /// `None` for unix peers and embedders that give none: such a connection is neither
    /// counted nor refused by the failure limiter.
    source: Option<crate::limits::Source>,
    limits: ConnLimits,
    waker: Waker,
    /// This connection in the instance's registry of wakers, once it waits on anything
    /// there (a task, a host's answer, the feed, durability).
    key: Option<ConnKey>,
    parser: RequestParser,
    out: Vec<u8>,
    out_pos: usize,
    state: State,
    /// Take no more requests; finish once the output is written.
    closing: bool,
    /// Drop the connection now, written or not (a peer that stopped reading).
    aborted: bool,
    idle_since: u64,
    head_started: Option<u64>,
    body_started: Option<u64>,
    write_stalled_since: Option<u64>,
    date: (u64, String),
    /// The browser origin of the request being answered, and whether it is served.
    cors: Cors,
    /// The TLS session of an `https://` listener (set up on the first bytes).
    tls: Option<crate::tls::TlsLayer>,
    tls_checked: bool,
    /// Bytes received before [`Connection::prepare`]: taken at the next poll.
    unprepared: Vec<u8>,
    /// The peer closed its side (a TLS close_notify): the next poll acts on it.
    peer_closed: bool,
    /// Held output, in output order (so also in sequence order).
    holds: std::collections::VecDeque<Hold>,
    /// Which requests are recorded for the driver's request log (see [`crate::reqlog`]).
    keep: Keep,
    /// The monotonic millisecond the head of the request being answered was read.
    req_started: u64,
    /// The last monotonic millisecond the driver gave: when a request abandoned at
    /// [`Connection::close`] (which takes no time) ended.
    last_mono: u64,
    /// The record of the request being answered: every request's under [`Keep::All`], only
    /// a refused one's under [`Keep::Refusals`].
    current: Option<Box<RequestRecord>>,
    /// Records the driver has not taken yet, at most [`reqlog::MAX_RECORDS`].
    records: VecDeque<Box<RequestRecord>>,
    dropped: Dropped,
    /// Bytes of large read answers this connection holds unsent, counted in the instance's
    /// pool (see [`ConnLimits::large_answers_bytes`]), and that pool, once it held any.
    large_held: usize,
    large_pool: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// An answer larger than the output bound, written as room frees. Nothing else is
    /// written (no further request is answered, no stream event) until it is complete.
    tail: Option<Tail>,
    /// An answer [`Connection::serve`] decided and [`Connection::produce`] frames: the
    /// costly part of answering (serializing a task, copying a card or a result) runs
    /// outside the instance. No further request is served until it is framed.
    deferred: Option<Deferred>,
    /// What the parser gave ahead of [`Connection::serve`], outside the instance: the next
    /// request's head, then its body (or the error that ends the connection). At most one
    /// request.
    ahead: VecDeque<Result<Event, HttpError>>,
}

/// An answer decided under the instance and not yet framed. It owns (or shares) everything
/// it needs, so framing it takes no instance.
#[derive(Debug)]
enum Deferred {
    /// A JSON-RPC result whose `result` member is already JSON (a list page, a push
    /// config, a message).
    Result {
        id: RequestId,
        result: Vec<u8>,
        keep_alive: bool,
        minor: u8,
        echo: Option<String>,
        /// It acknowledges a change: never refused for room in the large-answers pool.
        acknowledges: bool,
    },
    /// A JSON-RPC result holding one task, serialized from a snapshot that shares the
    /// store's content.
    Task(TaskAnswer),
    /// The agent card (shared with the instance), or `304` when the peer's copy is fresh.
    Card {
        card: Arc<CachedCard>,
        fresh: bool,
        head_only: bool,
        keep_alive: bool,
        minor: u8,
    },
}

/// A result holding one task, and how to answer it.
#[derive(Debug)]
struct TaskAnswer {
    json: Box<TaskJson>,
    id: RequestId,
    keep_alive: bool,
    minor: u8,
    echo: Option<String>,
    /// It acknowledges a change: always given (its request carried the change).
    acknowledges: bool,
}

/// The rest of a large answer: a task written from a snapshot that shares the store's
/// content, so the connection holds no more of it than its output bound.
#[derive(Debug)]
struct Tail {
    json: Box<TaskJson>,
    /// Each slice goes out as one HTTP chunk (an SSE frame of a chunked stream).
    chunked: bool,
    /// Framed bytes that follow the answer (a stream's end).
    then: Vec<u8>,
}

/// Everything written was sent. A buffer grown past twice the output bound (a large answer)
/// is given back rather than kept at that size for the connection's life.
fn clear_output(out: &mut Vec<u8>, bound: usize) {
    if out.capacity() > 2 * bound {
        *out = Vec::new();
    } else {
        out.clear();
    }
}

impl Drop for Connection {
    /// A connection dropped without [`Connection::close`] still gives its large-answer
    /// bytes back.
    fn drop(&mut self) {
        self.release_large(usize::MAX);
    }
}

/// Output written but held until the change it acknowledges is durable.
#[derive(Debug)]
struct Hold {
    /// Where in `out` the held bytes start.
    start: usize,
    /// The record sequence they wait for.
    seq: u64,
    /// What the peer hears instead if the store fails first.
    instead: Instead,
}

/// What a held answer becomes when the change it acknowledges cannot be made durable (the
/// host's store failed): the held bytes and everything after them are dropped, this is
/// written in their place, and the connection closes (answers pipelined behind the hold are
/// gone with it; the close tells their client so).
#[derive(Debug)]
enum Instead {
    /// A whole JSON-RPC answer, or a stream's head with its first frames: a JSON-RPC error.
    Rpc { id: RequestId, minor: u8 },
    /// A frame of a stream already open: an error event, and the stream's end.
    StreamFrame { id: RequestId, chunked: bool },
    /// A device-grant answer: 503 `temporarily_unavailable` (RFC 6749 §4.1.2.1).
    OAuth { minor: u8 },
}

/// A request's standing with CORS.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cors {
    /// No `Origin`: not a browser's cross-origin request.
    None,
    /// A listed origin: its responses name it, and expose the headers a page reads.
    Allowed {
        origin: String,
        preflight: bool,
        private_network: bool,
    },
    /// An unlisted origin: refused, and the answer varies with `Origin`.
    Refused,
}

impl Connection {
    /// A new connection on `listener` (an index into the instance's listeners) from a peer
    /// the transport identified as `peer`. `waker` is woken when the connection has output to
    /// produce without new input (a task it watches changed).
    pub fn new(listener: usize, peer: Peer, limits: ConnLimits, waker: Waker, now: Now) -> Self {
        Connection {
            listener,
            peer,
            source: None,
            limits,
            waker,
            key: None,
            parser: RequestParser::new(limits.http),
            out: Vec::new(),
            out_pos: 0,
            state: State::Reading { pending: None },
            closing: false,
            aborted: false,
            idle_since: now.mono_ms,
            head_started: None,
            body_started: None,
            write_stalled_since: None,
            date: (u64::MAX, String::new()),
            cors: Cors::None,
            tls: None,
            tls_checked: false,
            unprepared: Vec::new(),
            peer_closed: false,
            holds: std::collections::VecDeque::new(),
            keep: Keep::Off,
            req_started: now.mono_ms,
            last_mono: now.mono_ms,
            current: None,
            records: VecDeque::new(),
            dropped: Dropped::default(),
            large_held: 0,
            large_pool: None,
            tail: None,
            deferred: None,
            ahead: VecDeque::new(),
        }
    }

    /// Whether a read answer of `len` bytes may be written now. An answer within the output
    /// bound always may; a larger one (a large task) takes its bytes from the instance's
    /// pool until the peer reads them, and is refused while the pool is spent (but one is
    /// always admitted into an empty pool). A small request cannot otherwise make the
    /// daemon hold megabytes for a reader that does not read.
    fn admit_large(&mut self, len: usize) -> bool {
        use std::sync::atomic::Ordering;
        if len <= self.limits.max_output_bytes {
            return true;
        }
        let Some(pool) = self.large_pool.as_ref() else {
            // Never prepared, so never served: nothing to answer.
            return false;
        };
        let cap = self.limits.large_answers_bytes;
        let admitted = pool
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(len) <= cap).then(|| held + len)
            })
            .is_ok();
        if admitted {
            self.large_held += len;
        }
        admitted
    }

    /// The peer read `n` bytes (or they were dropped): as many large-answer bytes go back
    /// to the pool.
    fn release_large(&mut self, n: usize) {
        let r = n.min(self.large_held);
        if r > 0 {
            self.large_held -= r;
            if let Some(pool) = &self.large_pool {
                pool.fetch_sub(r, std::sync::atomic::Ordering::AcqRel);
            }
        }
    }

    /// Writes more of a large answer while the output has room.
    fn pump_tail(&mut self) {
        let bound = self.limits.max_output_bytes;
        while let Some(tail) = self.tail.as_mut() {
            let room = bound.saturating_sub(
                self.out.len() - self.out_pos + self.tls.as_ref().map_or(0, |t| t.pending().len()),
            );
            if room == 0 {
                return;
            }
            let done = if tail.chunked {
                let mut slice = Vec::with_capacity(room.min(64 * 1024) + 8);
                let done = tail.json.fill(&mut slice, room);
                if !slice.is_empty() {
                    use std::io::Write;
                    let _ = write!(self.out, "{:x}\r\n", slice.len());
                    self.out.extend_from_slice(&slice);
                    self.out.extend_from_slice(b"\r\n");
                }
                done
            } else {
                tail.json.fill(&mut self.out, room)
            };
            if done {
                let then = std::mem::take(&mut tail.then);
                self.out.extend_from_slice(&then);
                self.tail = None;
                // A head buffered behind the answer starts its clock now.
                self.head_started = None;
                // What waited behind it (pipelined requests, a stream's next events) goes
                // on at the next poll.
                self.waker.wake_by_ref();
            }
        }
    }

    /// Where bytes that must follow everything already answered go: after the large answer
    /// still being written, if there is one.
    fn out_after_tail(&mut self) -> &mut Vec<u8> {
        match self.tail.as_mut() {
            Some(t) => &mut t.then,
            None => &mut self.out,
        }
    }

    /// Which requests to keep records of for the request log (none by default). A driver
    /// that keeps any takes them with [`Connection::poll_request_record`] after each call
    /// into the connection.
    pub fn keep_records(&mut self, keep: Keep) {
        self.keep = keep;
        if keep == Keep::Off {
            self.current = None;
            self.records.clear();
        }
    }

    /// The oldest record not yet taken.
    pub fn poll_request_record(&mut self) -> Option<RequestRecord> {
        let r = self.records.pop_front().map(|b| *b);
        if self.records.is_empty() && self.records.capacity() > 4 {
            // A burst of pipelined requests leaves no large queue behind on an idle
            // connection.
            self.records = VecDeque::new();
        }
        r
    }

    /// How many records were dropped (the queue was full) since this was last asked, and
    /// resets the count.
    pub fn take_dropped_records(&mut self) -> Dropped {
        std::mem::take(&mut self.dropped)
    }

    /// The TCP peer's address, for the failure limiter (an IPv4 address, or the IPv6 /64 it
    /// is in). A driver calls it once, right after [`Connection::new`]; the unix-socket
    /// driver never does (its peers are the operator, decided by the kernel).
    pub fn set_source(&mut self, addr: std::net::IpAddr) {
        if matches!(self.peer, Peer::Tcp | Peer::Cert(_)) {
            self.source = Some(crate::limits::Source::of(addr));
        }
    }

    /// Queues a record for the driver, if it keeps that kind; counts it if the queue is
    /// full.
    fn push_record(&mut self, r: Box<RequestRecord>) {
        let wanted = match self.keep {
            Keep::Off => false,
            Keep::Refusals => r.refusal.is_some(),
            Keep::All => true,
        };
        if !wanted {
            return;
        }
        if self.records.len() >= reqlog::MAX_RECORDS {
            self.dropped.records = self.dropped.records.saturating_add(1);
            if r.refusal.is_some() {
                self.dropped.refusals = self.dropped.refusals.saturating_add(1);
            }
            return;
        }
        self.records.push_back(r);
    }

    /// The request being answered was answered `status`: its record is complete.
    fn answered(&mut self, status: u16, now: Now) {
        if let Some(mut r) = self.current.take() {
            r.status = status;
            r.phase = Phase::Answered;
            r.duration_ms = now.mono_ms.saturating_sub(r.started_ms);
            self.push_record(r);
        }
    }

    /// The head of the answer's stream was written: recorded now, and again at its end.
    fn stream_started(&mut self, now: Now) {
        if let Some(r) = self.current.as_mut() {
            r.status = 200;
            r.phase = Phase::StreamStarted;
            r.duration_ms = now.mono_ms.saturating_sub(r.started_ms);
            let copy = r.clone();
            self.push_record(copy);
        }
    }

    /// The answer's stream ended.
    fn stream_ended(&mut self, now: Now) {
        if let Some(mut r) = self.current.take() {
            r.phase = Phase::StreamEnded;
            r.duration_ms = now.mono_ms.saturating_sub(r.started_ms);
            self.push_record(r);
        }
    }

    /// The answer being written refuses the request with `kind`.
    fn note_error(&mut self, kind: ErrorKind) {
        if let Some(r) = self.current.as_mut() {
            r.error = Some(kind);
        }
    }

    /// The request concerns task `id`, unless one is already known.
    fn note_task(&mut self, id: &str) {
        if let Some(r) = self.current.as_mut() {
            if r.task_id.is_empty() {
                r.task_id = Label::new(id);
            }
        }
    }

    /// A limiter refused the request `head`: its record, made now if only refusals are
    /// kept.
    fn note_refusal(&mut self, head: &RequestHead, limiter: Limiter, retry_after_s: u32) {
        if self.keep == Keep::Off {
            return;
        }
        let started = self.req_started;
        let r = self
            .current
            .get_or_insert_with(|| Box::new(RequestRecord::new(Some(head), started)));
        r.refusal = Some(Refusal {
            limiter,
            retry_after_s,
            source: self.source,
        });
    }

    /// Holds the output written from `start` on until change `seq` is durable.
    fn hold_from(&mut self, inst: &mut Instance, start: usize, seq: u64, instead: Instead) {
        if !inst.must_hold(seq) || self.holds.back().is_some_and(|h| h.seq >= seq) {
            // Durable already, or behind a hold that waits for as much.
            return;
        }
        if self.holds.is_empty() {
            inst.set_holding(true);
        }
        self.holds.push_back(Hold {
            start,
            seq,
            instead,
        });
        let key = self.key(inst);
        inst.wait_durable(seq, key);
    }

    /// Releases the holds whose changes are durable now; gives them up if the store cannot
    /// make them durable.
    fn release(&mut self, inst: &mut Instance, now: Now) {
        let had = !self.holds.is_empty();
        while self.holds.front().is_some_and(|h| !inst.must_hold(h.seq)) {
            self.holds.pop_front();
        }
        if had && self.holds.is_empty() {
            inst.set_holding(false);
        }
        if !self.holds.is_empty() && inst.store_unavailable().is_some() {
            self.give_up_holds(inst, now);
        }
    }

    /// The store failed before the held answers' changes were durable: nothing may
    /// acknowledge them. The first held answer becomes a STORE_UNAVAILABLE refusal; what
    /// follows it is dropped, whatever the connection was doing ends, and it closes.
    fn give_up_holds(&mut self, inst: &mut Instance, now: Now) {
        let Some(first) = self.holds.pop_front() else {
            return;
        };
        self.holds.clear();
        inst.set_holding(false);
        self.out.truncate(first.start);
        self.tail = None;
        self.deferred = None;
        self.release_large(usize::MAX);
        self.end_state(inst);
        let why = inst.store_unavailable().unwrap_or_default().to_owned();
        let err = RpcError::new(
            ErrorKind::StoreUnavailable,
            format!(
                "the store could not make this change durable ({why}); it may or may not \
                 be kept: read the task again once the store has healed"
            ),
        );
        match first.instead {
            Instead::Rpc { id, minor } => self.write_error_reply(&err, &id, false, minor, now),
            Instead::StreamFrame { id, chunked } => {
                let mut doc = Vec::with_capacity(256);
                jsonrpc::write_error(&mut doc, &id, &err);
                response::write_sse_event(&mut self.out, &doc, chunked);
                if chunked {
                    response::write_chunked_end(&mut self.out);
                }
                self.note_error(err.kind);
            }
            Instead::OAuth { minor } => {
                let date = self.date(now);
                let mut h = Head::new(503, &date)
                    .header("content-type", "application/json")
                    .header("cache-control", "no-store")
                    .header("retry-after", "5");
                self.finish_head(&mut h, minor, false, now);
                h.write_full(
                    &mut self.out,
                    br#"{"error":"temporarily_unavailable","error_description":"the store cannot write; try again"}"#,
                    false,
                );
            }
        }
        self.closing = true;
    }

    /// The end of what may be written: the start of the first hold.
    fn visible_end(&self) -> usize {
        self.holds.front().map_or(self.out.len(), |h| h.start)
    }

    /// The output buffer lost its first `n` bytes.
    fn shift_holds(&mut self, n: usize) {
        for h in self.holds.iter_mut() {
            h.start = h.start.saturating_sub(n);
        }
    }

    /// Takes the listener's TLS configuration from the instance, so that
    /// [`Connection::receive`] can take bytes without it. Call once, right after
    /// [`Connection::new`] (a connection not prepared is prepared at its first poll).
    pub fn prepare(&mut self, inst: &Instance) {
        if self.tls_checked {
            return;
        }
        self.tls_checked = true;
        self.large_pool = Some(inst.large_answers.clone());
        if let Some(t) = inst.config().tls.get(&self.listener) {
            match crate::tls::TlsLayer::new(t.config.clone()) {
                Some(layer) => self.tls = Some(layer),
                None => self.aborted = true,
            }
        }
    }

    /// Bytes read from the peer, taken without the instance: a TLS session decrypts them
    /// here (the handshake runs here, and what it answers is ready to write at once) and the
    /// plaintext waits for [`Connection::poll`], which answers it. A driver that shares the
    /// instance behind a lock calls this outside the lock. True when `poll` has something to
    /// do (plaintext arrived, or the peer closed); a handshake in progress needs no poll.
    pub fn receive(&mut self, bytes: &[u8], now: Now) -> bool {
        self.last_mono = now.mono_ms;
        if self.closing || self.aborted || bytes.is_empty() {
            return false;
        }
        if !self.tls_checked {
            // Not prepared: whether these bytes are TLS is decided at the next poll.
            self.unprepared.extend_from_slice(bytes);
            return true;
        }
        let serve = self.take_input(bytes);
        self.read_ahead();
        serve
    }

    /// Parses the next request out of the input, outside the instance, unless one is
    /// parsed already: its head (so its route can be decided before its body arrives), and
    /// its body once whole.
    fn read_ahead(&mut self) {
        while !self.closing && !matches!(self.ahead.back(), Some(Ok(Event::Body(_)) | Err(_))) {
            match self.parser.next_event() {
                Ok(Some(event)) => self.ahead.push_back(Ok(event)),
                Ok(None) => return,
                Err(e) => self.ahead.push_back(Err(e)),
            }
        }
    }

    /// Bytes of the request parsed ahead.
    fn ahead_bytes(&self) -> usize {
        self.ahead
            .iter()
            .map(|e| match e {
                Ok(Event::Body(b)) => b.len(),
                _ => 0,
            })
            .sum()
    }

    /// Prepares a connection its driver did not prepare, and takes the bytes it received
    /// before.
    fn prepare_late(&mut self, inst: &Instance) {
        if !self.tls_checked {
            self.prepare(inst);
            let bytes = std::mem::take(&mut self.unprepared);
            if !self.aborted && !bytes.is_empty() {
                self.take_input(&bytes);
            }
        }
    }

    /// Decrypts (with TLS) and buffers `bytes`; true when there is plaintext or an end of
    /// input to act on.
    fn take_input(&mut self, bytes: &[u8]) -> bool {
        let Some(tls) = self.tls.as_mut() else {
            self.parser.push(bytes);
            return true;
        };
        let mut plain = Vec::new();
        let was_handshaking = tls.handshaking();
        match tls.receive(bytes, &mut plain) {
            Ok(peer_closed) => {
                if was_handshaking && !tls.handshaking() {
                    // The handshake's clock stops here, though no poll may follow: the
                    // request head's starts with its first bytes.
                    self.head_started = None;
                }
                if !tls.handshaking() && matches!(self.peer, Peer::Tcp) {
                    if let Some(id) = tls.client_identity() {
                        self.peer = Peer::Cert(id);
                    }
                }
                self.parser.push(&plain);
                self.peer_closed |= peer_closed;
                !plain.is_empty() || peer_closed
            }
            Err(()) => {
                // A failed handshake or a corrupt record: its alert goes out, then close.
                self.closing = true;
                false
            }
        }
    }

    /// Bytes read from the peer: [`Connection::receive`] and [`Connection::poll`] in one
    /// call, for a driver that holds the instance anyway.
    pub fn handle_input(&mut self, inst: &mut Instance, bytes: &[u8], now: Now) {
        if self.receive(bytes, now) {
            self.poll(inst, now);
        }
    }

    /// Moves written plaintext through the TLS session (a no-op without TLS).
    fn encrypt(&mut self) {
        let Some(tls) = self.tls.as_mut() else { return };
        if self.closing && tls.handshaking() {
            // Nothing can be said to a peer that never finished its handshake.
            self.aborted = true;
            return;
        }
        let end = self.holds.front().map_or(self.out.len(), |h| h.start);
        let n = tls.send(&self.out[self.out_pos..end]);
        self.out_pos += n;
        if self.out_pos == self.out.len() {
            clear_output(&mut self.out, self.limits.max_output_bytes);
            self.out_pos = 0;
            // Only empty holds can remain (held bytes are never sent).
            self.holds.iter_mut().for_each(|h| h.start = 0);
            // Not before the last slice of a large answer still being written.
            if self.closing && self.tail.is_none() {
                tls.close_notify();
            }
        }
        self.release_large(n);
    }

    /// The peer will send nothing more. What was asked is still answered; then it closes.
    pub fn handle_eof(&mut self, inst: &mut Instance, now: Now) {
        self.last_mono = now.mono_ms;
        self.prepare_late(inst);
        // Every request read before the end is answered, not only the first.
        self.drive(inst, now);
        while self.produce(now) {
            self.drive(inst, now);
        }
        if self.tls.as_ref().is_some_and(|t| t.handshaking()) {
            self.aborted = true;
            return;
        }
        match self.state {
            State::Reading { .. } => self.closing = true,
            // The answer in progress still goes out; the connection closes after it.
            State::Waiting {
                ref mut keep_alive, ..
            }
            | State::Streaming {
                ref mut keep_alive, ..
            }
            | State::Calling {
                ref mut keep_alive, ..
            }
            | State::Feed {
                ref mut keep_alive, ..
            } => *keep_alive = false,
        }
    }

    /// Answers what arrived and what became ready without new input (the waker fired: a
    /// task it watches changed, or a change its held answer waits for became durable):
    /// [`Connection::serve`] and [`Connection::produce`] in turn until neither has more to
    /// do, for a driver that holds the instance anyway.
    pub fn poll(&mut self, inst: &mut Instance, now: Now) {
        self.serve(inst, now);
        while self.produce(now) {
            self.serve(inst, now);
        }
    }

    /// The half of [`Connection::poll`] that needs the instance: decides the answers to
    /// the requests read (who asks, which method, what result) and takes what the instance
    /// has for this connection (a settled task, stream events, feed events, a host's
    /// answer). A driver that shares the instance behind a lock calls this under the lock,
    /// then [`Connection::produce`] outside it: a task, a card or a result is framed there,
    /// and TLS encrypts there.
    pub fn serve(&mut self, inst: &mut Instance, now: Now) {
        self.last_mono = now.mono_ms;
        self.prepare_late(inst);
        if std::mem::take(&mut self.peer_closed) {
            self.handle_eof(inst, now);
            return;
        }
        self.drive(inst, now);
    }

    /// The half of [`Connection::poll`] that needs no instance: frames the answer
    /// [`Connection::serve`] decided (a task serialized, a card or a result copied), writes
    /// more of a large answer, and encrypts. True when `serve` has more to do (a request
    /// read behind the answer just framed): call it again.
    pub fn produce(&mut self, now: Now) -> bool {
        self.last_mono = now.mono_ms;
        let framed = self.frame_deferred(now);
        self.pump_tail();
        self.encrypt();
        self.note_output(now);
        if !framed || self.closing || self.tail.is_some() {
            return false;
        }
        self.read_ahead();
        !self.ahead.is_empty() || self.parser.buffered() > 0
    }

    /// Bytes to write to the peer.
    pub fn pending_output(&self) -> &[u8] {
        if self.aborted {
            return &[];
        }
        match &self.tls {
            Some(tls) => tls.pending(),
            None => &self.out[self.out_pos..self.visible_end()],
        }
    }

    /// `n` bytes of [`Connection::pending_output`] were written.
    pub fn consume_output(&mut self, n: usize, now: Now) {
        self.last_mono = now.mono_ms;
        if let Some(tls) = self.tls.as_mut() {
            tls.consume(n);
            self.write_stalled_since = (!tls.pending().is_empty()).then_some(now.mono_ms);
            self.pump_tail();
            self.encrypt();
            return;
        }
        let before = self.out_pos;
        self.out_pos = (self.out_pos + n).min(self.visible_end());
        self.release_large(self.out_pos - before);
        if self.out_pos == self.out.len() {
            clear_output(&mut self.out, self.limits.max_output_bytes);
            self.out_pos = 0;
            self.holds.iter_mut().for_each(|h| h.start = 0);
            self.write_stalled_since = None;
        } else if self.out_pos == self.visible_end() {
            // What remains is held, not stalled.
            self.write_stalled_since = None;
        } else if n > 0 {
            self.write_stalled_since = Some(now.mono_ms);
        }
        if self.out_pos > 64 * 1024 {
            self.out.drain(..self.out_pos);
            let n = self.out_pos;
            self.shift_holds(n);
            self.out_pos = 0;
            // What is left of a large answer keeps no more room than it needs.
            let bound = 2 * self.limits.max_output_bytes;
            if self.out.capacity() > bound && self.out.len() < self.out.capacity() / 2 {
                self.out.shrink_to(self.out.len().max(bound));
            }
        }
        if self.tail.is_some() {
            self.pump_tail();
            if self.write_stalled_since.is_none() && self.visible_end() > self.out_pos {
                self.write_stalled_since = Some(now.mono_ms);
            }
        }
    }

    /// Whether the driver should read: the connection can take more requests and has room.
    pub fn wants_read(&self) -> bool {
        // While an answer is held the driver waits for the wake-up that releases it.
        !self.closing
            && !self.aborted
            && self.holds.is_empty()
            && !self.answering()
            && matches!(self.state, State::Reading { .. })
            && self.backlog() < self.limits.max_output_bytes
            && self.parser.buffered() + self.unprepared.len() + self.ahead_bytes()
                < self.limits.http.input_capacity()
    }

    /// The connection is done: close the socket, then call [`Connection::close`].
    pub fn is_finished(&self) -> bool {
        self.aborted || (self.closing && self.backlog() == 0 && !self.answering())
    }

    /// An answer is still being written: a large one's tail, or one not yet framed.
    /// Nothing else is read or answered meanwhile, and no request's clock runs.
    fn answering(&self) -> bool {
        self.tail.is_some() || self.deferred.is_some()
    }

    /// Releases what the connection holds in the instance. Call once, when dropping it.
    pub fn close(&mut self, inst: &mut Instance) {
        if let Some(mut r) = self.current.take() {
            // Answered in part (a stream's head) or not at all: the peer is gone.
            r.phase = Phase::Abandoned;
            r.duration_ms = self.last_mono.saturating_sub(r.started_ms);
            self.push_record(r);
        }
        if !self.holds.is_empty() {
            self.holds.clear();
            inst.set_holding(false);
        }
        self.end_state(inst);
        if let Some(key) = self.key.take() {
            inst.forget_conn(key);
        }
        self.tail = None;
        self.deferred = None;
        self.release_large(usize::MAX);
        self.closing = true;
        self.aborted = true;
    }

    /// Ends what the connection was doing (a wait, a stream, a feed, a command call) and
    /// lets go of what it held in the instance for it.
    fn end_state(&mut self, inst: &mut Instance) {
        match self.state {
            State::Waiting { sub, .. } | State::Streaming { sub: Some(sub), .. } => {
                inst.unsubscribe(sub)
            }
            State::Feed { watcher, .. } => inst.unwatch_feed(watcher),
            State::Calling { call, .. } => {
                if let Some(c) = inst.end_call(call) {
                    if let Some(CallOutcome::Started { sub: Some(sub), .. }) = c.outcome {
                        inst.unsubscribe(sub);
                    }
                }
            }
            _ => {}
        }
        self.state = State::Reading { pending: None };
    }

    /// The monotonic millisecond at which [`Connection::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<u64> {
        let l = &self.limits;
        let write = self.write_stalled_since.map(|t| t + l.write_timeout_ms);
        let state = match &self.state {
            _ if self.closing => None,
            // Nothing is read while an answer is being written.
            State::Reading { .. } if self.answering() => None,
            State::Reading { .. } if self.parser.in_body() => {
                self.body_started.map(|t| t + l.body_timeout_ms)
            }
            State::Reading { .. } if self.reading_head() => {
                self.head_started.map(|t| t + l.header_timeout_ms)
            }
            State::Reading { .. } if self.backlog() == 0 && self.ahead.is_empty() => {
                Some(self.idle_since + l.idle_timeout_ms)
            }
            State::Reading { .. } => None,
            State::Waiting { deadline, .. } | State::Calling { deadline, .. } => Some(*deadline),
            State::Streaming { last_write, .. } => Some(last_write + l.sse_keepalive_ms),
            State::Feed {
                last_write,
                deadline,
                ..
            } => Some((last_write + l.sse_keepalive_ms).min(*deadline)),
        };
        match (write, state) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Acts on whichever deadline has passed.
    pub fn handle_timeout(&mut self, inst: &mut Instance, now: Now) {
        self.last_mono = now.mono_ms;
        self.on_timeout(inst, now);
        self.release(inst, now);
        while self.produce(now) {
            self.drive(inst, now);
        }
    }

    fn on_timeout(&mut self, inst: &mut Instance, now: Now) {
        let t = now.mono_ms;
        let l = self.limits;
        if self
            .write_stalled_since
            .is_some_and(|s| t >= s + l.write_timeout_ms)
        {
            // The peer stopped reading: nothing more can reach it.
            self.close(inst);
            return;
        }
        if self.closing {
            return;
        }
        let answering = self.answering();
        match &mut self.state {
            // Nothing is read while an answer is being written: no request's clock runs.
            State::Reading { .. } if answering => {}
            State::Reading { .. } => {
                if self.parser.in_body()
                    && self
                        .body_started
                        .is_some_and(|s| t >= s + l.body_timeout_ms)
                {
                    self.refuse_and_close(408, "request body not received in time", now);
                } else if self.reading_head()
                    && self
                        .head_started
                        .is_some_and(|s| t >= s + l.header_timeout_ms)
                {
                    self.refuse_and_close(408, "request head not received in time", now);
                } else if !self.reading_head()
                    && !self.parser.in_body()
                    && self.backlog() == 0
                    && !self.answering()
                    && self.ahead.is_empty()
                    && t >= self.idle_since + l.idle_timeout_ms
                {
                    self.closing = true;
                }
            }
            State::Waiting { deadline, .. } => {
                if t >= *deadline {
                    self.finish_wait(inst, now);
                    self.drive(inst, now);
                }
            }
            State::Feed {
                deadline,
                last_write,
                chunked,
                ..
            } => {
                if t >= *deadline {
                    self.end_feed(inst, Some(crate::feed::Goodbye::Deadline), now);
                    self.drive(inst, now);
                } else if t >= *last_write + l.sse_keepalive_ms {
                    response::write_sse_comment(&mut self.out, "keep-alive", *chunked);
                    *last_write = t;
                    self.note_output(now);
                }
            }
            State::Calling {
                deadline,
                call,
                ref id,
                keep_alive,
                minor_version,
                ..
            } => {
                if t >= *deadline {
                    let id = id.clone();
                    let (call, keep_alive, minor_version) = (*call, *keep_alive, *minor_version);
                    if let Some(c) = inst.end_call(call) {
                        if let Some(CallOutcome::Started { sub: Some(sub), .. }) = c.outcome {
                            inst.unsubscribe(sub);
                        }
                    }
                    self.state = State::Reading { pending: None };
                    let err = RpcError::new(
                        ErrorKind::Internal,
                        "the runtime did not answer this command in time",
                    );
                    let mut doc = Vec::with_capacity(128);
                    jsonrpc::write_error(&mut doc, &id, &err);
                    self.note_error(err.kind);
                    self.write_json_keep(200, &doc, keep_alive, minor_version, None, now);
                    self.drive(inst, now);
                }
            }
            State::Streaming {
                last_write,
                chunked,
                ..
            } => {
                if t >= *last_write + l.sse_keepalive_ms {
                    *last_write = t;
                    // Not in the middle of a task frame still being written (which is
                    // output enough).
                    if self.tail.is_none() {
                        response::write_sse_comment(&mut self.out, "keep-alive", *chunked);
                        self.note_output(now);
                    }
                }
            }
        }
    }

    /// A request head is arriving, or the TLS handshake before it: the slowloris deadline runs.
    fn reading_head(&self) -> bool {
        self.parser.in_head() || self.tls.as_ref().is_some_and(|t| t.handshaking())
    }

    fn backlog(&self) -> usize {
        self.out.len() - self.out_pos + self.tls.as_ref().map_or(0, |t| t.pending().len())
    }

    fn note_output(&mut self, now: Now) {
        let writable = self.visible_end() > self.out_pos
            || self.tls.as_ref().is_some_and(|t| !t.pending().is_empty());
        if self.write_stalled_since.is_none() && writable {
            self.write_stalled_since = Some(now.mono_ms);
        }
    }

    fn date(&mut self, now: Now) -> String {
        let sec = now.epoch_ms / 1000;
        if self.date.0 != sec {
            self.date = (sec, http_date(now.epoch_ms));
        }
        self.date.1.clone()
    }

    /// Runs the state machine as far as it can go without new input. What it decides to
    /// answer is framed by [`Connection::produce`], and encrypted there.
    fn drive(&mut self, inst: &mut Instance, now: Now) {
        self.release(inst, now);
        loop {
            if self.answering() {
                // The answer being written goes out first; what comes after it waits.
                break;
            }
            let progressed = match self.state {
                State::Reading { .. } => self.read_requests(inst, now),
                State::Waiting { .. } => self.pump_wait(inst, now),
                State::Streaming { .. } => self.pump_stream(inst, now),
                State::Calling { .. } => self.pump_call(inst, now),
                State::Feed { .. } => self.pump_feed(inst, now),
            };
            if !progressed || self.closing {
                break;
            }
        }
        self.release(inst, now);
        match (&self.state, self.reading_head()) {
            (State::Reading { .. }, true) if self.head_started.is_none() => {
                self.head_started = Some(now.mono_ms)
            }
            (State::Reading { .. }, false) => self.head_started = None,
            _ => {}
        }
        self.note_output(now);
    }

    /// Reads and answers buffered requests. True when it moved to another state.
    fn read_requests(&mut self, inst: &mut Instance, now: Now) -> bool {
        while !self.closing && !self.answering() && self.backlog() < self.limits.max_output_bytes {
            if self.ahead.is_empty() {
                self.read_ahead();
            }
            let event = match self.ahead.pop_front() {
                Some(Ok(e)) => e,
                None => return false,
                Some(Err(e)) => {
                    self.refuse_and_close(e.status, e.reason, now);
                    return false;
                }
            };
            match event {
                Event::Head(head) => {
                    self.head_started = None;
                    self.body_started = Some(now.mono_ms);
                    self.req_started = now.mono_ms;
                    self.current = (self.keep == Keep::All)
                        .then(|| Box::new(RequestRecord::new(Some(&head), now.mono_ms)));
                    let mut route = route(&head);
                    if inst.config().device_grant.enabled {
                        if let Some(endpoint) = crate::oauth::Endpoint::from_path(&head.path) {
                            let wanted = if endpoint.takes_form() {
                                Method::Post
                            } else {
                                Method::Get
                            };
                            route = if head.method == wanted {
                                Route::OAuth(endpoint)
                            } else {
                                Route::Refuse {
                                    status: 405,
                                    allow: Some(if endpoint.takes_form() { "POST" } else { "GET" }),
                                }
                            };
                        }
                    }
                    self.cors = cors_standing(inst, &head, &route);
                    if self.cors == Cors::Refused {
                        // Before the body is read, and never counted as a failed credential.
                        route = Route::Refuse {
                            status: 403,
                            allow: None,
                        };
                    }
                    if let Route::Refuse { status, allow } = route {
                        if head.has_body() {
                            // Refused from its head: its body is never read, so the byte
                            // stream can no longer be trusted to find the next request.
                            self.write_simple(status, allow, now, &head, true);
                            self.closing = true;
                            return false;
                        }
                    }
                    if head.expect_continue && matches!(route, Route::Rpc) {
                        self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                    }
                    self.state = State::Reading {
                        pending: Some((head, route)),
                    };
                }
                Event::Body(body) => {
                    self.body_started = None;
                    self.idle_since = now.mono_ms;
                    let State::Reading { pending } = &mut self.state else {
                        unreachable!("bodies are read only in the reading state")
                    };
                    let Some((head, route)) = pending.take() else {
                        self.refuse_and_close(400, "body without a request", now);
                        return false;
                    };
                    if self.answer(inst, head, route, &body, now) {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Answers one complete request. True when the answer is pending (wait or stream).
    fn answer(
        &mut self,
        inst: &mut Instance,
        head: RequestHead,
        route: Route,
        body: &[u8],
        now: Now,
    ) -> bool {
        match route {
            Route::Refuse { status, allow } => {
                self.write_simple(status, allow, now, &head, !head.keep_alive);
                false
            }
            Route::Options { allow } => {
                self.write_simple(204, Some(allow), now, &head, !head.keep_alive);
                false
            }
            Route::Card { head_only } => {
                self.answer_card(inst, &head, head_only, now);
                false
            }
            Route::Rpc => self.answer_rpc(inst, head, body, now),
            Route::OAuth(endpoint) => {
                let mut hold = None;
                let start = self.out.len();
                let a = if body.len() > crate::oauth::MAX_FORM_BYTES {
                    crate::oauth::Answer {
                        status: 413,
                        content_type: "application/json",
                        body: br#"{"error":"invalid_request"}"#.to_vec(),
                        retry_after_s: None,
                    }
                } else {
                    let form = head.header("content-type").is_some_and(|ct| {
                        let media = ct.split(|b| *b == b';').next().unwrap_or_default();
                        media
                            .trim_ascii()
                            .eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
                    });
                    let before = inst.record_seq();
                    let a = crate::oauth::answer(
                        inst,
                        endpoint,
                        self.listener,
                        self.source,
                        form,
                        body,
                        now,
                    );
                    inst.announce_records();
                    if inst.record_seq() > before {
                        // A token issued or revoked: its answer waits for the session record.
                        hold = Some(inst.record_seq());
                    }
                    a
                };
                let date = self.date(now);
                let retry_after = a.retry_after_s.map(|s| s.to_string());
                let mut h = Head::new(a.status, &date)
                    .header("content-type", a.content_type)
                    .header("cache-control", "no-store");
                if let Some(secs) = &retry_after {
                    h = h.header("retry-after", secs);
                    self.note_refusal(&head, Limiter::OAuthSource, a.retry_after_s.unwrap_or(1));
                }
                self.finish_head(&mut h, head.minor_version, head.keep_alive, now);
                h.write_full(&mut self.out, &a.body, false);
                if let Some(seq) = hold {
                    let instead = Instead::OAuth {
                        minor: head.minor_version,
                    };
                    self.hold_from(inst, start, seq, instead);
                }
                false
            }
        }
    }

    fn answer_rpc(
        &mut self,
        inst: &mut Instance,
        head: RequestHead,
        body: &[u8],
        now: Now,
    ) -> bool {
        let loopback = inst
            .config()
            .listeners
            .get(self.listener)
            .is_some_and(|l| l.loopback);
        let authorization = head.header("authorization");
        if let Some(source) = self.source {
            // A source over its failure limit presents no more configured credentials: they
            // are refused before they are checked. Session tokens (the store decides them,
            // and a live one is served), certificates and requests presenting nothing pass.
            let checked = authorization.is_some_and(|value| {
                inst.config().auth.has_bearer() && !crate::auth::is_session_bearer(value)
            });
            if checked {
                if let Some(wait) = inst.limits.failures.refusal(source, now.mono_ms) {
                    let secs = crate::limits::retry_after_secs(wait);
                    self.note_refusal(&head, Limiter::SourceFailures, secs);
                    let err = RpcError::rate_limited(
                        format!(
                            "too many failed credentials from this address: try again in {secs} s"
                        ),
                        secs,
                    );
                    self.write_error_reply(
                        &err,
                        &RequestId::null(),
                        head.keep_alive,
                        head.minor_version,
                        now,
                    );
                    return false;
                }
            }
        }
        let resolved = crate::auth::resolve_with_sessions(
            &inst.config().auth,
            Some((&inst.sessions, now.epoch_ms)),
            &self.peer,
            loopback,
            authorization,
            head.header("origin").is_some(),
        );
        let (principal, via, sid) = match resolved {
            Ok(found) => found,
            Err(why) => {
                // A presented credential that failed, and a certificate no rule gives a role,
                // count against the source; presenting nothing (or a browser refused the
                // implicit operator) does not.
                if let (Some(source), Unauthenticated::InvalidToken | Unauthenticated::NoRole) =
                    (self.source, why)
                {
                    inst.limits.failures.count(source, now.mono_ms);
                }
                // Nothing costly runs before the caller is known: refused before the body is
                // read as JSON, so the id is null.
                self.write_unauthenticated(why, &head, now);
                return false;
            }
        };
        let ctx = CallContext {
            principal: &principal,
            via,
            listener: self.listener,
            head: &head,
            now,
            sid: sid.as_deref(),
        };
        if let Some(r) = self.current.as_mut() {
            // Who asked and what, for the request log: read only for a known caller.
            r.principal = Label::new(&principal.id);
            (r.method, r.task_id) = reqlog::peek_call(body);
        }
        let before = inst.record_seq();
        let rpc::Answer {
            id,
            activated,
            reply,
        } = rpc::call(inst, &ctx, body);
        inst.announce_records();
        // The call changed something: its answer acknowledges that, so it waits for it.
        let changed = (inst.record_seq() > before).then(|| inst.record_seq());
        let start = self.out.len();
        let keep_alive = head.keep_alive;
        let minor = head.minor_version;
        let annotate = activated.contains(crate::ext::Ext::TaskAnnotations);
        match reply {
            Reply::Task(json) => {
                if self
                    .current
                    .as_ref()
                    .is_some_and(|r| r.task_id.is_empty() && r.method == "SendMessage")
                {
                    // A send that returned at once: the task it created.
                    let task = json.task().id.clone();
                    self.note_task(&task);
                }
                // Held (below) when it acknowledges a change, so never refused for room.
                let instead = changed.map(|seq| {
                    (
                        seq,
                        Instead::Rpc {
                            id: id.clone(),
                            minor,
                        },
                    )
                });
                self.deferred = Some(Deferred::Task(TaskAnswer {
                    json,
                    id,
                    keep_alive,
                    minor,
                    echo: activated.echo(),
                    acknowledges: changed.is_some(),
                }));
                if let Some((seq, instead)) = instead {
                    self.hold_from(inst, start, seq, instead);
                }
                false
            }
            Reply::Result(result) => {
                if self
                    .current
                    .as_ref()
                    .is_some_and(|r| r.task_id.is_empty() && r.method == "SendMessage")
                {
                    // A send that returned at once: the task it created.
                    let task = reqlog::peek_result_task(&result);
                    self.note_task(task.as_str());
                }
                let instead = changed.map(|seq| {
                    (
                        seq,
                        Instead::Rpc {
                            id: id.clone(),
                            minor,
                        },
                    )
                });
                self.deferred = Some(Deferred::Result {
                    id,
                    result,
                    keep_alive,
                    minor,
                    echo: activated.echo(),
                    acknowledges: changed.is_some(),
                });
                if let Some((seq, instead)) = instead {
                    self.hold_from(inst, start, seq, instead);
                }
                false
            }
            Reply::Error(err) => {
                if err.kind == ErrorKind::RateLimited {
                    // Only the rate check of the call's pipeline answers RATE_LIMITED: a
                    // device session's rate, or the principal's own.
                    let limiter = if via == crate::auth::Via::Session {
                        Limiter::DeviceGrantRate
                    } else {
                        Limiter::PrincipalRate
                    };
                    self.note_refusal(&head, limiter, err.retry_after().unwrap_or(1));
                    if let Some(r) = self.current.as_mut() {
                        if r.principal.is_empty() {
                            // Recorded only because it was refused.
                            r.principal = Label::new(&principal.id);
                            r.method = reqlog::peek_call(body).0;
                        }
                    }
                }
                if let Some((_, task)) = err.metadata.iter().find(|(k, _)| *k == "taskId") {
                    self.note_task(task);
                }
                // A refused request echoes nothing.
                self.write_error_reply(&err, &id, keep_alive, minor, now);
                if let Some(seq) = changed {
                    self.hold_from(inst, start, seq, Instead::Rpc { id, minor });
                }
                false
            }
            Reply::Wait {
                sub,
                task_id,
                history_length,
            } => {
                self.note_task(&task_id);
                self.watch(inst, sub);
                self.state = State::Waiting {
                    sub,
                    id,
                    task_id,
                    history: history_length,
                    deadline: now.mono_ms + self.limits.request_timeout_ms,
                    keep_alive,
                    minor_version: minor,
                    annotate,
                    activated,
                };
                true
            }
            Reply::Stream {
                sub,
                task_id,
                frames,
            } => {
                if let Some(t) = &task_id {
                    self.note_task(t);
                }
                let rid = id.clone();
                self.start_stream(
                    inst, id, sub, task_id, frames, keep_alive, minor, activated, now,
                );
                // The first frame of a stream that created or changed a task.
                if let Some(seq) = changed {
                    let instead = Instead::Rpc { id: rid, minor };
                    self.hold_from(inst, start, seq, instead);
                }
                true
            }
            Reply::Feed { from_seq } => {
                self.start_feed(
                    inst, id, principal, sid, from_seq, keep_alive, minor, activated, now,
                );
                true
            }
            Reply::Call {
                call,
                streaming,
                history_length,
            } => {
                let key = self.key(inst);
                if let Some(c) = inst.call(call) {
                    c.conn = Some(key);
                }
                self.state = State::Calling {
                    call,
                    id,
                    streaming,
                    history: history_length,
                    deadline: now.mono_ms + self.limits.request_timeout_ms,
                    keep_alive,
                    minor_version: minor,
                    activated,
                    since: before,
                };
                true
            }
        }
    }

    /// Points a subscription's wake-ups at this connection.
    fn watch(&mut self, inst: &mut Instance, sub: SubId) {
        let key = self.key(inst);
        if let Some(s) = inst.subscription(sub) {
            s.conn = Some(key);
        }
    }

    /// This connection's key in the instance's registry of wakers, registered the first
    /// time it waits on anything there.
    fn key(&mut self, inst: &mut Instance) -> ConnKey {
        *self
            .key
            .get_or_insert_with(|| inst.register_conn(&self.waker))
    }

    #[allow(clippy::too_many_arguments)]
    fn start_stream(
        &mut self,
        inst: &mut Instance,
        id: RequestId,
        sub: Option<SubId>,
        task_id: Option<String>,
        frames: Vec<(u64, Arc<StreamResponse>)>,
        keep_alive: bool,
        minor: u8,
        activated: ExtSet,
        now: Now,
    ) {
        if let Some(sub) = sub {
            self.watch(inst, sub);
        }
        let chunked = self.write_stream_head(minor, keep_alive, activated, now);
        self.state = State::Streaming {
            sub,
            task_id,
            pending: frames.into(),
            id,
            chunked,
            keep_alive: keep_alive && chunked,
            last_write: now.mono_ms,
        };
        // As much as the output bound allows now; the rest as the peer reads.
        self.pump_stream(inst, now);
    }

    /// The head of an SSE answer: the echo, CORS, and chunked transfer (HTTP/1.0 has no
    /// chunked coding: its stream ends when the connection does). Returns whether chunked.
    fn write_stream_head(
        &mut self,
        minor: u8,
        keep_alive: bool,
        activated: ExtSet,
        now: Now,
    ) -> bool {
        let chunked = minor >= 1;
        let date = self.date(now);
        let mut h = Head::new(200, &date);
        if let Some(echo) = activated.echo() {
            h = h.header("a2a-extensions", echo);
        }
        h.close = !chunked || !keep_alive;
        self.cors_headers(&mut h);
        h.write_sse_start(&mut self.out, chunked);
        self.stream_started(now);
        chunked
    }

    #[allow(clippy::too_many_arguments)]
    fn start_feed(
        &mut self,
        inst: &mut Instance,
        id: RequestId,
        principal: Principal,
        sid: Option<String>,
        from_seq: u64,
        keep_alive: bool,
        minor: u8,
        activated: ExtSet,
        now: Now,
    ) {
        let (newest, resync, start) = match inst.feed() {
            Some(ring) => {
                let resync = ring.needs_resync(from_seq);
                // The replay starts at the ring's start with resync, or when the cursor
                // (0: "from the start") is older than anything the ring still holds.
                let ring_start = ring.oldest() - 1;
                let start = if resync {
                    ring_start
                } else {
                    from_seq.max(ring_start)
                };
                (ring.newest(), resync, start)
            }
            None => (0, from_seq > 0, 0),
        };
        let watcher = self.key(inst);
        inst.watch_feed(watcher);
        let chunked = self.write_stream_head(minor, keep_alive, activated, now);
        let hello = crate::feed::hello(
            newest,
            from_seq,
            resync,
            inst.config().introspection_enabled,
            &inst.config().version,
        );
        let mut doc = Vec::with_capacity(160);
        jsonrpc::write_result(&mut doc, &id, &serde_json::json!({ "hello": hello }));
        response::write_sse_event(&mut self.out, &doc, chunked);
        self.state = State::Feed {
            watcher,
            principal,
            sid,
            id,
            cursor: start,
            chunked,
            keep_alive: keep_alive && chunked,
            deadline: now.mono_ms + inst.config().events_stream_deadline_ms,
            annotate: activated.contains(crate::ext::Ext::TaskAnnotations),
            last_write: now.mono_ms,
        };
    }

    /// Writes feed events past the cursor that this caller may see. True when the stream
    /// ended (the subscriber fell out of the ring).
    fn pump_feed(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Feed {
            ref id,
            ref principal,
            ref sid,
            ref mut cursor,
            chunked,
            annotate,
            ref mut last_write,
            ..
        } = self.state
        else {
            return false;
        };
        if let Some(sid) = sid {
            if !inst.session_live(sid, now) {
                // Within one tick of the revocation, and nothing past it.
                self.end_feed(inst, Some(crate::feed::Goodbye::Revoked), now);
                return true;
            }
        }
        let Some(ring) = inst.feed.as_ref() else {
            return false;
        };
        if ring.overran(*cursor) {
            // Too slow: the events it needs are gone. End the stream without goodbye; its
            // reconnect from the same cursor is answered with resync.
            self.end_feed(inst, None, now);
            return true;
        }
        let mut wrote = false;
        let mut doc = Vec::with_capacity(512);
        // Bounded by the output backlog: the driver writes it, then polls again.
        for e in ring.after(*cursor) {
            if self.out.len() - self.out_pos >= self.limits.max_output_bytes {
                break;
            }
            *cursor = e.seq;
            if !e.visible_to(principal) {
                continue;
            }
            doc.clear();
            e.write_response(&mut doc, id.as_json(), annotate);
            response::write_sse_event(&mut self.out, &doc, chunked);
            wrote = true;
        }
        if wrote {
            *last_write = now.mono_ms;
        }
        false
    }

    /// Ends the feed stream, with `goodbye` when it has a reason to give.
    fn end_feed(&mut self, inst: &mut Instance, goodbye: Option<crate::feed::Goodbye>, now: Now) {
        let State::Feed {
            watcher,
            ref id,
            cursor,
            chunked,
            keep_alive,
            ..
        } = self.state
        else {
            return;
        };
        if let Some(reason) = goodbye {
            let mut doc = Vec::with_capacity(96);
            let frame = serde_json::json!({"goodbye": {"reason": reason.as_str(), "seq": cursor}});
            jsonrpc::write_result(&mut doc, id, &frame);
            response::write_sse_event(&mut self.out, &doc, chunked);
        }
        if chunked {
            response::write_chunked_end(&mut self.out);
        }
        inst.unwatch_feed(watcher);
        self.state = State::Reading { pending: None };
        if !keep_alive {
            self.closing = true;
        }
        self.stream_ended(now);
    }

    /// A command handed to the host: answers once the host does. True when it did.
    fn pump_call(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Calling {
            call,
            ref id,
            streaming,
            history,
            keep_alive,
            minor_version,
            activated,
            since,
            ..
        } = self.state
        else {
            return false;
        };
        if inst.call(call).is_some_and(|c| c.outcome.is_none()) {
            return false;
        }
        let id = id.clone();
        let annotate = activated.contains(crate::ext::Ext::TaskAnnotations);
        self.state = State::Reading { pending: None };
        // Whatever the host changed for this call (a task started, state it changed) is
        // acknowledged by the answer: it waits for those records.
        let start = self.out.len();
        let seq = inst.record_seq();
        let changed = seq > since;
        let instead = Instead::Rpc {
            id: id.clone(),
            minor: minor_version,
        };
        self.pump_call_answer(
            inst,
            call,
            id,
            streaming,
            history,
            keep_alive,
            minor_version,
            activated,
            annotate,
            now,
        );
        if changed {
            self.hold_from(inst, start, seq, instead);
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn pump_call_answer(
        &mut self,
        inst: &mut Instance,
        call: CallId,
        id: RequestId,
        streaming: bool,
        history: Option<usize>,
        keep_alive: bool,
        minor_version: u8,
        activated: ExtSet,
        annotate: bool,
        now: Now,
    ) {
        let Some(pending) = inst.end_call(call) else {
            let err = RpcError::new(ErrorKind::Internal, "the command call was lost");
            self.note_error(err.kind);
            let mut doc = Vec::new();
            jsonrpc::write_error(&mut doc, &id, &err);
            self.write_json_keep(200, &doc, keep_alive, minor_version, None, now);
            return;
        };
        match pending.outcome {
            None => unreachable!("checked above"),
            Some(CallOutcome::Answered(CommandAnswer::Refused(err))) => {
                self.write_error_reply(&err, &id, keep_alive, minor_version, now);
            }
            Some(CallOutcome::Answered(CommandAnswer::Document(result))) => {
                let message = crate::ext::command::reply_message(
                    format!("msg-{}", inst.new_id()),
                    pending.context.name,
                    result,
                );
                let response = StreamResponse::Message(message);
                if streaming {
                    self.start_stream(
                        inst,
                        id,
                        None,
                        None,
                        vec![(0, Arc::new(response))],
                        keep_alive,
                        minor_version,
                        activated,
                        now,
                    );
                } else {
                    let mut doc = Vec::with_capacity(256);
                    jsonrpc::write_result(&mut doc, &id, &response);
                    self.write_json_keep(
                        200,
                        &doc,
                        keep_alive,
                        minor_version,
                        activated.echo(),
                        now,
                    );
                }
            }
            Some(CallOutcome::Started {
                task_id,
                sub,
                first,
                first_seq,
            }) => {
                self.note_task(&task_id);
                match sub {
                    Some(sub) if streaming => {
                        self.start_stream(
                            inst,
                            id,
                            Some(sub),
                            Some(task_id),
                            vec![(first_seq, Arc::new(StreamResponse::Task(*first)))],
                            keep_alive,
                            minor_version,
                            activated,
                            now,
                        );
                    }
                    Some(sub) => {
                        self.watch(inst, sub);
                        self.state = State::Waiting {
                            sub,
                            id,
                            task_id,
                            history,
                            deadline: now.mono_ms + self.limits.request_timeout_ms,
                            keep_alive,
                            minor_version,
                            annotate,
                            activated,
                        };
                    }
                    None => {
                        let mut doc = Vec::with_capacity(512);
                        jsonrpc::write_result(&mut doc, &id, &StreamResponse::Task(*first));
                        self.write_json_keep(
                            200,
                            &doc,
                            keep_alive,
                            minor_version,
                            activated.echo(),
                            now,
                        );
                    }
                }
            }
        }
    }

    /// A blocking send: answers once the task settles. True when it did.
    fn pump_wait(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Waiting { sub, .. } = self.state else {
            return false;
        };
        match inst.subscription(sub) {
            Some(s) if !s.settled => false,
            _ => {
                self.finish_wait(inst, now);
                true
            }
        }
    }

    fn finish_wait(&mut self, inst: &mut Instance, now: Now) {
        let State::Waiting {
            sub,
            ref id,
            ref task_id,
            history,
            keep_alive,
            minor_version,
            annotate,
            activated,
            ..
        } = self.state
        else {
            return;
        };
        let id = id.clone();
        inst.unsubscribe(sub);
        let task_id = task_id.clone();
        let json = inst.tasks.get(&task_id).map(|t| {
            let task = t.view(history, true, annotate);
            TaskJson::new(
                task,
                b"{\"task\":".to_vec(),
                b"}".to_vec(),
                t.answer_weight(),
            )
        });
        self.state = State::Reading { pending: None };
        let start = self.out.len();
        match json {
            Some(json) => {
                self.deferred = Some(Deferred::Task(TaskAnswer {
                    json: Box::new(json),
                    id: id.clone(),
                    keep_alive,
                    minor: minor_version,
                    echo: activated.echo(),
                    acknowledges: true,
                }));
            }
            None => {
                let mut doc = Vec::with_capacity(256);
                jsonrpc::write_error(&mut doc, &id, &RpcError::task_not_found(&task_id));
                if let Some(r) = self.current.as_mut() {
                    r.error = Some(ErrorKind::TaskNotFound);
                }
                self.write_json_keep(200, &doc, keep_alive, minor_version, None, now);
            }
        }
        // The answer of a blocking send acknowledges the task and the state it reached.
        let seq = inst.record_seq();
        let minor = minor_version;
        self.hold_from(inst, start, seq, Instead::Rpc { id, minor });
    }

    /// Writes the answer's own frames, then queued stream events. True when the stream
    /// ended.
    fn pump_stream(&mut self, inst: &mut Instance, now: Now) -> bool {
        let State::Streaming { sub, .. } = self.state else {
            return false;
        };
        loop {
            if self.backlog() >= self.limits.max_output_bytes {
                return false;
            }
            if self.tail.is_some() {
                // A task frame is still being written.
                return false;
            }
            let State::Streaming {
                ref mut pending, ..
            } = self.state
            else {
                return true;
            };
            if let Some((seq, frame)) = pending.pop_front() {
                if self.write_stream_event(inst, seq, &frame, now) {
                    return true;
                }
                continue;
            }
            // Without a subscription the answer's frames were the whole stream (they end at
            // a terminal state anyway: a finished task's last event is its terminal status).
            let Some(s) = sub.and_then(|sub| inst.subscription(sub)) else {
                self.end_stream(inst, None, now);
                return true;
            };
            match s.queue.pop_front() {
                Some((seq, event)) => {
                    if self.write_stream_event(inst, seq, &event, now) {
                        return true;
                    }
                }
                None if s.overflowed => {
                    let err = RpcError::new(
                        ErrorKind::Internal,
                        "this stream fell too far behind its task and was ended; call SubscribeToTask to resume",
                    );
                    self.end_stream(inst, Some(err), now);
                    return true;
                }
                None => return false,
            }
        }
    }

    /// Writes one stream event, `seq` its number in the task's sequence (the SSE id of a
    /// task stream's frame); ends the stream after a terminal or interrupted status.
    /// True when the stream ended.
    fn write_stream_event(
        &mut self,
        inst: &mut Instance,
        seq: u64,
        event: &StreamResponse,
        now: Now,
    ) -> bool {
        let State::Streaming {
            ref id,
            ref task_id,
            chunked,
            ref mut last_write,
            ..
        } = self.state
        else {
            return false;
        };
        *last_write = now.mono_ms;
        let rid = id.clone();
        let start = self.out.len();
        let event_id = task_id.as_deref().map(|t| inst.stream_event_id(t, seq));
        if let StreamResponse::Task(task) = event {
            // A task snapshot may be megabytes: written as the peer reads it, in as many
            // chunks as the output's room makes.
            let mut prefix = Vec::with_capacity(96);
            if let Some(eid) = &event_id {
                prefix.extend_from_slice(b"id: ");
                prefix.extend_from_slice(eid.as_bytes());
                prefix.push(b'\n');
            }
            prefix.extend_from_slice(b"data: {\"id\":");
            prefix.extend_from_slice(rid.as_json().as_bytes());
            prefix.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":{\"task\":");
            let json = TaskJson::new(task.clone(), prefix, b"}}\n\n".to_vec(), 0);
            self.tail = Some(Tail {
                json: Box::new(json),
                chunked,
                then: Vec::new(),
            });
            self.pump_tail();
        } else {
            let mut doc = Vec::with_capacity(512);
            jsonrpc::write_result(&mut doc, &rid, event);
            response::write_sse_event_with_id(&mut self.out, event_id.as_deref(), &doc, chunked);
        }
        let ends = match event {
            StreamResponse::StatusUpdate(u) => u.status.state.ends_a_turn(),
            StreamResponse::Task(t) => t.status.state.is_terminal(),
            StreamResponse::Message(_) => true,
            StreamResponse::ArtifactUpdate(_) => false,
        };
        if matches!(event, StreamResponse::StatusUpdate(_)) && ends {
            // A settled state is never shown before it is durable; earlier frames may be.
            let seq = inst.record_seq();
            let instead = Instead::StreamFrame { id: rid, chunked };
            self.hold_from(inst, start, seq, instead);
        }
        if ends {
            self.end_stream(inst, None, now);
        }
        ends
    }

    fn end_stream(&mut self, inst: &mut Instance, error: Option<RpcError>, now: Now) {
        let State::Streaming {
            sub,
            ref id,
            chunked,
            keep_alive,
            ..
        } = self.state
        else {
            return;
        };
        if let Some(err) = error {
            let mut doc = Vec::with_capacity(256);
            jsonrpc::write_error(&mut doc, id, &err);
            response::write_sse_event(self.out_after_tail(), &doc, chunked);
            self.note_error(err.kind);
        }
        if chunked {
            response::write_chunked_end(self.out_after_tail());
        }
        if let Some(sub) = sub {
            inst.unsubscribe(sub);
        }
        self.state = State::Reading { pending: None };
        if !keep_alive {
            self.closing = true;
        }
        self.stream_ended(now);
    }

    /// The card: taken (shared) under the instance, copied out by `produce`.
    fn answer_card(&mut self, inst: &Instance, head: &RequestHead, head_only: bool, now: Now) {
        let Some(card) = inst.card(self.listener) else {
            self.write_simple(404, None, now, head, !head.keep_alive);
            return;
        };
        let fresh = head
            .header_all("if-none-match")
            .any(|v| etag_matches(v, &card.etag));
        self.deferred = Some(Deferred::Card {
            card: card.clone(),
            fresh,
            head_only,
            keep_alive: head.keep_alive,
            minor: head.minor_version,
        });
    }

    /// Frames the answer `serve` decided, if one waits. True when one did.
    fn frame_deferred(&mut self, now: Now) -> bool {
        let Some(deferred) = self.deferred.take() else {
            return false;
        };
        match deferred {
            Deferred::Card {
                card,
                fresh,
                head_only,
                keep_alive,
                minor,
            } => {
                let date = self.date(now);
                let mut h = Head::new(if fresh { 304 } else { 200 }, &date)
                    .header("content-type", "application/json")
                    .header("etag", Cow::Borrowed(card.etag.as_str()))
                    .header("cache-control", "public, max-age=60")
                    .header("access-control-allow-origin", "*");
                self.finish_head(&mut h, minor, keep_alive, now);
                h.write_full(&mut self.out, &card.body, head_only);
            }
            Deferred::Result {
                id,
                result,
                keep_alive,
                minor,
                echo,
                acknowledges,
            } => {
                // A read's large answer waits for room in the pool; an answer that
                // acknowledges a change is always given (its request carried the bytes).
                if !acknowledges && !self.admit_large(result.len()) {
                    let err = self.large_refusal(result.len());
                    self.write_error_reply(&err, &id, keep_alive, minor, now);
                    return true;
                }
                let mut doc = Vec::with_capacity(result.len() + 48);
                jsonrpc::write_result_raw(&mut doc, &id, &result);
                drop(result);
                self.write_json_keep(200, &doc, keep_alive, minor, echo, now);
            }
            Deferred::Task(answer) => self.write_task_result(answer, now),
        }
        true
    }

    /// 401: who the caller is could not be established. The challenge says which scheme.
    fn write_unauthenticated(&mut self, why: Unauthenticated, head: &RequestHead, now: Now) {
        self.note_error(if why == Unauthenticated::NoRole {
            ErrorKind::PermissionDenied
        } else {
            ErrorKind::Unauthenticated
        });
        if why == Unauthenticated::NoRole {
            // Who it is is known; it simply may do nothing here.
            let err = RpcError::new(
                ErrorKind::PermissionDenied,
                "no rule gives this client certificate a role",
            );
            let mut doc = Vec::with_capacity(192);
            jsonrpc::write_error(&mut doc, &RequestId::null(), &err);
            self.write_json_keep(403, &doc, head.keep_alive, head.minor_version, None, now);
            return;
        }
        let (challenge, message) = match why {
            Unauthenticated::NoRole => unreachable!("answered above"),
            Unauthenticated::Missing => (
                "Bearer realm=\"agentd\"",
                "authentication required: present a bearer token",
            ),
            Unauthenticated::InvalidToken => (
                "Bearer realm=\"agentd\", error=\"invalid_token\"",
                "the presented credential is not valid here",
            ),
            Unauthenticated::Browser => (
                "Bearer realm=\"agentd\"",
                "browser requests must authenticate: a request with Origin is never the implicit operator",
            ),
        };
        let err = RpcError::new(ErrorKind::Unauthenticated, message);
        let mut doc = Vec::with_capacity(192);
        jsonrpc::write_error(&mut doc, &RequestId::null(), &err);
        let date = self.date(now);
        let mut h = Head::new(401, &date)
            .header("content-type", "application/json")
            .header("www-authenticate", challenge);
        self.finish_head(&mut h, head.minor_version, head.keep_alive, now);
        h.write_full(&mut self.out, &doc, false);
    }

    /// A read's answer of `len` bytes found the large-answers pool spent.
    fn large_refusal(&self, len: usize) -> RpcError {
        let cap = self.limits.large_answers_bytes;
        RpcError::new(
            ErrorKind::LimitReached,
            format!(
                "this answer ({len} bytes) waits for large answers other clients have not \
                 read yet (limits.large_answers_bytes = {cap}); try again shortly"
            ),
        )
        .with_meta("limit", "limits.large_answers_bytes")
        .with_meta("max", cap.to_string())
    }

    /// A JSON-RPC result holding one task: written whole when it fits the output bound;
    /// otherwise its head now and the task as the peer reads it. A read's large answer that
    /// finds the pool spent is refused instead.
    fn write_task_result(&mut self, answer: TaskAnswer, now: Now) {
        let TaskAnswer {
            mut json,
            id,
            keep_alive,
            minor,
            echo,
            acknowledges,
        } = answer;
        let mut prefix = Vec::with_capacity(48);
        prefix.extend_from_slice(b"{\"id\":");
        prefix.extend_from_slice(id.as_json().as_bytes());
        prefix.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":");
        json.wrap(&prefix, b"}");
        let bound = self.limits.max_output_bytes;
        let len = if json.likely_large(bound) {
            json.measure()
        } else {
            0
        };
        if len <= bound {
            self.write_json_keep(200, &json.to_vec(), keep_alive, minor, echo, now);
            return;
        }
        // The bytes are shared with the store while the task is unchanged, but a reader
        // that does not read keeps what the store has since replaced: the pool bounds that.
        if !acknowledges && !self.admit_large(len) {
            let err = self.large_refusal(len);
            self.write_error_reply(&err, &id, keep_alive, minor, now);
            return;
        }
        let date = self.date(now);
        let mut h = Head::new(200, &date).header("content-type", "application/json");
        if let Some(echo) = echo {
            h = h.header("a2a-extensions", echo);
        }
        self.finish_head(&mut h, minor, keep_alive, now);
        h.write_sized(&mut self.out, len);
        self.tail = Some(Tail {
            json,
            chunked: false,
            then: Vec::new(),
        });
        self.pump_tail();
    }

    /// A JSON answer; `echo` is the `A2A-Extensions` value of a successful one.
    fn write_json_keep(
        &mut self,
        status: u16,
        doc: &[u8],
        keep_alive: bool,
        minor: u8,
        echo: Option<String>,
        now: Now,
    ) {
        let date = self.date(now);
        let mut h = Head::new(status, &date).header("content-type", "application/json");
        if let Some(echo) = echo {
            h = h.header("a2a-extensions", echo);
        }
        self.finish_head(&mut h, minor, keep_alive, now);
        h.write_full(&mut self.out, doc, false);
    }

    /// A JSON-RPC error answer at the table's HTTP status, with `Retry-After` where the
    /// table gives one. A refused request echoes no extension.
    fn write_error_reply(
        &mut self,
        err: &RpcError,
        id: &RequestId,
        keep_alive: bool,
        minor: u8,
        now: Now,
    ) {
        self.note_error(err.kind);
        let mut doc = Vec::with_capacity(128);
        jsonrpc::write_error(&mut doc, id, err);
        let date = self.date(now);
        let mut h = Head::new(err.http_status(), &date).header("content-type", "application/json");
        if let Some(secs) = err.retry_after() {
            h = h.header("retry-after", secs.to_string());
        }
        self.finish_head(&mut h, minor, keep_alive, now);
        h.write_full(&mut self.out, &doc, false);
    }

    /// A response with no body beyond its status: refusals, preflights.
    fn write_simple(
        &mut self,
        status: u16,
        allow: Option<&'static str>,
        now: Now,
        head: &RequestHead,
        close: bool,
    ) {
        let date = self.date(now);
        let mut h = Head::new(status, &date);
        if let Some(allow) = allow {
            h = h.header("allow", allow);
        }
        if status == 204 && allow == Some(CARD_ALLOW) {
            // The card is public: any page may read it.
            h = h
                .header("access-control-allow-origin", "*")
                .header("access-control-allow-methods", CARD_ALLOW);
        }
        self.finish_head(&mut h, head.minor_version, head.keep_alive && !close, now);
        h.write_full(&mut self.out, b"", false);
    }

    /// Marks the head for closing or, for an HTTP/1.0 peer that asked, keeping alive.
    /// Completes the answer's record: this head is the answer (see [`crate::reqlog`]).
    fn finish_head(&mut self, h: &mut Head<'_>, minor: u8, keep_alive: bool, now: Now) {
        self.answered(h.status, now);
        self.cors_headers(h);
        if !keep_alive {
            h.close = true;
            self.closing = true;
        } else if minor == 0 {
            h.headers.push(("connection", Cow::Borrowed("keep-alive")));
        }
    }

    /// The CORS headers of the request being answered.
    fn cors_headers(&self, h: &mut Head<'_>) {
        match &self.cors {
            Cors::None => {}
            Cors::Refused => h.headers.push(("vary", Cow::Borrowed("Origin"))),
            Cors::Allowed {
                origin,
                preflight,
                private_network,
            } => {
                h.headers
                    .push(("access-control-allow-origin", Cow::Owned(origin.clone())));
                h.headers.push(("vary", Cow::Borrowed("Origin")));
                if *preflight {
                    h.headers.push((
                        "access-control-allow-methods",
                        Cow::Borrowed(crate::http::cors::ALLOW_METHODS),
                    ));
                    h.headers.push((
                        "access-control-allow-headers",
                        Cow::Borrowed(crate::http::cors::ALLOW_HEADERS),
                    ));
                    h.headers.push((
                        "access-control-max-age",
                        Cow::Borrowed(crate::http::cors::MAX_AGE),
                    ));
                    if *private_network {
                        h.headers.push((
                            "access-control-allow-private-network",
                            Cow::Borrowed("true"),
                        ));
                    }
                } else {
                    h.headers.push((
                        "access-control-expose-headers",
                        Cow::Borrowed(crate::http::cors::EXPOSE_HEADERS),
                    ));
                }
            }
        }
    }

    /// Answers a framing error and closes: after it the byte stream cannot be trusted.
    fn refuse_and_close(&mut self, status: u16, reason: &str, now: Now) {
        if self.keep == Keep::All && self.current.is_none() {
            // Bytes that never made a request head: recorded without a route.
            let started = self.head_started.unwrap_or(now.mono_ms);
            self.current = Some(Box::new(RequestRecord::new(None, started)));
        }
        self.answered(status, now);
        let date = self.date(now);
        let mut h = Head::new(status, &date).header("content-type", "text/plain; charset=utf-8");
        h.close = true;
        let body = format!("{reason}\n");
        h.write_full(&mut self.out, body.as_bytes(), false);
        self.closing = true;
    }
}

fn route(head: &RequestHead) -> Route {
    match head.path.as_str() {
        RPC_PATH => match head.method {
            Method::Post => {
                if is_json(head.header("content-type")) {
                    Route::Rpc
                } else {
                    Route::Refuse {
                        status: 415,
                        allow: None,
                    }
                }
            }
            Method::Options => Route::Options { allow: RPC_ALLOW },
            _ => Route::Refuse {
                status: 405,
                allow: Some(RPC_ALLOW),
            },
        },
        CARD_PATH => match head.method {
            Method::Get => Route::Card { head_only: false },
            Method::Head => Route::Card { head_only: true },
            Method::Options => Route::Options { allow: CARD_ALLOW },
            _ => Route::Refuse {
                status: 405,
                allow: Some(CARD_ALLOW),
            },
        },
        "*" => match head.method {
            Method::Options => Route::Options {
                allow: SERVER_ALLOW,
            },
            _ => Route::Refuse {
                status: 400,
                allow: None,
            },
        },
        _ => Route::Refuse {
            status: 404,
            allow: None,
        },
    }
}

/// Where a request stands with CORS: the JSON-RPC route and its preflight are gated by the
/// listed origins; the card is public (its own `access-control-allow-origin: *`).
fn cors_standing(inst: &Instance, head: &RequestHead, route: &Route) -> Cors {
    let Some(origin) = head.header("origin") else {
        return Cors::None;
    };
    if head.path != RPC_PATH && !matches!(route, Route::OAuth(_)) {
        return Cors::None;
    }
    if !inst.config().cors.admits(origin) {
        return Cors::Refused;
    }
    Cors::Allowed {
        origin: String::from_utf8_lossy(origin).trim().to_owned(),
        preflight: matches!(route, Route::Options { .. }),
        private_network: head
            .header("access-control-request-private-network")
            .is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"true")),
    }
}

/// `application/json`, any case, with or without parameters.
fn is_json(content_type: Option<&[u8]>) -> bool {
    let Some(ct) = content_type else { return false };
    let media = ct.split(|b| *b == b';').next().unwrap_or_default();
    let media = media.trim_ascii();
    media.eq_ignore_ascii_case(b"application/json")
}

/// `If-None-Match`: `*`, or a list of entity tags compared weakly.
fn etag_matches(header: &[u8], etag: &str) -> bool {
    let Ok(text) = std::str::from_utf8(header) else {
        return false;
    };
    text.split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::CounterEntropy;
    use crate::instance::{InstanceConfig, ListenerInfo, ListenerKind};

    fn setup() -> (Instance, Connection, Now) {
        let now = Now::new(0, 1_767_225_600_000);
        let config = InstanceConfig::new(vec![ListenerInfo {
            kind: ListenerKind::Tcp,
            url: "http://127.0.0.1:8420/".into(),
            loopback: true,
        }]);
        let inst = Instance::new(config.clone(), Box::new(CounterEntropy(1)), now);
        let waker = std::task::Waker::noop().clone();
        let mut conn = Connection::new(0, Peer::Tcp, config.conn, waker, now);
        conn.prepare(&inst);
        (inst, conn, now)
    }

    /// `receive` (outside the instance) parses the next request, head and body, so `serve`
    /// (under it) only answers; one request at most is parsed ahead.
    #[test]
    fn receive_parses_one_request_ahead_of_serve() {
        let (mut inst, mut conn, now) = setup();
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#;
        let one = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             A2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut two = [one.as_bytes(), body].concat();
        two.extend_from_within(..);
        assert!(conn.receive(&two, now));
        assert!(
            matches!(
                conn.ahead.iter().collect::<Vec<_>>().as_slice(),
                [Ok(Event::Head(_)), Ok(Event::Body(b))] if b.as_slice() == body
            ),
            "the first request is parsed: {:?}",
            conn.ahead
        );
        assert_eq!(
            conn.parser.buffered(),
            one.len() + body.len(),
            "the second is not"
        );
        conn.serve(&mut inst, now);
        assert!(
            conn.ahead.is_empty() && conn.parser.buffered() == 0,
            "both served"
        );
        assert!(!conn.produce(now));
        let out = String::from_utf8_lossy(conn.pending_output()).into_owned();
        assert_eq!(out.matches("-32001").count(), 2, "{out}");

        // Behind an answer framed by `produce`, the next request is parsed there too.
        let card = b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n";
        let n = conn.pending_output().len();
        conn.consume_output(n, now);
        assert!(conn.receive(&[&card[..], &card[..]].concat(), now));
        conn.serve(&mut inst, now);
        assert_eq!(
            conn.parser.buffered(),
            card.len(),
            "one card served, one buffered"
        );
        assert!(conn.produce(now), "the second card waits");
        assert_eq!(conn.parser.buffered(), 0, "parsed outside the instance");
        assert_eq!(conn.ahead.len(), 2);
        conn.serve(&mut inst, now);
        assert!(!conn.produce(now));
        let out = String::from_utf8_lossy(conn.pending_output()).into_owned();
        assert_eq!(out.matches("HTTP/1.1 200").count(), 2, "{out}");
    }
}
