//! The events extension's schemas (`agentd_core::ext::events_schema`): held to the spec text,
//! and checked for agreement with the published reference bundle and its golden examples.
//!
//! The reference lives outside the workspace (`shared/reference/agentd/events/`). It is read,
//! never copied: our bundle is written from the spec and only compared with it here.

use std::path::{Path, PathBuf};

use agentd_core::ext::events_schema::{self as ev, Audience};
use agentd_core::ext::registry;
use serde_json::{json, Value};

const REFERENCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/reference/agentd/events/"
);

/// Places where our bundle knowingly differs from the reference after descriptions are
/// stripped: (JSON pointer into the bundle, why the spec text decides it our way). Each pointer
/// is removed from BOTH sides before the comparison, so exactly these places are tolerated.
///
/// Empty: written from the seed overview and the digest's §4, the bundle agrees with the
/// reference everywhere. (Choices the spec leaves open and the reference fixes, such as
/// `data` being an object or "any" being the `true` schema, were made the reference's way.)
const TOLERATED: &[(&str, &str)] = &[];

/// The reference directory, or `None` (after a notice) when it is absent outside CI.
fn reference_dir() -> Option<PathBuf> {
    // `scripts/test.sh` exports AGENTD_SHARED when the schemas are not beside this clone.
    let dir = match std::env::var_os("AGENTD_SHARED") {
        Some(shared) => PathBuf::from(shared).join("reference/agentd/events"),
        None => PathBuf::from(REFERENCE),
    };
    if dir.join("schema.json").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "the reference events bundle is missing at {}, and CI is set",
            dir.display()
        );
    }
    eprintln!(
        "notice: no reference events bundle at {}; skipping the agreement check",
        dir.display()
    );
    None
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Removes every `description` key, at any depth.
fn strip_descriptions(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("description");
            map.values_mut().for_each(strip_descriptions);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// Removes the value at a JSON pointer, if there is one.
fn remove_pointer(v: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match v.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Every place two values differ, as JSON pointers with both sides.
fn differences(path: &str, ours: &Value, theirs: &Value, out: &mut Vec<String>) {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, x) in a {
                let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                match b.get(k) {
                    Some(y) => differences(&p, x, y, out),
                    None => out.push(format!("{p}: only ours has {x}")),
                }
            }
            for (k, y) in b {
                if !a.contains_key(k) {
                    out.push(format!("{path}/{k}: only the reference has {y}"));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}/{i}"), x, y, out);
            }
        }
        _ if ours != theirs => out.push(format!("{path}: ours {ours}, reference {theirs}")),
        _ => {}
    }
}

/// A validator for the bundle entered at `pointer` (e.g. `/$defs/hello`), so `$ref`s inside
/// resolve against the whole bundle.
fn validator_at(pointer: &str) -> jsonschema::Validator {
    let mut schema = ev::bundle();
    schema["$ref"] = json!(format!("#{pointer}"));
    jsonschema::draft202012::new(&schema)
        .unwrap_or_else(|e| panic!("the bundle entered at {pointer} does not compile: {e}"))
}

