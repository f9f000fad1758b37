//! SendMessage is idempotent per (caller, messageId): a retry of a message already accepted
//! gets the task it created or continued, as a first send of its mode would, and runs
//! nothing again; another message under a used id is refused and changes nothing; the
//! memory of accepted messages survives a restart through the task records.

mod support;

use agentd_core::a2a::types::TaskState;
use agentd_core::auth::{Principal, Role};
use agentd_core::ext::annotations::{Link, LinkKind};
use agentd_core::ext::COMMAND_URI;
use agentd_core::{Completion, Effect};
use serde_json::{json, Value};
use support::*;

fn user(name: &str) -> Principal {
    Principal::new(format!("user:{name}"), Role::User, vec![])
}

fn immediate(message: Value) -> Vec<u8> {
    call(
        "SendMessage",
        1,
        json!({"message": message, "configuration": {"returnImmediately": true}}),
    )
}

fn task_of(r: &Resp) -> Value {
    r.json()["result"]["task"].clone()
}

/// Asserts the -32602 refusal of a reused messageId, naming the field and the task.
fn assert_reused(r: &Resp, task_id: &str) {
    let j = assert_rpc_error(r, -32602, None);
    let text = j["error"]["message"].as_str().unwrap();
    assert!(text.contains("message.messageId"), "{j}");
    assert!(text.contains(task_id), "names the task: {j}");
}

#[test]
fn a_retry_gets_the_same_task_and_runs_nothing_twice() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let first = task_of(&one(&c.feed(&mut h, &immediate(text_message("hi", "m-1")))));
    let task_id = h.turn();
    assert_eq!(first["id"], task_id.as_str());

    // The client timed out and retries on a new connection.
    let mut c2 = h.conn();
    let again = task_of(&one(&c2.feed(&mut h, &immediate(text_message("hi", "m-1")))));
    assert_eq!(again["id"], task_id.as_str());
    assert!(h.take_effects().is_empty(), "no second turn");
    assert_eq!(h.inst.task_count(), 1);
    assert_eq!(again["history"].as_array().unwrap().len(), 1);

    // A blocking retry of a task still working waits for it, as a first send would.
    let mut b = h.conn();
    assert!(b
        .feed(
            &mut h,
            &call(
                "SendMessage",
                2,
                json!({"message": text_message("hi", "m-1")})
            )
        )
        .is_empty());
    complete(&mut h, &task_id, TaskState::InputRequired, Some("which?"));
    let settled = task_of(&one(&b.poll(&mut h)));
    assert_eq!(settled["id"], task_id.as_str());
    assert_eq!(settled["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    // Once settled, a blocking retry answers at once.
    let at_once = task_of(&one(&b.feed(
        &mut h,
        &call(
            "SendMessage",
            3,
            json!({"message": text_message("hi", "m-1")}),
        ),
    )));
    assert_eq!(at_once["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    assert!(h.take_effects().is_empty());
    assert_eq!(h.inst.subscription_count(), 0);
}

#[test]
fn a_streaming_retry_streams_the_task_or_gives_its_final_snapshot() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let stream = |id: &str| {
        call(
            "SendStreamingMessage",
            1,
            json!({"message": text_message("hi", id)}),
        )
    };
    let _ = c.feed(&mut h, &stream("s-1"));
    let task_id = h.turn();

    // Live: the task now, then its events, as SubscribeToTask gives them.
    let mut r = h.conn();
    let mut out = r.feed(&mut h, &stream("s-1"));
    assert!(h.take_effects().is_empty(), "no second turn");
    complete(&mut h, &task_id, TaskState::Completed, Some("done"));
    out.extend(r.poll(&mut h));
    let events = one(&out).events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["result"]["task"]["id"], task_id.as_str());
    assert_eq!(
        events[1]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );

    // Finished: one Task frame, and the stream ends.
    let mut late = h.conn();
    let events = one(&late.feed(&mut h, &stream("s-1"))).events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["result"]["task"]["id"], task_id.as_str());
    assert_eq!(
        events[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert!(h.take_effects().is_empty());
}

#[test]
fn another_message_under_a_used_id_is_refused_and_changes_nothing() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let _ = c.feed(&mut h, &immediate(text_message("hi", "m-1")));
    let task_id = h.turn();
    let before = task_of(&one(
        &c.feed(&mut h, &call("GetTask", 2, json!({"id": task_id})))
    ));
    let changes = h.inst.record_seq();

    // Other text; the same text with other metadata; the same text sent into a context.
    let mut with_meta = text_message("hi", "m-1");
    with_meta["metadata"] = json!({"k": 1});
    let mut in_context = text_message("hi", "m-1");
    in_context["contextId"] = json!("elsewhere");
    for other in [text_message("bye", "m-1"), with_meta, in_context] {
        assert_reused(&one(&c.feed(&mut h, &immediate(other))), &task_id);
    }
    assert!(h.take_effects().is_empty());
    assert_eq!(h.inst.task_count(), 1);
    assert_eq!(h.inst.record_seq(), changes, "nothing changed");
    let after = task_of(&one(
        &c.feed(&mut h, &call("GetTask", 3, json!({"id": task_id})))
    ));
    assert_eq!(before, after);
}

#[test]
fn principals_use_message_ids_independently() {
    let mut h = Harness::new();
    let mut alice = h.conn_as(0, user("alice"));
    let mut bob = h.conn_as(0, user("bob"));
    let a = task_of(&one(
        &alice.feed(&mut h, &immediate(text_message("hi", "m-1")))
    ));
    let ta = h.turn();
    // Bob's message under the same id, other content: his own task, no refusal that would
    // tell him of Alice's.
    let b = task_of(&one(
        &bob.feed(&mut h, &immediate(text_message("other", "m-1")))
    ));
    let tb = h.turn();
    assert_ne!(ta, tb);
    assert_eq!(a["id"], ta.as_str());
    assert_eq!(b["id"], tb.as_str());
    // Each one's retry finds their own.
    let again = task_of(&one(
        &bob.feed(&mut h, &immediate(text_message("other", "m-1")))
    ));
    assert_eq!(again["id"], tb.as_str());
    assert!(h.take_effects().is_empty());
}

#[test]
fn a_retried_gate_answer_gets_the_task_not_a_refusal() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let _ = c.feed(&mut h, &immediate(text_message("deploy?", "m-1")));
    let task_id = h.turn();
    h.inst
        .handle_completion(
            Completion::Ask {
                task_id: task_id.clone(),
                schema: Some(json!({"type": "boolean"})),
                channel: None,
                operator_only: false,
            },
            h.now,
        )
        .unwrap();
    complete(&mut h, &task_id, TaskState::InputRequired, Some("ok?"));

    let mut answer = text_message("true", "m-2");
    answer["taskId"] = json!(task_id);
    let r = task_of(&one(&c.feed(&mut h, &immediate(answer.clone()))));
    assert_eq!(r["status"]["state"], "TASK_STATE_WORKING");
    match h.take_effects().as_slice() {
        [Effect::Turn { message, .. }] => assert_eq!(message.message_id, "m-2"),
        other => panic!("{other:?}"),
    }

    // The answer's reply was lost; its retry finds the task working (where a new message
    // would be refused -32004), and is not taken as a second answer.
    let r = task_of(&one(&c.feed(&mut h, &immediate(answer.clone()))));
    assert_eq!(r["id"], task_id.as_str());
    assert_eq!(r["status"]["state"], "TASK_STATE_WORKING");
    assert!(h.take_effects().is_empty());
    // Past the task's end, too.
    complete(&mut h, &task_id, TaskState::Completed, None);
    let r = task_of(&one(&c.feed(&mut h, &immediate(answer.clone()))));
    assert_eq!(r["status"]["state"], "TASK_STATE_COMPLETED");
    // A new message under a new id is still refused as before.
    let mut late = text_message("false", "m-3");
    late["taskId"] = json!(task_id);
    assert_rpc_error(
        &one(&c.feed(&mut h, &immediate(late))),
        -32004,
        Some("UNSUPPORTED_OPERATION"),
    );
}

