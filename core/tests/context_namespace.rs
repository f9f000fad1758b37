//! The contextId namespace (§7.6): a non-operator's contextId is mapped per principal to an
//! internal key `ctx-<32 hex>`, which is all the host sees; the wire shows each owner its
//! own name; operators address conversations by the internal keys.

mod support;

use agentd_core::a2a::types::{Part, TaskState};
use agentd_core::auth::{Principal, Role};
use agentd_core::ext::COMMAND_URI;
use agentd_core::{Completion, Effect};
use serde_json::{json, Value};
use support::*;

fn user(name: &str) -> Principal {
    Principal::new(format!("user:{name}"), Role::User, vec![])
}

fn message(text: &str, id: &str, context: Option<&str>) -> Value {
    let mut m = text_message(text, id);
    if let Some(c) = context {
        m["contextId"] = json!(c);
    }
    m
}

/// Sends `message` (returnImmediately) and returns the answer's task and the host's turn
/// effect's (task id, context id, context name, message.contextId).
fn send(h: &mut Harness, c: &mut Client, message: Value) -> (Value, [String; 4]) {
    let out = c.feed(
        h,
        &call(
            "SendMessage",
            1,
            json!({"message": message, "configuration": {"returnImmediately": true}}),
        ),
    );
    let task = one(&out).json()["result"]["task"].clone();
    let turn = match h.take_effects().as_slice() {
        [Effect::Turn {
            task_id,
            context_id,
            context_name,
            message,
            ..
        }] => [
            task_id.clone(),
            context_id.clone(),
            context_name.clone(),
            message.context_id.clone(),
        ],
        other => panic!("expected one turn, got {other:?}"),
    };
    (task, turn)
}