fn errors(v: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    v.iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

fn assert_valid(v: &jsonschema::Validator, instance: &Value, what: &str) {
    let errs = errors(v, instance);
    assert!(
        errs.is_empty(),
        "{what} should be valid: {instance}\n{}",
        errs.join("\n")
    );
}

fn assert_invalid(v: &jsonschema::Validator, instance: &Value, what: &str) {
    assert!(
        !v.is_valid(instance),
        "{what} should be refused: {instance}"
    );
}

fn kind_pointer(kind: &str) -> String {
    format!("/$defs/kinds/$defs/{kind}")
}

// ---- agreement with the reference ------------------------------------------------------------

#[test]
fn bundle_agrees_with_the_reference_bundle() {
    let Some(dir) = reference_dir() else { return };
    let mut theirs = read_json(&dir.join("schema.json"));
    let mut ours = ev::bundle();
    strip_descriptions(&mut theirs);
    strip_descriptions(&mut ours);
    for (pointer, _why) in TOLERATED {
        remove_pointer(&mut ours, pointer);
        remove_pointer(&mut theirs, pointer);
    }
    let mut diffs = Vec::new();
    differences("", &ours, &theirs, &mut diffs);
    assert!(
        diffs.is_empty(),
        "our events bundle differs from the reference (descriptions aside):\n{}",
        diffs.join("\n")
    );
    assert_eq!(ours, theirs);
}

#[test]
fn golden_examples_validate_against_our_bundle() {
    let Some(dir) = reference_dir() else { return };
    let root = jsonschema::draft202012::new(&ev::bundle()).expect("the bundle compiles");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.join("examples"))
        .expect("the reference has an examples directory")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    assert!(
        !paths.is_empty(),
        "no golden examples under {}",
        dir.display()
    );

    let mut frames_seen = Vec::new();
    for path in &paths {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let example = read_json(path);
        // Each golden example is one frame, the `result` of one response on the stream.
        assert_valid(&root, &example, &format!("{name} as a frame"));
        let obj = example
            .as_object()
            .unwrap_or_else(|| panic!("{name} is not an object"));
        assert_eq!(obj.len(), 1, "{name} holds exactly one frame");
        let (frame, member) = obj.iter().next().unwrap();
        assert!(
            ["hello", "event", "goodbye"].contains(&frame.as_str()),
            "{name}: unknown frame {frame}"
        );
        assert_valid(
            &validator_at(&format!("/$defs/{frame}")),
            member,
            &format!("{name}'s {frame}"),
        );
        if frame == "event" {
            let kind = member["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: kind"));
            assert!(
                ev::kind(kind).is_some(),
                "{name}: {kind} is not in the vocabulary"
            );
            assert_valid(
                &validator_at(&kind_pointer(kind)),
                &member["data"],
                &format!("{name}'s {kind} data"),
            );
        }
        frames_seen.push(frame.clone());
    }
    for frame in ["hello", "event", "goodbye"] {
        assert!(
            frames_seen.iter().any(|f| f == frame),
            "no golden example of a {frame} frame"
        );
    }
}

// ---- held to the spec text --------------------------------------------------------------------

#[test]
fn constants_agree_with_the_registry() {
    assert_eq!(ev::METHOD, registry::EVENTS_METHOD);
    assert_eq!(ev::URI, registry::EVENTS_URI);
    assert_eq!(
        ev::SCHEMA_ID,
        format!("{}/schema.json", registry::EVENTS_URI)
    );
}

