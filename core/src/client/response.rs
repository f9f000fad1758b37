//! The incremental response parser.
//!
//! Bytes arrive in any split ([`ResponseParser::push`]); [`ResponseParser::next_event`]
//! yields the head as soon as it is complete, then the decoded body in pieces as they
//! arrive (so a Server-Sent Events stream can be read while it is open), then
//! [`ResponseEvent::End`]. The body is framed as RFC 9112 §6.3 says: none (HEAD, 1xx, 204,
//! 304), chunked, `Content-Length`, or everything until the server closes (reported with
//! [`ResponseParser::eof`]). Interim 1xx responses are skipped. Errors are final.

use core::fmt;

use crate::http::parser::{find_head_end, trim};

/// Bounds on what one response may make the client hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseLimits {
    /// Status line plus header block, in bytes.
    pub max_head_bytes: usize,
    /// Header fields in one head (and trailer fields after a chunked body).
    pub max_headers: usize,
    /// Decoded body bytes over the whole response (a stream counts all its events).
    pub max_body_bytes: u64,
    /// Undelivered input the parser holds at once; `push` beyond it is refused. Must leave
    /// room for one read on top of a partial head.
    pub max_buffered: usize,
}

impl ResponseLimits {
    /// 16 KiB of head, 64 header fields, 8 MiB of body, 80 KiB of unparsed input.
    pub const DEFAULT: ResponseLimits = ResponseLimits {
        max_head_bytes: 16 * 1024,
        max_headers: 64,
        max_body_bytes: 8 * 1024 * 1024,
        max_buffered: 80 * 1024,
    };
}

impl Default for ResponseLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How the body of a response is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (a `HEAD` answer, 1xx, 204 or 304).
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the server closes the connection.
    UntilClose,
}

/// A parsed status line and header block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// The reason phrase, as sent.
    pub reason: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub(crate) minor_version: u8,
    /// Header fields in arrival order; names lower-cased, values as sent.
    pub headers: Vec<(String, Vec<u8>)>,
    /// How the body that follows is delimited.
    pub framing: Framing,
    /// Whether the connection may carry another request after this response.
    pub(crate) keep_alive: bool,
}

impl ResponseHead {
    /// The first value of a header, by lower-case name.
    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of a header as text, by lower-case name (None if not UTF-8).
    pub(crate) fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| core::str::from_utf8(v).ok())
    }

    /// The media type of the body, lower-cased, without parameters.
    pub fn media_type(&self) -> Option<String> {
        let v = self.header_str("content-type")?;
        let t = v.split(';').next().unwrap_or("").trim();
        Some(t.to_ascii_lowercase())
    }
}

/// What the parser has for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseEvent {
    /// A complete final (non-1xx) head.
    Head(ResponseHead),
    /// The next piece of the decoded body.
    Data(Vec<u8>),
    /// The body is complete; trailer fields of a chunked body, names lower-cased.
    End {
        /// The trailer fields, names lower-cased; empty unless the body was chunked.
        trailers: Vec<(String, Vec<u8>)>,
    },
}

/// Why a response cannot be read. Final: the connection must be closed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResponseError {
    /// The status line or a header field is malformed.
    BadHead(&'static str),
    /// The head exceeded [`ResponseLimits`]' header bytes.
    HeadTooLarge,
    /// The head has more fields than [`ResponseLimits`] allows.
    TooManyHeaders,
    /// The body exceeded [`ResponseLimits`]' body bytes.
    BodyTooLarge,
    /// A chunk-size line, a chunk's end or a trailer is malformed.
    BadChunk(&'static str),
    /// A transfer coding other than `chunked`.
    UnsupportedTransferCoding,
    /// The connection ended before the response did.
    Truncated(&'static str),
    /// More input was pushed than `max_buffered` allows without draining events.
    BufferFull,
    /// The parser already failed; nothing after a framing error is read.
    AlreadyFailed,
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseError::BadHead(why) => write!(f, "malformed response head: {why}"),
            ResponseError::HeadTooLarge => f.write_str("response head too large"),
            ResponseError::TooManyHeaders => f.write_str("too many response header fields"),
            ResponseError::BodyTooLarge => f.write_str("response body too large"),
            ResponseError::BadChunk(why) => write!(f, "malformed chunked body: {why}"),
            ResponseError::UnsupportedTransferCoding => {
                f.write_str("unsupported transfer coding (only chunked is understood)")
            }
            ResponseError::Truncated(what) => write!(f, "connection closed {what}"),
            ResponseError::BufferFull => f.write_str("response input buffer full"),
            ResponseError::AlreadyFailed => f.write_str("the response stream already failed"),
        }
    }
}

