//! An incremental HTTP/1.1 request parser on `httparse`.
//!
//! Bytes arrive in any split ([`RequestParser::push`]); [`RequestParser::next_event`] yields a
//! request's head as soon as it is complete and its body once all of it is in, so a caller
//! can refuse a request from its head alone and can answer `Expect: 100-continue`. Pipelined
//! requests stay buffered until the caller asks for them. Framing errors are final: the
//! caller answers the [`HttpError`] and closes, because after a framing error the byte
//! stream can no longer be trusted to delimit requests (request smuggling).

use super::HttpLimits;

/// The request methods agentd routes; anything else is kept by name for a 405.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Head,
    Post,
    Options,
    Other(String),
}

impl Method {
    fn parse(s: &str) -> Method {
        match s {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "OPTIONS" => Method::Options,
            other => Method::Other(other.to_owned()),
        }
    }
}

/// How the body of a request is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request line and header block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    pub(crate) method: Method,
    /// The path, without the query string.
    pub path: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Header fields in arrival order; names lower-cased, values as sent.
    pub headers: Vec<(String, Vec<u8>)>,
    /// How the body that follows is delimited.
    pub body: BodyKind,
    /// Whether the client allows the connection to stay open after this request.
    pub(crate) keep_alive: bool,
    /// The client sent `Expect: 100-continue` and has a body to send.
    pub(crate) expect_continue: bool,
}

impl RequestHead {
    /// The first value of a header, by lower-case name.
    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of a header, in arrival order.
    pub(crate) fn header_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    pub(crate) fn has_body(&self) -> bool {
        !matches!(self.body, BodyKind::None | BodyKind::Length(0))
    }
}

/// What the parser has for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A complete head. Its body (possibly empty) follows as [`Event::Body`].
    Head(RequestHead),
    /// The whole decoded body of the request whose head came last.
    Body(Vec<u8>),
}

/// A framing refusal: the status to answer with; the connection closes after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpError {
    pub(crate) status: u16,
    pub(crate) reason: &'static str,
}

impl HttpError {
    const fn new(status: u16, reason: &'static str) -> Self {
        HttpError { status, reason }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.reason)
    }
}

impl std::error::Error for HttpError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for a complete head; the end of head is searched from `scan_from`.
    Head {
        scan_from: usize,
    },
    /// Head delivered; the body has `remaining` bytes still to arrive.
    Length {
        remaining: usize,
    },
    /// Head delivered; the body is chunked (the decoder the outbound client shares).
    Chunked(super::chunked::Decoder),
    Failed,
}

/// The incremental parser of one connection's request stream.
#[derive(Debug)]
pub struct RequestParser {
    limits: HttpLimits,
    buf: Vec<u8>,
    state: State,
    body: Vec<u8>,
    /// Bytes of `buf` already consumed by the chunk decoder.
    pos: usize,
}

impl RequestParser {
    /// A parser for one connection's requests, within `limits`.
    pub fn new(limits: HttpLimits) -> Self {
        RequestParser {
            limits,
            buf: Vec::new(),
            state: State::Head { scan_from: 0 },
            body: Vec::new(),
            pos: 0,
        }
    }