#[test]
fn bundle_is_a_draft_2020_12_document_rooted_at_the_frame() {
    let b = ev::bundle();
    assert_eq!(b["$id"], "https://agentd.dev/a2a/ext/events/schema.json");
    assert_eq!(b["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert_eq!(b["title"], "agentd events");
    assert!(b["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert_eq!(b["$ref"], "#/$defs/frame");
    if let Err(e) = jsonschema::meta::validate(&b) {
        panic!("the bundle is not a valid draft 2020-12 schema: {e}");
    }
    let defs = b["$defs"].as_object().unwrap();
    for name in ["params", "frame", "hello", "event", "goodbye", "kinds"] {
        assert!(defs.contains_key(name), "$defs/{name}");
    }
    assert_eq!(b["$defs"]["params"], ev::params());
    assert_eq!(b["$defs"]["hello"], ev::hello());
    assert_eq!(b["$defs"]["event"], ev::event());
    assert_eq!(b["$defs"]["goodbye"], ev::goodbye());
    let kinds = b["$defs"]["kinds"]["$defs"].as_object().unwrap();
    assert_eq!(kinds.len(), ev::KINDS.len());
    for k in ev::KINDS {
        let mut published = kinds[k.kind].clone();
        assert_eq!(
            published["description"], k.description,
            "{} is described",
            k.kind
        );
        published.as_object_mut().unwrap().remove("description");
        let mut data = (k.data)();
        if let Some(m) = data.as_object_mut() {
            m.remove("description");
        }
        assert_eq!(
            published, data,
            "$defs/kinds/$defs/{} is the kind's data schema",
            k.kind
        );
    }
}

#[test]
fn kinds_are_the_closed_vocabulary_in_the_spec_order_with_their_audiences() {
    use Audience::*;
    let expected: [(&str, Audience); 18] = [
        ("task", Owner),
        ("task.removed", Owner), // the normative docs, over an older operator-only code tag
        ("run", Owner),
        ("run.removed", Owner),
        ("step", Operator),
        ("conversation", Owner),
        ("conversation.removed", Owner),
        ("subagent", Operator),
        ("subagent.removed", Operator),
        ("child", Operator),
        ("child.removed", Operator),
        ("activity", Owner),
        ("activity.removed", Owner),
        ("status", Operator),
        ("lifecycle", All),
        ("config", All),
        ("audit", Operator),
        ("auth", Operator),
    ];
    let got: Vec<(&str, Audience)> = ev::KINDS.iter().map(|k| (k.kind, k.audience)).collect();
    assert_eq!(got, expected);
    let introspection_only: Vec<&str> = ev::KINDS
        .iter()
        .filter(|k| k.introspection_only)
        .map(|k| k.kind)
        .collect();
    assert_eq!(introspection_only, ["audit"]);
    for k in ev::KINDS {
        assert!(std::ptr::eq(ev::kind(k.kind).unwrap(), k));
        assert!(!k.description.is_empty(), "{} has a description", k.kind);
    }
    for gone in ev::REMOVED_KINDS
        .iter()
        .chain(&["step.removed", "Task", "task.", ""])
    {
        assert!(ev::kind(gone).is_none(), "{gone} is not a kind");
    }
    let enumerated = ev::event()["properties"]["kind"]["enum"].clone();
    assert_eq!(enumerated, json!(expected.map(|(k, _)| k)));
}

#[test]
fn extended_card_kinds_follow_role_and_introspection() {
    let all: Vec<&str> = ev::KINDS.iter().map(|k| k.kind).collect();
    assert_eq!(ev::kinds_for(true, true).collect::<Vec<_>>(), all);
    let without_audit: Vec<&str> = all.iter().copied().filter(|k| *k != "audit").collect();
    assert_eq!(
        ev::kinds_for(true, false).collect::<Vec<_>>(),
        without_audit
    );
    let non_operator = [
        "task",
        "task.removed",
        "run",
        "run.removed",
        "conversation",
        "conversation.removed",
        "activity",
        "activity.removed",
        "lifecycle",
        "config",
    ];
    assert_eq!(ev::kinds_for(false, true).collect::<Vec<_>>(), non_operator);
    assert_eq!(
        ev::kinds_for(false, false).collect::<Vec<_>>(),
        non_operator
    );
}

/// Every object schema under a kind's data is closed, except the A2A Task inside `task` (and
/// its status), which the schema pins only partly because the core protocol owns its shape.
#[test]
fn every_data_schema_is_closed() {
    fn walk(kind: &str, path: &str, s: &Value) {
        let Some(map) = s.as_object() else { return };
        if kind == "task" && path.starts_with("/properties/task") {
            return;
        }
        // A record (an object schema listing its members) is closed; a map such as `steps` or
        // a free object such as `counters` lists none, and if/then fragments have no type.
        if map.get("type") == Some(&json!("object")) && map.contains_key("properties") {
            assert_eq!(
                map.get("additionalProperties"),
                Some(&json!(false)),
                "{kind}{path} is closed"
            );
        }
        for (k, v) in map {
            match v {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        walk(kind, &format!("{path}/{k}/{i}"), item);
                    }
                }
                // `properties` is a map of names, not a schema: walk its members.
                Value::Object(m) if k == "properties" => {
                    for (name, sub) in m {
                        walk(kind, &format!("{path}/properties/{name}"), sub);
                    }
                }
                other => walk(kind, &format!("{path}/{k}"), other),
            }
        }
    }
    for k in ev::KINDS {
        walk(k.kind, "", &(k.data)());
    }
    for s in [ev::params(), ev::hello(), ev::event(), ev::goodbye()] {
        assert_eq!(s["additionalProperties"], json!(false));
    }
}

/// One sample per kind, the way the feed would push it: valid as `data` and as a whole frame.
#[test]
fn a_sample_of_every_kind_validates() {
    let samples: Vec<(&str, Value)> = vec![
        (
            "task",
            json!({"task": {
                "id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_SUBMITTED"},
            }}),
        ),
        ("task.removed", json!({"id": "t-1"})),
        (
            "run",
            json!({
                "id": "r-1", "workflow": "triage", "status": "running", "start": "classify",
                "steps": {"classify": 1}, "tokens": 10, "created": 1, "updated": 2,
                "finished": null, "output": null, "error": null, "task": "t-1",
                "principal": "user:alice",
            }),
        ),
        ("run.removed", json!({"id": "r-1"})),
        (
            "step",
            json!({
                "run": "r-1", "step": "classify", "kind": "llm", "phase": "start", "attempt": 1,
            }),
        ),
        (
            "step",
            json!({
                "run": "r-1", "step": "classify", "phase": "done", "status": "failed",
                "attempt": 2, "tokens": 5, "err": "timeout",
            }),
        ),
        (
            "conversation",
            json!({
                "id": "k-1", "contextId": "chat1", "kind": "chat", "version": 3, "messages": 4,
                "est_tokens": 900, "turns": 2, "principal": null, "skills": ["conversation"],
                "plan": null, "updated": 5,
            }),
        ),
        ("conversation.removed", json!({"id": "k-1"})),
        (
            "subagent",
            json!({
                "handle": "h-1", "mode": "oneshot", "status": "running", "tokens": 0,
                "error": null, "updated": 7,
            }),
        ),
        ("subagent.removed", json!({"id": "h-1"})),
        (
            "child",
            json!({
                "node": 0, "pid": 4242, "kind": "tool", "age_ms": 150, "tokens": 0,
                "cancelled": false,
            }),
        ),
        ("child.removed", json!({"id": "4242"})),
        (
            "activity",
            json!({
                "id": "a-1", "task": null, "ctx": "chat1", "phase": "tool", "tool": "grep",
                "round": 2, "tokens_in": 100, "tokens_out": 20, "started_ms": 1, "updated_ms": 2,
            }),
        ),
        ("activity.removed", json!({"id": "a-1"})),
        (
            "status",
            json!({
                "instance": "reviewer", "model": "m", "version": "1.20.0", "draining": false,
                "inbox_pending": 0, "counters": {}, "budget": {"tokens": 1},
                "store": {"kind": "memory", "degraded": false}, "values": {},
                "skill_prefix": "workflow:",
            }),
        ),
        (
            "lifecycle",
            json!({"draining": true, "reason": "admin.drain"}),
        ),
        (
            "lifecycle",
            json!({"paused": true, "reason": "admin.pause"}),
        ),
        ("lifecycle", json!({"paused": false})),
        (
            "config",
            json!({"paths": ["agent.approval"], "source": "reload"}),
        ),
        (
            "audit",
            json!({
                "ts": 1, "principal": "user:alice", "role": "user", "action": "SendMessage",
                "target": {"task": "t-1"}, "outcome": "ok",
            }),
        ),
        (
            "audit",
            json!({
                "ts": 1, "principal": null, "role": null, "action": "admin.set", "target": null,
                "outcome": "denied", "sid": "s-1",
            }),
        ),
        (
            "auth",
            json!({
                "event": "approved", "client_id": "agentd-ui", "scope": "operator",
                "user_code": "WDJB-MJHT", "name": "alice",
            }),
        ),
        (
            "auth",
            json!({
                "event": "denied", "client_id": "agentd-ui", "scope": "user",
                "user_code": "WDJB-MJHT",
            }),
        ),
        (
            "auth",
            json!({
                "event": "revoked", "client_id": "agentd-ui", "scope": "user", "sid": "s-1",
            }),
        ),
        (
            "auth",
            json!({
                "event": "launch", "client_id": "agentd-tui", "scope": "operator", "sid": "s-2",
                "peer": "127.0.0.1",
            }),
        ),
    ];
    let root = jsonschema::draft202012::new(&ev::bundle()).unwrap();
    for k in ev::KINDS {
        assert!(
            samples.iter().any(|(kind, _)| *kind == k.kind),
            "no sample of {}",
            k.kind
        );
    }
    for (i, (kind, data)) in samples.iter().enumerate() {
        assert_valid(
            &validator_at(&kind_pointer(kind)),
            data,
            &format!("{kind} data"),
        );
        let frame = json!({"event": {
            "seq": i + 1, "ts": 1_790_676_902_130_u64, "kind": kind, "data": data,
        }});
        assert_valid(&root, &frame, &format!("a {kind} event frame"));
        // The allOf binds `data` to the kind named beside it: a live item's document under its
        // departure kind is refused, and a departure's `{id}` under the live kind too.
        let departure = format!("{kind}.removed");
        if ev::kind(&departure).is_some() {
            let frame = json!({"event": {"seq": 1, "ts": 1, "kind": departure, "data": data}});
            assert_invalid(&root, &frame, &format!("{kind} data under {departure}"));
            let frame = json!({"event": {"seq": 1, "ts": 1, "kind": kind, "data": {"id": "x"}}});
            assert_invalid(&root, &frame, &format!("{departure} data under {kind}"));
        }
    }
}

#[test]
fn params_are_closed_and_take_only_from_seq() {
    let v = validator_at("/$defs/params");
    for ok in [
        json!({}),
        json!({"fromSeq": 0}),
        json!({"fromSeq": 7}),
        json!({"fromSeq": u64::MAX}),
    ] {
        assert_valid(&v, &ok, "params");
    }
    // Note: JSON Schema counts 2.0 as an integer, but the method refuses it too (§4.1); that
    // check belongs to the handler, which reads fromSeq as a u64, and is not asserted here.
    for bad in [
        json!({"after": 3}),
        json!({"limit": 10}),
        json!({"fromSeq": 0, "limit": 10}),
        json!({"fromSeq": -1}),
        json!({"fromSeq": 1.5}),
        json!({"fromSeq": "3"}),
        json!({"fromSeq": null}),
        json!([]),
        json!([0]),
        json!("fromSeq"),
    ] {
        assert_invalid(&v, &bad, "params");
    }
}

#[test]
fn frames_are_closed_and_complete() {
    let root = jsonschema::draft202012::new(&ev::bundle()).unwrap();
    let hello = json!({
        "seq": 7, "resume": 0, "resync": false, "introspection": false, "version": "1.20.0",
    });
    assert_valid(&root, &json!({"hello": hello}), "the seed's hello");
    for member in ["seq", "resume", "resync", "introspection", "version"] {
        let mut h = hello.clone();
        h.as_object_mut().unwrap().remove(member);
        assert_invalid(
            &root,
            &json!({"hello": h}),
            &format!("hello without {member}"),
        );
    }
    let mut h = hello.clone();
    h["extra"] = json!(1);
    assert_invalid(&root, &json!({"hello": h}), "hello with an extra member");
    assert_invalid(
        &root,
        &json!({"hello": hello, "goodbye": {"seq": 1, "reason": "deadline"}}),
        "two frames",
    );
    assert_invalid(&root, &json!({}), "no frame");

    assert_valid(
        &root,
        &json!({"goodbye": {"seq": 9, "reason": "revoked"}}),
        "goodbye revoked",
    );
    assert_invalid(
        &root,
        &json!({"goodbye": {"seq": 9, "reason": "closed"}}),
        "goodbye with an unknown reason",
    );
    assert_invalid(
        &root,
        &json!({"goodbye": {"seq": 9}}),
        "goodbye without a reason",
    );

    let event =
        json!({"seq": 3, "ts": 1, "kind": "config", "data": {"paths": [], "source": "reload"}});
    assert_valid(&root, &json!({"event": event}), "a config event");
    let mut e = event.clone();
    e["id"] = json!(3);
    assert_invalid(
        &root,
        &json!({"event": e}),
        "an event with an SSE-style id member",
    );
    for kind in ev::REMOVED_KINDS.iter().chain(&["bogus", "step.removed"]) {
        let mut e = event.clone();
        e["kind"] = json!(kind);
        assert_invalid(
            &root,
            &json!({"event": e}),
            &format!("an event of kind {kind}"),
        );
    }
    let mut e = event.clone();
    e["data"]["paths"] = json!("a2a.introspection.enabled");
    assert_invalid(
        &root,
        &json!({"event": e}),
        "config data with paths not an array",
    );
    let mut e = event;
    e["ts"] = json!(-1);
    assert_invalid(&root, &json!({"event": e}), "a negative ts");
}

#[test]
fn bad_payloads_are_refused() {
    let data = |kind: &str| validator_at(&kind_pointer(kind));
    let auth = data("auth");
    for (bad, why) in [
        (
            json!({"event": "pending", "client_id": "c", "scope": "user"}),
            "pending without user_code",
        ),
        (
            json!({"event": "approved", "client_id": "c", "scope": "user"}),
            "approved without user_code",
        ),
        (
            json!({"event": "revoked", "client_id": "c", "scope": "user"}),
            "revoked without sid",
        ),
        (
            json!({"event": "launch", "client_id": "c", "scope": "operator"}),
            "launch without sid",
        ),
        (
            json!({"event": "launch", "client_id": "c", "sid": "s"}),
            "launch without scope",
        ),
        (
            json!({"event": "launch", "client_id": "c", "scope": "user", "sid": "s"}),
            "a user-scope launch",
        ),
        (
            json!({"event": "paired", "client_id": "c", "scope": "user"}),
            "an unknown auth event",
        ),
        (
            json!({"event": "revoked", "client_id": "c", "scope": "admin", "sid": "s"}),
            "an unknown scope",
        ),
        (
            json!({"event": "revoked", "client_id": "c", "scope": "user", "sid": "s", "t": 1}),
            "an extra member",
        ),
    ] {
        assert_invalid(&auth, &bad, why);
    }
    let step = data("step");
    assert_invalid(
        &step,
        &json!({"run": "r", "step": "s", "kind": "k", "phase": "start", "attempt": 1, "tokens": 3}),
        "a start step with tokens",
    );
    assert_invalid(
        &step,
        &json!({
            "run": "r", "step": "s", "phase": "done", "status": "ok", "attempt": 1, "tokens": 0,
        }),
        "a done step without err",
    );
    assert_invalid(
        &step,
        &json!({"run": "r", "step": "s", "kind": "llm", "phase": "running", "attempt": 1}),
        "an unknown phase",
    );
    let lifecycle = data("lifecycle");
    assert_invalid(
        &lifecycle,
        &json!({"draining": false, "reason": "x"}),
        "draining false",
    );
    assert_invalid(
        &lifecycle,
        &json!({"paused": false, "reason": "x"}),
        "a resume with a reason",
    );
    assert_invalid(
        &lifecycle,
        &json!({"paused": true}),
        "a pause without a reason",
    );
    assert_invalid(
        &data("config"),
        &json!({"paths": [], "source": "cli"}),
        "an unknown config source",
    );
    let audit = data("audit");
    assert_invalid(
        &audit,
        &json!({"ts": 1, "principal": null, "role": null, "action": "a", "outcome": "ok"}),
        "audit without target",
    );
    assert_invalid(
        &audit,
        &json!({
            "ts": 1, "principal": null, "role": null, "action": "a", "target": 1, "outcome": "ok",
            "sid": null,
        }),
        "a null sid",
    );
    let task = data("task");
    assert_invalid(
        &task,
        &json!({"task": {"id": "t", "contextId": "c", "status": {"state": "working"}}}),
        "a state outside TASK_STATE_*",
    );
    assert_invalid(
        &task,
        &json!({"task": {"id": "t", "status": {"state": "TASK_STATE_WORKING"}}}),
        "a task without contextId",
    );
    assert_invalid(
        &task,
        &json!({
            "task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}},
            "principal": "p",
        }),
        "task data with an extra member",
    );
    assert_invalid(
        &data("run.removed"),
        &json!({"id": "r", "workflow": "w"}),
        "a departure that says more than what left",
    );
    assert_invalid(
        &data("status"),
        &json!({
            "instance": "i", "model": "m", "version": "v", "draining": false, "inbox_pending": 0,
            "counters": {}, "budget": {}, "values": {}, "skill_prefix": "",
            "store": {"kind": "memory", "degraded": false, "path": "/x"},
        }),
        "a store with an extra member",
    );
    assert_invalid(
        &data("child"),
        &json!({"node": 0, "pid": 1, "kind": "k", "age_ms": 1, "tokens": 0, "cancelled": "no"}),
        "cancelled not a bool",
    );
}