impl std::error::Error for ResponseError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for a complete head; the end is searched from `scan_from`.
    Head {
        scan_from: usize,
    },
    Length {
        remaining: u64,
    },
    /// The body is chunked (the decoder the server's request parser shares).
    Chunked(crate::http::chunked::Decoder),
    UntilClose,
    /// The body is complete; `End` is next.
    BodyDone,
    /// The response ended and the connection carries no more (or failed).
    Closed,
    Failed,
}

/// The incremental parser of one connection's responses.
#[derive(Debug)]
pub struct ResponseParser {
    limits: ResponseLimits,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    pos: usize,
    state: State,
    eof: bool,
    head_request: bool,
    keep_alive: bool,
    body_total: u64,
    trailers: Vec<(String, Vec<u8>)>,
}

impl ResponseParser {
    /// A parser for one connection's responses, within `limits`.
    pub fn new(limits: ResponseLimits) -> Self {
        ResponseParser {
            limits,
            buf: Vec::new(),
            pos: 0,
            state: State::Head { scan_from: 0 },
            eof: false,
            head_request: false,
            keep_alive: true,
            body_total: 0,
            trailers: Vec::new(),
        }
    }

    /// The next response answers a HEAD request, so it has no body whatever it says.
    pub fn expect_head_response(&mut self) {
        self.head_request = true;
    }

    /// Appends bytes read from the server. Refused past `max_buffered` undelivered bytes:
    /// the caller drains [`ResponseParser::next_event`] between reads.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), ResponseError> {
        match self.state {
            State::Failed => return Err(ResponseError::AlreadyFailed),
            // After a response that closes the connection nothing more is read.
            State::Closed => return Ok(()),
            _ => {}
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.len().saturating_add(bytes.len()) > self.limits.max_buffered {
            self.fail();
            return Err(ResponseError::BufferFull);
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The server closed its side: no more bytes will come.
    pub fn eof(&mut self) {
        self.eof = true;
    }

    /// True once a response said the connection closes after it (or a framing error).
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed | State::Failed)
    }

    /// The next event, `Ok(None)` when more bytes (or `eof`) are needed.
    pub fn next_event(&mut self) -> Result<Option<ResponseEvent>, ResponseError> {
        let r = self.step();
        if r.is_err() {
            self.fail();
        }
        r
    }

    fn fail(&mut self) {
        self.state = State::Failed;
        self.buf = Vec::new();
        self.pos = 0;
        self.trailers = Vec::new();
    }

