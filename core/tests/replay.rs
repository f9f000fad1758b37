//! SSE reconnection of task streams: every task stream frame carries an `id:` naming its
//! event in the task's sequence, and `SubscribeToTask` with `Last-Event-ID` replays what the
//! client missed (or a fresh snapshot when that is no longer kept). Driven in memory.

mod support;

use agentd_core::a2a::types::{Artifact, Part, TaskState};
use agentd_core::auth::{Principal, Role};
use agentd_core::ext::COMMAND_URI;
use agentd_core::Completion;
use serde_json::{json, Value};
use support::*;

fn complete(h: &mut Harness, task_id: &str, state: TaskState) {
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: task_id.into(),
                state,
                message: None,
            },
            h.now,
        )
        .expect("completion accepted");
}

fn artifact(h: &mut Harness, task_id: &str, id: &str) {
    h.inst
        .handle_completion(
            Completion::Artifact {
                task_id: task_id.into(),
                artifact: Artifact {
                    artifact_id: id.into(),
                    description: String::new(),
                    extensions: vec![],
                    metadata: None,
                    name: "out".into(),
                    parts: vec![Part::text(id)],
                },
                append: false,
                last_chunk: true,
            },
            h.now,
        )
        .expect("artifact accepted");
}

/// A JSON-RPC POST with a `Last-Event-ID` header.
fn call_resuming(method: &str, id: u64, params: Value, last_event_id: &str) -> Vec<u8> {
    let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string();
    format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nLast-Event-ID: {last_event_id}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Each SSE event of a body: its `id:` (if any) and its `data:` JSON.
fn frames(body: &[u8]) -> Vec<(Option<String>, Value)> {
    let mut out = Vec::new();
    let mut id = None;
    for line in String::from_utf8_lossy(body).lines() {
        if let Some(i) = line.strip_prefix("id: ") {
            id = Some(i.to_owned());
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((id.take(), serde_json::from_str(d).expect("data is JSON")));
        } else if line.is_empty() {
            id = None;
        }
    }
    out
}

/// The frame's single result member (`task`, `statusUpdate`, ...).
fn kind(frame: &Value) -> &str {
    let r = frame["result"].as_object().expect("a result frame");
    assert_eq!(r.len(), 1, "{frame}");
    r.keys().next().unwrap()
}

fn eid(task: &str, n: u64) -> String {
    format!("{task}:{T0:x}:{n}")
}

/// Starts a streaming send; returns the task id and the stream's bytes so far.
fn start(h: &mut Harness, c: &mut Client) -> (String, Vec<u8>) {
    let out = c.feed(
        h,
        &call(
            "SendStreamingMessage",
            1,
            json!({"message": text_message("hi", &fresh_id())}),
        ),
    );
    (h.turn(), out)
}

#[test]
fn task_stream_frames_carry_ids_in_the_task_sequence() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let (t, mut out) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working);
    artifact(&mut h, &t, "a1");
    complete(&mut h, &t, TaskState::Completed);
    out.extend(c.poll(&mut h));
    let stream = one(&out);
    let got: Vec<(Option<String>, String)> = frames(&stream.body)
        .iter()
        .map(|(i, f)| (i.clone(), kind(f).to_owned()))
        .collect();
    assert_eq!(
        got,
        [
            (Some(eid(&t, 0)), "task".to_owned()),
            (Some(eid(&t, 1)), "statusUpdate".to_owned()),
            (Some(eid(&t, 2)), "artifactUpdate".to_owned()),
            (Some(eid(&t, 3)), "statusUpdate".to_owned()),
        ]
    );
}

#[test]
fn a_continued_task_keeps_numbering_its_events() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let (t, _) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working);
    complete(&mut h, &t, TaskState::InputRequired);
    c.poll(&mut h);
    let mut d = h.conn();
    let mut out = d.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            2,
            json!({"message": {"role":"ROLE_USER","messageId":"m-2","taskId":t,"parts":[{"text":"yes"}]}}),
        ),
    );
    h.take_effects();
    complete(&mut h, &t, TaskState::Completed);
    out.extend(d.poll(&mut h));
    let f = frames(&one(&out).body);
    // 1 WORKING, 2 INPUT_REQUIRED, 3 WORKING (the answer): the snapshot is at 3.
    assert_eq!(f[0].0.as_deref(), Some(eid(&t, 3).as_str()));
    assert_eq!(kind(&f[0].1), "task");
    assert_eq!(f[1].0.as_deref(), Some(eid(&t, 4).as_str()));
    assert_eq!(f.len(), 2);
}

