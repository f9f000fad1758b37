//! The outbound client's response side (`agentd_core::client`): the incremental response
//! parser, the SSE decoder over each body, and the A2A decoders over what they yield.
//!
//! Input layout: byte 0 seeds how the rest is split into pushes (low 3 bits: the largest
//! push), byte 1 picks the limits (default, or small ones so the size refusals are reached
//! with short inputs), byte 2 holds flags (bit 0: the request was HEAD; bit 1: the server
//! closes after the last byte), the rest is the server's byte stream.
//!
//! Properties checked: no panic; heads, decoded bodies, trailers, SSE events and the final
//! error are the same whether the stream arrives in one piece or split anywhere; bodies,
//! heads and events stay within their limits; a Content-Length body is exactly that long;
//! nothing is yielded after an error.

#![no_main]

use agentd_core::client::a2a;
use agentd_core::client::{
    Framing, ResponseError, ResponseEvent, ResponseHead, ResponseLimits, ResponseParser,
    SseDecoder, SseError, SseEvent,
};
use libfuzzer_sys::fuzz_target;

const PUSH_SIZES: [usize; 8] = [1, 2, 3, 5, 8, 17, 64, 512];
/// The largest push of the unsplit run: the parser bounds what it buffers, so "one piece"
/// means pieces this big, drained in between.
const WHOLE_PIECE: usize = 4096;

#[derive(Debug, PartialEq)]
struct Response {
    head: ResponseHead,
    body: Vec<u8>,
    trailers: Option<Vec<(String, Vec<u8>)>>,
    events: Vec<SseEvent>,
    sse_error: Option<SseError>,
}

#[derive(Debug, PartialEq)]
struct Outcome {
    responses: Vec<Response>,
    error: Option<ResponseError>,
}

fn limits(b: u8) -> (ResponseLimits, usize) {
    if b & 1 == 0 {
        return (ResponseLimits::DEFAULT, 64 * 1024);
    }
    let max_head_bytes = 32 + usize::from(b >> 1) * 4;
    let l = ResponseLimits {
        max_head_bytes,
        max_headers: 1 + usize::from(b >> 4),
        max_body_bytes: u64::from(b >> 1),
        // Room for a partial head or chunk line plus one push: never full when drained.
        max_buffered: max_head_bytes.max(1025) + WHOLE_PIECE,
    };
    (l, 1 + usize::from(b >> 2))
}

fn run(
    (limits, max_event): (ResponseLimits, usize),
    flags: u8,
    stream: &[u8],
    split: Option<(usize, u64)>,
) -> Outcome {
    let mut p = ResponseParser::new(limits);
    if flags & 1 != 0 {
        p.expect_head_response();
    }
    let mut out = Outcome {
        responses: Vec::new(),
        error: None,
    };
    let mut sse = SseDecoder::new(max_event);
    let mut rng = split.map_or(0, |(_, seed)| seed);
    let mut pos = 0;
    let mut eof_sent = false;
    loop {
        if pos < stream.len() {
            let n = match split {
                None => WHOLE_PIECE,
                Some((max, _)) => {
                    rng = rng
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    1 + (rng >> 33) as usize % max
                }
            }
            .min(stream.len() - pos);
            if let Err(e) = p.push(&stream[pos..pos + n]) {
                panic!("a drained parser refused a push of {n}: {e:?}");
            }
            pos += n;
        } else if flags & 2 != 0 && !eof_sent {
            p.eof();
            eof_sent = true;
        } else {
            return out;
        }
        loop {
            match p.next_event() {
                Ok(None) => break,
                Ok(Some(ev)) => record(&mut out, &mut sse, limits, max_event, ev),
                Err(e) => {
                    // Final: nothing more comes out.
                    let _ = p.push(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
                    assert!(p.next_event().is_err(), "the parser yielded after an error");
                    out.error = Some(e);
                    return out;
                }
            }
        }
    }
}

fn record(
    out: &mut Outcome,
    sse: &mut SseDecoder,
    limits: ResponseLimits,
    max_event: usize,
    ev: ResponseEvent,
) {
    let open = out.responses.last().is_some_and(|r| r.trailers.is_none());
    match ev {
        ResponseEvent::Head(head) => {
            assert!(!open, "a head inside a body");
            assert!((200..=599).contains(&head.status), "status {}", head.status);
            assert!(head.headers.len() <= limits.max_headers);
            if let Framing::Length(n) = head.framing {
                assert!(n > 0 && n <= limits.max_body_bytes);
            }
            *sse = SseDecoder::new(max_event);
            out.responses.push(Response {
                head,
                body: Vec::new(),
                trailers: None,
                events: Vec::new(),
                sse_error: None,
            });
        }
        ResponseEvent::Data(d) => {
            assert!(open, "data outside a body");
            assert!(!d.is_empty(), "an empty data event");
            let r = out.responses.last_mut().unwrap();
            r.body.extend_from_slice(&d);
            assert!(r.body.len() as u64 <= limits.max_body_bytes, "body over the limit");
            if r.sse_error.is_none() {
                // Events completed before a refusal still count, whatever the split.
                let pushed = sse.push(&d);
                while let Some(e) = sse.next_event() {
                    assert!(e.data.len() <= max_event);
                    let _ = a2a::decode_stream_event(&e.data, 1);
                    r.events.push(e);
                }
                r.sse_error = pushed.err();
            }
        }
        ResponseEvent::End { trailers } => {
            assert!(open, "an end without a head");
            let r = out.responses.last_mut().unwrap();
            if let Framing::Length(n) = r.head.framing {
                assert_eq!(r.body.len() as u64, n);
            }
            assert!(trailers.len() <= limits.max_headers);
            let _ = a2a::decode_send_response(&r.body, 1);
            let _ = a2a::decode_task_response(&r.body, 1);
            if let Ok(card) = a2a::parse_card(&r.body) {
                let _ = a2a::select_interface(&card, "http://127.0.0.1:8420/");
                let _ = a2a::select_interface(&card, "unix:///run/a.sock");
            }
            let _ = a2a::card_ttl_secs(&r.head, false);
            r.trailers = Some(trailers);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let max = PUSH_SIZES[usize::from(data[0] & 7)];
    let limits = limits(data[1]);
    let flags = data[2];
    let stream = &data[3..];
    let whole = run(limits, flags, stream, None);
    let split = run(limits, flags, stream, Some((max, u64::from(data[0]))));
    assert_eq!(
        whole, split,
        "the client's reading depends on how the bytes were split"
    );
});
