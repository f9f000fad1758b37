//! Write-ahead: an answer that acknowledges a change is held until the host reports the
//! change's records durable; reads are not held; records come out one per changed key.

mod support;

use agentd_core::a2a::types::TaskState;
use serde_json::json;
use support::*;

fn wal() -> Harness {
    let mut h = Harness::new();
    h.inst.set_write_ahead(true);
    h
}

/// Drains the records and reports them durable, as a host does after its fsync.
fn make_durable(h: &mut Harness) -> usize {
    let mut n = 0;
    while let Some(batch) = h.inst.poll_records() {
        n += batch.records.len();
        h.inst.records_durable(batch.upto);
    }
    n
}

#[test]
fn a_send_answer_is_held_until_its_task_is_durable_then_released() {
    let mut h = wal();
    let mut c = h.conn();
    let out = c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m"), "configuration": {"returnImmediately": true}}),
        ),
    );
    assert!(
        out.is_empty(),
        "held until durable: {}",
        String::from_utf8_lossy(&out)
    );
    assert!(
        !c.conn.wants_read(),
        "the driver waits for the wake-up, not for input"
    );
    let task_id = h.turn();

    let batch = h.inst.poll_records().expect("the new task is a record");
    assert_eq!(batch.records.len(), 1);
    assert_eq!(batch.records[0].kind, "task");
    assert_eq!(batch.records[0].key, task_id);
    assert!(c.poll(&mut h).is_empty(), "drained is not durable");

    let woken = c.wakes();
    h.inst.records_durable(batch.upto);
    assert!(c.wakes() > woken, "durability wakes the held connection");
    let out = c.poll(&mut h);
    let task = one(&out).json()["result"]["task"].clone();
    assert_eq!(task["id"], task_id.as_str());
    assert!(c.conn.wants_read());
}

#[test]
fn reads_are_not_held_behind_changes_not_yet_durable() {
    let mut h = wal();
    let mut writer = h.conn();
    let out = writer.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m"), "configuration": {"returnImmediately": true}}),
        ),
    );
    assert!(out.is_empty());
    let task_id = h.turn();

    let mut reader = h.conn();
    let got = one(&reader.feed(&mut h, &call("GetTask", 2, json!({"id": task_id}))));
    assert_eq!(got.json()["result"]["id"], task_id.as_str());
    let list = one(&reader.feed(&mut h, &call("ListTasks", 3, json!({}))));
    assert_eq!(list.json()["result"]["totalSize"], 1);
    make_durable(&mut h);
    assert_eq!(
        one(&writer.poll(&mut h)).json()["result"]["task"]["id"],
        task_id.as_str()
    );
}

#[test]
fn cancel_and_blocking_send_answers_wait_for_the_state_they_report() {
    let mut h = wal();
    let mut c = h.conn();
    let out = c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m")}),
        ),
    );
    assert!(out.is_empty());
    let t = h.turn();
    complete(&mut h, &t, TaskState::Completed, Some("done"));
    assert!(
        c.poll(&mut h).is_empty(),
        "the settled task is not durable yet"
    );
    make_durable(&mut h);
    let r = one(&c.poll(&mut h)).json();
    assert_eq!(
        r["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    let out = c.feed(
        &mut h,
        &call(
            "SendMessage",
            2,
            json!({"message": text_message("hi", "m2"), "configuration": {"returnImmediately": true}}),
        ),
    );
    assert!(out.is_empty());
    let t2 = h.turn();
    make_durable(&mut h);
    assert!(!c.poll(&mut h).is_empty());
    assert!(c
        .feed(&mut h, &call("CancelTask", 3, json!({"id": t2})))
        .is_empty());
    make_durable(&mut h);
    let r = one(&c.poll(&mut h)).json();
    assert_eq!(r["result"]["status"]["state"], "TASK_STATE_CANCELED");
}

