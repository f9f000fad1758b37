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

mod records;
mod route;
mod service;
mod streams;
mod transport;

use route::{cors_standing, etag_matches, route, Cors, Route, CARD_ALLOW};
pub use route::{CARD_PATH, HEALTHZ_PATH, METRICS_PATH, READYZ_PATH, RPC_PATH};

use crate::metrics::{InstanceFigures, MethodLabel, Metrics, Sources};

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
        /// When this subscriber last took events: under a steady flow it takes them at most
        /// once per `events_batch_ms`, or sooner once [`FEED_BATCH`] wait (see
        /// [`Connection::pump_feed`]). None: never, or long enough ago.
        last_batch: Option<u64>,
        /// Events wait for a batch until then.
        linger: Option<u64>,
        /// The last pump stopped at its bounds, with events past the cursor: serve again once
        /// the output is written, with no wake-up to wait for.
        more: bool,
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
    /// The TCP peer's address, as the driver gave it ([`Connection::set_source`]): each
    /// request's `source` is read from it (and, from a trusted proxy, from the request's
    /// `X-Forwarded-For`).
    peer_addr: Option<std::net::IpAddr>,
    /// The `Strict-Transport-Security` value of a TLS listener's answers.
    hsts: Option<std::borrow::Cow<'static, str>>,
    /// The current request's number ([`Instance::next_request`]), for its made-up id.
    req_no: (u64, u64),
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
    /// Frames of the open stream or feed that [`Connection::serve`] took from the instance
    /// and [`Connection::produce`] writes (their JSON is built outside the instance), at
    /// most [`FRAMES_AHEAD`]. Nothing else is answered until they are written.
    frames: VecDeque<Frame>,
    /// The request the frames answer, and whether its stream is chunked.
    frames_for: (RequestId, bool),
    /// The instance's counters for `/metrics`, once prepared (this connection is counted
    /// open in them until it is closed or dropped).
    metrics: Option<Arc<Metrics>>,
    /// What the request being answered is counted under, and what refused it.
    m_method: MethodLabel,
    m_error: Option<ErrorKind>,
    /// A request is being answered and has not been counted yet.
    m_open: bool,
    /// This connection's open stream is counted in `agentd_streams_open`.
    m_stream: bool,
}

/// Frames taken from the instance ahead of the output: enough to fill a write, few enough
/// that a slow reader leaves the rest queued in the instance (where a stream that falls too
/// far behind is cut off).
const FRAMES_AHEAD: usize = 32;

/// Feed frames taken from the ring ahead of the output: a feed's frames are shared bytes
/// ([`crate::feed`] encodes each event once), so a subscriber takes a larger batch per poll
/// and writes it in one go.
const FEED_FRAMES_AHEAD: usize = 128;

/// Events that wake a feed subscriber which waits for a batch before its deadline.
const FEED_BATCH: u64 = 64;

/// A frame of a stream or of the events feed, decided under the instance and written
/// outside it. It shares what it carries (a task's event, a feed event's rendered data)
/// with the instance.
#[derive(Debug)]
enum Frame {
    /// A task stream's event, with its SSE id.
    Event {
        event_id: Option<String>,
        event: Arc<StreamResponse>,
    },
    /// An events-feed event: the frame encoded once, when it was pushed, and shared with
    /// every subscriber (it follows this stream's request id).
    Feed(Arc<[u8]>),
    /// Bytes framed already: a stream's error event, a feed's goodbye, a stream's end.
    Framed(Vec<u8>),
}

/// A JSON-RPC result as decided: already JSON, or a list page still to serialize.
#[derive(Debug)]
enum ResultBody {
    Json(Vec<u8>),
    Page(Box<crate::rpc::ListPage>),
}

/// An answer decided under the instance and not yet framed. It owns (or shares) everything
/// it needs, so framing it takes no instance.
#[derive(Debug)]
enum Deferred {
    /// A JSON-RPC result whose `result` member is already JSON (a list page, a push
    /// config, a message).
    Result {
        id: RequestId,
        result: ResultBody,
        keep_alive: bool,
        minor: u8,
        echo: Option<String>,
        /// It acknowledges a change: never refused for room in the large-answers pool.
        acknowledges: bool,
    },
    /// A JSON-RPC result holding one task, serialized from a snapshot that shares the
    /// store's content.
    Task(TaskAnswer),
    /// A method's refusal: its error object is rendered here.
    Error {
        err: Box<RpcError>,
        id: RequestId,
        keep_alive: bool,
        minor: u8,
    },
    /// `/metrics`: the core's counters and what it read of the instance, rendered here
    /// with the host's sources.
    Metrics {
        metrics: Arc<Metrics>,
        figures: Box<InstanceFigures>,
        sources: Sources,
        head_only: bool,
        keep_alive: bool,
        minor: u8,
    },
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
        self.release_metrics();
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

impl Connection {
    /// A new connection on `listener` (an index into the instance's listeners) from a peer
    /// the transport identified as `peer`. `waker` is woken when the connection has output to
    /// produce without new input (a task it watches changed).
    pub fn new(listener: usize, peer: Peer, limits: ConnLimits, waker: Waker, now: Now) -> Self {
        Connection {
            listener,
            peer,
            source: None,
            peer_addr: None,
            hsts: None,
            req_no: (0, 0),
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
            frames: VecDeque::new(),
            frames_for: (RequestId::null(), false),
            metrics: None,
            m_method: MethodLabel::Other,
            m_error: None,
            m_open: false,
            m_stream: false,
        }
    }