#[test]
fn reconnecting_to_a_live_task_replays_what_was_missed_then_continues() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let (t, _) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working);
    let seen = frames(&c.poll(&mut h));
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0.as_deref(), Some(eid(&t, 1).as_str()));
    // The client read up to event 1 and dropped; meanwhile two more events happen.
    c.conn.close(&mut h.inst);
    assert_eq!(h.inst.subscription_count(), 0);
    artifact(&mut h, &t, "a1");
    artifact(&mut h, &t, "a2");

    let mut r = h.conn();
    let mut out = r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 7, json!({"id": t}), &eid(&t, 1)),
    );
    let head = first_head(&out);
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    let f = frames(&head.body);
    let got: Vec<(Option<String>, &str, Value)> = f
        .iter()
        .map(|(i, fr)| {
            (
                i.clone(),
                kind(fr),
                fr["result"]["artifactUpdate"]["artifact"]["artifactId"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some(eid(&t, 2)), "artifactUpdate", json!("a1")),
            (Some(eid(&t, 3)), "artifactUpdate", json!("a2")),
        ],
        "exactly the missed events, no snapshot"
    );
    assert_eq!(f[0].1["id"], 7);
    assert_eq!(h.inst.subscription_count(), 1, "the stream continues live");

    complete(&mut h, &t, TaskState::Completed);
    out.extend(r.poll(&mut h));
    let f = frames(&one(&out).body);
    assert_eq!(f.len(), 3);
    assert_eq!(f[2].0.as_deref(), Some(eid(&t, 4).as_str()));
    assert_eq!(
        f[2].1["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(h.inst.subscription_count(), 0);

    // Resuming at the newest event of a live task: nothing to replay, only what comes next.
    let mut c2 = h.conn();
    let (t2, _) = start(&mut h, &mut c2);
    complete(&mut h, &t2, TaskState::Working);
    let mut r2 = h.conn();
    let out = r2.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 8, json!({"id": t2}), &eid(&t2, 1)),
    );
    assert!(frames(&first_head(&out).body).is_empty());
    artifact(&mut h, &t2, "b1");
    let more = frames(&r2.poll(&mut h));
    assert_eq!(more.len(), 1);
    assert_eq!(more[0].0.as_deref(), Some(eid(&t2, 2).as_str()));
}

#[test]
fn reconnecting_to_a_finished_task_replays_and_closes() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let (t, _) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working);
    artifact(&mut h, &t, "a1");
    complete(&mut h, &t, TaskState::Completed);
    c.poll(&mut h);

    // Without the header: unchanged, -32004 as plain JSON.
    let mut r = h.conn();
    let plain = one(&r.feed(&mut h, &call("SubscribeToTask", 2, json!({"id": t}))));
    assert_eq!(plain.header("content-type"), Some("application/json"));
    assert_rpc_error(&plain, -32004, Some("UNSUPPORTED_OPERATION"));

    // With it: the events after the id, then the stream closes (a complete response, and
    // the connection takes the next request).
    let replay = one(&r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 3, json!({"id": t}), &eid(&t, 1)),
    ));
    assert_eq!(replay.header("content-type"), Some("text/event-stream"));
    let f = frames(&replay.body);
    let ids: Vec<Option<String>> = f.iter().map(|(i, _)| i.clone()).collect();
    assert_eq!(ids, [Some(eid(&t, 2)), Some(eid(&t, 3))]);
    assert_eq!(kind(&f[0].1), "artifactUpdate");
    assert_eq!(
        f[1].1["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(h.inst.subscription_count(), 0);

    // From the snapshot's id (0): everything.
    let all = one(&r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 4, json!({"id": t}), &eid(&t, 0)),
    ));
    assert_eq!(frames(&all.body).len(), 3);

    // From the last event: nothing is missing; the final snapshot, at the id the client
    // holds, so the request still gets one response; then the stream closes.
    let none = one(&r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 5, json!({"id": t}), &eid(&t, 3)),
    ));
    assert_eq!(none.status, 200);
    let f = frames(&none.body);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].0.as_deref(), Some(eid(&t, 3).as_str()));
    assert_eq!(
        f[0].1["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(one(&r.feed(&mut h, CARD_GET)).status, 200);
}

#[test]
fn dropped_events_are_replaced_by_a_fresh_snapshot() {
    let mut h = Harness::with(|c| c.replay.per_task = 2);
    let mut c = h.conn();
    let (t, _) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working); // 1 (dropped)
    artifact(&mut h, &t, "a1"); // 2
    artifact(&mut h, &t, "a2"); // 3

    // Live: events 2 and 3 are kept but 1 is not, so a resume after 0 gets the task as it
    // stands (id 3), then live events.
    let mut r = h.conn();
    let out = r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 2, json!({"id": t}), &eid(&t, 0)),
    );
    let f = frames(&first_head(&out).body);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].0.as_deref(), Some(eid(&t, 3).as_str()));
    assert_eq!(kind(&f[0].1), "task");
    assert_eq!(
        f[0].1["result"]["task"]["artifacts"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "the snapshot holds what the dropped events said"
    );
    // A resume after 1 is still complete from what is kept.
    let mut r1 = h.conn();
    let out1 = r1.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 3, json!({"id": t}), &eid(&t, 1)),
    );
    let ids: Vec<_> = frames(&first_head(&out1).body)
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ids, [Some(eid(&t, 2)), Some(eid(&t, 3))]);

    complete(&mut h, &t, TaskState::Completed); // 4
    let live = frames(&r.poll(&mut h));
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].0.as_deref(), Some(eid(&t, 4).as_str()));

    // Finished: a resume from before what is kept gets the final snapshot and closes.
    let mut f2 = h.conn();
    let snap = one(&f2.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 4, json!({"id": t}), &eid(&t, 1)),
    ));
    let f = frames(&snap.body);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].0.as_deref(), Some(eid(&t, 4).as_str()));
    assert_eq!(
        f[0].1["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    // An id from an earlier run of the daemon (another start time): the snapshot too.
    let earlier = format!("{t}:{:x}:2", T0 - 5_000);
    let snap = one(&f2.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 5, json!({"id": t}), &earlier),
    ));
    let f = frames(&snap.body);
    assert_eq!(f.len(), 1);
    assert_eq!(kind(&f[0].1), "task");
    assert_eq!(f[0].0.as_deref(), Some(eid(&t, 4).as_str()));
}