#[test]
fn a_stream_holds_its_first_frame_and_its_settled_state_not_the_frames_between() {
    let mut h = wal();
    let mut c = h.conn();
    let out = c.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            1,
            json!({"message": text_message("hi", "m")}),
        ),
    );
    assert!(out.is_empty(), "the task frame waits for the task's record");
    let t = h.turn();
    make_durable(&mut h);
    let mut out = c.poll(&mut h);
    assert!(!out.is_empty());
    complete(&mut h, &t, TaskState::Working, None);
    let working = c.poll(&mut h);
    assert!(
        !working.is_empty(),
        "a working frame may precede durability"
    );
    out.extend(working);
    complete(&mut h, &t, TaskState::Completed, Some("ok"));
    assert!(
        c.poll(&mut h).is_empty(),
        "a terminal frame never precedes durability"
    );
    make_durable(&mut h);
    out.extend(c.poll(&mut h));
    let events = one(&out).events();
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[2]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}

#[test]
fn one_record_per_task_per_drain_and_restore_is_exact() {
    let mut h = wal();
    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m"), "configuration": {"returnImmediately": true}}),
        ),
    );
    let t = h.turn();
    complete(&mut h, &t, TaskState::Working, Some("thinking"));
    complete(&mut h, &t, TaskState::InputRequired, Some("which?"));
    let batch = h.inst.poll_records().unwrap();
    assert_eq!(batch.records.len(), 1, "ten changes, one record");
    assert!(h.inst.poll_records().is_none());
    h.inst.records_durable(batch.upto);
    assert!(!c.poll(&mut h).is_empty());

    // A second instance restores the record: the task reads back the same, and, having been
    // in flight, is ended with the reason.
    let mut h2 = wal();
    let rec = &batch.records[0];
    h2.inst
        .restore_record(rec.kind, &rec.key, rec.value().unwrap(), h2.now)
        .unwrap();
    let mut c2 = h2.conn();
    let before = one(&c.feed(&mut h, &call("GetTask", 2, json!({"id": t})))).json();
    let after = one(&c2.feed(&mut h2, &call("GetTask", 2, json!({"id": t})))).json();
    assert_eq!(before, after);
    assert_eq!(
        h2.inst
            .end_in_flight("agentd restarted while this task was in flight", h2.now),
        1
    );
    make_durable(&mut h2);
    let ended = one(&c2.feed(&mut h2, &call("GetTask", 3, json!({"id": t})))).json();
    assert_eq!(ended["result"]["status"]["state"], "TASK_STATE_FAILED");
    assert_eq!(
        ended["result"]["status"]["message"]["parts"][0]["text"],
        "agentd restarted while this task was in flight"
    );
    let history = ended["result"]["history"].as_array().unwrap().len();
    assert_eq!(
        history,
        before["result"]["history"].as_array().unwrap().len() + 1
    );
}

#[test]
fn without_write_ahead_nothing_is_queued_or_held() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let out = c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m"), "configuration": {"returnImmediately": true}}),
        ),
    );
    assert!(!out.is_empty());
    assert!(h.inst.poll_records().is_none());
}

/// The store failed before a held answer's change was durable: nothing may acknowledge it.
/// The held answer becomes -32603 STORE_UNAVAILABLE with Retry-After and the connection
/// closes; while the store cannot write, changes are refused before they are made and reads
/// are answered; once the host healed it (all records rewritten and durable), changes are
/// taken again.
#[test]
fn a_held_answer_is_given_up_when_the_store_fails_and_changes_wait_for_its_heal() {
    let mut h = wal();
    let mut first = h.conn();
    let send = |id: u64, mid: &str| {
        call(
            "SendMessage",
            id,
            json!({"message": text_message("hi", mid), "configuration": {"returnImmediately": true}}),
        )
    };
    assert!(first.feed(&mut h, &send(1, "m1")).is_empty(), "held");
    let t1 = h.turn();
    h.inst.poll_records().expect("drained, never durable");

    h.inst.set_store_unavailable(Some(
        "write+fdatasync journal: No space left on device".into(),
    ));
    let out = first.poll(&mut h);
    let r = one(&out);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(r.header("connection"), Some("close"));
    let v = r.json();
    assert_eq!(v["id"], 1);
    assert_eq!(v["error"]["code"], -32603);
    assert_eq!(v["error"]["data"][0]["reason"], "STORE_UNAVAILABLE");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("No space left on device"));
    assert!(first.conn.is_finished(), "the connection closes after it");

    let mut c = h.conn();
    let refused = one(&c.feed(&mut h, &send(2, "m2"))).json();
    assert_eq!(refused["error"]["data"][0]["reason"], "STORE_UNAVAILABLE");
    assert!(h.take_effects().is_empty(), "nothing refused is run");
    let cancel = one(&c.feed(&mut h, &call("CancelTask", 3, json!({"id": t1})))).json();
    assert_eq!(cancel["error"]["data"][0]["reason"], "STORE_UNAVAILABLE");
    let got = one(&c.feed(&mut h, &call("GetTask", 4, json!({"id": t1})))).json();
    assert_eq!(got["result"]["id"], t1.as_str(), "reads are answered");

    // The heal: every record as it stands, then durable.
    let all = h.inst.all_records();
    assert!(all.records.iter().any(|r| r.key == t1 && r.body.is_some()));
    h.inst.records_durable(all.upto);
    h.inst.set_store_unavailable(None);
    assert!(c.feed(&mut h, &send(5, "m5")).is_empty(), "held as ever");
    let t5 = h.turn();
    make_durable(&mut h);
    let ok = one(&c.poll(&mut h)).json();
    assert_eq!(
        ok["result"]["task"]["id"],
        t5.as_str(),
        "changes are taken again"
    );
}

