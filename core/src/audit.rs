//! The `audit` feed kind for the requests the core answers itself: the core methods and the
//! command ops served in place (`status`, `config`, `auth.*`), and every refusal made before
//! a command reaches the host.
//!
//! A command handed to the host is audited by the host when it answers,
//! because only it knows the outcome; [`crate::instance::Effect::Command`] carries the `sid`
//! it needs for that.
//!
//! Rules (the events extension): audit events exist only while introspection is on; an event
//! is recorded unless it is a successful read (a read method or a message-reply op); every
//! event of a session caller carries `sid`.

use serde_json::{json, Value};

use crate::auth::Principal;
use crate::ext::command::table::{self, ReplyKind};
use crate::feed::FeedEvent;
use crate::instance::Instance;
use crate::time::Now;

/// The longest `action` recorded: a method name comes from the caller, and a refused
/// unknown method must not fill the feed with its bytes.
const MAX_ACTION: usize = 128;

/// The core methods that only read.
const READ_METHODS: &[&str] = &[
    "GetTask",
    "ListTasks",
    "SubscribeToTask",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "GetExtendedAgentCard",
];

/// Command arguments that name what an op acts on, in the order they are looked for (the
/// host's audit of the ops it serves uses the same list).
pub const TARGET_ARGS: &[&str] = &["run", "handle", "workflow", "path", "id"];

/// Who made a request, as its audit event names them.
pub(crate) struct Caller<'a> {
    pub(crate) principal: &'a Principal,
    /// The device session it came through, if any.
    pub(crate) sid: Option<&'a str>,
    pub(crate) now: Now,
}

/// How a request ended, as far as the audit is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Answered by the core.
    Answered,
    /// Refused with this JSON-RPC code.
    Refused(i32),
    /// A command handed to the host, which audits it when it answers.
    HandedToHost,
}

/// Records the audit event of one answered request, if the rules call for one.
pub(crate) fn record(
    inst: &mut Instance,
    caller: &Caller<'_>,
    method: &str,
    params: Option<&serde_json::value::RawValue>,
    outcome: Outcome,
) {
    if !inst.config.introspection_enabled || outcome == Outcome::HandedToHost {
        return;
    }
    let params: Value = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or(Value::Null);
    let (action, target, read) = describe(method, &params);
    let refused = match outcome {
        Outcome::Refused(code) => Some(code),
        _ => None,
    };
    if read && refused.is_none() {
        return;
    }
    let outcome = match refused {
        None => "ok".to_owned(),
        Some(code) => format!("refused {code}"),
    };
    let mut data = json!({
        "ts": caller.now.epoch_ms,
        "principal": caller.principal.id,
        "role": caller.principal.role.as_str(),
        "action": action,
        "target": target,
        "outcome": outcome,
    });
    if let (Some(sid), Some(obj)) = (caller.sid, data.as_object_mut()) {
        obj.insert("sid".into(), Value::String(sid.to_owned()));
    }
    let event = FeedEvent::Other {
        kind: "audit",
        data,
        owner: None,
    };
    // The feed's own checks are the only way this fails; the answer goes out regardless.
    let _ = inst.push_event(event, caller.now);
}

/// What a request did: its action (the op for a command, else the method), its target, and
/// whether it only read.
fn describe(method: &str, params: &Value) -> (String, Value, bool) {
    if matches!(method, "SendMessage" | "SendStreamingMessage") {
        let message = &params["message"];
        if let Some(envelope) = command_envelope(message) {
            if let Some(op) = envelope.get("op").and_then(Value::as_str) {
                let read = table::find(op).is_some_and(|s| s.reply == ReplyKind::Message);
                let target = TARGET_ARGS
                    .iter()
                    .find_map(|k| envelope.get(*k).cloned())
                    .unwrap_or(Value::Null);
                return (bounded(op), target, read);
            }
        }
        let target = ["taskId", "contextId"]
            .iter()
            .find_map(|k| message.get(*k).filter(|v| v.is_string()).cloned())
            .unwrap_or(Value::Null);
        return (method.to_owned(), target, false);
    }
    let target = ["id", "taskId"]
        .iter()
        .find_map(|k| params.get(*k).filter(|v| v.is_string()).cloned())
        .unwrap_or(Value::Null);
    let read = READ_METHODS.contains(&method) || method == crate::ext::registry::EVENTS_METHOD;
    (bounded(method), target, read)
}

/// The `agentd` object of a message's first data part, if it has one.
fn command_envelope(message: &Value) -> Option<&serde_json::Map<String, Value>> {
    message
        .get("parts")?
        .as_array()?
        .iter()
        .find_map(|p| p.get("data")?.get("agentd")?.as_object())
}

fn bounded(s: &str) -> String {
    let mut end = s.len().min(MAX_ACTION);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_methods_and_commands() {
        let (a, t, r) = describe("GetTask", &json!({"id": "t1"}));
        assert_eq!((a.as_str(), t, r), ("GetTask", json!("t1"), true));
        let (a, t, r) = describe("CancelTask", &json!({"id": "t1"}));
        assert_eq!((a.as_str(), t, r), ("CancelTask", json!("t1"), false));
        let status = json!({"message": {"parts": [{"data": {"agentd": {"op": "status"}}}]}});
        let (a, _, r) = describe("SendMessage", &status);
        assert_eq!((a.as_str(), r), ("status", true));
        let revoke = json!({"message": {"parts": [{"text": "x"},
            {"data": {"agentd": {"op": "auth.sessions.revoke", "id": "ds_1"}}}]}});
        let (a, t, r) = describe("SendMessage", &revoke);
        assert_eq!(
            (a.as_str(), t, r),
            ("auth.sessions.revoke", json!("ds_1"), false)
        );
        let turn = json!({"message": {"contextId": "c1", "parts": [{"text": "hi"}]}});
        let (a, t, r) = describe("SendStreamingMessage", &turn);
        assert_eq!(
            (a.as_str(), t, r),
            ("SendStreamingMessage", json!("c1"), false)
        );
    }

    #[test]
    fn a_long_method_name_is_cut_on_a_char_boundary() {
        let name = "é".repeat(100);
        let (a, _, _) = describe(&name, &Value::Null);
        assert!(a.len() <= MAX_ACTION && name.starts_with(&a));
    }
}
