//! The request log's records. The core logs nothing itself (it reads no clock and does no
//! I/O): a [`crate::Connection`] asked to keep records ([`crate::Connection::keep_records`])
//! queues one small [`RequestRecord`] per answer, and the driver takes them
//! ([`crate::Connection::poll_request_record`]) after each call into the connection and
//! writes its log lines from them.
//!
//! When a record is made:
//!
//! - a complete response: once, when it is queued for the peer (written into the output,
//!   even while it is held for durability), [`Phase::Answered`];
//! - a stream (an SSE answer, or the events feed): once when its head is queued,
//!   [`Phase::StreamStarted`], and once when it ends, [`Phase::StreamEnded`];
//! - a request the connection dropped before its answer was complete (the peer went away or
//!   stopped reading, in the middle of a stream too): [`Phase::Abandoned`], at
//!   [`crate::Connection::close`].
//!
//! The duration is taken from the `now` values the connection was given: from the call
//! that read the request's head to the one that queued its answer (or ended its stream).
//!
//! Everything is bounded: labels are inline, at most [`LABEL_CAP`] bytes (a longer value is
//! cut and ends in `...`); a connection queues at most [`MAX_RECORDS`] records and counts
//! the ones it had to drop ([`crate::Connection::take_dropped_records`]). A connection that
//! keeps no records ([`Keep::Off`], the default) makes none and costs nothing.

use std::fmt;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::errors::ErrorKind;
use crate::http::{Method, RequestHead};
use crate::limits::Source;

/// Largest label, in bytes (routes, methods, task ids).
pub const LABEL_CAP: usize = 64;
/// Largest principal label, in bytes: a configured principal's whole id (`agent:` and up to
/// 128 bytes) fits.
pub(crate) const PRINCIPAL_CAP: usize = 140;
/// Records a connection queues before it drops new ones (a driver takes them after each
/// call into the connection, so only a burst of pipelined requests answered in one call can
/// reach it).
pub const MAX_RECORDS: usize = 16;

/// Which requests a connection keeps records of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Keep {
    /// None (the default): nothing is recorded or allocated.
    #[default]
    Off,
    /// Only the requests a limiter refused.
    Refusals,
    /// Every request.
    All,
}

/// A short string kept inline: no allocation, at most `N` bytes (at most 255). Control and
/// other invisible characters are replaced by `?`, so a label is safe to print on one line.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Label<const N: usize = LABEL_CAP> {
    len: u8,
    bytes: [u8; N],
}

/// A principal's id, as a label.
pub(crate) type PrincipalLabel = Label<PRINCIPAL_CAP>;

// A label's length is kept in a byte.
const _: () = assert!(LABEL_CAP <= 255 && PRINCIPAL_CAP <= 255);

impl<const N: usize> Label<N> {
    /// The empty label.
    pub const EMPTY: Label<N> = Label {
        len: 0,
        bytes: [0; N],
    };

    /// `text`, sanitized and cut to `N` bytes.
    pub(crate) fn new(text: &str) -> Label<N> {
        let mut l = Label::EMPTY;
        l.push(text);
        l
    }

    /// Appends `text`; false once the label is full (it then ends in `...`).
    fn push(&mut self, text: &str) -> bool {
        for c in text.chars() {
            let c = if c.is_ascii_graphic() || c == ' ' || (!c.is_ascii() && c.is_alphanumeric()) {
                c
            } else {
                '?'
            };
            let mut buf = [0u8; 4];
            let enc = c.encode_utf8(&mut buf).as_bytes();
            let len = usize::from(self.len);
            if len + enc.len() > N {
                self.cut();
                return false;
            }
            self.bytes[len..len + enc.len()].copy_from_slice(enc);
            self.len += enc.len() as u8;
        }
        true
    }

    /// Marks a label that did not fit: drops whole characters until `...` fits after them.
    fn cut(&mut self) {
        let mut len = usize::from(self.len).min(N - 3);
        while len > 0
            && !self
                .as_str_upto(usize::from(self.len))
                .is_char_boundary(len)
        {
            len -= 1;
        }
        self.bytes[len..len + 3].copy_from_slice(b"...");
        self.len = (len + 3) as u8;
    }

    fn as_str_upto(&self, len: usize) -> &str {
        // Only whole UTF-8 characters are ever written.
        std::str::from_utf8(&self.bytes[..len]).unwrap_or_default()
    }

