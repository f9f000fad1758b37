//! The chunked transfer coding (RFC 9112 §7.1), decoded the same way for the requests the
//! server reads and the responses the outbound client reads: one grammar, one set of
//! bounds, so the two cannot drift (they had: one read 16 hex digits with checked
//! arithmetic, the other 15 unchecked, and only one bounded its trailer fields).
//!
//! The decoder keeps only where it is in the coding; the caller keeps the bytes. Each
//! [`Decoder::step`] looks at what the caller has buffered and says how many bytes it took
//! and what they were. A refusal never moves the decoder: asked again over the same bytes,
//! it refuses again, so what a caller reports does not depend on how the input was split.

use super::parser::trim;

/// A chunk-size line, or a trailer field line, longer than this is refused.
pub(crate) const MAX_LINE: usize = 1024;

/// Why a chunked body is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkError {
    /// A size or trailer line past [`MAX_LINE`].
    LineTooLong,
    /// A chunk size that is not 1 to 16 hex digits (with optional extensions).
    BadSize,
    /// Chunk data not followed by its line ending.
    Overran,
    /// The decoded body would pass the caller's bound.
    TooLarge,
    /// A trailer line that is not `name: value`.
    BadTrailer,
    /// More trailer fields than the caller's bound.
    TooManyTrailers,
}

impl ChunkError {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ChunkError::LineTooLong => "chunk line too long",
            ChunkError::BadSize => "malformed chunk size",
            ChunkError::Overran => "chunk data overran its size",
            ChunkError::TooLarge => "body too large",
            ChunkError::BadTrailer => "malformed trailer field",
            ChunkError::TooManyTrailers => "too many trailer fields",
        }
    }
}

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for ChunkError {}

/// What one [`Decoder::step`] found, after taking `taken` bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing can be decided without more bytes.
    NeedMore,
    /// Body bytes: the first `len` bytes of the input.
    Data { len: usize },
    /// A trailer field, checked.
    Trailer { name: String, value: Vec<u8> },
    /// The body ended (the empty line after the last chunk and the trailers).
    Done,
    /// Framing only (a size line, a chunk's line ending): nothing for the caller.
    Framing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Size,
    Data(u64),
    DataEnd,
    Trailer,
    Done,
}

/// Where a chunked body's decoding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decoder {
    at: At,
    decoded: u64,
    trailers: usize,
    max_body: u64,
    max_trailers: usize,
}

impl Decoder {
    /// A decoder for one body of at most `max_body` decoded bytes and `max_trailers`
    /// trailer fields.
    pub(crate) fn new(max_body: u64, max_trailers: usize) -> Self {
        Decoder {
            at: At::Size,
            decoded: 0,
            trailers: 0,
            max_body,
            max_trailers,
        }
    }

    /// Whether the body has ended.
    #[cfg(test)]
    pub(crate) fn is_done(&self) -> bool {
        self.at == At::Done
    }

    /// Decodes from the start of `input` (what the caller has not consumed yet): returns
    /// how many bytes to consume and what they were. Call again while it takes bytes.
    pub(crate) fn step(&mut self, input: &[u8]) -> Result<(usize, Step), ChunkError> {
        match self.at {
            At::Size => {
                let Some(line) = take_line(input)? else {
                    return Ok((0, Step::NeedMore));
                };
                let size = parse_size(&input[..line.content])?;
                if size == 0 {
                    self.at = At::Trailer;
                } else {
                    if self.decoded.saturating_add(size) > self.max_body {
                        return Err(ChunkError::TooLarge);
                    }
                    self.decoded += size;
                    self.at = At::Data(size);
                }
                Ok((line.total, Step::Framing))
            }
            At::Data(n) => {
                if input.is_empty() {
                    return Ok((0, Step::NeedMore));
                }
                let len = usize::try_from(n).unwrap_or(usize::MAX).min(input.len());
                let left = n - len as u64;
                self.at = if left == 0 {
                    At::DataEnd
                } else {
                    At::Data(left)
                };
                Ok((len, Step::Data { len }))
            }
            At::DataEnd => match input {
                [b'\r', b'\n', ..] => {
                    self.at = At::Size;
                    Ok((2, Step::Framing))
                }
                [b'\n', ..] => {
                    self.at = At::Size;
                    Ok((1, Step::Framing))
                }
                [] | [b'\r'] => Ok((0, Step::NeedMore)),
                _ => Err(ChunkError::Overran),
            },
            At::Trailer => {
                let Some(line) = take_line(input)? else {
                    return Ok((0, Step::NeedMore));
                };
                let content = &input[..line.content];
                if content.is_empty() {
                    self.at = At::Done;
                    return Ok((line.total, Step::Done));
                }
                let (name, value) = parse_trailer(content)?;
                if self.trailers >= self.max_trailers {
                    return Err(ChunkError::TooManyTrailers);
                }
                self.trailers += 1;
                Ok((line.total, Step::Trailer { name, value }))
            }
            At::Done => Ok((0, Step::Done)),
        }
    }
}

