//! The golden examples published beside each bundle (`schemas/<name>/examples/`). Tests hold
//! every one to its bundle, here with the `jsonschema` crate and in the interop suite with
//! Python's `jsonschema`, a validator that is not ours.

use serde_json::{json, Value};

use super::registry::Ext;

/// `(extension, file stem, document)` for every golden example.
pub fn all() -> Vec<(Ext, &'static str, Value)> {
    vec![
        (Ext::Command, "status", json!({"agentd": {"op": "status"}})),
        (
            Ext::Command,
            "workflow-run",
            json!({"agentd": {"op": "workflow.run", "workflow": "triage", "inputs": {"ticket": 42}}}),
        ),
        (
            Ext::Command,
            "admin-set",
            json!({"agentd": {"op": "admin.set", "path": "a2a.introspection.enabled", "value": true}}),
        ),
        (
            Ext::Command,
            "auth-device-approve",
            json!({"agentd": {"op": "auth.device.approve", "user_code": "WDJB-MJHT", "as": "alice.laptop", "scope": "user"}}),
        ),
        (
            Ext::TaskAnnotations,
            "run",
            json!({
                "link": {"kind": "run", "id": "triage-01J9Z8X4K2"},
                "created": "2026-09-29T10:15:02.114Z",
                "statusHistory": [
                    {"state": "TASK_STATE_SUBMITTED", "ts": "2026-09-29T10:15:02.114Z"},
                    {"state": "TASK_STATE_WORKING", "ts": "2026-09-29T10:15:02.130Z"},
                    {"state": "TASK_STATE_COMPLETED", "ts": "2026-09-29T10:15:04.870Z"}
                ],
                "principal": "user:alice",
                "command": "workflow.run"
            }),
        ),
        (
            Ext::TaskAnnotations,
            "gate",
            json!({
                "link": {"kind": "run", "id": "deploy-01J9Z9A1B2"},
                "created": "2026-09-29T11:02:40.003Z",
                "statusHistory": [
                    {"state": "TASK_STATE_SUBMITTED", "ts": "2026-09-29T11:02:40.003Z"},
                    {"state": "TASK_STATE_WORKING", "ts": "2026-09-29T11:02:40.010Z"},
                    {"state": "TASK_STATE_INPUT_REQUIRED", "ts": "2026-09-29T11:02:41.250Z"}
                ],
                "principal": "operator",
                "askChannel": "@channel/deploys",
                "askSchema": {"type": "object", "required": ["approve"], "properties": {"approve": {"type": "boolean"}}}
            }),
        ),
        (
            Ext::TaskAnnotations,
            "turn",
            json!({
                "link": {"kind": "turn", "id": "0f8e2c1a-4b7d-4e2a-9c3b-2d1e0f9a8b7c"},
                "created": "2026-12-02T12:19:31.166Z",
                "statusHistory": [
                    {"state": "TASK_STATE_SUBMITTED", "ts": "2026-12-02T12:19:31.166Z"},
                    {"state": "TASK_STATE_REJECTED", "ts": "2026-12-02T12:19:31.167Z"}
                ],
                "principal": "operator"
            }),
        ),
    ]
}