#[test]
fn the_global_bound_holds_over_many_tasks() {
    let mut h = Harness::with(|c| {
        c.replay.events = 10;
        c.replay.per_task = 4;
    });
    let mut c = h.conn();
    for _ in 0..8 {
        let (t, _) = start(&mut h, &mut c);
        complete(&mut h, &t, TaskState::Working);
        artifact(&mut h, &t, "a");
        complete(&mut h, &t, TaskState::Completed);
        c.poll(&mut h);
        assert!(h.inst.replay_kept().0 <= 10, "{:?}", h.inst.replay_kept());
    }
    assert_eq!(h.inst.replay_kept().0, 10);
}

#[test]
fn an_evicted_task_takes_its_sequence_with_it() {
    // Regression: evictions were never reported by the task store, so every task's sequence
    // (and kept events) outlived the task and memory grew with every SendMessage.
    let mut h = Harness::with(|c| c.tasks.max_tasks = 4);
    let mut c = h.conn();
    let mut first = None;
    for _ in 0..40 {
        let (t, _) = start(&mut h, &mut c);
        complete(&mut h, &t, TaskState::Completed);
        c.poll(&mut h);
        first.get_or_insert(t);
        assert!(h.inst.replay_tasks() <= 4, "{}", h.inst.replay_tasks());
    }
    assert_eq!(h.inst.replay_tasks(), 4);
    assert!(
        h.inst.replay_kept().0 <= 4 * 2,
        "{:?}",
        h.inst.replay_kept()
    );
    // The evicted task is gone for a resuming client too.
    let first = first.unwrap();
    let mut r = h.conn();
    let gone = one(&r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 9, json!({"id": first}), &eid(&first, 1)),
    ));
    assert_rpc_error(&gone, -32001, None);
}

#[test]
fn bad_last_event_ids_are_invalid_params_as_plain_json() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let (t, _) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working);
    let mut o = h.conn();
    let (other, _) = start(&mut h, &mut o);
    let cases = [
        ("garbage".to_owned(), "not an event id"),
        (format!("{t}:{T0:x}:x"), "not an event id"),
        (format!("{t}:{T0:x}:-1"), "not an event id"),
        (format!("{t}:zz:1"), "not an event id"),
        (eid(&other, 0), "another task"),
        (eid(&t, 2), "past the newest event"),
    ];
    for (header, why) in cases {
        let mut r = h.conn();
        let resp = one(&r.feed(
            &mut h,
            &call_resuming("SubscribeToTask", 6, json!({"id": t}), &header),
        ));
        assert_eq!(resp.header("content-type"), Some("application/json"));
        let j = assert_rpc_error(&resp, -32602, None);
        let msg = j["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("Last-Event-ID") && msg.contains(why),
            "{header}: {msg}"
        );
        assert_eq!(
            h.inst.subscription_count(),
            2,
            "only the two original streams"
        );
    }
    // The same for a finished task: the header is checked, not -32004.
    complete(&mut h, &t, TaskState::Completed);
    let mut r = h.conn();
    let resp = one(&r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 6, json!({"id": t}), "nonsense"),
    ));
    assert_rpc_error(&resp, -32602, None);
    // An empty header names no event: as without one.
    let resp = one(&r.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 6, json!({"id": t}), ""),
    ));
    assert_rpc_error(&resp, -32004, None);
}

