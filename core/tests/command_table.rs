//! The command op table (`agentd_core::ext::command::table`): held to the spec text (the
//! digest's §3.2/§3.3), and checked for agreement with the published reference bundle and its
//! golden examples.
//!
//! The reference lives outside the workspace (`shared/reference/agentd/command/`). It is read,
//! never copied: the table is written from the spec and only compared with it here. Where the
//! two disagree the spec wins, and each such place is listed in `deviations()`.

use std::path::{Path, PathBuf};

use agentd_core::ext::command::table::{self, envelope, find, Floor, Gate, ReplyKind, OPS};
use serde_json::{json, Map, Value};

const REFERENCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/reference/agentd/command/"
);

/// The card's order (§3.2), then the two reserved-and-served reports.
const CARD_ORDER: &[&str] = &[
    "status",
    "config",
    "workflow.run",
    "workflow.status",
    "workflow.cancel",
    "workflow.signal",
    "subagent.send",
    "subagent.kill",
    "subagent.status",
    "plan.get",
    "conversation.get",
    "run.get",
    "subagent.get",
    "debug.events",
    "admin.drain",
    "admin.pause",
    "admin.resume",
    "admin.cancel",
    "admin.set",
    "auth.device.pending",
    "auth.device.approve",
    "auth.device.deny",
    "auth.sessions",
    "auth.sessions.revoke",
    "_instance.result",
    "_instance.emit",
];

/// Which of an op's schemas a deviation is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Args,
    Result,
    Envelope,
}

/// One place where the table knowingly differs from the reference, because the spec text
/// says otherwise. The comparison checks that the reference still has `reference` there and
/// the table has `ours`, then puts `ours` in the reference's place: exactly these places are
/// tolerated, and a change on either side makes the test fail.
struct Deviation {
    op: &'static str,
    part: Part,
    /// A JSON pointer into the (normalized) schema.
    pointer: &'static str,
    ours: Value,
    reference: Value,
}

/// Every spec-vs-reference disagreement.
///
/// 1.-2. `auth.device.deny`, args and envelope, `/properties/all`: the spec (§3.3) says the
///    args are "exactly one of `{user_code}` or `{all: true}`" and "supplying both is invalid".
///    The reference types the member `all` as any boolean and puts `const: true` only inside the
///    `{all}` alternative, so `{user_code: "X", all: false}` passes its `oneOf` (the first
///    alternative matches, the second does not): both members supplied, yet valid. The table
///    makes `all` `{"const": true}` on the object itself, so that envelope is refused.
/// 3.-4. `auth.sessions.revoke`, args and envelope, `/properties/all`: the same, for "exactly
///    one of `{sid}`, `{name}` or `{all: true}`" (`{sid: "s", all: false}` passes the reference).
fn deviations() -> Vec<Deviation> {
    let mut out = Vec::new();
    for op in ["auth.device.deny", "auth.sessions.revoke"] {
        for part in [Part::Args, Part::Envelope] {
            out.push(Deviation {
                op,
                part,
                pointer: "/properties/all",
                ours: json!({"const": true}),
                reference: json!({"type": "boolean"}),
            });
        }
    }
    out
}