    fn avail(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn step(&mut self) -> Result<Option<ResponseEvent>, ResponseError> {
        loop {
            match self.state {
                State::Failed => return Err(ResponseError::AlreadyFailed),
                State::Closed => return Ok(None),
                State::Head { scan_from } => {
                    match self.parse_head(scan_from)? {
                        Some(head) => return Ok(Some(ResponseEvent::Head(head))),
                        // An interim response was skipped: look for the final one.
                        None if matches!(self.state, State::Head { scan_from: 0 }) => {
                            if self.avail().is_empty() {
                                return self.need_more("before the response head");
                            }
                        }
                        None => return self.need_more("in the middle of the response head"),
                    }
                }
                State::Length { remaining } => {
                    if remaining == 0 {
                        self.state = State::BodyDone;
                        continue;
                    }
                    let avail = self.avail().len();
                    if avail == 0 {
                        return self.need_more("in the middle of the response body");
                    }
                    let take = usize::try_from(remaining).unwrap_or(usize::MAX).min(avail);
                    let data = self.avail()[..take].to_vec();
                    self.pos += take;
                    self.state = State::Length {
                        remaining: remaining - take as u64,
                    };
                    return Ok(Some(ResponseEvent::Data(data)));
                }
                State::UntilClose => {
                    let avail = self.avail().len();
                    if avail > 0 {
                        // Up to the limit first, then the refusal: the same whatever the split.
                        let allowed = self.limits.max_body_bytes - self.body_total;
                        let take = usize::try_from(allowed).unwrap_or(usize::MAX).min(avail);
                        if take == 0 {
                            return Err(ResponseError::BodyTooLarge);
                        }
                        let data = self.avail()[..take].to_vec();
                        self.body_total += take as u64;
                        self.pos += take;
                        return Ok(Some(ResponseEvent::Data(data)));
                    }
                    if self.eof {
                        self.state = State::BodyDone;
                        continue;
                    }
                    return Ok(None);
                }
                State::Chunked(_) => return self.decode_chunked(),
                State::BodyDone => {
                    let trailers = core::mem::take(&mut self.trailers);
                    self.head_request = false;
                    self.body_total = 0;
                    self.state = if self.keep_alive {
                        State::Head { scan_from: 0 }
                    } else {
                        self.buf = Vec::new();
                        self.pos = 0;
                        State::Closed
                    };
                    return Ok(Some(ResponseEvent::End { trailers }));
                }
            }
        }
    }

    /// More bytes are needed: fine unless the server already closed.
    fn need_more(&self, what: &'static str) -> Result<Option<ResponseEvent>, ResponseError> {
        if self.eof {
            Err(ResponseError::Truncated(what))
        } else {
            Ok(None)
        }
    }

    /// A final head, or None: incomplete (state keeps `scan_from`), or an interim 1xx head
    /// was consumed (state reset to `scan_from: 0`).
    fn parse_head(&mut self, scan_from: usize) -> Result<Option<ResponseHead>, ResponseError> {
        let avail = self.avail();
        let Some(end) = find_head_end(avail, scan_from) else {
            if avail.len() > self.limits.max_head_bytes {
                return Err(ResponseError::HeadTooLarge);
            }
            self.state = State::Head {
                scan_from: avail.len(),
            };
            return Ok(None);
        };
        if end > self.limits.max_head_bytes {
            return Err(ResponseError::HeadTooLarge);
        }
        let head = parse_head_block(&avail[..end], self.limits.max_headers)?;
        self.pos += end;
        if (100..200).contains(&head.0) {
            if head.0 == 101 {
                return Err(ResponseError::BadHead("unexpected protocol switch (101)"));
            }
            self.state = State::Head { scan_from: 0 };
            return Ok(None);
        }
        let (status, reason, minor_version, headers) = head;
        let framing = self.framing(status, minor_version, &headers)?;
        let mut keep_alive = keep_alive(minor_version, &headers);
        if framing == Framing::UntilClose {
            keep_alive = false;
        }
        self.keep_alive = keep_alive;
        self.body_total = 0;
        self.trailers = Vec::new();
        self.state = match framing {
            Framing::None => State::BodyDone,
            Framing::Length(n) => State::Length { remaining: n },
            Framing::Chunked => State::Chunked(crate::http::chunked::Decoder::new(
                self.limits.max_body_bytes,
                self.limits.max_headers,
            )),
            Framing::UntilClose => State::UntilClose,
        };
        Ok(Some(ResponseHead {
            status,
            reason,
            minor_version,
            headers,
            framing,
            keep_alive,
        }))
    }

    fn framing(
        &self,
        status: u16,
        minor_version: u8,
        headers: &[(String, Vec<u8>)],
    ) -> Result<Framing, ResponseError> {
        if self.head_request || status == 204 || status == 304 {
            return Ok(Framing::None);
        }
        let mut content_length: Option<u64> = None;
        let mut transfer_encoding: Option<Vec<u8>> = None;
        for (name, value) in headers {
            match name.as_str() {
                "content-length" => {
                    let n = parse_content_length(value)?;
                    if content_length.is_some_and(|prev| prev != n) {
                        return Err(ResponseError::BadHead("conflicting Content-Length"));
                    }
                    content_length = Some(n);
                }
                "transfer-encoding" => {
                    let all = transfer_encoding.get_or_insert_with(Vec::new);
                    if !all.is_empty() {
                        all.push(b',');
                    }
                    all.extend_from_slice(value);
                }
                _ => {}
            }
        }
        match (transfer_encoding, content_length) {
            // Both is how response smuggling starts; an honest server sends one.
            (Some(_), Some(_)) => Err(ResponseError::BadHead(
                "both Content-Length and Transfer-Encoding",
            )),
            (Some(_), None) if minor_version == 0 => {
                Err(ResponseError::BadHead("Transfer-Encoding in HTTP/1.0"))
            }
            (Some(te), None) => {
                if trim(&te).eq_ignore_ascii_case(b"chunked") {
                    Ok(Framing::Chunked)
                } else {
                    Err(ResponseError::UnsupportedTransferCoding)
                }
            }
            (None, Some(n)) if n > self.limits.max_body_bytes => Err(ResponseError::BodyTooLarge),
            (None, Some(0)) => Ok(Framing::None),
            (None, Some(n)) => Ok(Framing::Length(n)),
            (None, None) => Ok(Framing::UntilClose),
        }
    }

    fn decode_chunked(&mut self) -> Result<Option<ResponseEvent>, ResponseError> {
        let mut out = Vec::new();
        let r = self.decode_chunks_into(&mut out);
        // Data decoded before an error is delivered first, so what the caller sees does not
        // depend on how the bytes were split; the error recurs on the next call (every
        // error is found before the state moves past its cause).
        if !out.is_empty() {
            return Ok(Some(ResponseEvent::Data(out)));
        }
        r?;
        if self.state == State::BodyDone {
            return self.step();
        }
        self.need_more("in the middle of a chunked body")
    }

    fn decode_chunks_into(&mut self, out: &mut Vec<u8>) -> Result<(), ResponseError> {
        use crate::http::chunked::{ChunkError, Step};
        while let State::Chunked(decoder) = &mut self.state {
            let avail = &self.buf[self.pos..];
            let (taken, step) = decoder.step(avail).map_err(|e| match e {
                ChunkError::TooLarge => ResponseError::BodyTooLarge,
                ChunkError::TooManyTrailers => ResponseError::TooManyHeaders,
                other => ResponseError::BadChunk(other.as_str()),
            })?;
            match step {
                Step::NeedMore => break,
                Step::Data { len } => out.extend_from_slice(&avail[..len]),
                Step::Trailer { name, value } => self.trailers.push((name, value)),
                Step::Done => self.state = State::BodyDone,
                Step::Framing => {}
            }
            self.pos += taken;
        }
        Ok(())
    }
}

type Head = (u16, String, u8, Vec<(String, Vec<u8>)>);

fn parse_head_block(block: &[u8], max_headers: usize) -> Result<Head, ResponseError> {
    let mut slots = [httparse::EMPTY_HEADER; 128];
    let max = max_headers.min(slots.len());
    let mut resp = httparse::Response::new(&mut slots[..max]);
    match resp.parse(block) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(ResponseError::BadHead("incomplete head")),
        Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooManyHeaders),
        Err(httparse::Error::Version) => return Err(ResponseError::BadHead("not HTTP/1.x")),
        Err(httparse::Error::Status) => return Err(ResponseError::BadHead("bad status code")),
        Err(_) => return Err(ResponseError::BadHead("malformed status line or header")),
    }
    let status = resp.code.unwrap_or(0);
    if !(100..=599).contains(&status) {
        return Err(ResponseError::BadHead("status code out of range"));
    }
    let reason = resp.reason.unwrap_or("").to_owned();
    let minor_version = resp.version.unwrap_or(1);
    let headers = resp
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
        .collect();
    Ok((status, reason, minor_version, headers))
}