    /// Appends bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.state != State::Failed {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// Bytes received and not yet delivered as part of a request.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// True between requests with nothing buffered: a clean place for the peer to hang up.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.state, State::Head { .. })
            && self.buf.iter().all(|b| matches!(b, b'\r' | b'\n'))
    }

    /// True once a head has arrived and its body is still incomplete.
    pub(crate) fn in_body(&self) -> bool {
        matches!(self.state, State::Length { .. } | State::Chunked(_))
    }

    /// True while part of a head has arrived.
    pub(crate) fn in_head(&self) -> bool {
        matches!(self.state, State::Head { .. }) && !self.is_idle()
    }

    /// The next event, `Ok(None)` when more bytes are needed.
    pub fn next_event(&mut self) -> Result<Option<Event>, HttpError> {
        let r = self.step();
        if r.is_err() {
            self.state = State::Failed;
            self.buf = Vec::new();
            self.body = Vec::new();
            self.pos = 0;
        }
        r
    }

    fn step(&mut self) -> Result<Option<Event>, HttpError> {
        match self.state {
            State::Failed => Err(HttpError::new(400, "connection already failed")),
            State::Head { scan_from } => self.parse_head(scan_from),
            State::Length { remaining } => {
                let take = remaining.min(self.buf.len() - self.pos);
                if take < remaining {
                    return Ok(None);
                }
                let body = self.buf[self.pos..self.pos + take].to_vec();
                self.consume(self.pos + take);
                self.state = State::Head { scan_from: 0 };
                Ok(Some(Event::Body(body)))
            }
            State::Chunked(_) => self.decode_chunked(),
        }
    }

    fn consume(&mut self, upto: usize) {
        self.buf.drain(..upto);
        self.pos = 0;
    }

    fn parse_head(&mut self, scan_from: usize) -> Result<Option<Event>, HttpError> {
        // RFC 9112 §2.2: ignore empty lines before the request line.
        let leading = self
            .buf
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .count();
        if leading > 0 {
            self.buf.drain(..leading);
        }
        let Some(end) = find_head_end(&self.buf, scan_from.saturating_sub(leading)) else {
            if self.buf.len() > self.limits.max_header_bytes {
                return Err(HttpError::new(431, "request header block too large"));
            }
            self.state = State::Head {
                scan_from: self.buf.len(),
            };
            return Ok(None);
        };
        if end > self.limits.max_header_bytes {
            return Err(HttpError::new(431, "request header block too large"));
        }
        let head = self.parse_head_block(end)?;
        self.consume(end);
        self.state = match head.body {
            BodyKind::None => State::Length { remaining: 0 },
            BodyKind::Length(n) => State::Length { remaining: n },
            BodyKind::Chunked => State::Chunked(super::chunked::Decoder::new(
                self.limits.max_body_bytes as u64,
                self.limits.max_headers,
            )),
        };
        self.body = Vec::new();
        Ok(Some(Event::Head(head)))
    }

    fn parse_head_block(&self, end: usize) -> Result<RequestHead, HttpError> {
        let mut slots = [httparse::EMPTY_HEADER; 128];
        let max = self.limits.max_headers.min(slots.len());
        let mut req = httparse::Request::new(&mut slots[..max]);
        match req.parse(&self.buf[..end]) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => {
                return Err(HttpError::new(400, "malformed request head"))
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(HttpError::new(431, "too many header fields"))
            }
            Err(httparse::Error::Version) => {
                return Err(HttpError::new(505, "HTTP version not supported"))
            }
            Err(_) => return Err(HttpError::new(400, "malformed request head")),
        }
        let minor_version = req.version.unwrap_or(1);
        let method = Method::parse(req.method.unwrap_or(""));
        let path = normalize_target(req.path.unwrap_or(""))
            .ok_or(HttpError::new(400, "malformed request target"))?;

        let mut headers = Vec::with_capacity(req.headers.len());
        let mut content_length: Option<usize> = None;
        let mut transfer_encoding: Option<Vec<u8>> = None;
        let mut hosts = 0;
        let mut authorizations = 0;
        let mut persistence = super::Persistence::default();
        let mut expect_continue = false;
        for h in req.headers.iter() {
            let name = h.name.to_ascii_lowercase();
            match name.as_str() {
                "content-length" => {
                    let n = parse_content_length(h.value)?;
                    if content_length.is_some_and(|prev| prev != n) {
                        return Err(HttpError::new(400, "conflicting Content-Length"));
                    }
                    if n > self.limits.max_body_bytes {
                        return Err(HttpError::new(413, "request body too large"));
                    }
                    content_length = Some(n);
                }
                "transfer-encoding" => {
                    let mut all = transfer_encoding.take().unwrap_or_default();
                    if !all.is_empty() {
                        all.push(b',');
                    }
                    all.extend_from_slice(h.value);
                    transfer_encoding = Some(all);
                }
                "host" => hosts += 1,
                "authorization" => authorizations += 1,
                "connection" => persistence.add(h.value),
                "expect" => {
                    if trim(h.value).eq_ignore_ascii_case(b"100-continue") {
                        expect_continue = true;
                    } else {
                        return Err(HttpError::new(417, "unsupported expectation"));
                    }
                }
                _ => {}
            }
            headers.push((name, h.value.to_vec()));
        }
        if minor_version == 1 && hosts != 1 {
            return Err(HttpError::new(400, "a request needs exactly one Host"));
        }
        // Two credentials: which one the request acts for would depend on which a reader
        // takes (the first, the last, or both joined), so neither is taken. RFC 9110 §5.3
        // allows a repeated field only for list-valued ones, and Authorization is not.
        if authorizations > 1 {
            return Err(HttpError::new(400, "more than one Authorization header"));
        }
        let body = match (transfer_encoding, content_length) {
            (Some(_), Some(_)) => {
                return Err(HttpError::new(
                    400,
                    "both Content-Length and Transfer-Encoding",
                ))
            }
            (Some(_), None) if minor_version == 0 => {
                return Err(HttpError::new(
                    400,
                    "Transfer-Encoding in an HTTP/1.0 request",
                ))
            }
            (Some(te), None) => {
                if !trim(&te).eq_ignore_ascii_case(b"chunked") {
                    return Err(HttpError::new(501, "unsupported transfer coding"));
                }
                BodyKind::Chunked
            }
            (None, Some(0)) | (None, None) => BodyKind::None,
            (None, Some(n)) => BodyKind::Length(n),
        };
        let keep_alive = persistence.persists(minor_version);
        Ok(RequestHead {
            // RFC 9110 §10.1.1: an HTTP/1.0 client's expectation is ignored (it may get no 1xx).
            expect_continue: expect_continue
                && minor_version == 1
                && !matches!(body, BodyKind::None),
            method,
            path,
            minor_version,
            headers,
            body,
            keep_alive,
        })
    }

    fn decode_chunked(&mut self) -> Result<Option<Event>, HttpError> {
        use super::chunked::{ChunkError, Step};
        loop {
            let State::Chunked(decoder) = &mut self.state else {
                unreachable!("decode_chunked outside the chunked state")
            };
            let avail = &self.buf[self.pos..];
            let (taken, step) = decoder.step(avail).map_err(|e| match e {
                ChunkError::TooLarge => HttpError::new(413, "request body too large"),
                other => HttpError::new(400, other.as_str()),
            })?;
            match step {
                Step::NeedMore => return Ok(None),
                Step::Data { len } => self.body.extend_from_slice(&avail[..len]),
                Step::Done => {
                    self.pos += taken;
                    let upto = self.pos;
                    self.consume(upto);
                    self.state = State::Head { scan_from: 0 };
                    return Ok(Some(Event::Body(core::mem::take(&mut self.body))));
                }
                // Trailer fields are checked and bounded, and not kept: nothing reads them.
                Step::Trailer { .. } | Step::Framing => {}
            }
            self.pos += taken;
            // Keep the buffer from holding decoded chunk data twice.
            if self.pos > 64 * 1024 {
                let upto = self.pos;
                self.consume(upto);
            }
        }
    }
}