/// The reference directory, or `None` (after a notice) when it is absent outside CI.
fn reference_dir() -> Option<PathBuf> {
    // `scripts/test.sh` exports AGENTD_SHARED when the schemas are not beside this clone.
    let dir = match std::env::var_os("AGENTD_SHARED") {
        Some(shared) => PathBuf::from(shared).join("reference/agentd/command"),
        None => PathBuf::from(REFERENCE),
    };
    if dir.join("schema.json").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "the reference command bundle is missing at {}, and CI is set",
            dir.display()
        );
    }
    eprintln!(
        "notice: no reference command bundle at {}; skipping the agreement check",
        dir.display()
    );
    None
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A schema made comparable: every `description` removed, and an empty schema (`{}`, which is
/// what a description-only schema leaves) written as `true`, its equivalent. The spec's
/// notation writes "any value" as `true`, and so does the table; the reference writes
/// `{"description": …}`. The walk knows JSON Schema's keywords, so only schemas are touched:
/// `properties` maps, `const`/`enum` values and `required` lists are data and stay as given
/// (key order never matters, serde_json's `Value` equality ignores it).
fn normalize(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in map {
        let value = match key.as_str() {
            "description" => continue,
            "properties" | "patternProperties" | "dependentSchemas" | "$defs" => match value {
                Value::Object(m) => {
                    Value::Object(m.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
                }
                other => other.clone(),
            },
            "items"
            | "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedProperties"
            | "unevaluatedItems" => normalize(value),
            "oneOf" | "anyOf" | "allOf" | "prefixItems" => match value {
                Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
                other => other.clone(),
            },
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    if out.is_empty() {
        Value::Bool(true)
    } else {
        Value::Object(out)
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

#[test]
fn table_is_in_card_order_with_the_spec_columns() {
    let names: Vec<&str> = OPS.iter().map(|s| s.op).collect();
    assert_eq!(names, CARD_ORDER);
    for spec in OPS {
        let reserved = spec.op.starts_with(table::RESERVED_PREFIX);
        assert_eq!(
            spec.listed, !reserved,
            "{}: only the _instance.* reports are unlisted",
            spec.op
        );
        if reserved || spec.op.starts_with("admin.") || spec.op.starts_with("auth.") {
            assert_eq!(spec.floor, Floor::Operator, "{}", spec.op);
        }
        if spec.floor != Floor::Granted {
            assert!(
                spec.defaults.is_empty(),
                "{}: role defaults only on a Granted op",
                spec.op
            );
        }
        let gate = match spec.op {
            "conversation.get" | "run.get" | "subagent.get" | "debug.events" => Gate::Introspection,
            op if op.starts_with("auth.device.") => Gate::DeviceGrant,
            op if op.starts_with("auth.sessions") => Gate::TcpListener,
            _ => Gate::Always,
        };
        assert_eq!(spec.gate, gate, "{}", spec.op);
        assert!(
            !spec.description.is_empty() && !spec.description.contains('\n'),
            "{}",
            spec.op
        );
        let args = (spec.args)();
        assert_eq!(args["type"], "object", "{}", spec.op);
        assert_eq!(
            args["additionalProperties"], false,
            "{}: args are closed",
            spec.op
        );
        if spec.reply == ReplyKind::Message {
            assert_ne!(
                (spec.result)(),
                json!(false),
                "{}: a read always answers a document",
                spec.op
            );
        }
    }
}

#[test]
fn envelopes_add_op_first_and_compile() {
    for spec in OPS {
        let env = envelope(spec);
        assert_eq!(
            env["properties"]["op"],
            json!({"const": spec.op}),
            "{}",
            spec.op
        );
        let required = env["required"].as_array().expect("required");
        assert_eq!(required[0], "op", "{}: op first in required", spec.op);
        let args_required = (spec.args)().get("required").cloned().unwrap_or(json!([]));
        assert_eq!(
            &required[1..],
            args_required.as_array().expect("array").as_slice(),
            "{}",
            spec.op
        );
        jsonschema::draft202012::new(&env)
            .unwrap_or_else(|e| panic!("{}: envelope does not compile: {e}", spec.op));
        for schema in [(spec.args)(), (spec.result)()] {
            jsonschema::draft202012::new(&schema)
                .unwrap_or_else(|e| panic!("{}: schema does not compile: {e}", spec.op));
        }
    }
}

fn valid(op: &str, envelope_value: Value) -> bool {
    let spec = find(op).expect("op in the table");
    let v = jsonschema::draft202012::new(&envelope(spec)).expect("compiles");
    v.is_valid(&envelope_value)
}

#[test]
fn exactly_one_of_ops_refuse_both_and_neither() {
    let deny = "auth.device.deny";
    assert!(valid(deny, json!({"op": deny, "user_code": "WDJB-MJHT"})));
    assert!(valid(deny, json!({"op": deny, "all": true})));
    assert!(!valid(deny, json!({"op": deny})));
    assert!(!valid(
        deny,
        json!({"op": deny, "user_code": "WDJB-MJHT", "all": true})
    ));
    assert!(!valid(
        deny,
        json!({"op": deny, "user_code": "WDJB-MJHT", "all": false})
    ));
    assert!(!valid(deny, json!({"op": deny, "all": false})));
    assert!(!valid(deny, json!({"op": deny, "user_code": ""})));
    assert!(!valid(deny, json!({"op": deny, "all": true, "extra": 1})));

    let revoke = "auth.sessions.revoke";
    for one in [
        json!({"sid": "s-1"}),
        json!({"name": "alice"}),
        json!({"all": true}),
    ] {
        let mut env = one.clone();
        env["op"] = json!(revoke);
        assert!(valid(revoke, env), "{one}");
    }
    assert!(!valid(revoke, json!({"op": revoke})));
    assert!(!valid(
        revoke,
        json!({"op": revoke, "sid": "s-1", "name": "alice"})
    ));
    assert!(!valid(
        revoke,
        json!({"op": revoke, "sid": "s-1", "all": false})
    ));
    assert!(!valid(revoke, json!({"op": revoke, "name": ""})));

    let approve = "auth.device.approve";
    assert!(valid(
        approve,
        json!({"op": approve, "user_code": "X", "as": "alice"})
    ));
    assert!(!valid(
        approve,
        json!({"op": approve, "user_code": "X", "as": "operator"})
    ));
    assert!(!valid(
        approve,
        json!({"op": approve, "user_code": "X", "as": "alice", "scope": "agent"})
    ));

    let set = "admin.set";
    assert!(valid(
        set,
        json!({"op": set, "path": "agent.approval", "value": "auto"})
    ));
    assert!(!valid(
        set,
        json!({"op": set, "path": "a2a.listen", "value": "x"})
    ));
}

#[test]
fn ops_agree_with_the_reference_bundle() {
    let Some(dir) = reference_dir() else { return };
    let bundle = read_json(&dir.join("schema.json"));
    let defs = &bundle["$defs"];
    let ref_ops = defs["ops"].as_object().expect("$defs/ops");
    let ref_reserved = defs["reserved"].as_object().expect("$defs/reserved");
    let ref_envelopes = defs["envelopes"]["$defs"]
        .as_object()
        .expect("$defs/envelopes/$defs");

    // The same ops, listed and reserved alike, in the same (card) order.
    let ours: Vec<&str> = OPS.iter().map(|s| s.op).collect();
    let dispatch: Vec<&str> = defs["envelope"]["allOf"]
        .as_array()
        .expect("$defs/envelope/allOf")
        .iter()
        .map(|arm| {
            arm["if"]["properties"]["op"]["const"]
                .as_str()
                .expect("op const")
        })
        .collect();
    assert_eq!(
        ours, dispatch,
        "the reference dispatches the ops in another order or set"
    );
    let mut ours_sorted = ours.clone();
    ours_sorted.sort_unstable();
    let mut envelope_names: Vec<&str> = ref_envelopes.keys().map(String::as_str).collect();
    envelope_names.sort_unstable();
    assert_eq!(ours_sorted, envelope_names);
    let mut entry_names: Vec<&str> = ref_ops
        .keys()
        .chain(ref_reserved.keys())
        .map(String::as_str)
        .collect();
    entry_names.sort_unstable();
    assert_eq!(ours_sorted, entry_names);

    let deviations = deviations();
    let mut used = vec![false; deviations.len()];
    let mut mismatches = Vec::new();
    for spec in OPS {
        let entry = if spec.listed {
            ref_ops.get(spec.op)
        } else {
            ref_reserved.get(spec.op)
        };
        let Some(entry) = entry else {
            mismatches.push(format!(
                "{}: listed={} but the reference files it elsewhere",
                spec.op, spec.listed
            ));
            continue;
        };
        if entry["reply"] != spec.reply.as_str() {
            mismatches.push(format!(
                "{}: reply {} vs reference {}",
                spec.op,
                spec.reply.as_str(),
                entry["reply"]
            ));
        }
        let parts = [
            (Part::Args, (spec.args)(), &entry["args"]),
            (Part::Result, (spec.result)(), &entry["result"]),
            (Part::Envelope, envelope(spec), &ref_envelopes[spec.op]),
        ];
        for (part, ours, reference) in parts {
            let ours = normalize(&ours);
            let mut reference = normalize(reference);
            for (i, d) in deviations
                .iter()
                .enumerate()
                .filter(|(_, d)| d.op == spec.op && d.part == part)
            {
                used[i] = true;
                assert_eq!(
                    ours.pointer(d.pointer),
                    Some(&d.ours),
                    "{} {part:?} {}: the table changed",
                    d.op,
                    d.pointer
                );
                let slot = reference.pointer_mut(d.pointer).unwrap_or_else(|| {
                    panic!("{} {part:?} {}: gone from the reference", d.op, d.pointer)
                });
                assert_eq!(
                    *slot, d.reference,
                    "{} {part:?} {}: the reference changed",
                    d.op, d.pointer
                );
                *slot = d.ours.clone();
            }
            if ours != reference {
                mismatches.push(format!(
                    "{} {part:?}:\n--- ours\n{}\n--- reference\n{}",
                    spec.op,
                    pretty(&ours),
                    pretty(&reference)
                ));
            }
        }
    }
    assert!(
        used.iter().all(|u| *u),
        "a listed deviation names no op part"
    );
    assert!(
        mismatches.is_empty(),
        "the table and the reference differ:\n{}",
        mismatches.join("\n\n")
    );
}

#[test]
fn reference_examples_validate_against_our_envelopes() {
    let Some(dir) = reference_dir() else { return };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir.join("examples"))
        .expect("examples directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no examples");
    for path in paths {
        let example = read_json(&path);
        let env = &example["agentd"];
        let op = env["op"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no op", path.display()));
        let spec =
            find(op).unwrap_or_else(|| panic!("{}: op {op} is not in the table", path.display()));
        let validator = jsonschema::draft202012::new(&envelope(spec)).expect("compiles");
        let errors: Vec<String> = validator.iter_errors(env).map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "{}: {}",
            path.display(),
            errors.join("; ")
        );
    }
}
