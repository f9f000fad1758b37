//! A task as a ListTasks page shows it. A page is mostly finished tasks, and a finished
//! task keeps its status message as its parts' JSON text ([`super::StatusMessage`]): made
//! whole for every listed task, that message was read back into values, given its three
//! strings, written out and dropped again, about a fifth of a page's CPU (half of it under
//! the instance lock). A [`Listed`] keeps the text and writes the message from it as the
//! page is serialized, in the exact bytes the whole message would have.

use std::sync::Arc;

use serde::Serialize;
use serde_json::value::RawValue;

use super::StatusId;
use crate::a2a::types::{Artifact, Message, Role, Struct, Task, TaskState};

/// A listed task: its wire form, save a packed status message (its parts' text and the
/// status count that names it), which [`Listed::write_json`] writes from that text.
#[derive(Debug)]
pub(crate) struct Listed {
    task: Task,
    made_status: Option<(Arc<RawValue>, u64)>,
}

impl From<Task> for Listed {
    fn from(task: Task) -> Self {
        Listed {
            task,
            made_status: None,
        }
    }
}

impl Listed {
    /// `task` without its status message, which is the one the store makes from `parts`
    /// (the JSON text of the parts, as packed) for status count `n`.
    pub(super) fn made(task: Task, parts: Arc<RawValue>, n: u64) -> Self {
        debug_assert!(task.status.message.is_none());
        Listed {
            task,
            made_status: Some((parts, n)),
        }
    }

    /// The wire task, for its annotations.
    pub(crate) fn task_mut(&mut self) -> &mut Task {
        &mut self.task
    }

    /// The task's JSON, as `serde_json::to_string` of the whole [`Task`] would write it.
    #[cfg(test)]
    pub(crate) fn to_json(&self) -> serde_json::Result<Box<RawValue>> {
        let mut out = Vec::new();
        self.write_json(&mut out)?;
        RawValue::from_string(String::from_utf8(out).expect("serde_json writes UTF-8"))
    }

    /// Appends the task's JSON to `out`, as `serde_json::to_writer` of the whole [`Task`]
    /// would write it. A page's tasks go into one buffer this way, not each into its own.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        let Some((parts, n)) = &self.made_status else {
            return serde_json::to_writer(out, &self.task);
        };
        let t = &self.task;
        let shown = TaskOut {
            artifacts: &t.artifacts,
            context_id: &t.context_id,
            history: &t.history,
            id: &t.id,
            metadata: t.metadata.as_ref(),
            status: StatusOut {
                message: MadeOut {
                    context_id: &t.context_id,
                    message_id: StatusId(&t.id, *n),
                    parts,
                    role: Role::Agent,
                    task_id: &t.id,
                },
                state: t.status.state,
                timestamp: &t.status.timestamp,
            },
        };
        serde_json::to_writer(out, &shown)
    }
}

/// The JSON length of the status message the store makes from packed `parts` for task
/// `id` of context `context_id` at status count `n`: what the whole message would write,
/// counted without making it.
pub(super) fn made_status_len(id: &str, context_id: &str, parts: &RawValue, n: u64) -> usize {
    super::serialized_len(&MadeOut {
        context_id,
        message_id: StatusId(id, n),
        parts,
        role: Role::Agent,
        task_id: id,
    })
}

// The wire shapes of `Task`, `TaskStatus` and `Message` (a2a/types.rs), field for field in
// their order, for a status message made by the store (no extensions, metadata or
// references). `a_listed_task_writes_what_the_whole_task_writes` holds them to the derived
// ones byte for byte.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TaskOut<'a> {
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    artifacts: &'a [Arc<Artifact>],
    context_id: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    history: &'a [Arc<Message>],
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a Struct>,
    status: StatusOut<'a>,
}

#[derive(Serialize)]
struct StatusOut<'a> {
    message: MadeOut<'a>,
    state: TaskState,
    timestamp: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MadeOut<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    context_id: &'a str,
    message_id: StatusId<'a>,
    parts: &'a RawValue,
    role: Role,
    #[serde(skip_serializing_if = "str::is_empty")]
    task_id: &'a str,
}
