//! Trace context in memory: a request's `traceparent` rides with the work it hands out
//! (turns, commands' tasks, webhook deliveries), as is while the instance does not trace
//! requests, and under the request's server span (whose ids its record carries) while it
//! does; a request without a valid one starts a trace only then.

mod support;

use agentd_core::a2a::types::{Part, TaskState};
use agentd_core::ids::hex;
use agentd_core::push::PushPolicy;
use agentd_core::reqlog::{Keep, RequestRecord};
use agentd_core::trace::TraceContext;
use agentd_core::{Completion, Effect};
use serde_json::json;
use support::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

/// `req` with header lines added after its request line.
fn with_headers(mut req: Vec<u8>, lines: &[&str]) -> Vec<u8> {
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    let extra: String = lines.iter().map(|l| format!("{l}\r\n")).collect();
    req.splice(at..at, extra.into_bytes());
    req
}

fn send(headers: &[&str], push: bool) -> Vec<u8> {
    let mut params = json!({"message": text_message("hi", &fresh_id()),
                            "configuration": {"returnImmediately": true}});
    if push {
        params["configuration"]["taskPushNotificationConfig"] =
            json!({"url": "https://hooks.example.com/x"});
    }
    with_headers(call("SendMessage", 1, params), headers)
}

fn turn_trace(h: &mut Harness) -> (String, Option<TraceContext>) {
    match h.take_effects().as_slice() {
        [Effect::Turn { task_id, trace, .. }] => (task_id.clone(), trace.clone()),
        other => panic!("expected one turn, got {other:?}"),
    }
}

fn record(c: &mut Client) -> RequestRecord {
    let all: Vec<_> = std::iter::from_fn(|| c.conn.poll_request_record()).collect();
    assert_eq!(all.len(), 1, "{all:#?}");
    all.into_iter().next().unwrap()
}

#[test]
fn untraced_the_callers_context_rides_as_is() {
    let mut h = Harness::new();
    let mut c = h.conn();
    c.conn.keep_records(Keep::All);
    let tp = format!("traceparent: 00-{TRACE}-{CALLER}-01");
    one(&c.feed(&mut h, &send(&[&tp, "tracestate: a=1"], false)));
    let (_, trace) = turn_trace(&mut h);
    let trace = trace.expect("the caller's context");
    assert_eq!(trace.traceparent(), format!("00-{TRACE}-{CALLER}-01"));
    assert_eq!(trace.tracestate(), Some("a=1"));
    assert_eq!(record(&mut c).span, None, "no server span");

    // None, or an invalid one: no trace at all.
    for headers in [&[][..], &["traceparent: 00-bad"][..]] {
        one(&c.feed(&mut h, &send(headers, false)));
        assert_eq!(turn_trace(&mut h).1, None);
        let r = record(&mut c);
        assert_eq!((r.span, r.trace_id.get()), (None, None));
    }
}

#[test]
fn traced_the_work_names_the_requests_server_span() {
    let mut h = Harness::with(|c| {
        c.push = PushPolicy {
            enabled: true,
            ..PushPolicy::default()
        }
    });
    h.inst.set_trace_requests(true);
    let mut c = h.conn();
    c.conn.keep_records(Keep::All);
    let tp = format!("traceparent: 00-{TRACE}-{CALLER}-01");
    one(&c.feed(&mut h, &send(&[&tp, "tracestate: a=1"], true)));
    let r = record(&mut c);
    let ids = r.span.expect("a server span");
    assert_eq!(hex(&ids.trace_id), TRACE);
    assert_eq!(ids.parent_span_id.map(|p| hex(&p)).as_deref(), Some(CALLER));
    assert_ne!(ids.span_id, [0; 8]);
    let (task_id, trace) = turn_trace(&mut h);
    let trace = trace.unwrap();
    assert_eq!(trace.trace_id, ids.trace_id);
    assert_eq!(
        trace.span_id, ids.span_id,
        "the turn's parent is the server span"
    );
    assert_eq!(trace.tracestate(), Some("a=1"));
    let span = agentd_core::trace::server_span(&r, 5_000_000_000).unwrap();
    assert_eq!(span.name, "SendMessage");

    // The task's webhook delivery carries the same context.
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: task_id.clone(),
                state: TaskState::Completed,
                message: Some(vec![Part::text("done")]),
            },
            h.now,
        )
        .unwrap();
    let delivered = h
        .take_effects()
        .into_iter()
        .find_map(|e| match e {
            Effect::Deliver { trace, .. } => Some(trace),
            _ => None,
        })
        .expect("a delivery");
    assert_eq!(delivered, Some(trace));

    // Without a valid traceparent: a new trace, a root span, named in the log's trace_id.
    one(&c.feed(&mut h, &send(&["traceparent: 00-BAD"], false)));
    let r = record(&mut c);
    let ids = r.span.unwrap();
    assert_eq!(ids.parent_span_id, None);
    assert_ne!(hex(&ids.trace_id), TRACE);
    assert_eq!(r.trace_id, hex(&ids.trace_id).as_str());
    let (_, trace) = turn_trace(&mut h);
    let trace = trace.unwrap();
    assert_eq!((trace.trace_id, trace.span_id), (ids.trace_id, ids.span_id));
    assert!(trace.sampled());

    // Each request its own span.
    one(&c.feed(&mut h, &send(&[&tp], false)));
    let again = record(&mut c).span.unwrap();
    assert_eq!(hex(&again.trace_id), TRACE);
    assert_ne!(again.span_id, r.span.unwrap().span_id);
    turn_trace(&mut h);
}
