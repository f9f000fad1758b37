//! The events feed driven in memory: frames, replay, live delivery, resync, visibility,
//! annotations, the deadline, slow subscribers, params refusals, and the one push path.

mod support;

use agentd_core::a2a::types::TaskState;
use agentd_core::auth::{Principal, Role};
use agentd_core::feed::{FeedEvent, PushError};
use agentd_core::{Completion, Effect};
use serde_json::{json, Value};
use support::*;

const EVENTS: &str = "https://agentd.dev/a2a/ext/events";
const ANNOTATIONS: &str = "https://agentd.dev/a2a/ext/task-annotations";

fn feed_harness(ring: usize) -> Harness {
    Harness::with(|c| feed_config(c, ring))
}

/// The feed on, with a ring of `ring` events and a 10 s stream deadline; every event goes
/// out at once (no batching: `a_steady_flow_is_taken_in_batches` has that).
fn feed_config(c: &mut agentd_core::InstanceConfig, ring: usize) {
    c.events_enabled = true;
    c.events_ring = ring;
    c.events_stream_deadline_ms = 10_000;
    c.events_batch_ms = 0;
}

/// A task created and rejected by the fake host: two events.
fn task_round(h: &mut Harness, c: &mut Client) -> String {
    c.feed(
        h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("x",&fresh_id()), "configuration":{"returnImmediately":true}}),
        ),
    );
    let id = h.turn();
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: id.clone(),
                state: TaskState::Rejected,
                message: None,
            },
            h.now,
        )
        .unwrap();
    id
}

fn subscribe(h: &mut Harness, c: &mut Client, params: Value, extensions: &[&str]) -> Vec<u8> {
    c.feed(
        h,
        &call_ext("agentd.events/SubscribeToEvents", 7, params, extensions),
    )
}

/// The frames of a (possibly still open) feed stream.
fn frames(bytes: &[u8]) -> Vec<Value> {
    first_head(bytes).events()
}

fn frame_kind(f: &Value) -> &str {
    let r = f["result"].as_object().expect("a result");
    assert_eq!(r.len(), 1, "one frame per event: {f}");
    r.keys().next().unwrap()
}

fn event_seqs(frames: &[Value]) -> Vec<u64> {
    frames
        .iter()
        .filter(|f| frame_kind(f) == "event")
        .map(|f| f["result"]["event"]["seq"].as_u64().unwrap())
        .collect()
}