    /// The TCP peer's address, for the failure limiter (an IPv4 address, or the IPv6 /64 it
    /// is in). A driver calls it once, right after [`Connection::new`]; the unix-socket
    /// driver never does (its peers are the operator, decided by the kernel).
    pub fn set_source(&mut self, addr: std::net::IpAddr) {
        if matches!(self.peer, Peer::Tcp | Peer::Cert(_)) {
            self.source = Some(crate::limits::Source::of(addr));
            self.peer_addr = Some(addr);
        }
    }

    /// A request's head was read: its number, and the source it counts against (the peer,
    /// or on a listener behind a proxy, the client a trusted proxy's `X-Forwarded-For`
    /// names: see [`crate::proxy`]).
    pub(super) fn begin_request(&mut self, inst: &mut Instance, head: &crate::http::RequestHead) {
        self.req_no = inst.next_request();
        if let Some(addr) = self.peer_addr {
            let client = inst.config().proxy.client(self.listener, addr, head);
            self.source = Some(crate::limits::Source::of(client));
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
        inst.metrics.connection_opened();
        self.metrics = Some(inst.metrics.clone());
        if let Some(t) = inst.config().tls.get(&self.listener) {
            match crate::tls::TlsLayer::new(t) {
                Some(layer) => self.tls = Some(layer),
                None => self.aborted = true,
            }
            self.hsts = match inst.config().hsts_max_age_s {
                0 => None,
                crate::instance::DEFAULT_HSTS_MAX_AGE_S => {
                    Some(std::borrow::Cow::Borrowed("max-age=31536000"))
                }
                n => Some(std::borrow::Cow::Owned(format!("max-age={n}"))),
            };
        }
    }

    /// Prepares a connection its driver did not prepare, and takes the bytes it received
    /// before.
    fn prepare_late(&mut self, inst: &Instance, now: Now) {
        if !self.tls_checked {
            self.prepare(inst);
            let bytes = std::mem::take(&mut self.unprepared);
            if !self.aborted && !bytes.is_empty() {
                self.take_input(&bytes, now);
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

    /// The peer will send nothing more. What was asked is still answered; then it closes.
    pub fn handle_eof(&mut self, inst: &mut Instance, now: Now) {
        self.last_mono = now.mono_ms;
        self.prepare_late(inst, now);
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

    /// Whether [`Connection::serve`] should run again once the output is written, before
    /// waiting for anything: writing may have made room for more (a long replay, a stream's
    /// next frames). A feed subscriber that took every event it could see waits for the
    /// wake-up of the next one instead.
    pub fn serve_after_write(&self) -> bool {
        match self.state {
            State::Feed { more, .. } => more || self.closing,
            _ => true,
        }
    }

    /// The connection is done: close the socket, then call [`Connection::close`].
    pub fn is_finished(&self) -> bool {
        self.aborted || (self.closing && self.backlog() == 0 && !self.answering())
    }

    /// An answer is still being written: a large one's tail, one not yet framed, or a
    /// stream's frames not yet written. Nothing else is read or answered meanwhile, and no
    /// request's clock runs.
    fn answering(&self) -> bool {
        self.tail.is_some() || self.deferred.is_some() || !self.frames.is_empty()
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
        self.frames.clear();
        self.release_large(usize::MAX);
        self.release_metrics();
        self.closing = true;
        self.aborted = true;
    }

    /// This connection is no longer counted open (nor its stream).
    fn release_metrics(&mut self) {
        if let Some(m) = self.metrics.take() {
            if std::mem::take(&mut self.m_stream) {
                m.stream_closed();
            }
            m.connection_closed();
        }
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
                linger,
                ..
            } => {
                let due = (last_write + l.sse_keepalive_ms).min(*deadline);
                Some(linger.map_or(due, |t| t.min(due)))
            }
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
                linger,
                ..
            } => {
                if t >= *deadline {
                    self.end_feed(inst, Some(crate::feed::Goodbye::Deadline), now);
                    self.drive(inst, now);
                } else if linger.is_some_and(|d| t >= d) {
                    // The batch waited long enough: what there is goes out now.
                    *linger = None;
                    self.drive(inst, now);
                } else if t >= *last_write + l.sse_keepalive_ms {
                    *last_write = t;
                    // Frames waiting to be written are output enough.
                    if self.frames.is_empty() {
                        response::write_sse_comment(&mut self.out, "keep-alive", *chunked);
                        self.note_output(now);
                    }
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
                    // Not in the middle of a task frame still being written, nor ahead
                    // of frames waiting to be written (which are output enough).
                    if self.tail.is_none() && self.frames.is_empty() {
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
        assert!(conn.ahead.is_empty(), "the first is served");
        assert!(conn.pending_output().is_empty(), "and framed by produce");
        assert!(conn.produce(now), "the second waits");
        assert_eq!(
            conn.parser.buffered(),
            0,
            "parsed in produce, outside the instance"
        );
        assert_eq!(conn.ahead.len(), 2);
        conn.serve(&mut inst, now);
        assert!(!conn.produce(now));
        let out = String::from_utf8_lossy(conn.pending_output()).into_owned();
        assert_eq!(out.matches("-32001").count(), 2, "{out}");
    }

    /// Every subscriber's frame of an event is the one encoding the ring holds: nothing is
    /// serialized per subscriber, only its request id is written around the shared bytes.
    #[test]
    fn feed_subscribers_share_each_events_encoded_frame() {
        let now = Now::new(0, 1_767_225_600_000);
        let mut config = InstanceConfig::new(vec![ListenerInfo {
            kind: ListenerKind::Tcp,
            url: "http://127.0.0.1:8420/".into(),
            loopback: true,
        }]);
        config.events_enabled = true;
        let mut inst = Instance::new(config.clone(), Box::new(CounterEntropy(1)), now);
        let mut subs: Vec<Connection> = (0..5u64)
            .map(|i| {
                let waker = std::task::Waker::noop().clone();
                let mut conn = Connection::new(0, Peer::Tcp, config.conn, waker, now);
                conn.prepare(&inst);
                let body = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"method":"agentd.events/SubscribeToEvents","params":{{}}}}"#,
                    100 + i
                );
                let req = format!(
                    "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                     A2A-Version: 1.0\r\nA2A-Extensions: https://agentd.dev/a2a/ext/events\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                conn.handle_input(&mut inst, req.as_bytes(), now);
                let n = conn.pending_output().len();
                assert!(n > 0, "hello");
                conn.consume_output(n, now);
                conn
            })
            .collect();
        assert_eq!(inst.feed_subscribers(), 5);
        let event = crate::feed::FeedEvent::Other {
            kind: "config",
            data: serde_json::json!({"paths": ["agent.approval"], "source": "admin.set"}),
            owner: None,
        };
        inst.push_event(event, now).unwrap();
        for conn in subs.iter_mut() {
            conn.serve(&mut inst, now);
        }
        let ring = inst.feed().unwrap();
        let entry = ring.after(0).next().unwrap();
        assert_eq!(
            Arc::strong_count(&entry.frame),
            1 + subs.len(),
            "the ring's encoding and one share per subscriber"
        );
        for conn in &subs {
            match conn.frames.front() {
                Some(Frame::Feed(f)) => assert!(Arc::ptr_eq(f, &entry.frame)),
                other => panic!("a feed frame: {other:?}"),
            }
        }
        let shared = String::from_utf8_lossy(&entry.frame).into_owned();
        for (i, conn) in subs.iter_mut().enumerate() {
            conn.produce(now);
            let out = String::from_utf8_lossy(conn.pending_output()).into_owned();
            let frame = format!("data: {{\"id\":{}{shared}", 100 + i);
            assert_eq!(out, format!("{:x}\r\n{frame}\r\n", frame.len()));
            let doc: serde_json::Value =
                serde_json::from_str(frame.trim_start_matches("data: ").trim_end()).unwrap();
            assert_eq!(doc["result"]["event"]["seq"], 1);
            assert_eq!(doc["result"]["event"]["data"]["source"], "admin.set");
        }
        let entry = inst.feed().unwrap().after(0).next().unwrap();
        assert_eq!(Arc::strong_count(&entry.frame), 1, "written: no copy kept");
        assert_eq!(
            entry.data(),
            r#"{"paths":["agent.approval"],"source":"admin.set"}"#
        );
    }
}