#[test]
fn another_principals_task_stays_not_found() {
    let mut h = Harness::new();
    let alice = Principal::new("user:alice", Role::User, vec![]);
    let bob = Principal::new("user:bob", Role::User, vec![]);
    let mut a = h.conn_as(0, alice.clone());
    let (t, _) = start(&mut h, &mut a);
    complete(&mut h, &t, TaskState::Working);
    artifact(&mut h, &t, "a1");

    for header in [eid(&t, 0), eid(&t, 1), "garbage".to_owned()] {
        let mut b = h.conn_as(0, bob.clone());
        let resp = one(&b.feed(
            &mut h,
            &call_resuming("SubscribeToTask", 3, json!({"id": t}), &header),
        ));
        assert_eq!(resp.header("content-type"), Some("application/json"));
        assert_rpc_error(&resp, -32001, None);
    }
    complete(&mut h, &t, TaskState::Completed);
    let mut b = h.conn_as(0, bob);
    let resp = one(&b.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 3, json!({"id": t}), &eid(&t, 0)),
    ));
    assert_rpc_error(&resp, -32001, None);
    // Its owner may resume it.
    let mut a2 = h.conn_as(0, alice);
    let resp = one(&a2.feed(
        &mut h,
        &call_resuming("SubscribeToTask", 3, json!({"id": t}), &eid(&t, 0)),
    ));
    assert_eq!(frames(&resp.body).len(), 3);
}

#[test]
fn a_command_message_reply_carries_no_id() {
    // §3.6: a streamed `message` reply is one frame with no SSE id (it is no task event).
    let mut h = Harness::with(|c| c.introspection_enabled = true);
    let mut c = h.conn();
    let out = c.feed(
        &mut h,
        &call_ext(
            "SendStreamingMessage",
            2,
            json!({"message": {"role":"ROLE_USER","messageId":"m","extensions":[COMMAND_URI],
                               "parts":[{"data":{"agentd": {"op":"status"}}}]}}),
            &[COMMAND_URI],
        ),
    );
    let r = one(&out);
    let f = frames(&r.body);
    assert_eq!(f.len(), 1);
    assert_eq!(kind(&f[0].1), "message");
    assert_eq!(f[0].0, None);
}

#[test]
fn a_long_replay_is_written_as_the_peer_reads() {
    let mut h = Harness::with(|c| c.conn.max_output_bytes = 1024);
    let mut c = h.conn();
    let (t, _) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working);
    for i in 0..20 {
        artifact(&mut h, &t, &format!("a{i}"));
    }
    complete(&mut h, &t, TaskState::Completed);
    c.conn.close(&mut h.inst);

    // A peer that reads what is pending one write at a time, as a driver writes it: the
    // output bound holds the replay back (the bound, plus the frame that crossed it).
    let mut r = h.conn();
    let req = call_resuming("SubscribeToTask", 2, json!({"id": t}), &eid(&t, 0));
    r.conn.handle_input(&mut h.inst, &req, h.now);
    let (mut out, mut writes, mut largest) = (Vec::new(), 0, 0);
    for _ in 0..1000 {
        let pending = r.conn.pending_output();
        if pending.is_empty() {
            // All written: the driver polls again for what comes next.
            r.conn.poll(&mut h.inst, h.now);
            if r.conn.pending_output().is_empty() {
                break;
            }
            continue;
        }
        largest = largest.max(pending.len());
        writes += 1;
        out.extend_from_slice(pending);
        let n = pending.len();
        r.conn.consume_output(n, h.now);
    }
    assert!(
        largest < 1024 + 512,
        "the output bound holds the replay back: {largest} bytes pending at once"
    );
    assert!(writes > 2, "the replay took {writes} writes");
    let ids: Vec<Option<String>> = frames(&one(&out).body)
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    let want: Vec<Option<String>> = (1..=22).map(|n| Some(eid(&t, n))).collect();
    assert_eq!(ids, want);
}

/// Stream frames are taken from the instance under `serve` and written by `produce`,
/// which takes no instance: a driver builds their JSON outside its lock.
#[test]
fn stream_frames_are_written_by_produce_outside_the_instance() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let (t, _) = start(&mut h, &mut c);
    complete(&mut h, &t, TaskState::Working);
    artifact(&mut h, &t, "a1");
    c.conn.serve(&mut h.inst, h.now);
    assert!(
        c.conn.pending_output().is_empty(),
        "serve only takes the frames: {:?}",
        String::from_utf8_lossy(c.conn.pending_output())
    );
    c.conn.produce(h.now);
    let got: Vec<String> = frames(&c.drain(&h))
        .iter()
        .map(|(_, f)| kind(f).to_owned())
        .collect();
    assert_eq!(got, ["statusUpdate", "artifactUpdate"]);
}
