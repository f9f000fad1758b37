//! HTTP/1.1 as the core speaks it: an incremental request parser ([`RequestParser`]) and the
//! response and Server-Sent Events writer the connection uses. No sockets: bytes in, bytes
//! out.

pub(crate) mod chunked;
pub mod cors;
pub(crate) mod parser;
pub(crate) mod response;

pub(crate) use parser::Method;
pub use parser::{BodyKind, Event, HttpError, RequestHead, RequestParser};

/// The `Connection` header's persistence tokens over a message's fields, both parsers'
/// rule (RFC 9112 §9.3): `close` ends the connection after the message; HTTP/1.0 persists
/// only with `keep-alive`, HTTP/1.1 unless `close`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Persistence {
    close: bool,
    keep_alive: bool,
}

impl Persistence {
    /// Reads one `Connection` field value (a comma-separated token list).
    pub(crate) fn add(&mut self, value: &[u8]) {
        for token in value.split(|b| *b == b',') {
            let t = parser::trim(token);
            self.close |= t.eq_ignore_ascii_case(b"close");
            self.keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
        }
    }

    /// Whether the connection persists after a message of this HTTP/1.x minor version.
    pub(crate) fn persists(self, minor_version: u8) -> bool {
        match minor_version {
            0 => self.keep_alive && !self.close,
            _ => !self.close,
        }
    }
}

/// Bounds on what one request may make the core hold. Every one is a typed refusal when
/// exceeded, never an allocation without end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Request line plus header block, in bytes. Exceeded: 431, and the connection closes.
    pub max_header_bytes: usize,
    /// Header fields in one request. Exceeded: 431.
    pub max_headers: usize,
    /// Decoded body bytes. Exceeded: 413, and the connection closes.
    pub max_body_bytes: usize,
}

impl HttpLimits {
    /// 16 KiB of head, 64 header fields, 2 MiB of body.
    pub const DEFAULT: HttpLimits = HttpLimits {
        max_header_bytes: 16 * 1024,
        max_headers: 64,
        max_body_bytes: 2 * 1024 * 1024,
    };

    /// How many unprocessed input bytes a connection buffers before it stops reading: one
    /// whole request of the largest size, plus the framing a chunked body may add.
    pub(crate) fn input_capacity(&self) -> usize {
        self.max_header_bytes + self.max_body_bytes + self.max_body_bytes / 8 + 4096
    }
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}