fn is_internal_key(k: &str) -> bool {
    k.len() == 36
        && k.starts_with("ctx-")
        && k[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn list(h: &mut Harness, c: &mut Client, params: Value) -> Vec<String> {
    let out = c.feed(h, &call("ListTasks", 2, params));
    let r = one(&out).json();
    r["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn two_users_naming_root_get_separate_internal_keys_and_see_their_own_name() {
    let mut h = Harness::new();
    let mut a = h.conn_as(0, user("alice"));
    let mut b = h.conn_as(0, user("bob"));
    let (ta, [_, ka, na, ma]) = send(&mut h, &mut a, message("hi", "m1", Some("root")));
    let (tb, [_, kb, nb, _]) = send(&mut h, &mut b, message("hi", "m2", Some("root")));
    assert!(is_internal_key(&ka), "{ka}");
    assert!(is_internal_key(&kb), "{kb}");
    assert_ne!(ka, kb, "two principals' `root` are two conversations");
    assert_eq!(ma, ka, "the host's message carries the internal key");
    assert_eq!((na.as_str(), nb.as_str()), ("root", "root"));
    // The wire shows each owner its own name, in the task and in its history.
    for t in [&ta, &tb] {
        assert_eq!(t["contextId"], "root");
        assert_eq!(t["history"][0]["contextId"], "root");
    }
    // The same name again maps to the same key: one conversation per (principal, name).
    let (_, [_, ka2, _, _]) = send(&mut h, &mut a, message("again", "m3", Some("root")));
    assert_eq!(ka2, ka);
    // A missing contextId gets a UUIDv4 name, bound the same way.
    let (t, [_, k, n, _]) = send(&mut h, &mut a, message("new", "m4", None));
    assert!(is_internal_key(&k));
    assert_eq!(n.len(), 36);
    assert_eq!(n.matches('-').count(), 4);
    assert_eq!(t["contextId"], n.as_str());
}

#[test]
fn status_updates_and_get_task_show_the_owner_its_name() {
    let mut h = Harness::new();
    let mut a = h.conn_as(0, user("alice"));
    let (task, [id, key, _, _]) = send(&mut h, &mut a, message("hi", "m1", Some("root")));
    assert_eq!(task["contextId"], "root");
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: id.clone(),
                state: TaskState::Completed,
                message: Some(vec![Part::text("done")]),
            },
            h.now,
        )
        .unwrap();
    let out = a.feed(&mut h, &call("GetTask", 3, json!({"id": id})));
    let t = one(&out).json()["result"].clone();
    assert_eq!(t["contextId"], "root");
    assert_eq!(t["status"]["message"]["contextId"], "root");
    assert!(
        !t.to_string().contains(&key),
        "the internal key never reaches the owner"
    );
    // Task.contextId is the owner's name, for an operator too.
    let mut op = h.conn();
    let out = op.feed(&mut h, &call("GetTask", 4, json!({"id": id})));
    assert_eq!(one(&out).json()["result"]["contextId"], "root");
}

#[test]
fn list_tasks_filters_a_user_by_its_own_name_and_an_operator_by_key_or_name() {
    let mut h = Harness::new();
    let mut a = h.conn_as(0, user("alice"));
    let mut b = h.conn_as(0, user("bob"));
    let (_, [ta, ka, _, _]) = send(&mut h, &mut a, message("hi", "m1", Some("root")));
    let (_, [tb, kb, _, _]) = send(&mut h, &mut b, message("hi", "m2", Some("root")));
    let (_, [tc, _, _, _]) = send(&mut h, &mut a, message("hi", "m3", Some("other")));

    assert_eq!(
        list(&mut h, &mut a, json!({"contextId": "root"})),
        std::slice::from_ref(&ta)
    );
    assert_eq!(
        list(&mut h, &mut b, json!({"contextId": "root"})),
        std::slice::from_ref(&tb)
    );
    assert_eq!(list(&mut h, &mut a, json!({"contextId": "other"})), [tc]);
    // A non-operator's filter matches only its own wire names, never an internal key.
    assert!(list(&mut h, &mut a, json!({"contextId": ka})).is_empty());
    assert!(list(&mut h, &mut b, json!({"contextId": ka})).is_empty());

    let mut op = h.conn();
    assert_eq!(
        list(&mut h, &mut op, json!({"contextId": ka})),
        std::slice::from_ref(&ta)
    );
    assert_eq!(
        list(&mut h, &mut op, json!({"contextId": kb})),
        std::slice::from_ref(&tb)
    );
    let mut by_name = list(&mut h, &mut op, json!({"contextId": "root"}));
    by_name.sort();
    let mut both = vec![ta, tb];
    both.sort();
    assert_eq!(
        by_name, both,
        "an operator's filter matches the wire id too"
    );
}

#[test]
fn a_continuation_is_checked_in_the_callers_namespace() {
    let mut h = Harness::new();
    let mut a = h.conn_as(0, user("alice"));
    let (_, [id, key, _, _]) = send(&mut h, &mut a, message("hi", "m1", Some("root")));
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: id.clone(),
                state: TaskState::InputRequired,
                message: Some(vec![Part::text("which?")]),
            },
            h.now,
        )
        .unwrap();
    let continue_with = |context: &str, mid: &str| {
        let mut m = message("this", mid, Some(context));
        m["taskId"] = json!(id);
        call(
            "SendMessage",
            5,
            json!({"message": m, "configuration": {"returnImmediately": true}}),
        )
    };
    // The owner may not name its task's context by the internal key, nor by another name.
    for wrong in [key.as_str(), "other"] {
        let out = a.feed(&mut h, &continue_with(wrong, "m-x"));
        assert_rpc_error(&one(&out), -32602, None);
        assert!(h.take_effects().is_empty());
    }
    // An operator names it by the internal key, not by the owner's name.
    let mut op = h.conn();
    let out = op.feed(&mut h, &continue_with("root", "m-y"));
    assert_rpc_error(&one(&out), -32602, None);
    // The owner's own name continues it; the host sees the internal key.
    let out = a.feed(&mut h, &continue_with("root", "m2"));
    assert_eq!(one(&out).json()["result"]["task"]["contextId"], "root");
    match h.take_effects().as_slice() {
        [Effect::Turn {
            context_id,
            context_name,
            message,
            ..
        }] => {
            assert_eq!(context_id, &key);
            assert_eq!(context_name, "root");
            assert_eq!(message.context_id, key);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_operators_context_id_is_its_own_key() {
    let mut h = Harness::new();
    let mut op = h.conn();
    let (t, [_, key, name, _]) = send(&mut h, &mut op, message("hi", "m1", Some("root")));
    assert_eq!((key.as_str(), name.as_str()), ("root", "root"));
    assert_eq!(t["contextId"], "root");
    // An operator may open a turn in a user's conversation by its internal key.
    let mut a = h.conn_as(0, user("alice"));
    let (_, [_, ka, _, _]) = send(&mut h, &mut a, message("hi", "m2", Some("root")));
    let (_, [_, k, _, _]) = send(&mut h, &mut op, message("hi", "m3", Some(&ka)));
    assert_eq!(k, ka);
}

#[test]
fn command_effects_carry_the_internal_key() {
    let mut h = Harness::with(|c| c.introspection_enabled = true);
    let mut a = h.conn_as(0, user("alice"));
    let (_, [_, key, _, _]) = send(&mut h, &mut a, message("hi", "m1", Some("root")));
    let m = json!({"role": "ROLE_USER", "messageId": "m2", "contextId": "root",
        "extensions": [COMMAND_URI],
        "parts": [{"data": {"agentd": {"op": "conversation.get", "id": "root"}}}]});
    let _ = a.feed(
        &mut h,
        &call_ext("SendMessage", 6, json!({"message": m}), &[COMMAND_URI]),
    );
    match h.take_effects().as_slice() {
        [Effect::Command {
            context_id,
            context_name,
            ..
        }] => {
            assert_eq!(context_id, &key);
            assert_eq!(context_name, "root");
        }
        other => panic!("expected the command effect, got {other:?}"),
    }
}

#[test]
fn the_namespace_survives_a_restart_through_the_task_records() {
    let mut h = Harness::new();
    h.inst.set_write_ahead(true);
    let mut a = h.conn_as(0, user("alice"));
    let _ = a.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": message("hi", "m1", Some("root")), "configuration": {"returnImmediately": true}}),
        ),
    );
    let key = match h.take_effects().as_slice() {
        [Effect::Turn { context_id, .. }] => context_id.clone(),
        other => panic!("{other:?}"),
    };
    let batch = h.inst.poll_records().expect("the task is a record");
    let rec = &batch.records[0];
    assert_eq!(rec.value().unwrap()["contextKey"], key.as_str());

    let mut h2 = Harness::new();
    h2.inst
        .restore_record(rec.kind, &rec.key, rec.value().unwrap(), h2.now)
        .unwrap();
    let mut a2 = h2.conn_as(0, user("alice"));
    let (t, [_, k, _, _]) = send(&mut h2, &mut a2, message("back", "m2", Some("root")));
    assert_eq!(
        k, key,
        "alice's `root` is the same conversation after a restart"
    );
    assert_eq!(t["contextId"], "root");
    let mut b2 = h2.conn_as(0, user("bob"));
    let (_, [_, kb, _, _]) = send(&mut h2, &mut b2, message("hi", "m3", Some("root")));
    assert_ne!(kb, key);
}

