//! `status` answers in bounded time: the host's runs, conversations and activity it lists are
//! the newest `STATUS_LIST_MAX` the caller may see, newest first, and `counts` says how many
//! it may see in all. The host publishes and withdraws through the instance's API.

mod support;

use agentd_core::auth::{Principal, Role};
use agentd_core::ext::command::table::find;
use agentd_core::ext::COMMAND_URI;
use agentd_core::view::{ObjectKind, STATUS_LIST_MAX};
use serde_json::{json, Value};
use support::*;

const ANN: &str = "user:ann";
const BOB: &str = "user:bob";

fn ann() -> Principal {
    Principal::new(ANN, Role::User, vec![])
}

fn bob() -> Principal {
    Principal::new(BOB, Role::User, vec![])
}

/// A user who holds nothing.
fn carol() -> Principal {
    Principal::new("user:carol", Role::User, vec![])
}

/// A feed `run` document (§4.4), as the host publishes it.
fn run_doc(id: &str, owner: Option<&str>) -> Value {
    json!({
        "id": id, "workflow": "w", "status": "running", "start": "s", "steps": {},
        "tokens": 0, "created": 1, "updated": 1, "finished": null, "output": null,
        "error": null, "task": null, "principal": owner,
    })
}

fn conversation_doc(id: &str, owner: Option<&str>) -> Value {
    json!({
        "id": id, "contextId": id, "kind": "chat", "version": 1, "messages": 1,
        "est_tokens": 0, "turns": 1, "principal": owner, "skills": [], "plan": null,
        "updated": 1,
    })
}

fn activity_doc(id: &str) -> Value {
    json!({
        "id": id, "task": null, "ctx": null, "phase": "thinking", "tool": null, "round": 0,
        "tokens_in": 0, "tokens_out": 0, "started_ms": 1, "updated_ms": 1,
    })
}

fn publish(h: &mut Harness, kind: ObjectKind, id: &str, owner: Option<&str>) {
    let doc = match kind {
        ObjectKind::Run => run_doc(id, owner),
        ObjectKind::Conversation => conversation_doc(id, owner),
        _ => activity_doc(id),
    };
    h.inst.publish_object(kind, id, owner, doc);
}

/// The `status` document `p` is answered, or the refusal's HTTP status.
fn status_as(h: &mut Harness, p: Principal) -> Result<Value, u16> {
    let mut c = h.conn_as(0, p);
    let message = json!({"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],
        "parts":[{"data":{"agentd":{"op":"status"}}}]});
    let r = one(&c.feed(
        h,
        &call_ext(
            "SendMessage",
            1,
            json!({ "message": message }),
            &[COMMAND_URI],
        ),
    ));
    let j = r.json();
    match j.get("result") {
        Some(result) => Ok(result["message"]["parts"][0]["data"].clone()),
        None => Err(r.status),
    }
}

fn status(h: &mut Harness, p: Principal) -> Value {
    status_as(h, p).expect("status is answered")
}

