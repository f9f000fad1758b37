//! The incremental HTTP/1.1 request parser (`agentd_core::http::RequestParser`) on its own.
//!
//! Input layout: byte 0 seeds how the rest is split into pushes (low 3 bits: the largest
//! push), byte 1 picks the limits (default, or small ones so the 413/431 paths are reached
//! with short inputs), the rest is the request stream.
//!
//! Properties checked: no panic; the events and the final refusal are the same whether the
//! stream arrives all at once or split anywhere (a split-dependent parser is a request
//! smuggling hazard); every body follows its head and matches its declared length; bodies
//! and heads stay within the limits; nothing is yielded after a refusal.

#![no_main]

use agentd_core::http::{BodyKind, Event, HttpError, HttpLimits, RequestParser};
use libfuzzer_sys::fuzz_target;

const PUSH_SIZES: [usize; 8] = [1, 2, 3, 5, 8, 17, 64, 512];

#[derive(Debug, PartialEq)]
enum Outcome {
    /// More bytes were needed.
    Waiting,
    Refused(HttpError),
}

fn limits(b: u8) -> HttpLimits {
    if b & 1 == 0 {
        HttpLimits::DEFAULT
    } else {
        HttpLimits {
            max_header_bytes: 64 + usize::from(b >> 1) * 4,
            max_headers: 1 + usize::from(b >> 4),
            max_body_bytes: usize::from(b >> 1),
        }
    }
}

/// Pulls events until the parser needs more bytes or refuses.
fn pull(p: &mut RequestParser, events: &mut Vec<Event>) -> Option<HttpError> {
    loop {
        match p.next_event() {
            Ok(Some(e)) => events.push(e),
            Ok(None) => return None,
            Err(e) => return Some(e),
        }
    }
}

fn parse(limits: HttpLimits, stream: &[u8], split: Option<(usize, u64)>) -> (Vec<Event>, Outcome) {
    let mut p = RequestParser::new(limits);
    let mut events = Vec::new();
    let mut pos = 0;
    let mut rng = split.map_or(0, |(_, seed)| seed);
    loop {
        let n = match split {
            None => stream.len() - pos,
            Some((max, _)) => {
                rng = rng
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (1 + (rng >> 33) as usize % max).min(stream.len() - pos)
            }
        };
        p.push(&stream[pos..pos + n]);
        pos += n;
        if let Some(err) = pull(&mut p, &mut events) {
            // A refusal is final.
            p.push(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
            assert!(p.next_event().is_err(), "the parser yielded after refusing");
            return (events, Outcome::Refused(err));
        }
        if pos >= stream.len() {
            return (events, Outcome::Waiting);
        }
    }
}

fn check_events(limits: HttpLimits, events: &[Event]) {
    let mut head: Option<&agentd_core::http::RequestHead> = None;
    for e in events {
        match e {
            Event::Head(h) => {
                assert!(head.is_none(), "a head before the previous body");
                assert!(h.minor_version <= 1);
                assert!(h.headers.len() <= limits.max_headers);
                assert!(
                    h.path.starts_with('/') || h.path == "*",
                    "path {:?}",
                    h.path
                );
                assert!(!h.path.contains('?'), "query left in path {:?}", h.path);
                for (name, _) in &h.headers {
                    assert_eq!(*name, name.to_ascii_lowercase());
                }
                if let BodyKind::Length(n) = h.body {
                    assert!(n <= limits.max_body_bytes);
                }
                head = Some(h);
            }
            Event::Body(b) => {
                let h = head.take().expect("a body without a head");
                assert!(b.len() <= limits.max_body_bytes, "body over the limit");
                match h.body {
                    BodyKind::None => assert!(b.is_empty()),
                    BodyKind::Length(n) => assert_eq!(b.len(), n),
                    BodyKind::Chunked => {}
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let max = PUSH_SIZES[usize::from(data[0] & 7)];
    let limits = limits(data[1]);
    let stream = &data[2..];
    if stream.is_empty() {
        return;
    }
    let whole = parse(limits, stream, None);
    check_events(limits, &whole.0);
    let split = parse(limits, stream, Some((max, u64::from(data[0]))));
    assert_eq!(
        whole, split,
        "the parser's answer depends on how the bytes were split"
    );
});
