//! The published schema bundles, one per extension, generated from the values the listener
//! validates with. `agentd --extension-schema NAME` prints them; `schemas/` holds the
//! checked-in copies, and a test fails when the two differ.

use serde_json::{json, Map, Value};

use super::command::table::{self, OPS};
use super::registry::Ext;
use super::{annotations, events_schema};

const DRAFT: &str = "https://json-schema.org/draft/2020-12/schema";

/// The bundle of an extension.
pub fn bundle(ext: Ext) -> Value {
    match ext {
        Ext::Command => command(),
        Ext::Events => events_schema::bundle(),
        Ext::TaskAnnotations => {
            let mut s = annotations::schema();
            let head = json!({
                "$id": ext.schema_url(),
                "$schema": DRAFT,
                "title": "agentd task-annotations",
                "description": "agentd's facts about a task, carried in Task.metadata under \
                                https://agentd.dev/a2a/ext/task-annotations on an answer to a \
                                request that activated it.",
            });
            if let (Some(obj), Value::Object(h)) = (s.as_object_mut(), head) {
                obj.extend(h);
            }
            s
        }
    }
}

/// The bundle as published: pretty-printed, keys sorted, with a trailing newline.
pub fn render(value: &Value) -> String {
    // serde_json's Map is ordered by key (no preserve_order feature), so this is canonical.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

fn command() -> Value {
    let mut envelopes = Map::new();
    let mut ops = Map::new();
    let mut reserved = Map::new();
    let mut dispatch = Vec::new();
    for spec in OPS {
        envelopes.insert(spec.op.into(), table::envelope(spec));
        dispatch.push(json!({
            "if": {"properties": {"op": {"const": spec.op}}, "required": ["op"]},
            "then": {"$ref": format!("#/$defs/envelopes/$defs/{}", spec.op)},
        }));
        let entry = json!({
            "reply": spec.reply.as_str(),
            "description": spec.description,
            "args": (spec.args)(),
            "result": (spec.result)(),
        });
        if spec.listed {
            ops.insert(spec.op.into(), entry);
        } else {
            reserved.insert(spec.op.into(), entry);
        }
    }
    json!({
        "$id": Ext::Command.schema_url(),
        "$schema": DRAFT,
        "title": "agentd command",
        "description": "The data of a command DataPart. $defs/envelopes/$defs/<op> is each op's \
                        envelope; $defs/ops/<op> and $defs/reserved/<op> give its reply kind \
                        (message or task), arguments and result: for a message op the document \
                        its reply carries, for a task op the data of the result artifact it \
                        completes with (false: none). Reserved ops are operator only and never \
                        listed in params.ops. An op not named here may be a workflow-declared \
                        command, held to its workflow's own schema.",
        "type": "object",
        "required": ["agentd"],
        "properties": {"agentd": {"$ref": "#/$defs/envelope"}},
        "$defs": {
            "envelope": {
                "type": "object",
                "required": ["op"],
                "properties": {"op": {"type": "string", "minLength": 1}},
                "allOf": dispatch,
            },
            "envelopes": {"$defs": envelopes},
            "ops": ops,
            "reserved": reserved,
        }
    })
}