/// The ids a list shows, in its order.
fn ids(doc: &Value, list: &str) -> Vec<String> {
    doc[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list} is a list in {doc}"))
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

/// `prefix-<n>` for n in `range`, newest (highest) first.
fn newest_first(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.rev().map(|n| format!("{prefix}-{n}")).collect()
}

/// Validates a `status` document against the op table's result schema.
fn assert_schema(doc: &Value) {
    let schema = (find("status").unwrap().result)();
    let v = jsonschema::draft202012::new(&schema).expect("compiles");
    let errors: Vec<String> = v.iter_errors(doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn each_list_is_the_newest_bound_newest_first_and_counts_say_how_many() {
    let mut h = Harness::new();
    // More than the bound of each kind: 250 runs for ann, interleaved with 30 for bob and 5
    // of the operator's own (no owner).
    for n in 0..250 {
        publish(&mut h, ObjectKind::Run, &format!("ann-{n}"), Some(ANN));
        if n % 8 == 0 && n / 8 < 30 {
            publish(
                &mut h,
                ObjectKind::Run,
                &format!("bob-{}", n / 8),
                Some(BOB),
            );
        }
        if n % 50 == 0 {
            publish(&mut h, ObjectKind::Run, &format!("op-{}", n / 50), None);
        }
    }
    for n in 0..120 {
        publish(
            &mut h,
            ObjectKind::Conversation,
            &format!("c-{n}"),
            Some(BOB),
        );
    }
    for n in 0..3 {
        publish(&mut h, ObjectKind::Activity, &format!("a-{n}"), Some(ANN));
    }
    assert_eq!(h.inst.view().len(ObjectKind::Run), 285);

    // The operator: everything, the newest first, cut at the bound.
    let op = status(&mut h, Principal::operator());
    assert_schema(&op);
    let runs = ids(&op, "runs");
    assert_eq!(runs.len(), STATUS_LIST_MAX);
    assert_eq!(runs[0], "ann-249", "the last published is first");
    assert_eq!(runs[1], "ann-248");
    assert_eq!(op["counts"]["runs"], 285);
    assert_eq!(
        ids(&op, "conversations"),
        newest_first("c", 20..120),
        "the newest 100 of bob's 120"
    );
    assert_eq!(op["counts"]["conversations"], 120);
    assert_eq!(ids(&op, "activity"), newest_first("a", 0..3));
    assert_eq!(op["counts"]["activity"], 3);

    // The owner: its own only, newest first, cut at the bound; the total is its own.
    let a = status(&mut h, ann());
    assert_schema(&a);
    assert_eq!(ids(&a, "runs"), newest_first("ann", 150..250));
    assert_eq!(a["counts"]["runs"], 250);
    assert!(ids(&a, "conversations").is_empty());
    assert_eq!(a["counts"]["conversations"], 0);
    assert_eq!(ids(&a, "activity"), newest_first("a", 0..3));
    assert_eq!(a["counts"]["activity"], 3);

    // Another owner, under the bound: all of its own.
    let b = status(&mut h, bob());
    assert_eq!(ids(&b, "runs"), newest_first("bob", 0..30));
    assert_eq!(b["counts"]["runs"], 30);
    assert_eq!(ids(&b, "conversations"), newest_first("c", 20..120));
    assert_eq!(b["counts"]["conversations"], 120);
    assert!(ids(&b, "activity").is_empty());
    assert_eq!(b["counts"]["activity"], 0);

    // The existing counts stay beside the new ones.
    for key in ["tasks", "tasksByState", "streams", "pendingCommands"] {
        assert!(
            op["counts"].get(key).is_some(),
            "counts.{key} in {}",
            op["counts"]
        );
    }
}

#[test]
fn a_user_who_holds_nothing_and_an_anonymous_caller_see_nothing() {
    let mut h = Harness::new();
    for n in 0..(STATUS_LIST_MAX + 10) {
        publish(&mut h, ObjectKind::Run, &format!("ann-{n}"), Some(ANN));
        publish(&mut h, ObjectKind::Conversation, &format!("op-{n}"), None);
    }
    publish(&mut h, ObjectKind::Activity, "a-0", Some(ANN));
    let c = status(&mut h, carol());
    for list in ["runs", "conversations", "activity"] {
        assert!(ids(&c, list).is_empty(), "carol sees no {list}: {c}");
        assert_eq!(c["counts"][list], 0, "carol counts no {list}");
    }
    // The operator's own objects (no owner) are no user's, not even the one that owns others.
    let a = status(&mut h, ann());
    assert!(ids(&a, "conversations").is_empty());
    assert_eq!(a["counts"]["conversations"], 0);
    assert_eq!(a["counts"]["runs"], STATUS_LIST_MAX + 10);

    // An anonymous caller (even one named like an owner) is refused `status`, and the view
    // would show it nothing anyway.
    let anon = Principal::new(ANN, Role::Anonymous, vec![]);
    assert_eq!(status_as(&mut h, anon.clone()), Err(403));
    for kind in ObjectKind::ALL {
        let page = h.inst.view().page(kind, &anon, STATUS_LIST_MAX);
        assert!(page.items.is_empty() && page.total == 0, "{kind:?}");
    }
}

#[test]
fn a_change_moves_an_object_to_the_front_and_a_withdrawal_lets_the_next_one_in() {
    let mut h = Harness::new();
    let extra = 5;
    for n in 0..(STATUS_LIST_MAX + extra) {
        publish(
            &mut h,
            ObjectKind::Conversation,
            &format!("c-{n}"),
            Some(ANN),
        );
    }
    let before = status(&mut h, ann());
    assert_eq!(
        ids(&before, "conversations"),
        newest_first("c", extra..STATUS_LIST_MAX + extra)
    );

    // The oldest changes: it is the newest now, and the next oldest drops out of the page.
    let mut doc = conversation_doc("c-0", Some(ANN));
    doc["turns"] = json!(2);
    h.inst
        .publish_object(ObjectKind::Conversation, "c-0", Some(ANN), doc);
    let after = status(&mut h, ann());
    let listed = ids(&after, "conversations");
    assert_eq!(listed[0], "c-0");
    assert_eq!(after["conversations"][0]["turns"], 2, "its latest document");
    assert!(!listed.contains(&format!("c-{extra}")), "{listed:?}");
    assert_eq!(
        after["counts"]["conversations"],
        STATUS_LIST_MAX + extra,
        "a change is no new object"
    );

    // Withdrawn: gone from the list and the count; the newest left out comes in.
    let newest = format!("c-{}", STATUS_LIST_MAX + extra - 1);
    assert!(h.inst.withdraw_object(ObjectKind::Conversation, &newest));
    assert!(!h.inst.withdraw_object(ObjectKind::Conversation, &newest));
    let gone = status(&mut h, ann());
    let listed = ids(&gone, "conversations");
    assert_eq!(listed.len(), STATUS_LIST_MAX);
    assert!(!listed.contains(&newest));
    assert_eq!(listed.last().unwrap(), &format!("c-{extra}"));
    assert_eq!(gone["counts"]["conversations"], STATUS_LIST_MAX + extra - 1);
    let op = status(&mut h, Principal::operator());
    assert_eq!(op["counts"]["conversations"], STATUS_LIST_MAX + extra - 1);
    assert!(!ids(&op, "conversations").contains(&newest));

    // Everything withdrawn: empty lists and zero counts, for the owner and the operator.
    for n in 0..(STATUS_LIST_MAX + extra) {
        h.inst
            .withdraw_object(ObjectKind::Conversation, &format!("c-{n}"));
    }
    for p in [ann(), Principal::operator()] {
        let s = status(&mut h, p);
        assert!(ids(&s, "conversations").is_empty());
        assert_eq!(s["counts"]["conversations"], 0);
    }
    assert!(h.inst.view().is_empty(ObjectKind::Conversation));
}

#[test]
fn an_object_handed_to_another_owner_leaves_the_first_owners_list() {
    let mut h = Harness::new();
    publish(&mut h, ObjectKind::Run, "r-0", Some(ANN));
    publish(&mut h, ObjectKind::Run, "r-1", Some(ANN));
    h.inst
        .publish_object(ObjectKind::Run, "r-0", Some(BOB), run_doc("r-0", Some(BOB)));
    let a = status(&mut h, ann());
    assert_eq!(ids(&a, "runs"), ["r-1"]);
    assert_eq!(a["counts"]["runs"], 1);
    let b = status(&mut h, bob());
    assert_eq!(ids(&b, "runs"), ["r-0"]);
    assert_eq!(b["counts"]["runs"], 1);
    let op = status(&mut h, Principal::operator());
    assert_eq!(ids(&op, "runs"), ["r-0", "r-1"]);
    assert_eq!(op["counts"]["runs"], 2);
}

#[test]
fn workflows_model_and_lifecycle_go_through_the_instance() {
    let mut h = Harness::new();
    h.inst.set_model("claude");
    h.inst.set_workflows(vec![agentd_core::view::WorkflowEntry {
        name: "deploy".into(),
        doc: json!({"name": "deploy"}),
        roles: vec![Role::User],
    }]);
    let s = status(&mut h, ann());
    assert_eq!(s["model"], "claude");
    assert_eq!(s["workflows"], json!([{"name": "deploy"}]));
    assert!(!h.inst.is_draining() && !h.inst.is_paused());
    let now = h.now;
    h.inst.set_paused(true, "maintenance", now);
    assert!(h.inst.is_paused());
    assert_eq!(h.inst.lifecycle_reason(), "maintenance");
    assert_eq!(status(&mut h, ann())["paused"], true);
    h.inst.set_draining("shutdown", now);
    assert!(h.inst.is_draining());
    assert_eq!(status(&mut h, ann())["draining"], true);
}

#[test]
fn a_hundred_thousand_conversations_make_no_longer_answer() {
    let mut h = Harness::new();
    // 100,000 conversations over 1,000 owners; ann holds every 1,000th.
    for n in 0..100_000usize {
        let owner = if n % 1_000 == 0 {
            ANN.to_owned()
        } else {
            format!("user:u{}", n % 1_000)
        };
        // A small document: the test is about the count, not the shape.
        let id = format!("c-{n}");
        let doc = json!({ "id": id });
        h.inst
            .publish_object(ObjectKind::Conversation, &id, Some(&owner), doc);
    }
    let op = status(&mut h, Principal::operator());
    assert_eq!(op["counts"]["conversations"], 100_000);
    assert_eq!(
        ids(&op, "conversations"),
        newest_first("c", 99_900..100_000)
    );
    let a = status(&mut h, ann());
    assert_eq!(a["counts"]["conversations"], 100);
    let expected: Vec<String> = (0..100).rev().map(|k| format!("c-{}", k * 1_000)).collect();
    assert_eq!(ids(&a, "conversations"), expected);
    // The answer is sized by the bound, not the store: about 100 documents and the facts.
    let one = conversation_doc("c-99999", Some("user:u999"))
        .to_string()
        .len();
    let answer = op.to_string().len();
    assert!(
        answer < STATUS_LIST_MAX * (one + 8) + 4096,
        "{answer} bytes for 100 conversations of {one}"
    );
}