fn keep_alive(minor_version: u8, headers: &[(String, Vec<u8>)]) -> bool {
    let mut persistence = crate::http::Persistence::default();
    for (_, v) in headers.iter().filter(|(n, _)| n == "connection") {
        persistence.add(v);
    }
    persistence.persists(minor_version)
}

fn parse_content_length(value: &[u8]) -> Result<u64, ResponseError> {
    crate::http::parser::content_length(value)
        .ok_or(ResponseError::BadHead("malformed Content-Length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything one response yields: head, body, trailers.
    #[derive(Debug, PartialEq)]
    struct Whole {
        head: ResponseHead,
        body: Vec<u8>,
        trailers: Vec<(String, Vec<u8>)>,
    }

    fn drain(p: &mut ResponseParser, out: &mut Vec<ResponseEvent>) -> Result<(), ResponseError> {
        while let Some(e) = p.next_event()? {
            out.push(e);
        }
        Ok(())
    }

    fn collect(events: Vec<ResponseEvent>) -> Vec<Whole> {
        let mut all = Vec::new();
        let mut cur: Option<Whole> = None;
        for e in events {
            match e {
                ResponseEvent::Head(head) => {
                    assert!(cur.is_none(), "a head inside a body");
                    cur = Some(Whole {
                        head,
                        body: Vec::new(),
                        trailers: Vec::new(),
                    })
                }
                ResponseEvent::Data(d) => {
                    assert!(!d.is_empty(), "empty data events are noise");
                    cur.as_mut().unwrap().body.extend(d)
                }
                ResponseEvent::End { trailers } => {
                    let mut w = cur.take().unwrap();
                    w.trailers = trailers;
                    all.push(w);
                }
            }
        }
        assert!(cur.is_none(), "an unfinished response");
        all
    }

    /// Feeds `bytes` split at `split` (and then at every byte), then EOF.
    fn parse_split(bytes: &[u8], split: usize, eof: bool) -> Result<Vec<Whole>, ResponseError> {
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        let mut events = Vec::new();
        p.push(&bytes[..split])?;
        drain(&mut p, &mut events)?;
        p.push(&bytes[split..])?;
        drain(&mut p, &mut events)?;
        if eof {
            p.eof();
            drain(&mut p, &mut events)?;
        }
        Ok(collect(events))
    }

    fn parse_bytewise(bytes: &[u8], eof: bool) -> Result<Vec<Whole>, ResponseError> {
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        let mut events = Vec::new();
        for b in bytes {
            p.push(core::slice::from_ref(b))?;
            drain(&mut p, &mut events)?;
        }
        if eof {
            p.eof();
            drain(&mut p, &mut events)?;
        }
        Ok(collect(events))
    }

    /// Same result for every split and byte by byte.
    fn parse_all_ways(bytes: &[u8], eof: bool) -> Result<Vec<Whole>, ResponseError> {
        let first = parse_split(bytes, 0, eof);
        for split in 1..=bytes.len() {
            assert_eq!(parse_split(bytes, split, eof), first, "split at {split}");
        }
        assert_eq!(parse_bytewise(bytes, eof), first, "byte by byte");
        first
    }

    #[test]
    fn content_length_in_every_split() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}";
        let w = parse_all_ways(r, false).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].head.status, 200);
        assert_eq!(w[0].head.reason, "OK");
        assert_eq!(w[0].head.framing, Framing::Length(7));
        assert!(w[0].head.keep_alive);
        assert_eq!(w[0].head.media_type().as_deref(), Some("application/json"));
        assert_eq!(w[0].body, b"{\"a\":1}");
    }

    #[test]
    fn chunked_with_extensions_and_trailers_in_every_split() {
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\nA\r\n0123456789\r\n1\nz\n0\r\nX-Sum: 9\r\nX-Other:\tv \r\n\r\n";
        let w = parse_all_ways(r, false).unwrap();
        assert_eq!(w[0].body, b"abc0123456789z");
        assert_eq!(
            w[0].trailers,
            vec![
                ("x-sum".into(), b"9".to_vec()),
                ("x-other".into(), b"v".to_vec())
            ]
        );
    }

    #[test]
    fn keep_alive_responses_follow_each_other() {
        let mut r = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n".to_vec();
        r.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi");
        r.extend_from_slice(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n");
        r.extend_from_slice(b"HTTP/1.0 404 Not Found\r\ncontent-length: 1\r\n\r\nx");
        let w = parse_all_ways(&r, false).unwrap();
        let statuses: Vec<_> = w.iter().map(|w| w.head.status).collect();
        assert_eq!(statuses, [204, 200, 200, 404]);
        assert_eq!(w[1].body, b"hi");
        assert!(w[2].body.is_empty());
        assert!(!w[3].head.keep_alive, "HTTP/1.0 without keep-alive closes");
    }

    #[test]
    fn until_close_body_needs_eof() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\ndata: 2\n\n";
        let w = parse_all_ways(r, true).unwrap();
        assert_eq!(w[0].head.framing, Framing::UntilClose);
        assert!(!w[0].head.keep_alive);
        assert_eq!(w[0].body, b"data: 1\n\ndata: 2\n\n");
        // Without EOF the body is still open.
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        p.push(r).unwrap();
        let mut ev = Vec::new();
        drain(&mut p, &mut ev).unwrap();
        assert!(!ev.iter().any(|e| matches!(e, ResponseEvent::End { .. })));
    }

    #[test]
    fn head_request_and_bodiless_statuses() {
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        p.expect_head_response();
        p.push(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n")
            .unwrap();
        let mut ev = Vec::new();
        drain(&mut p, &mut ev).unwrap();
        let w = collect(ev);
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|w| w.body.is_empty()));
    }

    #[test]
    fn connection_close_ends_the_stream() {
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        p.push(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n\r\n")
            .unwrap();
        let mut ev = Vec::new();
        drain(&mut p, &mut ev).unwrap();
        assert_eq!(collect(ev).len(), 1);
        assert!(p.is_closed());
        assert_eq!(p.next_event(), Ok(None));
    }

    #[test]
    fn truncation_is_typed() {
        let cases: &[&[u8]] = &[
            b"",
            b"HTTP/1.1 200 OK\r\nContent-Le",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
        ];
        for bytes in cases {
            for split in 0..=bytes.len() {
                let err = parse_split(bytes, split, true).unwrap_err();
                assert!(
                    matches!(err, ResponseError::Truncated(_)),
                    "{}: {err:?}",
                    String::from_utf8_lossy(bytes)
                );
            }
        }
    }

    #[test]
    fn refusals() {
        use ResponseError::*;
        let cases: &[(&[u8], ResponseError)] = &[
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                BadHead("both Content-Length and Transfer-Encoding"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                BadHead("conflicting Content-Length"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
                BadHead("malformed Content-Length"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
                BadHead("malformed Content-Length"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
                BodyTooLarge,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                UnsupportedTransferCoding,
            ),
            (
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                BadHead("Transfer-Encoding in HTTP/1.0"),
            ),
            (
                b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
                BadHead("unexpected protocol switch (101)"),
            ),
            (b"HTTP/2 200 OK\r\n\r\n", BadHead("not HTTP/1.x")),
            (b"HTTP/1.1 2000 OK\r\n\r\n", BadHead("bad status code")),
            (
                b"HTTP/1.1 099 Low\r\n\r\n",
                BadHead("status code out of range"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
                BadHead("malformed status line or header"),
            ),
            (b"SMTP ready\r\n\r\n", BadHead("not HTTP/1.x")),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                BadChunk("malformed chunk size"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
                BadChunk("malformed chunk size"),
            ),
            // Sixteen hex digits are a size (the server's rule too): past any body bound.
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\n",
                BodyTooLarge,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n",
                BadChunk("malformed chunk size"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
                BadChunk("chunk data overran its size"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nno colon\r\n\r\n",
                BadChunk("malformed trailer field"),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\n",
                BodyTooLarge,
            ),
        ];
        for (bytes, want) in cases {
            for split in 0..=bytes.len() {
                let got = parse_split(bytes, split, false);
                assert_eq!(
                    got.as_ref().err(),
                    Some(want),
                    "{} split {split}",
                    String::from_utf8_lossy(bytes)
                );
            }
        }
        // Once failed, always failed.
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        p.push(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n")
            .unwrap();
        assert!(p.next_event().is_err());
        assert!(p.push(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(p.next_event().is_err());
    }

    #[test]
    fn data_before_an_error_comes_out_first_in_every_split() {
        // The fuzzer's find: data decoded in the same call as a later framing error.
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nxyz\r\n";
        for split in 0..=r.len() {
            let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
            let mut body = Vec::new();
            let mut err = None;
            for piece in [&r[..split], &r[split..]] {
                p.push(piece).unwrap();
                loop {
                    match p.next_event() {
                        Ok(Some(ResponseEvent::Data(d))) => body.extend(d),
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => {
                            err = Some(e);
                            break;
                        }
                    }
                }
                if err.is_some() {
                    break;
                }
            }
            assert_eq!(body, b"abcxy", "split {split}");
            assert_eq!(
                err,
                Some(ResponseError::BadChunk("chunk data overran its size"))
            );
        }
    }

    #[test]
    fn limits() {
        let small = ResponseLimits {
            max_head_bytes: 64,
            max_headers: 4,
            max_body_bytes: 10,
            max_buffered: 200,
        };
        let run = |bytes: &[u8]| -> Result<Vec<ResponseEvent>, ResponseError> {
            let mut p = ResponseParser::new(small);
            let mut ev = Vec::new();
            for piece in bytes.chunks(7) {
                p.push(piece)?;
                drain(&mut p, &mut ev)?;
            }
            p.eof();
            drain(&mut p, &mut ev)?;
            Ok(ev)
        };
        let mut long_head = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        long_head.resize(100, b'a');
        assert_eq!(run(&long_head).unwrap_err(), ResponseError::HeadTooLarge);
        long_head.extend_from_slice(b"\r\n\r\n");
        assert_eq!(run(&long_head).unwrap_err(), ResponseError::HeadTooLarge);
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n").unwrap_err(),
            ResponseError::TooManyHeaders
        );
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n").unwrap_err(),
            ResponseError::BodyTooLarge
        );
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\n\r\n0123456789x").unwrap_err(),
            ResponseError::BodyTooLarge
        );
        assert_eq!(
            run(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n6\r\n")
                .unwrap_err(),
            ResponseError::BodyTooLarge
        );
        // A chunk-size line can't grow without end either.
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        p.push(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap();
        assert!(matches!(p.next_event(), Ok(Some(ResponseEvent::Head(_)))));
        p.push(&[b'0'; 2000]).unwrap();
        assert_eq!(
            p.next_event(),
            Err(ResponseError::BadChunk("chunk line too long"))
        );
        // Input not drained is bounded.
        let mut p = ResponseParser::new(small);
        assert!(p.push(&[b'x'; 150]).is_ok());
        assert_eq!(p.push(&[b'x'; 51]), Err(ResponseError::BufferFull));
    }
}
