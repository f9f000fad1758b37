//! A sans-io HTTP/1.1 + Server-Sent Events client, for agentd's outbound calls (the
//! `a2a.send` / `a2a.delegate` steps, webhooks).
//!
//! Like the server side it owns no socket and no clock: [`OutRequest`] writes request bytes,
//! [`ResponseParser`] parses response bytes fed in any split, [`SseDecoder`] decodes an event
//! stream out of a body, and [`a2a`] builds and reads the A2A JSON-RPC documents and picks the
//! interface of a peer's card. A driver moves the bytes and keeps the time.

pub mod a2a;
pub(crate) mod request;
pub(crate) mod response;
pub(crate) mod sse;

pub use request::{OutRequest, RequestError};
pub use response::{
    Framing, ResponseError, ResponseEvent, ResponseHead, ResponseLimits, ResponseParser,
};
pub use sse::{SseDecoder, SseError, SseEvent};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::response::{write_chunked_end, write_sse_comment, write_sse_event, Head};

    /// The server's own SSE writer, read back by the client in every split: the two halves
    /// of the core agree on the wire format.
    #[test]
    fn reads_what_the_server_writes_in_every_split() {
        for chunked in [true, false] {
            let mut wire = Vec::new();
            Head::new(200, "now").write_sse_start(&mut wire, chunked);
            write_sse_event(&mut wire, b"{\"n\":1}", chunked);
            write_sse_comment(&mut wire, "keep-alive", chunked);
            write_sse_event(&mut wire, b"{\"n\":2}", chunked);
            if chunked {
                write_chunked_end(&mut wire);
            }
            for split in 0..=wire.len() {
                let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
                let mut sse = SseDecoder::new(1024);
                let mut data = Vec::new();
                let mut ended = false;
                for piece in [&wire[..split], &wire[split..]] {
                    p.push(piece).unwrap();
                    while let Some(e) = p.next_event().unwrap() {
                        match e {
                            ResponseEvent::Head(h) => {
                                assert_eq!(h.media_type().as_deref(), Some("text/event-stream"))
                            }
                            ResponseEvent::Data(d) => sse.push(&d).unwrap(),
                            ResponseEvent::End { .. } => ended = true,
                        }
                    }
                    while let Some(e) = sse.next_event() {
                        data.push(e.data);
                    }
                }
                if !chunked {
                    p.eof();
                    assert!(matches!(
                        p.next_event(),
                        Ok(Some(ResponseEvent::End { .. }))
                    ));
                    ended = true;
                }
                assert!(ended && sse.is_between_events());
                assert_eq!(
                    data,
                    ["{\"n\":1}", "{\"n\":2}"],
                    "chunked {chunked} split {split}"
                );
            }
        }
    }
}