#[test]
fn a_retried_task_op_does_not_run_the_command_again() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let run = json!({"role":"ROLE_USER","messageId":"run-1","extensions":[COMMAND_URI],
                     "parts":[{"data":{"agentd":{"op":"workflow.run","workflow":"triage"}}}]});
    let send = |message: &Value| {
        call_ext(
            "SendMessage",
            1,
            json!({"message": message, "configuration": {"returnImmediately": true}}),
            &[COMMAND_URI],
        )
    };
    assert!(c.feed(&mut h, &send(&run)).is_empty(), "waits for the host");
    let (call_id, task_id) = match h.take_effects().as_slice() {
        [Effect::Command { call, task_id, .. }] => (*call, task_id.clone().unwrap()),
        other => panic!("{other:?}"),
    };
    // Retried while the host has not started the task: not run again, and told to retry.
    let mut other = h.conn();
    let r = one(&other.feed(&mut h, &send(&run)));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_rpc_error(&r, -32603, Some("IN_PROGRESS"));
    assert!(h.take_effects().is_empty(), "the command is not run twice");
    let mut changed = run.clone();
    changed["parts"][0]["data"]["agentd"]["workflow"] = json!("other");
    assert_rpc_error(&one(&other.feed(&mut h, &send(&changed))), -32602, None);
    h.inst
        .handle_completion(
            Completion::CommandStarted {
                call: call_id,
                link: Link {
                    kind: LinkKind::Run,
                    id: "triage-1".into(),
                },
            },
            h.now,
        )
        .unwrap();
    assert_eq!(task_of(&one(&c.poll(&mut h)))["id"], task_id.as_str());

    let again = task_of(&one(&c.feed(&mut h, &send(&run))));
    assert_eq!(again["id"], task_id.as_str());
    assert!(h.take_effects().is_empty(), "the command is not run again");

    // A read op answered with a message is not remembered: the same id reads again.
    let status = json!({"role":"ROLE_USER","messageId":"st-1","extensions":[COMMAND_URI],
                        "parts":[{"data":{"agentd":{"op":"status"}}}]});
    for _ in 0..2 {
        let r = one(&c.feed(&mut h, &send(&status)));
        assert_eq!(r.json()["result"]["message"]["role"], "ROLE_AGENT");
    }
}

