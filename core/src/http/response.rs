//! The response writer: whole responses with `Content-Length`, and Server-Sent Events
//! streams with chunked transfer (close-delimited for an HTTP/1.0 client, which has no
//! chunked coding).

use std::io::Write as _;

/// The reason phrase of every status agentd sends.
pub(crate) fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// A response head under construction.
pub(crate) struct Head<'a> {
    pub(crate) status: u16,
    /// Lower-case header names with their values.
    pub(crate) headers: Vec<(&'static str, std::borrow::Cow<'a, str>)>,
    /// Close the connection after this response.
    pub(crate) close: bool,
    /// The `Date` header's value.
    pub(crate) date: &'a str,
}

impl<'a> Head<'a> {
    pub(crate) fn new(status: u16, date: &'a str) -> Self {
        Head {
            status,
            headers: Vec::new(),
            close: false,
            date,
        }
    }

    pub(crate) fn header(
        mut self,
        name: &'static str,
        value: impl Into<std::borrow::Cow<'a, str>>,
    ) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn write_start(&self, out: &mut Vec<u8>) {
        let _ = write!(
            out,
            "HTTP/1.1 {} {}\r\n",
            self.status,
            reason_phrase(self.status)
        );
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(self.date.as_bytes());
        out.extend_from_slice(b"\r\n");
        if self.close {
            out.extend_from_slice(b"connection: close\r\n");
        }
    }

    /// A whole response. `head_only` answers a HEAD request: the length of the body that a
    /// GET would carry, and no body.
    pub(crate) fn write_full(&self, out: &mut Vec<u8>, body: &[u8], head_only: bool) {
        self.write_start(out);
        if self.status != 304 && self.status != 204 {
            let _ = write!(out, "content-length: {}\r\n", body.len());
        }
        out.extend_from_slice(b"\r\n");
        if !head_only && self.status != 304 && self.status != 204 {
            out.extend_from_slice(body);
        }
    }

    /// The head of a response whose `len`-byte body the caller writes after it.
    pub(crate) fn write_sized(&self, out: &mut Vec<u8>, len: usize) {
        self.write_start(out);
        let _ = write!(out, "content-length: {len}\r\n\r\n");
    }

    /// The head of an SSE stream. `chunked` is false for an HTTP/1.0 client: its stream is
    /// delimited by closing the connection.
    pub(crate) fn write_sse_start(&self, out: &mut Vec<u8>, chunked: bool) {
        self.write_start(out);
        out.extend_from_slice(b"content-type: text/event-stream\r\ncache-control: no-store\r\n");
        if chunked {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// One SSE event holding one JSON document on a single `data:` line. JSON text from
/// serde_json never contains a raw newline, so one line always suffices.
pub(crate) fn write_sse_event(out: &mut Vec<u8>, json: &[u8], chunked: bool) {
    write_sse_event_with_id(out, None, json, chunked)
}

/// An SSE event with an `id:` line first when `id` is given (a task stream's frame, so that a
/// client can reconnect with `Last-Event-ID`). The id holds no line break.
pub(crate) fn write_sse_event_with_id(
    out: &mut Vec<u8>,
    id: Option<&str>,
    json: &[u8],
    chunked: bool,
) {
    debug_assert!(!json.contains(&b'\n'));
    debug_assert!(id.is_none_or(|i| !i.contains(['\n', '\r'])));
    let id_len = id.map_or(0, |i| i.len() + b"id: \n".len());
    let len = id_len + json.len() + b"data: \n\n".len();
    if chunked {
        let _ = write!(out, "{len:x}\r\n");
    }
    if let Some(i) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(i.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
}

/// An SSE event whose bytes are given in parts, `data: ` and the blank line after it
/// included (a feed event's frame: its head, the request id, the shared rest), inside one
/// chunk when chunked.
pub(crate) fn write_sse_shared(out: &mut Vec<u8>, parts: [&[u8]; 3], chunked: bool) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if chunked {
        write_hex(out, len);
        out.extend_from_slice(b"\r\n");
    }
    out.reserve(len + 2);
    for p in parts {
        out.extend_from_slice(p);
    }
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
}

/// `n` in lowercase hex, as a chunk size.
fn write_hex(out: &mut Vec<u8>, n: usize) {
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(b"0123456789abcdef"[(n >> (4 * i)) & 0xf]);
    }
}

/// An SSE comment: a keep-alive that every client ignores.
pub(crate) fn write_sse_comment(out: &mut Vec<u8>, text: &str, chunked: bool) {
    let len = text.len() + b": \n\n".len();
    if chunked {
        let _ = write!(out, "{len:x}\r\n");
    }
    out.extend_from_slice(b": ");
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\n\n");
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
}

/// The end of a chunked stream.
pub(crate) fn write_chunked_end(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_response_bytes() {
        let mut out = Vec::new();
        Head::new(200, "D")
            .header("content-type", "application/json")
            .write_full(&mut out, b"{}", false);
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: D\r\ncontent-length: 2\r\n\r\n{}"
        );
        let mut out = Vec::new();
        let mut h = Head::new(415, "D");
        h.close = true;
        h.write_full(&mut out, b"", true);
        assert_eq!(
            out,
            b"HTTP/1.1 415 Unsupported Media Type\r\ndate: D\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn sse_frames_are_chunks() {
        let mut out = Vec::new();
        write_sse_event(&mut out, b"{\"a\":1}", true);
        write_chunked_end(&mut out);
        assert_eq!(out, b"f\r\ndata: {\"a\":1}\n\n\r\n0\r\n\r\n");
        let mut out = Vec::new();
        write_sse_event(&mut out, b"{}", false);
        assert_eq!(out, b"data: {}\n\n");
    }
}
