//! The request writer. Every name and value is checked before a byte is written, so a value
//! taken from configuration or from a peer can never add a header line or end the head
//! early (CR/LF injection), and the body is always framed by a `Content-Length` the writer
//! computes itself.

use core::fmt;

/// A request to write. The writer adds `Host` and, when there is a body or the method is
/// POST/PUT, `Content-Length`; callers may not set those (or `Transfer-Encoding`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutRequest {
    pub(crate) method: String,
    /// Origin-form target: starts with `/`.
    pub(crate) path: String,
    /// The `Host` header's value.
    pub(crate) host: String,
    /// Further header fields, written in this order.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

/// Why a request was not written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The method is not an HTTP token.
    BadMethod,
    /// The target is not an origin-form path without spaces or control bytes.
    BadPath,
    /// The host holds bytes a Host header cannot carry.
    BadHost,
    /// A header name is not an HTTP token.
    BadHeaderName(String),
    /// A header value holds CR, LF, NUL or another control byte.
    BadHeaderValue(String),
    /// A header the writer owns (framing) was set by the caller.
    ReservedHeader(String),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::BadMethod => f.write_str("the request method is not an HTTP token"),
            RequestError::BadPath => {
                f.write_str("the request path must start with / and hold no space or control byte")
            }
            RequestError::BadHost => f.write_str("the host holds a space or control byte"),
            RequestError::BadHeaderName(n) => write!(f, "header name {n:?} is not an HTTP token"),
            RequestError::BadHeaderValue(n) => {
                write!(
                    f,
                    "the value of header {n:?} holds CR, LF or another control byte"
                )
            }
            RequestError::ReservedHeader(n) => {
                write!(f, "header {n:?} is set by the HTTP client itself")
            }
        }
    }
}

impl std::error::Error for RequestError {}

impl OutRequest {
    /// A request with no header but `Host` and no body; `method`, `host` and `path` are checked
    /// when it is encoded.
    pub fn new(method: &str, host: &str, path: &str) -> Self {
        OutRequest {
            method: method.to_owned(),
            path: path.to_owned(),
            host: host.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Adds a header field (checked when written).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body; its `Content-Length` is written with it.
    pub fn body(mut self, body: Vec<u8>) -> Self {
        self.body = body;
        self
    }

    /// The value of a header set on this request, by case-insensitive name.
    #[cfg(test)]
    pub(crate) fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The request's bytes: head, then body.
    pub fn encode(&self) -> Result<Vec<u8>, RequestError> {
        if !is_token(&self.method) {
            return Err(RequestError::BadMethod);
        }
        if !self.path.starts_with('/') || !self.path.bytes().all(|b| b > b' ' && b != 0x7f) {
            return Err(RequestError::BadPath);
        }
        if self.host.is_empty() || !self.host.bytes().all(|b| b > b' ' && b != 0x7f) {
            return Err(RequestError::BadHost);
        }
        for (name, value) in &self.headers {
            if !is_token(name) {
                return Err(RequestError::BadHeaderName(name.clone()));
            }
            if ["host", "content-length", "transfer-encoding"]
                .iter()
                .any(|r| name.eq_ignore_ascii_case(r))
            {
                return Err(RequestError::ReservedHeader(name.clone()));
            }
            if !value
                .bytes()
                .all(|b| b == b'\t' || (b >= b' ' && b != 0x7f))
            {
                return Err(RequestError::BadHeaderValue(name.clone()));
            }
        }
        let mut out = Vec::with_capacity(128 + self.body.len());
        for piece in [
            &self.method,
            " ",
            &self.path,
            " HTTP/1.1\r\nHost: ",
            &self.host,
            "\r\n",
        ] {
            out.extend_from_slice(piece.as_bytes());
        }
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.trim_matches([' ', '\t']).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if !self.body.is_empty() || matches!(self.method.as_str(), "POST" | "PUT" | "PATCH") {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        Ok(out)
    }
}

/// RFC 9110 §5.6.2 token.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_head_and_length() {
        let r = OutRequest::new("POST", "127.0.0.1:8420", "/")
            .header("A2A-Version", "1.0")
            .body(b"{}".to_vec());
        assert_eq!(
            r.encode().unwrap(),
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1:8420\r\nA2A-Version: 1.0\r\nContent-Length: 2\r\n\r\n{}"
        );
        let g = OutRequest::new("GET", "h", "/x");
        assert_eq!(g.encode().unwrap(), b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n");
        // An empty POST still says how long its body is.
        let p = OutRequest::new("POST", "h", "/");
        assert!(String::from_utf8(p.encode().unwrap())
            .unwrap()
            .contains("Content-Length: 0\r\n"));
    }

    #[test]
    fn refuses_injection_and_framing_headers() {
        let base = || OutRequest::new("GET", "h", "/");
        let cases = [
            (
                base().header("X", "a\r\nEvil: 1"),
                RequestError::BadHeaderValue("X".into()),
            ),
            (
                base().header("X", "a\nb"),
                RequestError::BadHeaderValue("X".into()),
            ),
            (
                base().header("X", "a\0"),
                RequestError::BadHeaderValue("X".into()),
            ),
            (
                base().header("X Y", "a"),
                RequestError::BadHeaderName("X Y".into()),
            ),
            (
                base().header("", "a"),
                RequestError::BadHeaderName("".into()),
            ),
            (
                base().header("content-length", "1"),
                RequestError::ReservedHeader("content-length".into()),
            ),
            (
                base().header("Transfer-Encoding", "chunked"),
                RequestError::ReservedHeader("Transfer-Encoding".into()),
            ),
            (
                base().header("HOST", "x"),
                RequestError::ReservedHeader("HOST".into()),
            ),
            (OutRequest::new("GE T", "h", "/"), RequestError::BadMethod),
            (OutRequest::new("GET", "h", "x"), RequestError::BadPath),
            (OutRequest::new("GET", "h", "/a b"), RequestError::BadPath),
            (OutRequest::new("GET", "h", "/a\r\n"), RequestError::BadPath),
            (
                OutRequest::new("GET", "h\r\nX: 1", "/"),
                RequestError::BadHost,
            ),
            (OutRequest::new("GET", "", "/"), RequestError::BadHost),
        ];
        for (req, want) in cases {
            assert_eq!(req.encode(), Err(want), "{req:?}");
        }
        // A tab inside a value is legal field content.
        assert!(base().header("X", "a\tb").encode().is_ok());
    }
}