    pub(crate) fn as_str(&self) -> &str {
        self.as_str_upto(usize::from(self.len))
    }

    /// Whether nothing was recorded (the request never got that far).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The label, or `None` when it is empty.
    pub fn get(&self) -> Option<&str> {
        (!self.is_empty()).then(|| self.as_str())
    }
}

impl<const N: usize> Default for Label<N> {
    fn default() -> Self {
        Label::EMPTY
    }
}

impl<const N: usize> fmt::Debug for Label<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> fmt::Display for Label<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<const N: usize> PartialEq<str> for Label<N> {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl<const N: usize> PartialEq<&str> for Label<N> {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Where in its life a request was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// A complete response was queued.
    Answered,
    /// A stream's head was queued; its end is recorded too.
    StreamStarted,
    /// A stream ended (its last frame was queued).
    StreamEnded,
    /// The connection closed before the answer was complete: `status` is what was already
    /// sent (200 for a stream), or 0 when nothing was.
    Abandoned,
}

impl Phase {
    /// The phase as log lines spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Answered => "answered",
            Phase::StreamStarted => "stream-started",
            Phase::StreamEnded => "stream-ended",
            Phase::Abandoned => "abandoned",
        }
    }
}

/// Which limiter refused a request (§7.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limiter {
    /// The failure limiter: too many failed credentials from the request's source address.
    SourceFailures,
    /// The principal's `quotas.rate`.
    PrincipalRate,
    /// `a2a.device_grant.rate`, the rate of a device-grant session.
    DeviceGrantRate,
    /// The OAuth endpoints' limits per source: device-authorization and token requests,
    /// and pending device codes.
    OAuthSource,
}

impl Limiter {
    /// The limiter as log lines spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Limiter::SourceFailures => "source-failures",
            Limiter::PrincipalRate => "principal-rate",
            Limiter::DeviceGrantRate => "device-grant-rate",
            Limiter::OAuthSource => "oauth-source",
        }
    }
}

/// A limiter's refusal of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Refusal {
    /// Which limiter refused it.
    pub limiter: Limiter,
    /// The `Retry-After` the answer carried.
    pub retry_after_s: u32,
    /// The TCP source the request came from (`None` on a unix socket).
    pub source: Option<Source>,
}

/// One request, as the request log shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestRecord {
    /// Where in the request's life this record was taken.
    pub phase: Phase,
    /// HTTP method and path: `GET /.well-known/agent-card.json`, `POST /`,
    /// `POST /oauth2/token`. Empty for bytes that never made a request head (a framing
    /// error or a head that did not arrive in time).
    pub route: Label,
    /// The JSON-RPC method (empty when the request is not a JSON-RPC call, or its body was
    /// not read: refused before its caller was known).
    pub method: Label,
    /// The HTTP status (0: nothing was answered).
    pub status: u16,
    /// The JSON-RPC error the answer carried, if it refused the request (its code and reason
    /// are [`RequestRecord::error_code`] and [`RequestRecord::error_reason`]).
    pub error: Option<ErrorKind>,
    /// Milliseconds from the request's head to this record.
    pub duration_ms: u64,
    /// Who asked, as the principal's id (`operator`, `user:alice`, `agent:peer-a`); empty
    /// when it was not established.
    pub principal: PrincipalLabel,
    /// The task the request concerns, when it names or created one.
    pub task_id: Label,
    /// Set when a limiter refused the request.
    pub refusal: Option<Refusal>,
    /// The request's id: its `X-Request-Id` (as a proxy or client set it: 1 to 64 visible
    /// ASCII characters), else one the instance made up, unique while it runs
    /// (`<start in epoch ms, hex>-<request number>`).
    pub request_id: Label,
    /// The trace id of the request's W3C `traceparent` header (32 lowercase hex digits),
    /// when it carries a valid one.
    pub trace_id: Label,
    /// The ids of the request's server span: set on an A2A request while the instance
    /// traces requests ([`crate::Instance::set_trace_requests`]); the host makes the span
    /// from the record with [`crate::trace::server_span`].
    pub span: Option<crate::trace::SpanIds>,
    /// The monotonic millisecond the request's head was read.
    pub(crate) started_ms: u64,
}