struct Line {
    /// Length without the line ending.
    content: usize,
    /// Length with it.
    total: usize,
}

/// A line ended by LF (a CR before it is not content), at most [`MAX_LINE`] long.
fn take_line(buf: &[u8]) -> Result<Option<Line>, ChunkError> {
    match buf.iter().take(MAX_LINE + 1).position(|b| *b == b'\n') {
        Some(nl) => {
            let content = if nl > 0 && buf[nl - 1] == b'\r' {
                nl - 1
            } else {
                nl
            };
            Ok(Some(Line {
                content,
                total: nl + 1,
            }))
        }
        None if buf.len() > MAX_LINE => Err(ChunkError::LineTooLong),
        None => Ok(None),
    }
}

/// `chunk-size [ chunk-ext ]`: 1 to 16 hex digits (a `u64`), extensions ignored.
fn parse_size(line: &[u8]) -> Result<u64, ChunkError> {
    let size_part = match line.iter().position(|b| *b == b';') {
        Some(i) => &line[..i],
        None => line,
    };
    let digits = trim(size_part);
    if digits.is_empty() || digits.len() > 16 {
        return Err(ChunkError::BadSize);
    }
    let mut n: u64 = 0;
    for b in digits {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(ChunkError::BadSize),
        };
        n = n
            .checked_mul(16)
            .and_then(|n| n.checked_add(u64::from(d)))
            .ok_or(ChunkError::BadSize)?;
    }
    Ok(n)
}

/// `field-name ":" OWS field-value OWS`, the name lower-cased.
fn parse_trailer(line: &[u8]) -> Result<(String, Vec<u8>), ChunkError> {
    let colon = line
        .iter()
        .position(|b| *b == b':')
        .ok_or(ChunkError::BadTrailer)?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic() && *b != b':') {
        return Err(ChunkError::BadTrailer);
    }
    let value = trim(&line[colon + 1..]);
    if value.iter().any(|b| *b < b' ' && *b != b'\t') {
        return Err(ChunkError::BadTrailer);
    }
    Ok((
        String::from_utf8_lossy(name).to_ascii_lowercase(),
        value.to_vec(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `split` bytes; returns the body and trailers, or the
    /// first refusal.
    fn decode(input: &[u8], split: usize) -> Result<(Vec<u8>, Vec<String>), ChunkError> {
        let mut d = Decoder::new(1 << 20, 4);
        let (mut buf, mut body, mut trailers) = (Vec::new(), Vec::new(), Vec::new());
        for piece in input.chunks(split.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                let (n, step) = d.step(&buf)?;
                match step {
                    Step::Data { len } => body.extend_from_slice(&buf[..len]),
                    Step::Trailer { name, .. } => trailers.push(name),
                    _ => {}
                }
                buf.drain(..n);
                if n == 0 || d.is_done() {
                    break;
                }
            }
        }
        assert!(d.is_done(), "the body did not end");
        Ok((body, trailers))
    }

    #[test]
    fn every_split_decodes_the_same() {
        let input = b"5;ext=1\r\nhello\r\n1\nX\n0\r\nExpires: never\r\n\r\n";
        for split in 1..input.len() {
            let (body, trailers) = decode(input, split).unwrap();
            assert_eq!(body, b"helloX");
            assert_eq!(trailers, ["expires"]);
        }
    }

    #[test]
    fn refusals() {
        let cases: [(&[u8], ChunkError); 7] = [
            (b"g\r\n", ChunkError::BadSize),
            (b"\r\n", ChunkError::BadSize),
            (b"10000000000000000\r\n", ChunkError::BadSize),
            (b"200000\r\n", ChunkError::TooLarge),
            (b"1\r\nab\r\n", ChunkError::Overran),
            (b"0\r\nno colon\r\n\r\n", ChunkError::BadTrailer),
            (
                b"0\r\na: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\ne: 5\r\n\r\n",
                ChunkError::TooManyTrailers,
            ),
        ];
        for (input, want) in cases {
            for split in [1, 3, input.len()] {
                assert_eq!(decode(input, split).unwrap_err(), want, "{input:?}");
            }
        }
        let long = [b"1".repeat(MAX_LINE + 1).as_slice(), b"\r\n"].concat();
        assert_eq!(decode(&long, 64).unwrap_err(), ChunkError::LineTooLong);
        // Sixteen hex digits are a u64; the size is then refused by the body bound only.
        assert_eq!(
            decode(b"ffffffffffffffff\r\n", 64).unwrap_err(),
            ChunkError::TooLarge
        );
    }

    #[test]
    fn a_refusal_never_moves_the_decoder() {
        let mut d = Decoder::new(4, 0);
        assert_eq!(d.step(b"5\r\nhello"), Err(ChunkError::TooLarge));
        assert_eq!(d.step(b"5\r\nhello"), Err(ChunkError::TooLarge));
        assert_eq!(d.step(b"4\r\n"), Ok((3, Step::Framing)));
    }
}
