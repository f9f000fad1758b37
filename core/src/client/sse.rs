//! A Server-Sent Events decoder (the WHATWG event-stream format) over a response body fed
//! in any split: lines end in CRLF, LF or CR; `data:` lines are joined with `\n`; `event:`,
//! `id:` and `retry:` fields are kept; comment lines (`:`) and unknown fields are ignored.
//! A line, and the data of one event, are bounded: past the bound the stream is refused.

use std::collections::VecDeque;
use std::fmt;

/// One dispatched event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty means the default type, `message`.
    pub(crate) event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last event id seen on the stream so far (it carries over to later events).
    pub(crate) id: Option<String>,
    /// A `retry:` reconnection time in milliseconds, if this event set one.
    pub(crate) retry: Option<u64>,
}

impl SseEvent {
    /// The last event id seen on the stream so far: what a reconnect sends back as
    /// `Last-Event-ID`.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

/// Why a stream was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SseError {
    /// One line, or one event's data, exceeded the bound.
    EventTooLarge {
        /// The bound, in bytes.
        limit: usize,
    },
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::EventTooLarge { limit } => {
                write!(f, "a server-sent event exceeds {limit} bytes")
            }
        }
    }
}

impl std::error::Error for SseError {}

/// The decoder of one event stream.
#[derive(Debug)]
pub struct SseDecoder {
    max_event_bytes: usize,
    line: Vec<u8>,
    /// The last byte seen was CR: an LF right after it ends nothing more.
    after_cr: bool,
    /// Still at the very start, where a UTF-8 BOM is skipped.
    at_start: bool,
    /// The first bytes, held back while they may still be a split BOM.
    bom_held: Vec<u8>,
    data: String,
    has_data: bool,
    event: String,
    last_id: Option<String>,
    retry: Option<u64>,
    ready: VecDeque<SseEvent>,
    failed: bool,
}

impl SseDecoder {
    /// `max_event_bytes` bounds one line and the joined data of one event.
    pub fn new(max_event_bytes: usize) -> Self {
        SseDecoder {
            max_event_bytes,
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            bom_held: Vec::new(),
            data: String::new(),
            has_data: false,
            event: String::new(),
            last_id: None,
            retry: None,
            ready: VecDeque::new(),
            failed: false,
        }
    }