fn parse_content_length(value: &[u8]) -> Result<usize, HttpError> {
    content_length(value)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(HttpError::new(400, "malformed Content-Length"))
}

/// A `Content-Length` value: digits, or a list of identical values ("5, 5", allowed by
/// RFC 9110 §8.6); anything else, or a number past `u64`, is `None`. Requests and the
/// outbound client's responses are framed by the same rule.
pub(crate) fn content_length(value: &[u8]) -> Option<u64> {
    let mut result: Option<u64> = None;
    for part in value.split(|b| *b == b',') {
        let digits = trim(part);
        if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let mut n: u64 = 0;
        for d in digits {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        }
        if result.is_some_and(|r| r != n) {
            return None;
        }
        result = Some(n);
    }
    result
}

/// `s` without HTTP optional whitespace (spaces and tabs) at either end.
pub(crate) fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Index just past the blank line that ends a head, searching from `from`.
pub(crate) fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let start = from.saturating_sub(3);
    let mut i = start;
    while i < buf.len() {
        if buf[i] == b'\n' {
            match buf.get(i + 1..) {
                Some([b'\n', ..]) => return Some(i + 2),
                Some([b'\r', b'\n', ..]) => return Some(i + 3),
                _ => {}
            }
        }
        i += 1;
    }
    None
}

