//! W3C Trace Context (`traceparent`, `tracestate`) and spans in the OTLP/HTTP JSON encoding.
//!
//! The core reads the context of every inbound A2A request and hands it to the host with the
//! work the request starts ([`crate::Effect::Turn`], [`crate::Effect::Command`],
//! [`crate::Effect::Deliver`]), so the host can carry it on: into an agent's turn line, an
//! exec step's environment, and the `traceparent` header of its outbound calls.
//!
//! With [`crate::Instance::set_trace_requests`] on, the core also gives each A2A request a
//! *server span*: a span id drawn from the instance's entropy (the host's randomness: the
//! core has none of its own), a child of the caller's span, or the root of a new trace when
//! the request carried no valid `traceparent`. The request's [`crate::reqlog::RequestRecord`]
//! carries its ids ([`SpanIds`]); the host makes the span from the record
//! ([`server_span`]) with the times its own clock gives, and exports it
//! ([`encode_traces`]). The work the request hands out then names the server span as its
//! parent.
//!
//! Parsing is strict (version `00` is exactly `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, no
//! all-zero id; a later version may add fields after them; version `ff` is invalid): a value
//! that does not parse is ignored, as if there were none. `tracestate` is kept only beside a
//! valid `traceparent`, only up to [`TRACESTATE_CAP`] bytes of visible ASCII, and dropped
//! whole otherwise (never cut: a cut list would carry a broken member).

use serde_json::{json, Value};

use crate::http::RequestHead;
use crate::ids::{hex, Entropy};
use crate::reqlog::RequestRecord;

/// Largest `tracestate` kept, in bytes; a longer one is dropped. (W3C allows 32 members of
/// up to 256 bytes each; 512 bytes is what it asks a vendor to propagate at least.)
pub const TRACESTATE_CAP: usize = 512;

/// The sampled flag of `trace-flags`.
pub const SAMPLED: u8 = 0x01;

/// A trace context as W3C `traceparent` (and `tracestate`) carry it: the trace, the span the
/// next hop's spans are children of, the flags, and the vendors' state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The parent-id field: the span the receiver's spans are children of (never all zero).
    pub span_id: [u8; 8],
    /// `trace-flags`; bit 0 is [`SAMPLED`].
    pub flags: u8,
    /// `tracestate`, as received (at most [`TRACESTATE_CAP`] bytes), if any.
    tracestate: Option<Box<str>>,
}

impl TraceContext {
    /// A new trace's root context, sampled.
    pub fn root(trace_id: [u8; 16], span_id: [u8; 8]) -> TraceContext {
        TraceContext {
            trace_id,
            span_id,
            flags: SAMPLED,
            tracestate: None,
        }
    }

