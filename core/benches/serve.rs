//! What a driver holds its shared lock for, per request: `Connection::serve` (under the
//! lock) against `Connection::produce` (outside it), in memory, with no socket.
//!
//! `cargo bench -p agentd-core --bench serve` (requests per row: `AGENTD_BENCH_REQUESTS`,
//! default 20,000). Before the serve/produce split the whole of both ran under the lock
//! (`poll`), so `serve + produce` is the hold a request had then, `serve` the hold it has
//! now.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use agentd_core::a2a::types::{Artifact, Part, TaskState};
use agentd_core::Completion;
use serde_json::json;
use support::*;

fn main() {
    let n: u32 = std::env::var("AGENTD_BENCH_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let mut h = Harness::new();
    let small = task_with_artifact(&mut h, 200);
    let large = task_with_artifact(&mut h, 64 * 1024);
    println!("serve bench: {n} requests per row, one keep-alive connection, in memory");
    println!(
        "{:<24} {:>12} {:>14} {:>22}",
        "request", "serve µs", "produce µs", "serve share of both"
    );
    let rows: [(&str, Vec<u8>); 4] = [
        ("card GET", CARD_GET.to_vec()),
        ("GetTask unknown", call("GetTask", 1, json!({"id": "nope"}))),
        (
            "GetTask 200 B task",
            call("GetTask", 2, json!({"id": small})),
        ),
        (
            "GetTask 64 KiB task",
            call("GetTask", 3, json!({"id": large})),
        ),
    ];
    for (name, request) in rows {
        let (serve, produce) = measure(&mut h, &request, n);
        let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
        println!(
            "{:<24} {:>12.2} {:>14.2} {:>21.0}%",
            name,
            per(serve),
            per(produce),
            100.0 * serve.as_secs_f64() / (serve + produce).as_secs_f64()
        );
    }
    // An open stream's events: serve takes each from the instance, produce writes its frame.
    for len in [200, 2 * 1024] {
        let (serve, produce) = measure_stream(&mut h, len, n);
        let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
        println!(
            "{:<24} {:>12.2} {:>14.2} {:>21.0}%",
            format!("stream event, {len} B"),
            per(serve),
            per(produce),
            100.0 * serve.as_secs_f64() / (serve + produce).as_secs_f64()
        );
    }
}

/// `n` artifact events of `len` bytes on one open stream: the time spent in `serve` and in
/// `produce` per event (the instance's own work on the completion is not counted).
fn measure_stream(h: &mut Harness, len: usize, n: u32) -> (Duration, Duration) {
    let mut c = h.conn();
    let out = c.feed(
        h,
        &call(
            "SendStreamingMessage",
            1,
            json!({"message": text_message("hi", &fresh_id())}),
        ),
    );
    assert!(out.starts_with(b"HTTP/1.1 200"), "the stream opens");
    let task_id = h.turn();
    let (mut serve, mut produce) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        h.inst
            .handle_completion(
                Completion::Artifact {
                    task_id: task_id.clone(),
                    artifact: Artifact {
                        artifact_id: "a".into(),
                        description: String::new(),
                        extensions: vec![],
                        metadata: None,
                        name: "out".into(),
                        parts: vec![Part::text("x".repeat(len))],
                    },
                    append: false,
                    last_chunk: false,
                },
                h.now,
            )
            .expect("artifact accepted");
        let t0 = Instant::now();
        c.conn.serve(&mut h.inst, h.now);
        let t1 = Instant::now();
        c.conn.produce(h.now);
        let t2 = Instant::now();
        serve += t1 - t0;
        produce += t2 - t1;
        let out = c.drain(h);
        assert!(out.len() > len, "the event is written");
    }
    complete(h, &task_id, TaskState::Completed, None);
    c.poll(h);
    (serve, produce)
}

/// Feeds `request` `n` times on one connection; the time spent in `serve` and in `produce`.
fn measure(h: &mut Harness, request: &[u8], n: u32) -> (Duration, Duration) {
    let mut c = h.conn();
    let (mut serve, mut produce) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        assert!(c.conn.receive(request, h.now));
        let t0 = Instant::now();
        c.conn.serve(&mut h.inst, h.now);
        let t1 = Instant::now();
        while c.conn.produce(h.now) {
            c.conn.serve(&mut h.inst, h.now);
        }
        let t2 = Instant::now();
        serve += t1 - t0;
        produce += t2 - t1;
        let out = c.drain(h);
        assert!(out.starts_with(b"HTTP/1.1 200"), "answered");
    }
    (serve, produce)
}

/// A completed task holding one text artifact of `len` bytes.
fn task_with_artifact(h: &mut Harness, len: usize) -> String {
    let mut c = h.conn();
    let out = c.feed(
        h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", &fresh_id()), "configuration": {"returnImmediately": true}}),
        ),
    );
    assert!(!out.is_empty());
    let task_id = h.turn();
    h.inst
        .handle_completion(
            Completion::Artifact {
                task_id: task_id.clone(),
                artifact: Artifact {
                    artifact_id: "a".into(),
                    description: String::new(),
                    extensions: vec![],
                    metadata: None,
                    name: "out".into(),
                    parts: vec![Part::text("x".repeat(len))],
                },
                append: false,
                last_chunk: true,
            },
            h.now,
        )
        .expect("artifact accepted");
    complete(h, &task_id, TaskState::Completed, Some("done"));
    task_id
}