/// The path of an origin-form or absolute-form target, without its query; `*` as is.
fn normalize_target(target: &str) -> Option<String> {
    let rest = if let Some(r) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        match r.find('/') {
            Some(i) => &r[i..],
            None => "/",
        }
    } else {
        target
    };
    if rest == "*" {
        return Some(rest.to_owned());
    }
    if !rest.starts_with('/') {
        return None;
    }
    let path = rest.split(['?', '#']).next().unwrap_or("/");
    Some(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> RequestParser {
        RequestParser::new(HttpLimits::DEFAULT)
    }

    fn all_events(p: &mut RequestParser) -> Result<Vec<Event>, HttpError> {
        let mut out = Vec::new();
        while let Some(e) = p.next_event()? {
            out.push(e);
        }
        Ok(out)
    }

    const POST: &[u8] = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello";

    #[test]
    fn content_length_body_in_every_split() {
        for split in 0..POST.len() {
            let mut p = parser();
            p.push(&POST[..split]);
            let mut events = all_events(&mut p).unwrap();
            p.push(&POST[split..]);
            events.extend(all_events(&mut p).unwrap());
            assert_eq!(events.len(), 2, "split at {split}");
            let Event::Head(h) = &events[0] else { panic!() };
            assert_eq!(h.method, Method::Post);
            assert_eq!(h.body, BodyKind::Length(5));
            assert_eq!(h.header("content-type"), Some(&b"application/json"[..]));
            assert_eq!(events[1], Event::Body(b"hello".to_vec()));
        }
    }

    #[test]
    fn chunked_body_byte_by_byte() {
        let req = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n";
        let mut p = parser();
        let mut events = Vec::new();
        for b in req.iter() {
            p.push(core::slice::from_ref(b));
            events.extend(all_events(&mut p).unwrap());
        }
        assert_eq!(events.len(), 2);
        assert_eq!(events[1], Event::Body(b"abcde".to_vec()));
        assert!(p.is_idle());
    }

    /// Trailer fields are read by the client's rule (the shared decoder): checked, and no
    /// more of them than header fields.
    #[test]
    fn trailer_fields_are_checked_and_bounded() {
        let head = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n";
        let malformed = format!("{head}no colon here\r\n\r\n");
        let many = format!("{head}{}\r\n", "X-T: 1\r\n".repeat(65));
        for (req, reason) in [
            (malformed, "malformed trailer field"),
            (many, "too many trailer fields"),
        ] {
            let mut p = parser();
            p.push(req.as_bytes());
            let err = all_events(&mut p).unwrap_err();
            assert_eq!((err.status, err.reason), (400, reason));
        }
    }

    #[test]
    fn pipelined_requests_come_out_in_order() {
        let mut p = parser();
        let mut bytes = POST.to_vec();
        bytes
            .extend_from_slice(b"GET /.well-known/agent-card.json?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        bytes.extend_from_slice(POST);
        p.push(&bytes);
        let events = all_events(&mut p).unwrap();
        assert_eq!(events.len(), 6);
        let Event::Head(h) = &events[2] else { panic!() };
        assert_eq!(h.path, "/.well-known/agent-card.json");
        assert_eq!(events[3], Event::Body(Vec::new()));
    }

    #[test]
    fn refusals() {
        let cases: &[(&[u8], u16)] = &[
            (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3x\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n", 413),
            (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
            (b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nAuthorization: Bearer a\r\n\r\n", 400),
            (b"POST / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
            (b"POST / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nExpect: nothing\r\n\r\n", 417),
            (b"GET nope HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n300000\r\n", 413),
        ];
        for (bytes, status) in cases {
            let mut p = parser();
            p.push(bytes);
            let err = all_events(&mut p).expect_err(&String::from_utf8_lossy(bytes));
            assert_eq!(err.status, *status, "{}", String::from_utf8_lossy(bytes));
            // Once failed, always failed: nothing after a framing error is trusted.
            p.push(POST);
            assert!(p.next_event().is_err());
        }
    }

    #[test]
    fn header_limits_answer_431() {
        let mut p = parser();
        let mut big = b"GET / HTTP/1.1\r\nHost: x\r\nX: ".to_vec();
        big.resize(20_000, b'a');
        p.push(&big);
        assert_eq!(p.next_event().unwrap_err().status, 431);

        let mut p = parser();
        let mut many = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
        for i in 0..70 {
            many.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        p.push(&many);
        assert_eq!(p.next_event().unwrap_err().status, 431);
    }

    #[test]
    fn keep_alive_and_expect() {
        let mut p = parser();
        p.push(b"POST / HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n");
        let Some(Event::Head(h)) = p.next_event().unwrap() else {
            panic!()
        };
        assert!(!h.keep_alive);
        assert!(!h.expect_continue, "HTTP/1.0 expectations are ignored");
        assert!(p.in_body());

        let mut p = parser();
        p.push(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n");
        let Some(Event::Head(h)) = p.next_event().unwrap() else {
            panic!()
        };
        assert!(!h.keep_alive);

        let mut p = parser();
        p.push(b"\r\n\r\nGET http://example/x?y HTTP/1.1\nHost: x\n\n");
        let Some(Event::Head(h)) = p.next_event().unwrap() else {
            panic!()
        };
        assert_eq!(h.path, "/x");
        assert!(h.keep_alive);
    }
}