impl RequestRecord {
    /// A record of the request `head` names, read at `started_ms`.
    pub(crate) fn new(head: Option<&RequestHead>, started_ms: u64) -> RequestRecord {
        let mut route = Label::EMPTY;
        let mut request_id = Label::EMPTY;
        let mut trace_id = Label::EMPTY;
        if let Some(head) = head {
            if let Some(id) = head.header("x-request-id").filter(|v| {
                (1..=LABEL_CAP).contains(&v.len()) && v.iter().all(u8::is_ascii_graphic)
            }) {
                request_id = Label::new(std::str::from_utf8(id).unwrap_or_default());
            }
            if let Some(t) = head.header("traceparent").and_then(trace_of) {
                trace_id = Label::new(t);
            }
            let method = match &head.method {
                Method::Get => "GET",
                Method::Head => "HEAD",
                Method::Post => "POST",
                Method::Options => "OPTIONS",
                Method::Other(m) => m.as_str(),
            };
            if route.push(method) && route.push(" ") {
                route.push(&head.path);
            }
        }
        RequestRecord {
            phase: Phase::Answered,
            route,
            method: Label::EMPTY,
            status: 0,
            error: None,
            duration_ms: 0,
            principal: PrincipalLabel::EMPTY,
            task_id: Label::EMPTY,
            refusal: None,
            request_id,
            trace_id,
            span: None,
            started_ms,
        }
    }

    /// The JSON-RPC error code of the answer.
    pub fn error_code(&self) -> Option<i32> {
        self.error.map(|k| k.row().code)
    }

    /// The `google.rpc.ErrorInfo` reason of the answer's error.
    pub fn error_reason(&self) -> Option<&'static str> {
        self.error.and_then(|k| k.row().reason)
    }
}

/// The trace id of a W3C `traceparent` value, as [`crate::trace::TraceContext::parse`]
/// reads it: `None` for an invalid one.
fn trace_of(value: &[u8]) -> Option<&str> {
    crate::trace::TraceContext::parse(value, None)?;
    let text = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    text.get(3..35)
}

/// Records a connection could not queue, since they were last taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Records dropped, refusals included.
    pub records: u32,
    /// Of them, limiter refusals.
    pub refusals: u32,
}

impl Dropped {
    /// Whether nothing was dropped (no log line is owed).
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }
}

/// An IPv4 address, or an IPv6 /64 as `prefix::/64`.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Source::V4(a) => std::net::Ipv4Addr::from(a).fmt(f),
            Source::V6Prefix(p) => {
                let mut full = [0u8; 16];
                full[..8].copy_from_slice(&p);
                write!(f, "{}/64", std::net::Ipv6Addr::from(full))
            }
            Source::Loopback => f.write_str("127.0.0.0/8"),
        }
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Ids<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "taskId")]
    task_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
    #[serde(borrow, default)]
    task: Option<&'a RawValue>,
}

/// A JSON string's text as a label; empty for anything else.
fn text(raw: Option<&RawValue>) -> Label {
    let Some(raw) = raw else {
        return Label::EMPTY;
    };
    if let Ok(s) = serde_json::from_str::<&str>(raw.get()) {
        return Label::new(s);
    }
    // Escapes: rare, and only while every request is recorded.
    serde_json::from_str::<String>(raw.get())
        .map(|s| Label::new(&s))
        .unwrap_or_default()
}

fn ids(raw: Option<&RawValue>) -> Option<Ids<'_>> {
    serde_json::from_str(raw?.get()).ok()
}

/// A JSON-RPC body's method, and the task its params name (`id` of the task methods,
/// `taskId` of the push-config methods, `message.taskId` of a send). A second, shallow read
/// of the body (the call's own parse is the rpc module's): made only while every request is
/// recorded, and only for a caller already authenticated.
pub(crate) fn peek_call(body: &[u8]) -> (Label, Label) {
    let Ok(env) = serde_json::from_slice::<Envelope<'_>>(body) else {
        return (Label::EMPTY, Label::EMPTY);
    };
    let method = text(env.method);
    let task = match method.as_str() {
        "GetTask" | "CancelTask" | "SubscribeToTask" => ids(env.params).map(|p| text(p.id)),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => ids(env.params).map(|p| text(p.task_id)),
        "SendMessage" | "SendStreamingMessage" => ids(env.params)
            .and_then(|p| ids(p.message))
            .map(|m| text(m.task_id)),
        _ => None,
    };
    (method, task.unwrap_or_default())
}