    /// The context of a `traceparent` value and, beside it, a `tracestate` value. `None`
    /// when `traceparent` is not valid; a `tracestate` that is not valid or longer than
    /// [`TRACESTATE_CAP`] is dropped, the context kept.
    pub fn parse(traceparent: &[u8], tracestate: Option<&[u8]>) -> Option<TraceContext> {
        let text = std::str::from_utf8(traceparent)
            .ok()?
            .trim_matches([' ', '\t']);
        let b = text.as_bytes();
        // version "-" trace-id "-" parent-id "-" trace-flags: 2+1+32+1+16+1+2.
        if b.len() < 55 {
            return None;
        }
        let version = u8_of(&b[0..2])?;
        if version == 0xff || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        match b.len() {
            55 => {}
            // A later version may add fields, each after a dash; version 00 may not.
            _ if version != 0 && b[55] == b'-' => {}
            _ => return None,
        }
        let mut trace_id = [0u8; 16];
        for (i, out) in trace_id.iter_mut().enumerate() {
            *out = u8_of(&b[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, out) in span_id.iter_mut().enumerate() {
            *out = u8_of(&b[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = u8_of(&b[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let tracestate = tracestate.and_then(|s| {
            let s = std::str::from_utf8(s).ok()?.trim_matches([' ', '\t']);
            let ok = !s.is_empty()
                && s.len() <= TRACESTATE_CAP
                && s.bytes().all(|c| c == b' ' || c.is_ascii_graphic());
            ok.then(|| s.into())
        });
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
            tracestate,
        })
    }

    /// The context a request's `traceparent` and `tracestate` headers carry, if valid.
    pub fn of_head(head: &RequestHead) -> Option<TraceContext> {
        TraceContext::parse(head.header("traceparent")?, head.header("tracestate"))
    }

    /// The same trace, flags and state, with `span_id` as the parent of what follows.
    pub fn child(&self, span_id: [u8; 8]) -> TraceContext {
        TraceContext {
            span_id,
            ..self.clone()
        }
    }

    /// The `traceparent` value: `00-<trace id>-<span id>-<flags>`, lowercase hex.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{}",
            hex(&self.trace_id),
            hex(&self.span_id),
            hex(&[self.flags])
        )
    }

    /// The `tracestate` value to pass on, if one was received.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// Whether the caller may be recording this trace (the sampled flag).
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

/// One byte of two lowercase hex digits.
fn u8_of(two: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(two[0])? << 4 | d(two[1])?)
}

/// A new span id from `entropy` (never all zero).
pub fn new_span_id(entropy: &mut dyn Entropy) -> [u8; 8] {
    let mut id = [0u8; 8];
    while id == [0; 8] {
        entropy.fill(&mut id);
    }
    id
}

/// A new trace id from `entropy` (never all zero).
pub fn new_trace_id(entropy: &mut dyn Entropy) -> [u8; 16] {
    let mut id = [0u8; 16];
    while id == [0; 16] {
        entropy.fill(&mut id);
    }
    id
}

/// The ids of a request's server span, as its record carries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanIds {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The server span's own id.
    pub span_id: [u8; 8],
    /// The caller's span, when the request carried a valid `traceparent`.
    pub parent_span_id: Option<[u8; 8]>,
    /// The trace's flags.
    pub flags: u8,
}

/// What a span is to its trace (OTLP `SpanKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// Work inside the process.
    Internal = 1,
    /// An inbound request served.
    Server = 2,
    /// An outbound request made.
    Client = 3,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrValue {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
}

/// A finished span, ready to encode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The span's id.
    pub span_id: [u8; 8],
    /// Its parent's id; `None` for a trace's root.
    pub parent_span_id: Option<[u8; 8]>,
    /// The operation: the A2A method of a server span, `a2a.send peer` of a client span.
    pub name: String,
    /// Server, client or internal.
    pub kind: SpanKind,
    /// Start, in nanoseconds since the Unix epoch.
    pub start_unix_nano: u64,
    /// End, in nanoseconds since the Unix epoch.
    pub end_unix_nano: u64,
    /// Its attributes, in order.
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// Why it failed (the span's status is then `ERROR`); `None` leaves the status unset.
    pub error: Option<String>,
}

/// The server span of a request record that carries span ids ([`RequestRecord::span`]):
/// named by its JSON-RPC method (its route when it has none), ending at `end_unix_nano` and
/// starting the record's duration before. Attributes: `rpc.system` (`jsonrpc`),
/// `rpc.method`, `http.route`, `http.response.status_code`, `a2a.task_id`,
/// `agentd.request_id`, and `rpc.jsonrpc.error_code` and `error.type` (the A2A reason) of a
/// refusal, whose span is an error. `None` for a record with no span ids.
pub fn server_span(r: &RequestRecord, end_unix_nano: u64) -> Option<Span> {
    let ids = r.span?;
    let start = end_unix_nano.saturating_sub(r.duration_ms.saturating_mul(1_000_000));
    let mut attributes = vec![("rpc.system", AttrValue::Str("jsonrpc".into()))];
    if let Some(m) = r.method.get() {
        attributes.push(("rpc.method", AttrValue::Str(m.into())));
    }
    if let Some(route) = r.route.get() {
        attributes.push(("http.route", AttrValue::Str(route.into())));
    }
    attributes.push((
        "http.response.status_code",
        AttrValue::Int(i64::from(r.status)),
    ));
    if let Some(t) = r.task_id.get() {
        attributes.push(("a2a.task_id", AttrValue::Str(t.into())));
    }
    if let Some(id) = r.request_id.get() {
        attributes.push(("agentd.request_id", AttrValue::Str(id.into())));
    }
    let mut error = None;
    if let Some(code) = r.error_code() {
        attributes.push(("rpc.jsonrpc.error_code", AttrValue::Int(i64::from(code))));
        let reason = r.error_reason().unwrap_or("error");
        attributes.push(("error.type", AttrValue::Str(reason.into())));
        error = Some(reason.to_owned());
    } else if r.status >= 500 || r.status == 0 {
        error = Some(format!("HTTP status {}", r.status));
    }
    let name = r
        .method
        .get()
        .or(r.route.get())
        .unwrap_or("request")
        .to_owned();
    Some(Span {
        trace_id: ids.trace_id,
        span_id: ids.span_id,
        parent_span_id: ids.parent_span_id,
        name,
        kind: SpanKind::Server,
        start_unix_nano: start,
        end_unix_nano: end_unix_nano.max(start),
        attributes,
        error,
    })
}

fn attr_json(key: &str, v: &AttrValue) -> Value {
    let value = match v {
        AttrValue::Str(s) => json!({ "stringValue": s }),
        // OTLP/JSON carries 64-bit integers as decimal strings.
        AttrValue::Int(i) => json!({ "intValue": i.to_string() }),
    };
    json!({ "key": key, "value": value })
}

/// The body of an OTLP/HTTP JSON export (`POST <collector>/v1/traces`,
/// `Content-Type: application/json`): one resource named `service_name`
/// (`service.name`), one instrumentation scope `agentd`, and `spans`. Ids are lowercase
/// hex, times decimal strings of nanoseconds since the Unix epoch, as the OTLP JSON mapping
/// says.
pub fn encode_traces(service_name: &str, spans: &[Span]) -> Vec<u8> {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut span = json!({
                "traceId": hex(&s.trace_id),
                "spanId": hex(&s.span_id),
                "name": s.name,
                "kind": s.kind as u8,
                "startTimeUnixNano": s.start_unix_nano.to_string(),
                "endTimeUnixNano": s.end_unix_nano.to_string(),
                "attributes": s.attributes.iter().map(|(k, v)| attr_json(k, v)).collect::<Vec<_>>(),
                "status": match &s.error {
                    None => json!({}),
                    Some(m) => json!({ "code": 2, "message": m }),
                },
            });
            if let Some(p) = s.parent_span_id {
                span["parentSpanId"] = json!(hex(&p));
            }
            span
        })
        .collect();
    let doc = json!({
        "resourceSpans": [{
            "resource": {
                "attributes": [attr_json("service.name", &AttrValue::Str(service_name.into()))]
            },
            "scopeSpans": [{
                "scope": { "name": "agentd", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }]
    });
    serde_json::to_vec(&doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const P: &str = "00f067aa0ba902b7";

    fn parse(s: &str) -> Option<TraceContext> {
        TraceContext::parse(s.as_bytes(), None)
    }

    #[test]
    fn a_valid_traceparent_parses_and_formats_back() {
        let v = format!("00-{T}-{P}-01");
        let c = parse(&v).expect("valid");
        assert_eq!(c.trace_id_hex(), T);
        assert_eq!(hex(&c.span_id), P);
        assert_eq!(c.flags, 1);
        assert!(c.sampled());
        assert_eq!(c.traceparent(), v);
        let unsampled = parse(&format!("00-{T}-{P}-00")).unwrap();
        assert!(!unsampled.sampled());
        assert_eq!(unsampled.traceparent(), format!("00-{T}-{P}-00"));
        // Surrounding whitespace (OWS) is not part of the value.
        assert!(parse(&format!(" 00-{T}-{P}-01\t")).is_some());
        // A child keeps the trace, the flags and the state.
        let c = TraceContext::parse(v.as_bytes(), Some(b"congo=t61rcWkgMzE")).unwrap();
        let child = c.child([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(child.traceparent(), format!("00-{T}-0102030405060708-01"));
        assert_eq!(child.tracestate(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn versions_other_than_00() {
        // A later version may add fields; it is read as version 00.
        let c = parse(&format!("01-{T}-{P}-01-what-comes-next")).unwrap();
        assert_eq!(c.traceparent(), format!("00-{T}-{P}-01"));
        assert!(parse(&format!("cc-{T}-{P}-01")).is_some());
        for bad in [
            format!("ff-{T}-{P}-01"),
            format!("00-{T}-{P}-01-extra"),
            format!("01-{T}-{P}-01x"),
            format!("0-{T}-{P}-01"),
            format!("0g-{T}-{P}-01"),
        ] {
            assert_eq!(parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        let zeros32 = "0".repeat(32);
        for bad in [
            format!("00-{zeros32}-{P}-01"),
            format!("00-{T}-0000000000000000-01"),
            format!("00-{}-{P}-01", T.to_uppercase()),
            format!("00-{T}-{}-01", P.to_uppercase()),
            format!("00-{T}-{P}-0A"),
            format!("00-{T}-{P}"),
            format!("00-{T}-{P}-1"),
            format!("00-{}-{P}-01", &T[1..]),
            format!("00-{T}0-{P}-01"),
            format!("00-{T}-{}-01", &P[1..]),
            format!("00_{T}_{P}_01"),
            String::new(),
            "garbage".into(),
        ] {
            assert_eq!(parse(&bad), None, "{bad:?}");
        }
        assert_eq!(TraceContext::parse(b"\xff\xfe", None), None);
    }

    #[test]
    fn tracestate_is_bounded_and_dropped_whole() {
        let tp = format!("00-{T}-{P}-01");
        let ok = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
        let c = TraceContext::parse(tp.as_bytes(), Some(ok.as_bytes())).unwrap();
        assert_eq!(c.tracestate(), Some(ok));
        let long = format!("a={}", "x".repeat(TRACESTATE_CAP));
        let c = TraceContext::parse(tp.as_bytes(), Some(long.as_bytes())).unwrap();
        assert_eq!(c.tracestate(), None, "too long: dropped, the context kept");
        let at_cap = format!("a={}", "x".repeat(TRACESTATE_CAP - 2));
        let c = TraceContext::parse(tp.as_bytes(), Some(at_cap.as_bytes())).unwrap();
        assert_eq!(c.tracestate().map(str::len), Some(TRACESTATE_CAP));
        for bad in [&b"a=1\nb=2"[..], b"", b"  ", b"a=\xc3\xa9"] {
            let c = TraceContext::parse(tp.as_bytes(), Some(bad)).unwrap();
            assert_eq!(c.tracestate(), None, "{bad:?}");
        }
        // No tracestate without a valid traceparent.
        assert_eq!(TraceContext::parse(b"bad", Some(ok.as_bytes())), None);
    }

    #[test]
    fn new_ids_are_never_zero() {
        struct Zeros(u8);
        impl Entropy for Zeros {
            fn fill(&mut self, buf: &mut [u8]) {
                // Zeros the first time, then ones.
                buf.fill(self.0);
                self.0 = 1;
            }
        }
        assert_eq!(new_span_id(&mut Zeros(0)), [1; 8]);
        assert_eq!(new_trace_id(&mut Zeros(0)), [1; 16]);
    }

    #[test]
    fn a_span_encodes_as_otlp_json() {
        let span = Span {
            trace_id: parse(&format!("00-{T}-{P}-01")).unwrap().trace_id,
            span_id: [0xab; 8],
            parent_span_id: Some([0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08]),
            name: "SendMessage".into(),
            kind: SpanKind::Server,
            start_unix_nano: 1_767_225_600_000_000_000,
            end_unix_nano: 1_767_225_600_250_000_000,
            attributes: vec![
                ("rpc.method", AttrValue::Str("SendMessage".into())),
                ("http.response.status_code", AttrValue::Int(200)),
            ],
            error: None,
        };
        let mut failed = span.clone();
        failed.parent_span_id = None;
        failed.kind = SpanKind::Client;
        failed.error = Some("TASK_NOT_FOUND \"x\"".into());
        let body = encode_traces("front \"1\"", &[span, failed]);
        let doc: Value = serde_json::from_slice(&body).unwrap();
        let rs = &doc["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0],
            json!({"key": "service.name", "value": {"stringValue": "front \"1\""}})
        );
        assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "agentd");
        let spans = rs["scopeSpans"][0]["spans"].as_array().unwrap();
        assert_eq!(spans.len(), 2);
        assert_eq!(
            spans[0],
            json!({
                "traceId": T,
                "spanId": "abababababababab",
                "parentSpanId": "0102030405060708",
                "name": "SendMessage",
                "kind": 2,
                "startTimeUnixNano": "1767225600000000000",
                "endTimeUnixNano": "1767225600250000000",
                "attributes": [
                    {"key": "rpc.method", "value": {"stringValue": "SendMessage"}},
                    {"key": "http.response.status_code", "value": {"intValue": "200"}},
                ],
                "status": {},
            })
        );
        assert!(spans[1].get("parentSpanId").is_none(), "a root has none");
        assert_eq!(spans[1]["kind"], 3);
        assert_eq!(
            spans[1]["status"],
            json!({"code": 2, "message": "TASK_NOT_FOUND \"x\""})
        );
    }

    #[test]
    fn a_record_with_span_ids_makes_a_server_span() {
        let mut r = RequestRecord::new(None, 0);
        assert_eq!(server_span(&r, 5), None, "no ids, no span");
        r.method = crate::reqlog::Label::new("GetTask");
        r.task_id = crate::reqlog::Label::new("t-1");
        r.status = 200;
        r.duration_ms = 3;
        r.error = Some(crate::errors::ErrorKind::TaskNotFound);
        r.span = Some(SpanIds {
            trace_id: [7; 16],
            span_id: [8; 8],
            parent_span_id: Some([9; 8]),
            flags: 1,
        });
        let s = server_span(&r, 10_000_000).unwrap();
        assert_eq!(s.name, "GetTask");
        assert_eq!(s.kind, SpanKind::Server);
        assert_eq!(
            (s.start_unix_nano, s.end_unix_nano),
            (7_000_000, 10_000_000)
        );
        assert_eq!(s.parent_span_id, Some([9; 8]));
        assert_eq!(s.error.as_deref(), Some("TASK_NOT_FOUND"));
        assert!(s
            .attributes
            .contains(&("a2a.task_id", AttrValue::Str("t-1".into()))));
        assert!(s
            .attributes
            .contains(&("rpc.jsonrpc.error_code", AttrValue::Int(-32001))));
    }
}