/// A stream whose settled frame waits for durability when the store fails ends with an error
/// event in place of that frame.
#[test]
fn a_held_stream_frame_becomes_an_error_event_when_the_store_fails() {
    let mut h = wal();
    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            1,
            json!({"message": text_message("hi", "m")}),
        ),
    );
    let t = h.turn();
    make_durable(&mut h);
    let mut out = c.poll(&mut h);
    complete(&mut h, &t, TaskState::Completed, Some("ok"));
    assert!(c.poll(&mut h).is_empty(), "the terminal frame is held");
    h.inst.set_store_unavailable(Some("EIO".into()));
    out.extend(c.poll(&mut h));
    let events = one(&out).events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["result"]["task"]["id"], t.as_str());
    assert_eq!(events[1]["error"]["data"][0]["reason"], "STORE_UNAVAILABLE");
    assert!(c.conn.is_finished());
}

/// A large answer that acknowledges a change (a cancel of a large task) is written as the
/// peer reads it like any large answer, and held like any acknowledgement: nothing of it
/// goes out before the change is durable, the connection holds about its output bound
/// meanwhile, and if the store fails first the peer gets the error alone, no part of the
/// task.
#[test]
fn a_large_held_answer_is_released_whole_or_given_up_whole() {
    for store_fails in [false, true] {
        let mut h = wal();
        let bound = h.config.conn.max_output_bytes;
        let mut c = h.conn();
        let big = "z".repeat(1_500_000);
        let out = c.feed(
            &mut h,
            &call(
                "SendMessage",
                1,
                json!({"message": text_message(&big, "big"), "configuration": {"returnImmediately": true}}),
            ),
        );
        assert!(out.is_empty());
        let t = h.turn();
        make_durable(&mut h);
        let created = one(&c.poll(&mut h));
        assert!(created.body.len() > 1_500_000);

        let out = c.feed(&mut h, &call("CancelTask", 2, json!({"id": t})));
        assert!(out.is_empty(), "held until durable");
        assert!(
            c.conn.pending_output().is_empty(),
            "nothing of it is visible"
        );
        if store_fails {
            h.inst.poll_records().expect("drained, never durable");
            h.inst
                .set_store_unavailable(Some("write journal: No space left on device".into()));
            let r = one(&c.poll(&mut h));
            let v = r.json();
            assert_eq!(v["error"]["data"][0]["reason"], "STORE_UNAVAILABLE", "{v}");
            assert!(
                r.body.len() < 4096,
                "the error alone: {} bytes",
                r.body.len()
            );
            assert!(c.conn.is_finished());
        } else {
            make_durable(&mut h);
            c.conn.poll(&mut h.inst, h.now);
            let first = c.conn.pending_output().len();
            assert!(first <= bound + 64, "{first} bytes held (bound {bound})");
            let r = one(&c.drain(&h));
            let v = r.json();
            assert_eq!(v["result"]["status"]["state"], "TASK_STATE_CANCELED");
            assert_eq!(v["result"]["history"][0]["parts"][0]["text"], big);
        }
    }
}