/// The id of the task a send's result (`{"task": {"id": ...}}`) holds.
pub(crate) fn peek_result_task(result: &[u8]) -> Label {
    serde_json::from_slice::<Ids<'_>>(result)
        .ok()
        .and_then(|r| ids(r.task))
        .map(|t| text(t.id))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_and_printable() {
        type L = Label<LABEL_CAP>;
        assert_eq!(L::new("GetTask"), "GetTask");
        assert_eq!(L::new("a\nb\u{202e}c\u{7f}é"), "a?b?c?é");
        let long = "x".repeat(100);
        let l = L::new(&long);
        assert_eq!(l.as_str().len(), LABEL_CAP);
        assert!(l.as_str().ends_with("..."));
        // Cut on a character boundary.
        let wide = "é".repeat(40);
        let l = L::new(&wide);
        assert!(l.as_str().len() <= LABEL_CAP && l.as_str().ends_with("..."));
        assert!(L::new("").get().is_none());
        let p = PrincipalLabel::new(&format!("agent:{}", "p".repeat(128)));
        assert_eq!(p.as_str().len(), 134, "a whole principal id fits");
    }

    #[test]
    fn peeks() {
        let (m, t) =
            peek_call(br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"t-1"}}"#);
        assert_eq!((m.as_str(), t.as_str()), ("GetTask", "t-1"));
        let (m, t) = peek_call(
            br#"{"id":1,"method":"SendMessage","params":{"message":{"taskId":"t\u002d2","parts":[]}}}"#,
        );
        assert_eq!((m.as_str(), t.as_str()), ("SendMessage", "t-2"));
        let (m, t) = peek_call(
            br#"{"method":"GetTaskPushNotificationConfig","params":{"id":"c","taskId":"t-3"}}"#,
        );
        assert_eq!(
            (m.as_str(), t.as_str()),
            ("GetTaskPushNotificationConfig", "t-3")
        );
        let (m, t) = peek_call(br#"{"method":"GetTask","params":{"id":7}}"#);
        assert_eq!((m.as_str(), t.as_str()), ("GetTask", ""));
        assert_eq!(peek_call(b"not json"), (Label::EMPTY, Label::EMPTY));
        assert_eq!(
            peek_result_task(br#"{"task":{"contextId":"c","id":"t-4","status":{}}}"#),
            "t-4"
        );
        assert!(peek_result_task(br#"{"message":{}}"#).is_empty());
    }

    #[test]
    fn sources_print() {
        assert_eq!(Source::V4([192, 0, 2, 1]).to_string(), "192.0.2.1");
        let v6 = Source::of("2001:db8:1:2::9".parse().unwrap());
        assert_eq!(v6.to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn trace_ids_are_read_from_valid_traceparents_only() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let ok = format!("00-{t}-00f067aa0ba902b7-01");
        assert_eq!(trace_of(ok.as_bytes()), Some(t));
        // A later version may carry more fields; version 00 may not.
        let later = format!("01-{t}-00f067aa0ba902b7-01-extra");
        assert_eq!(trace_of(later.as_bytes()), Some(t));
        for bad in [
            format!("00-{t}-00f067aa0ba902b7-01-extra"),
            format!("ff-{t}-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", t.to_uppercase()),
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("00-{t}-0000000000000000-01"),
            format!("00-{t}-00f067aa0ba902b7"),
            "garbage".to_owned(),
        ] {
            assert_eq!(trace_of(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn a_record_takes_the_request_id_and_trace_id_from_the_head() {
        let head = |extra: &str| {
            let mut p = crate::http::RequestParser::new(crate::http::HttpLimits::DEFAULT);
            p.push(format!("GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n").as_bytes());
            match p.next_event() {
                Ok(Some(crate::http::Event::Head(h))) => h,
                other => panic!("{other:?}"),
            }
        };
        let h = head("X-Request-Id: abc-123\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n");
        let r = RequestRecord::new(Some(&h), 0);
        assert_eq!(r.request_id, "abc-123");
        assert_eq!(r.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        // An id with a space, or longer than a label, is not taken (the connection then
        // makes one up).
        let long = format!("X-Request-Id: {}\r\n", "x".repeat(65));
        for extra in ["X-Request-Id: a b\r\n", long.as_str(), ""] {
            let r = RequestRecord::new(Some(&head(extra)), 0);
            assert!(r.request_id.is_empty() && r.trace_id.is_empty(), "{extra}");
        }
    }
}