#[test]
fn an_evicted_task_frees_its_message_ids() {
    let mut h = Harness::with(|c| c.tasks.max_tasks = 1);
    let mut c = h.conn();
    let _ = c.feed(&mut h, &immediate(text_message("hi", "m-1")));
    let first = h.turn();
    complete(&mut h, &first, TaskState::Completed, None);
    let _ = c.feed(&mut h, &immediate(text_message("other", "m-2")));
    let second = h.turn();
    assert!(h.inst.task_state(&first).is_none(), "evicted");
    complete(&mut h, &second, TaskState::Completed, None);
    // m-1 names no held task: a message under it is new.
    let r = task_of(&one(&c.feed(&mut h, &immediate(text_message("new", "m-1")))));
    let third = h.turn();
    assert_eq!(r["id"], third.as_str());
    assert_ne!(third, first);
}

#[test]
fn a_retry_is_recognized_after_a_restart() {
    let mut h = Harness::new();
    h.inst.set_write_ahead(true);
    let mut c = h.conn();
    let _ = c.feed(&mut h, &immediate(text_message("deploy?", "m-1")));
    let task_id = h.turn();
    complete(&mut h, &task_id, TaskState::InputRequired, Some("which?"));
    let mut answer = text_message("prod", "m-2");
    answer["taskId"] = json!(task_id);
    let _ = c.feed(&mut h, &immediate(answer.clone()));
    let _ = h.turn();
    let mut records = Vec::new();
    while let Some(batch) = h.inst.poll_records() {
        records.extend(batch.records);
        h.inst.records_durable(batch.upto);
    }
    let rec = records.last().expect("the task is a record");
    let body = rec.value().unwrap();
    assert_eq!(body["accepted"].as_array().unwrap().len(), 2, "{body}");

    // A fresh instance restores it, and ends the work the old process had in flight.
    let mut h2 = Harness::new();
    h2.inst
        .restore_record(rec.kind, &rec.key, body.clone(), h2.now)
        .unwrap();
    assert_eq!(h2.inst.end_in_flight("restarted", h2.now), 1);
    let mut c2 = h2.conn();
    for m in [text_message("deploy?", "m-1"), answer] {
        let r = task_of(&one(&c2.feed(&mut h2, &immediate(m))));
        assert_eq!(r["id"], task_id.as_str());
        assert_eq!(r["status"]["state"], "TASK_STATE_FAILED");
    }
    assert!(h2.take_effects().is_empty());
    assert_reused(
        &one(&c2.feed(&mut h2, &immediate(text_message("other", "m-1")))),
        &task_id,
    );

    // A record written before idempotent sends restores, remembering nothing.
    let mut old = body;
    old.as_object_mut().unwrap().remove("accepted");
    let mut h3 = Harness::new();
    h3.inst
        .restore_record(rec.kind, &rec.key, old, h3.now)
        .unwrap();
    let mut c3 = h3.conn();
    let _ = c3.feed(&mut h3, &immediate(text_message("deploy?", "m-1")));
    match h3.take_effects().as_slice() {
        [Effect::Turn { message, .. }] => assert_eq!(message.message_id, "m-1"),
        other => panic!("the message is new there: {other:?}"),
    }
}

#[test]
fn a_retry_is_answered_once_its_task_is_durable() {
    let mut h = Harness::new();
    h.inst.set_write_ahead(true);
    let mut c = h.conn();
    assert!(c
        .feed(&mut h, &immediate(text_message("hi", "m-1")))
        .is_empty());
    let task_id = h.turn();
    // The retry overtook the first send's write: it waits for it too.
    let mut r = h.conn();
    assert!(r
        .feed(&mut h, &immediate(text_message("hi", "m-1")))
        .is_empty());
    while let Some(batch) = h.inst.poll_records() {
        h.inst.records_durable(batch.upto);
    }
    assert_eq!(task_of(&one(&r.poll(&mut h)))["id"], task_id.as_str());
    assert_eq!(task_of(&one(&c.poll(&mut h)))["id"], task_id.as_str());
    assert!(h.take_effects().is_empty());
}