/// A held answer on a connection that closes after it (`Connection: close`) still goes out
/// once its change is durable: the poll that releases it is not skipped for a closing
/// connection.
#[test]
fn a_held_answer_on_a_closing_connection_is_released() {
    let mut h = wal();
    let mut c = h.conn();
    let req = call(
        "SendMessage",
        1,
        json!({"message": text_message("hi", "close-1"), "configuration": {"returnImmediately": true}}),
    );
    let text = String::from_utf8(req).unwrap();
    let req = text.replacen("\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1);
    assert!(c.feed(&mut h, req.as_bytes()).is_empty(), "held");
    h.turn();
    make_durable(&mut h);
    let r = one(&c.poll(&mut h));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(r.json()["result"]["task"]["id"].is_string());
    assert!(c.conn.is_finished());
}

#[test]
fn a_host_learns_when_an_answer_waits_for_changes_it_let_gather() {
    use std::sync::{atomic::Ordering, Arc};
    let mut h = wal();
    let records = Arc::new(WakeCount::default());
    h.inst
        .register_records_waker(&std::task::Waker::from(records.clone()));
    let wakes = || records.0.load(Ordering::SeqCst);
    let mut c = h.conn();
    // A blocking send: its task is a change, but its answer waits for the turn, not the disk.
    assert!(c
        .feed(
            &mut h,
            &call(
                "SendMessage",
                1,
                json!({"message": text_message("hi", "m")})
            )
        )
        .is_empty());
    let t = h.turn();
    assert_eq!(wakes(), 1, "the new task is announced");
    assert!(
        !h.inst.records_awaited(),
        "no answer waits for the task yet: a host may let it gather"
    );
    complete(&mut h, &t, TaskState::Completed, Some("done"));
    assert_eq!(
        wakes(),
        1,
        "a host told of changes it has not drained is not woken for each one after"
    );
    let announced = wakes();
    assert!(c.poll(&mut h).is_empty(), "the settled task is not durable");
    assert!(
        h.inst.records_awaited(),
        "the answer waits for the settled task"
    );
    assert!(
        wakes() > announced,
        "the waiter wakes a host that let the announced change gather"
    );
    let batch = h.inst.poll_records().expect("the task's changes");
    assert_eq!(
        batch.records.len(),
        1,
        "its start and its end are one record"
    );
    assert!(
        !h.inst.records_awaited(),
        "drained: what is left is the fsync"
    );
    h.inst.records_durable(batch.upto);
    let r = one(&c.poll(&mut h)).json();
    assert_eq!(
        r["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    // Drained: the next round's first change is announced again.
    let drained = wakes();
    let msg = json!({"message": text_message("again", "m2")});
    assert!(c.feed(&mut h, &call("SendMessage", 2, msg)).is_empty());
    h.turn();
    assert_eq!(wakes(), drained + 1, "the next round is announced");
}

#[test]
fn a_settled_task_a_webhook_will_report_is_not_left_to_gather() {
    let mut h = Harness::with(|c| {
        c.push = agentd_core::push::PushPolicy {
            enabled: true,
            ..agentd_core::push::PushPolicy::default()
        }
    });
    h.inst.set_write_ahead(true);
    let mut c = h.conn();
    let params = json!({"message": text_message("hi", "m"),
        "configuration": {"returnImmediately": true,
                          "taskPushNotificationConfig": {"url": "https://hooks.example.com/x"}}});
    assert!(c.feed(&mut h, &call("SendMessage", 1, params)).is_empty());
    let t = h.turn();
    make_durable(&mut h);
    assert!(
        !c.poll(&mut h).is_empty(),
        "the task and its webhook are durable"
    );
    assert!(!h.inst.records_awaited());
    complete(&mut h, &t, TaskState::Completed, Some("done"));
    assert!(
        h.take_effects()
            .iter()
            .any(|e| matches!(e, agentd_core::Effect::Deliver { .. })),
        "the webhook is told"
    );
    assert!(
        h.inst.records_awaited(),
        "no answer waits, but the webhook reports the settled task: it is drained at once"
    );
    make_durable(&mut h);
    assert!(!h.inst.records_awaited());
}