#[test]
fn hello_replay_live_and_the_deadline_goodbye() {
    let mut h = feed_harness(64);
    let mut writer = h.conn();
    task_round(&mut h, &mut writer);
    task_round(&mut h, &mut writer);
    let mut c = h.conn();
    let out = subscribe(&mut h, &mut c, json!({"fromSeq": 0}), &[EVENTS]);
    let head = first_head(&out);
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    assert_eq!(head.header("a2a-extensions"), Some(EVENTS));
    let f = frames(&out);
    assert_eq!(f[0]["id"], 7);
    assert_eq!(
        f[0]["result"]["hello"],
        json!({"introspection": false, "resume": 0, "resync": false, "seq": 4, "version": env!("CARGO_PKG_VERSION")})
    );
    assert_eq!(event_seqs(&f), [1, 2, 3, 4]);
    let e = &f[1]["result"]["event"];
    assert_eq!(e["kind"], "task");
    assert_eq!(e["ts"], T0);
    assert_eq!(e["data"]["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    // The overview's member order: kind, seq, ts, data.
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains(r#"{"event":{"kind":"task","seq":1,"ts":"#),
        "{text}"
    );

    // Live: the waker fires and the new events follow.
    let wakes = c.wakes();
    task_round(&mut h, &mut writer);
    assert!(c.wakes() > wakes);
    // Taken under the instance by serve, written by produce (which takes none).
    c.conn.serve(&mut h.inst, h.now);
    assert!(c.conn.pending_output().is_empty(), "serve writes no frame");
    c.conn.produce(h.now);
    let live = c.drain(&h);
    let seqs: Vec<u64> = String::from_utf8_lossy(&live)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["result"]["event"]["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [5, 6]);

    // The deadline: goodbye with the cursor to resume from, then the stream ends.
    h.advance(10_000);
    let bye = c.timeout(&mut h);
    let text = String::from_utf8_lossy(&bye);
    assert!(
        text.contains(r#"{"goodbye":{"reason":"deadline","seq":6}}"#),
        "{text}"
    );
    assert!(
        text.ends_with("0\r\n\r\n"),
        "the chunked stream ends: {text}"
    );
    assert_eq!(h.inst.feed_subscribers(), 0);
    // Reconnecting from goodbye's seq: nothing missed, nothing repeated.
    task_round(&mut h, &mut writer);
    let again = frames(&subscribe(&mut h, &mut c, json!({"fromSeq": 6}), &[EVENTS]));
    assert_eq!(again[0]["result"]["hello"]["resync"], false);
    assert_eq!(event_seqs(&again), [7, 8]);
}

#[test]
fn resync_when_the_cursor_cannot_be_honoured() {
    let mut h = feed_harness(4);
    let mut w = h.conn();
    for _ in 0..5 {
        task_round(&mut h, &mut w);
    }
    // Ten events, the ring holds 7..10.
    let mut c = h.conn();
    let f = frames(&subscribe(&mut h, &mut c, json!({"fromSeq": 3}), &[EVENTS]));
    assert_eq!(
        f[0]["result"]["hello"]["resync"], true,
        "events past the cursor left the ring"
    );
    assert_eq!(f[0]["result"]["hello"]["resume"], 3);
    assert_eq!(
        event_seqs(&f),
        [7, 8, 9, 10],
        "the replay starts at the ring's start"
    );
    // A cursor the ring still honours.
    let mut c = h.conn();
    let f = frames(&subscribe(&mut h, &mut c, json!({"fromSeq": 6}), &[EVENTS]));
    assert_eq!(f[0]["result"]["hello"]["resync"], false);
    assert_eq!(event_seqs(&f), [7, 8, 9, 10]);
    // From the start is never a resync, even when the start has left.
    let mut c = h.conn();
    let f = frames(&subscribe(&mut h, &mut c, json!({}), &[EVENTS]));
    assert_eq!(f[0]["result"]["hello"]["resync"], false);
    // After a restart the feed starts again: every old cursor is ahead of it.
    let mut restarted = feed_harness(4);
    let mut c = restarted.conn();
    let f = frames(&subscribe(
        &mut restarted,
        &mut c,
        json!({"fromSeq": 10}),
        &[EVENTS],
    ));
    assert_eq!(
        f[0]["result"]["hello"],
        json!({"introspection": false, "resume": 10, "resync": true, "seq": 0, "version": env!("CARGO_PKG_VERSION")})
    );
}

#[test]
fn visibility_gives_a_non_operator_gaps() {
    let mut h = feed_harness(64);
    let alice = Principal::new("user:alice", Role::User, vec![]);
    let mut a = h.conn_as(0, alice.clone());
    let mut op = h.conn();
    task_round(&mut h, &mut op); // 1, 2: the operator's
    task_round(&mut h, &mut a); // 3, 4: alice's
    h.inst
        .push_event(
            FeedEvent::Other {
                kind: "lifecycle",
                data: json!({"paused": true, "reason": "maintenance"}),
                owner: None,
            },
            h.now,
        )
        .unwrap(); // 5: every subscriber
    h.inst
        .push_event(
            FeedEvent::Other {
                kind: "subagent.removed",
                data: json!({"id": "s1"}),
                owner: Some("user:alice".into()),
            },
            h.now,
        )
        .unwrap(); // 6: operators only, whoever owned it
    let mut sa = h.conn_as(0, alice);
    let f = frames(&subscribe(
        &mut h,
        &mut sa,
        json!({"fromSeq": 0}),
        &[EVENTS],
    ));
    assert_eq!(
        event_seqs(&f),
        [3, 4, 5],
        "alice sees her tasks and what is addressed to all"
    );
    let mut so = h.conn();
    let f = frames(&subscribe(
        &mut h,
        &mut so,
        json!({"fromSeq": 0}),
        &[EVENTS],
    ));
    assert_eq!(
        event_seqs(&f),
        [1, 2, 3, 4, 5, 6],
        "an operator sees every event"
    );
    let mut anon = h.conn_as(
        0,
        Principal::new("nobody", Role::Anonymous, vec!["*".into()]),
    );
    let f = frames(&subscribe(
        &mut h,
        &mut anon,
        json!({"fromSeq": 0}),
        &[EVENTS],
    ));
    assert!(event_seqs(&f).is_empty(), "anonymous receives nothing");
}

#[test]
fn an_evicted_task_is_reported_removed_to_its_owner() {
    let mut h = Harness::with(|c| {
        feed_config(c, 64);
        c.tasks.max_tasks = 2;
    });
    let alice = Principal::new("user:alice", Role::User, vec![]);
    let mut a = h.conn_as(0, alice.clone());
    // A millisecond apart: the oldest terminal task goes first, by creation time.
    let first = task_round(&mut h, &mut a); // 1, 2
    h.advance(1);
    task_round(&mut h, &mut a); // 3, 4
    h.advance(1);
    let third = task_round(&mut h, &mut a); // 5: the first is evicted to make room, 6, 7
    let mut sa = h.conn_as(0, alice);
    let f = frames(&subscribe(
        &mut h,
        &mut sa,
        json!({"fromSeq": 4}),
        &[EVENTS],
    ));
    let events: Vec<(String, Value)> = f
        .iter()
        .filter(|f| frame_kind(f) == "event")
        .map(|f| {
            let e = &f["result"]["event"];
            (e["kind"].as_str().unwrap().to_owned(), e["data"].clone())
        })
        .collect();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0], ("task.removed".into(), json!({"id": first})));
    assert_eq!(events[1].1["task"]["id"], json!(third));
}

#[test]
fn task_events_carry_annotations_only_when_activated() {
    let mut h = feed_harness(64);
    let mut w = h.conn();
    task_round(&mut h, &mut w);
    let mut c = h.conn();
    let plain = frames(&subscribe(&mut h, &mut c, json!({"fromSeq": 0}), &[EVENTS]));
    for e in plain.iter().filter(|f| frame_kind(f) == "event") {
        assert!(
            e["result"]["event"]["data"]["task"]
                .get("metadata")
                .is_none(),
            "{e}"
        );
    }
    let both = format!("{EVENTS}, {ANNOTATIONS}");
    let mut c = h.conn();
    let out = subscribe(&mut h, &mut c, json!({"fromSeq": 0}), &[&both]);
    assert_eq!(
        first_head(&out).header("a2a-extensions"),
        Some(both.as_str())
    );
    let annotated = frames(&out);
    let a = &annotated[2]["result"]["event"]["data"]["task"]["metadata"][ANNOTATIONS];
    assert_eq!(a["link"]["kind"], "turn");
    assert_eq!(a["statusHistory"].as_array().unwrap().len(), 2);
}

#[test]
fn a_slow_subscriber_is_cut_off_not_buffered() {
    let mut h = Harness::with(|c| {
        c.events_enabled = true;
        c.events_ring = 8;
        c.conn.max_output_bytes = 2048;
    });
    let mut w = h.conn();
    let mut slow = h.conn();
    // It subscribes, then never reads its socket: nothing is drained from its output.
    slow.conn.handle_input(
        &mut h.inst,
        &call_ext(
            "agentd.events/SubscribeToEvents",
            7,
            json!({"fromSeq": 0}),
            &[EVENTS],
        ),
        h.now,
    );
    for _ in 0..20 {
        task_round(&mut h, &mut w);
        slow.conn.poll(&mut h.inst, h.now);
        assert!(
            slow.conn.pending_output().len() < 2048 + 4096,
            "output stays bounded"
        );
    }
    // Once it reads again, it learns it fell out of the ring: the stream ends, no goodbye.
    let mut out = slow.drain(&h);
    slow.conn.poll(&mut h.inst, h.now);
    out.extend(slow.drain(&h));
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("goodbye"), "{text}");
    assert!(text.ends_with("0\r\n\r\n"), "the stream ended: {text}");
    assert_eq!(h.inst.feed_subscribers(), 0);
    // Its reconnect from the last seq it read gets resync.
    let last = frames(&out)
        .iter()
        .filter(|f| frame_kind(f) == "event")
        .map(|f| f["result"]["event"]["seq"].as_u64().unwrap())
        .max()
        .unwrap();
    let mut again = h.conn();
    let f = frames(&subscribe(
        &mut h,
        &mut again,
        json!({"fromSeq": last}),
        &[EVENTS],
    ));
    assert_eq!(f[0]["result"]["hello"]["resync"], true);
    // Other subscribers were never held up: a fast one is at the newest seq.
    let mut fast = h.conn();
    let mut out = subscribe(&mut h, &mut fast, json!({"fromSeq": 0}), &[EVENTS]);
    loop {
        let more = fast.poll(&mut h);
        if more.is_empty() {
            break;
        }
        out.extend(more);
    }
    assert_eq!(*event_seqs(&frames(&out)).last().unwrap(), 40);
}

#[test]
fn params_refusals_are_plain_json() {
    let mut h = feed_harness(8);
    let mut c = h.conn();
    for (params, field) in [
        (json!({"after": 3}), "params.after"),
        (json!({"fromSeq": 1, "limit": 2}), "params.limit"),
        (json!({"fromSeq": -1}), "params.fromSeq"),
        (json!({"fromSeq": 2.0}), "params.fromSeq"),
        (json!({"fromSeq": "3"}), "params.fromSeq"),
        (
            json!({"fromSeq": 18446744073709551616u128 as f64}),
            "params.fromSeq",
        ),
    ] {
        let r = one(&subscribe(&mut h, &mut c, params.clone(), &[EVENTS]));
        assert_eq!(
            r.header("content-type"),
            Some("application/json"),
            "never SSE"
        );
        let j = assert_rpc_error(&r, -32602, None);
        assert_eq!(
            j["error"]["data"][0]["fieldViolations"][0]["field"], field,
            "{params}"
        );
        assert!(j["error"]["message"]
            .as_str()
            .unwrap()
            .contains("it takes only fromSeq"));
    }
    for body in [
        r#"{"jsonrpc":"2.0","id":7,"method":"agentd.events/SubscribeToEvents","params":null}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"agentd.events/SubscribeToEvents"}"#,
    ] {
        let out = c.feed(&mut h, &rpc_ext(body, &[EVENTS]));
        assert_eq!(
            frames(&out)[0]["result"]["hello"]["resume"],
            0,
            "{body}: from the start"
        );
        c = h.conn();
    }
    assert_eq!(h.inst.task_count(), 0);
    assert!(h
        .take_effects()
        .iter()
        .all(|e| !matches!(e, Effect::Command { .. })));
}

#[test]
fn the_host_pushes_through_one_typed_api() {
    let mut h = feed_harness(8);
    let cases = [
        (
            FeedEvent::Other {
                kind: "task",
                data: json!({}),
                owner: None,
            },
            PushError::Reserved("task"),
        ),
        (
            FeedEvent::TaskRemoved {
                id: "t".into(),
                owner: "x".into(),
            },
            PushError::Reserved("task.removed"),
        ),
        (
            FeedEvent::Other {
                kind: "pairing",
                data: json!({}),
                owner: None,
            },
            PushError::UnknownKind("pairing".into()),
        ),
    ];
    for (event, err) in cases {
        assert_eq!(h.inst.push_event(event, h.now), Err(err));
    }
    let seq = h
        .inst
        .push_event(
            FeedEvent::Other {
                kind: "config",
                data: json!({"paths": ["agent.approval"], "source": "admin.set"}),
                owner: None,
            },
            h.now,
        )
        .unwrap();
    assert_eq!(seq, 1);
    if cfg!(debug_assertions) {
        let bad = FeedEvent::Other {
            kind: "config",
            data: json!({"paths": ["x"], "source": "elsewhere"}),
            owner: None,
        };
        assert!(matches!(
            h.inst.push_event(bad, h.now),
            Err(PushError::Invalid { kind: "config", .. })
        ));
    }
    // Without the extension declared there is no feed: pushes are no-ops.
    let mut off = Harness::new();
    assert_eq!(
        off.inst.push_event(
            FeedEvent::Other {
                kind: "config",
                data: json!({"paths": [], "source": "reload"}),
                owner: None
            },
            off.now
        ),
        Ok(0)
    );
    assert!(off.inst.feed().is_none());
}

/// Every push site goes through the one API: the ring is appended to in exactly one place,
/// and only `Instance::push_feed` calls it.
#[test]
fn no_other_push_path_exists() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut appends = Vec::new();
    let mut pushes = Vec::new();
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains("push_entry(") {
                    appends.push(format!("{}:{}", path.display(), n + 1));
                }
                if code.contains("feed::push(") {
                    pushes.push(format!("{}:{}", path.display(), n + 1));
                }
            }
        }
    }
    assert_eq!(
        appends.len(),
        2,
        "push_entry: its definition and its one caller: {appends:?}"
    );
    assert!(appends.iter().all(|a| a.contains("feed.rs")), "{appends:?}");
    assert_eq!(
        pushes.len(),
        1,
        "feed::push is called only by Instance::push_feed: {pushes:?}"
    );
    assert!(pushes[0].contains("instance.rs"), "{pushes:?}");
}