#[test]
fn stream_frames_show_the_owner_its_name() {
    let mut h = Harness::new();
    let mut a = h.conn_as(0, user("alice"));
    let mut out = a.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            7,
            json!({"message": message("hi", "m1", Some("root"))}),
        ),
    );
    let (id, key) = match h.take_effects().as_slice() {
        [Effect::Turn {
            task_id,
            context_id,
            ..
        }] => (task_id.clone(), context_id.clone()),
        other => panic!("{other:?}"),
    };
    h.inst
        .handle_completion(
            Completion::Artifact {
                task_id: id.clone(),
                artifact: serde_json::from_value(
                    json!({"artifactId": "a1", "parts": [{"text": "x"}]}),
                )
                .unwrap(),
                append: false,
                last_chunk: true,
            },
            h.now,
        )
        .unwrap();
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: id,
                state: TaskState::Completed,
                message: Some(vec![Part::text("done")]),
            },
            h.now,
        )
        .unwrap();
    out.extend(a.poll(&mut h));
    let events = one(&out).events();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0]["result"]["task"]["contextId"], "root");
    assert_eq!(events[1]["result"]["artifactUpdate"]["contextId"], "root");
    assert_eq!(events[2]["result"]["statusUpdate"]["contextId"], "root");
    assert_eq!(
        events[2]["result"]["statusUpdate"]["status"]["message"]["contextId"],
        "root"
    );
    assert!(!String::from_utf8_lossy(&out).contains(&key));
}
