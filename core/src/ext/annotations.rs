//! Task annotations: agentd's facts about a task, in `Task.metadata[<URI>]`, only in an answer
//! to a request that activated the extension. A webhook body never carries them.

use serde_json::{json, Map, Value};

use super::registry::TASK_ANNOTATIONS_URI;
use crate::a2a::types::Task;
use crate::tasks::TaskRecord;
use crate::time::rfc3339_ms;

pub use crate::tasks::{Link, LinkKind};

/// The annotations object of a task.
pub(crate) fn object(rec: &TaskRecord) -> Value {
    let mut a = Map::new();
    a.insert(
        "link".into(),
        json!({"kind": rec.link().0.as_str(), "id": rec.link().1}),
    );
    a.insert("created".into(), json!(rfc3339_ms(rec.created_ms)));
    a.insert(
        "statusHistory".into(),
        Value::Array(
            rec.status_history
                .iter()
                .map(|(state, ts)| json!({"state": state.as_str(), "ts": rfc3339_ms(*ts)}))
                .collect(),
        ),
    );
    a.insert("principal".into(), json!(rec.owner.id));
    if let Some(schema) = rec.gate().and_then(|g| g.schema.as_ref()) {
        a.insert("askSchema".into(), schema.clone());
    }
    if let Some(channel) = rec.gate().and_then(|g| g.channel.as_ref()) {
        a.insert("askChannel".into(), json!(channel));
    }
    if let Some(op) = rec.command() {
        a.insert("command".into(), json!(op));
    }
    Value::Object(a)
}

/// Puts the annotations into `task.metadata`.
pub(crate) fn annotate(task: &mut Task, rec: &TaskRecord) {
    task.metadata
        .get_or_insert_with(Map::new)
        .insert(TASK_ANNOTATIONS_URI.into(), object(rec));
}

/// The JSON Schema of the annotations object: what [`object`] writes.
pub(crate) fn schema() -> Value {
    let date_time = json!({"type": "string", "format": "date-time"});
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["link", "created", "statusHistory"],
        "properties": {
            "link": {
                "description": "what the task tracks: a workflow run, a subagent, or a conversation turn",
                "type": "object",
                "additionalProperties": false,
                "required": ["kind", "id"],
                "properties": {
                    "kind": {"enum": ["run", "subagent", "turn"]},
                    "id": {"type": "string"}
                }
            },
            "created": date_time,
            "statusHistory": {
                "description": "every state the task has been in, oldest first",
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["state", "ts"],
                    "properties": {
                        "state": {"type": "string", "pattern": "^TASK_STATE_"},
                        "ts": date_time
                    }
                }
            },
            "principal": {"description": "who started the task", "type": "string"},
            "askSchema": {
                "description": "the JSON Schema of the answer an INPUT_REQUIRED gate asks for",
                "type": ["object", "boolean"]
            },
            "askChannel": {
                "description": "where the gate is also announced, from the instruction document's ::!human",
                "type": "string"
            },
            "command": {"description": "the command op that started the task", "type": "string"}
        }
    })
}

/// A task's wire view lives here, beside its annotations, so the task store does not
/// depend on the extensions.
impl TaskRecord {
    /// The task as the wire shows it, with its annotations when the request activated them.
    pub(crate) fn view(
        &self,
        history_length: Option<usize>,
        include_artifacts: bool,
        annotate: bool,
    ) -> Task {
        let mut task = self.to_task(history_length, include_artifacts);
        if annotate {
            self::annotate(&mut task, self);
        }
        task
    }

    /// [`TaskRecord::view`] as a list page holds it ([`crate::tasks::Listed`]).
    pub(crate) fn listed_view(
        &self,
        history_length: Option<usize>,
        include_artifacts: bool,
        annotate: bool,
    ) -> crate::tasks::Listed {
        let mut listed = self.to_listed(history_length, include_artifacts);
        if annotate {
            self::annotate(listed.task_mut(), self);
        }
        listed
    }
}
