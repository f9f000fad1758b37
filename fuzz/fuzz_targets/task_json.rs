//! A task's JSON written in slices (`agentd_core::a2a::piecewise::TaskJson`) against the
//! same task serialized whole by serde_json.
//!
//! Input layout:
//!
//! * bytes 0 and 1 — the room of each slice (1 to 65,536 bytes, little-endian plus one);
//! * the rest — a JSON object whose `history` (messages), `artifacts` and `status` (a
//!   message) members become the task, as the store would hold them; anything that does not
//!   parse as such is left out.
//!
//! Properties checked, for every input:
//!
//! * no panic;
//! * the slices joined are byte for byte what serde_json writes for the prefix, task and
//!   suffix, and what `TaskJson::to_vec` gives;
//! * no slice is more than 5 bytes past its room (an escape is not split), and every call
//!   but the last adds at least one byte;
//! * `TaskJson::measure` is the document's length.

#![no_main]

use std::sync::Arc;

use agentd_core::a2a::piecewise::TaskJson;
use agentd_core::a2a::types::{Artifact, Message, Task, TaskState, TaskStatus};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn members<T: serde::de::DeserializeOwned>(v: &Value, key: &str) -> Vec<Arc<T>> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|i| serde_json::from_value(i.clone()).ok())
                .map(Arc::new)
                .collect()
        })
        .unwrap_or_default()
}

fuzz_target!(|data: &[u8]| {
    let [lo, hi, rest @ ..] = data else { return };
    let room = usize::from(u16::from_le_bytes([*lo, *hi])) + 1;
    let Ok(v) = serde_json::from_slice::<Value>(rest) else {
        return;
    };
    let task = Task {
        artifacts: members::<Artifact>(&v, "artifacts"),
        context_id: v["contextId"].as_str().unwrap_or("ctx").to_owned(),
        history: members::<Message>(&v, "history"),
        id: v["id"].as_str().unwrap_or("task").to_owned(),
        metadata: v["metadata"].as_object().cloned(),
        status: TaskStatus {
            message: serde_json::from_value(v["status"].clone()).ok().map(Arc::new),
            state: TaskState::Working,
            timestamp: "2026-12-03T00:00:00.000Z".into(),
        },
    };
    let mut expected = b"{\"result\":".to_vec();
    serde_json::to_writer(&mut expected, &task).unwrap();
    expected.push(b'}');

    let json = TaskJson::new(task, b"{\"result\":".to_vec(), b"}".to_vec(), 0);
    assert_eq!(json.to_vec(), expected);
    assert_eq!(json.measure(), expected.len());
    let mut w = json;
    let mut out = Vec::new();
    loop {
        let before = out.len();
        let done = w.fill(&mut out, room);
        let added = out.len() - before;
        assert!(added <= room + 5, "a slice of {added} bytes for a room of {room}");
        if done {
            break;
        }
        assert!(added > 0, "a slice that adds nothing before the end");
    }
    assert_eq!(out, expected);
});