    /// Decodes more of the body. Complete events queue up for [`SseDecoder::next_event`];
    /// at most one per two input bytes, so the queue is bounded by what was pushed.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.failed {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        if !self.at_start {
            return self.push_lines(bytes);
        }
        // A BOM at the very start is skipped; it may itself arrive split.
        const BOM: &[u8] = b"\xEF\xBB\xBF";
        let mut held = std::mem::take(&mut self.bom_held);
        held.extend_from_slice(bytes);
        let n = held.len().min(3);
        if held[..n] == BOM[..n] {
            if held.len() < 3 {
                self.bom_held = held;
                return Ok(());
            }
            self.at_start = false;
            return self.push_lines(&held[3..]);
        }
        self.at_start = false;
        self.push_lines(&held)
    }

    fn push_lines(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        let r = self.lines(bytes);
        if r.is_err() {
            self.failed = true;
            self.line = Vec::new();
            self.data = String::new();
        }
        r
    }

    fn lines(&mut self, mut bytes: &[u8]) -> Result<(), SseError> {
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            match bytes.iter().position(|b| matches!(b, b'\r' | b'\n')) {
                Some(i) => {
                    self.extend_line(&bytes[..i])?;
                    self.after_cr = bytes[i] == b'\r';
                    bytes = &bytes[i + 1..];
                    let line = core::mem::take(&mut self.line);
                    self.process_line(&line)?;
                    // Reuse the allocation for the next line.
                    self.line = line;
                    self.line.clear();
                }
                None => {
                    self.extend_line(bytes)?;
                    bytes = &[];
                }
            }
        }
        Ok(())
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), SseError> {
        if self.line.len().saturating_add(part.len()) > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn process_line(&mut self, line: &[u8]) -> Result<(), SseError> {
        if line.is_empty() {
            self.dispatch();
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                let grown = self.data.len() + usize::from(self.has_data) + value.len();
                if grown > self.max_event_bytes {
                    return Err(SseError::EventTooLarge {
                        limit: self.max_event_bytes,
                    });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event = value.into_owned(),
            // An id holding NUL is ignored, as the standard says.
            b"id" if !value.contains('\0') => self.last_id = Some(value.into_owned()),
            b"retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                // Absurdly long digit strings saturate rather than fail.
                self.retry = Some(value.parse().unwrap_or(u64::MAX));
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self) {
        let retry = self.retry.take();
        if !self.has_data {
            // No data: nothing is dispatched, and the event type resets.
            self.event.clear();
            return;
        }
        self.has_data = false;
        self.ready.push_back(SseEvent {
            event: core::mem::take(&mut self.event),
            data: core::mem::take(&mut self.data),
            id: self.last_id.clone(),
            retry,
        });
    }

    /// The next complete event, if any.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }

    /// True when the stream stands between events (nothing half-received). An event not
    /// ended by a blank line when the stream closes is discarded, as the standard says.
    #[cfg(test)]
    pub(crate) fn is_between_events(&self) -> bool {
        self.line.is_empty() && !self.has_data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_split(bytes: &[u8], split: usize) -> Result<Vec<SseEvent>, SseError> {
        let mut d = SseDecoder::new(1024);
        let mut out = Vec::new();
        d.push(&bytes[..split])?;
        while let Some(e) = d.next_event() {
            out.push(e);
        }
        d.push(&bytes[split..])?;
        while let Some(e) = d.next_event() {
            out.push(e);
        }
        Ok(out)
    }

    fn decode_all_ways(bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let first = decode_split(bytes, 0);
        for split in 1..=bytes.len() {
            assert_eq!(decode_split(bytes, split), first, "split at {split}");
        }
        let mut d = SseDecoder::new(1024);
        let mut out = Vec::new();
        for b in bytes {
            d.push(core::slice::from_ref(b)).unwrap();
            while let Some(e) = d.next_event() {
                out.push(e);
            }
        }
        assert_eq!(Ok(out), first, "byte by byte");
        first
    }

    fn ev(event: &str, data: &str, id: Option<&str>) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: id.map(Into::into),
            retry: None,
        }
    }

    #[test]
    fn fields_and_line_ends() {
        let s = b"\xEF\xBB\xBF: comment\r\ndata: a\r\ndata:b\rdata\n\nevent: x\nid: 7\ndata: {\"k\":1}\n\n:only a comment\n\nid\ndata:  two spaces\r\n\r\n";
        let got = decode_all_ways(s).unwrap();
        assert_eq!(
            got,
            vec![
                ev("", "a\nb\n", None),
                ev("x", "{\"k\":1}", Some("7")),
                ev("", " two spaces", Some("")),
            ]
        );
    }

    #[test]
    fn retry_unknown_fields_and_no_data() {
        let s = b"retry: 1500\nfoo: bar\ndata: x\n\nretry: 1x\nevent: nothing\n\ndata: y\n\n";
        let got = decode_all_ways(s).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].retry, Some(1500));
        assert_eq!(got[0].data, "x");
        // An event with no data dispatches nothing and its type does not leak forward.
        assert_eq!(got[1], ev("", "y", None));
    }

    #[test]
    fn crlf_split_between_cr_and_lf_is_one_line_end() {
        let got = decode_all_ways(b"data: a\r\n\r\ndata: b\r\r").unwrap();
        assert_eq!(got, vec![ev("", "a", None), ev("", "b", None)]);
    }

    #[test]
    fn unfinished_event_stays_pending() {
        let mut d = SseDecoder::new(64);
        d.push(b"data: partial\n").unwrap();
        assert_eq!(d.next_event(), None);
        assert!(!d.is_between_events());
        d.push(b"\n").unwrap();
        assert!(d.next_event().is_some());
        assert!(d.is_between_events());
    }

    #[test]
    fn bounded() {
        let mut d = SseDecoder::new(16);
        assert_eq!(
            d.push(&[b'a'; 17]),
            Err(SseError::EventTooLarge { limit: 16 })
        );
        assert!(d.push(b"\n\n").is_err(), "failed stays failed");

        // Many short data lines add up to one big event.
        let mut d = SseDecoder::new(16);
        d.push(b"data: 12345\ndata: 12345\n").unwrap();
        assert!(d.push(b"data: 12345\n").is_err());

        // Invalid UTF-8 is replaced, not refused.
        let mut d = SseDecoder::new(16);
        d.push(b"data: \xff\n\n").unwrap();
        assert_eq!(d.next_event().unwrap().data, "\u{fffd}");
    }
}