/// A `config` event, addressed to every subscriber.
fn push_config(h: &mut Harness) -> u64 {
    h.inst
        .push_event(
            FeedEvent::Other {
                kind: "config",
                data: json!({"paths": ["agent.approval"], "source": "admin.set"}),
                owner: None,
            },
            h.now,
        )
        .unwrap()
}

#[test]
fn a_steady_flow_is_taken_in_batches() {
    // The default pacing: at most one batch per 10 ms, or sooner once 64 events wait.
    let mut h = Harness::with(|c| {
        c.events_enabled = true;
        c.events_ring = 1024;
    });
    assert_eq!(h.config.events_batch_ms, 10);
    let mut c = h.conn();
    let out = subscribe(&mut h, &mut c, json!({"fromSeq": 0}), &[EVENTS]);
    assert_eq!(event_seqs(&frames(&out)), Vec::<u64>::new());
    assert!(
        !c.conn.serve_after_write(),
        "caught up: it waits for a wake-up, not another poll"
    );

    // After a quiet spell an event goes out at once.
    let wakes = c.wakes();
    push_config(&mut h);
    assert_eq!(c.wakes(), wakes + 1);
    let live = c.poll(&mut h);
    assert_eq!(event_seqs(&frames_of(&live)), [1]);

    // Within 10 ms of that batch, events wait for the next one: one wake-up for the first,
    // none for the rest, nothing written until the batch's deadline.
    for _ in 0..20 {
        push_config(&mut h);
    }
    assert_eq!(c.wakes(), wakes + 2, "one wake-up, not one per event");
    assert!(c.poll(&mut h).is_empty(), "the batch waits");
    for _ in 0..10 {
        push_config(&mut h);
    }
    assert_eq!(c.wakes(), wakes + 2);
    assert_eq!(c.conn.poll_timeout(), Some(h.now.mono_ms + 10));
    h.advance(10);
    let batch = c.timeout(&mut h);
    assert_eq!(event_seqs(&frames_of(&batch)), (2..=31).collect::<Vec<_>>());

    // A full batch does not wait for the deadline: the 64th event waiting wakes it.
    let wakes = c.wakes();
    for _ in 0..63 {
        push_config(&mut h);
    }
    assert!(c.wakes() <= wakes + 1);
    assert!(c.poll(&mut h).is_empty(), "63 wait for more");
    let woken = c.wakes();
    push_config(&mut h);
    assert_eq!(c.wakes(), woken + 1, "the 64th wakes it");
    let batch = c.poll(&mut h);
    assert_eq!(
        event_seqs(&frames_of(&batch)),
        (32..=95).collect::<Vec<_>>()
    );
    assert_eq!(
        batch
            .windows(b"\"kind\":\"config\"".len())
            .filter(|w| w == b"\"kind\":\"config\"")
            .count(),
        64,
        "every frame whole"
    );

    // A batch larger than the frames taken per poll is taken over several polls, each right
    // after the last one's output was written.
    for _ in 0..300 {
        push_config(&mut h);
    }
    let mut seqs = Vec::new();
    let mut polls = 0;
    loop {
        c.conn.poll(&mut h.inst, h.now);
        polls += 1;
        seqs.extend(event_seqs(&frames_of(&c.drain(&h))));
        if !c.conn.serve_after_write() {
            break;
        }
    }
    assert_eq!(seqs, (96..=395).collect::<Vec<_>>());
    assert!((3..=4).contains(&polls), "{polls} polls");
}

/// The frames of a stream's continuation (no HTTP head): chunk sizes skipped.
fn frames_of(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .collect()
}
