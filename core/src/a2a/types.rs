//! The A2A 1.0 data model in ProtoJSON: lowerCamelCase members (snake_case accepted on
//! input), enums as their proto names (integers accepted on input), defaults omitted on
//! output, unknown input members ignored. Output structs list their members in
//! alphabetical order, so documents read the same way everywhere.

use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;

pub(crate) type Struct = Map<String, Value>;

macro_rules! proto_enum {
    ($(#[$m:meta])* $name:ident {
        $($(#[$vm:meta])* $variant:ident = $num:literal => $text:literal),* $(,)?
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
        pub enum $name {
            #[default]
            $($(#[$vm])* $variant),*
        }

        impl $name {
            /// The proto name, as ProtoJSON writes it.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }
            /// The value of a proto name; `None` for a name the enum does not have.
            pub fn from_name(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)* _ => None }
            }
            /// The value of a proto number (ProtoJSON accepts them on input).
            pub(crate) fn from_number(n: i64) -> Option<Self> {
                match n { $($num => Some($name::$variant),)* _ => None }
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                match Value::deserialize(d)? {
                    Value::String(s) => Self::from_name(&s).ok_or_else(|| {
                        de::Error::custom(format_args!("unknown {} value {s:?}", stringify!($name)))
                    }),
                    Value::Number(n) => n.as_i64().and_then(Self::from_number).ok_or_else(|| {
                        de::Error::custom(format_args!("unknown {} value {n}", stringify!($name)))
                    }),
                    _ => Err(de::Error::custom(concat!("expected a ", stringify!($name), " name"))),
                }
            }
        }
    };
}

proto_enum!(
    /// Who wrote a message.
    Role {
        /// Not set; what a message without a role reads as.
        Unspecified = 0 => "ROLE_UNSPECIFIED",
        /// The client's side of the conversation.
        User = 1 => "ROLE_USER",
        /// The agent's side of the conversation.
        Agent = 2 => "ROLE_AGENT",
    }
);

proto_enum!(
    /// Where a task is in its lifecycle.
    TaskState {
        /// Not set; no task the core keeps is in it.
        Unspecified = 0 => "TASK_STATE_UNSPECIFIED",
        /// Accepted, not yet started.
        Submitted = 1 => "TASK_STATE_SUBMITTED",
        /// The agent is at work on it.
        Working = 2 => "TASK_STATE_WORKING",
        /// Finished with a result (terminal).
        Completed = 3 => "TASK_STATE_COMPLETED",
        /// Finished without one (terminal).
        Failed = 4 => "TASK_STATE_FAILED",
        /// Stopped at a client's or operator's request (terminal).
        Canceled = 5 => "TASK_STATE_CANCELED",
        /// Waiting for the client's next message.
        InputRequired = 6 => "TASK_STATE_INPUT_REQUIRED",
        /// The agent declined it (terminal).
        Rejected = 7 => "TASK_STATE_REJECTED",
        /// Waiting for the client to authenticate further.
        AuthRequired = 8 => "TASK_STATE_AUTH_REQUIRED",
    }
);

impl TaskState {
    /// A terminal task never changes again.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// The client must act before the task goes on.
    pub(crate) const fn is_interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }

    /// A stream on the task ends, and a blocking send returns, at these states.
    pub const fn ends_a_turn(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }
}

/// An int32 as ProtoJSON writes it: a number, or a string of digits.
fn de_opt_i32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    let v = Value::deserialize(d)?;
    let n = match &v {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_i64(),
        Value::String(s)
            if !s.is_empty()
                && s.trim_start_matches('-')
                    .bytes()
                    .all(|b| b.is_ascii_digit()) =>
        {
            s.parse::<i64>().ok()
        }
        _ => None,
    };
    n.and_then(|n| i32::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| de::Error::custom(format_args!("expected an int32, got {v}")))
}

/// Presence for a `google.protobuf.Value`: a member written as `null` is present.
fn de_present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A proto string: `null` reads as the default.
fn de_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn de_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a part holds: exactly one of the `content` oneof.
#[derive(Clone, Debug, PartialEq)]
pub enum PartContent {
    /// Plain text.
    Text(String),
    /// Bytes, as the base64 text the client sent.
    Raw(String),
    /// A file by reference: its URL, not fetched by the core.
    Url(String),
    /// Structured JSON (the command extension's envelope travels as one).
    Data(Value),
}

/// A piece of a message or artifact.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// The part's payload.
    pub content: PartContent,
    pub(crate) metadata: Option<Struct>,
    pub(crate) filename: String,
    pub(crate) media_type: String,
}

impl Part {
    /// The text parts of `parts`, joined with `\n`: what a reader that wants only text sees.
    pub fn joined_text(parts: &[Part]) -> String {
        parts
            .iter()
            .filter_map(|p| match &p.content {
                PartContent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A text part with no metadata, filename or media type.
    pub fn text(text: impl Into<String>) -> Self {
        Part {
            content: PartContent::Text(text.into()),
            metadata: None,
            filename: String::new(),
            media_type: String::new(),
        }
    }

    /// A data part with no metadata, filename or media type.
    pub fn data(value: Value) -> Self {
        Part {
            content: PartContent::Data(value),
            metadata: None,
            filename: String::new(),
            media_type: String::new(),
        }
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if let PartContent::Data(v) = &self.content {
            m.serialize_entry("data", v)?;
        }
        if !self.filename.is_empty() {
            m.serialize_entry("filename", &self.filename)?;
        }
        if !self.media_type.is_empty() {
            m.serialize_entry("mediaType", &self.media_type)?;
        }
        if let Some(meta) = &self.metadata {
            m.serialize_entry("metadata", meta)?;
        }
        match &self.content {
            PartContent::Raw(b) => m.serialize_entry("raw", b)?,
            PartContent::Text(t) => m.serialize_entry("text", t)?,
            PartContent::Url(u) => m.serialize_entry("url", u)?,
            PartContent::Data(_) => {}
        }
        m.end()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PartWire {
    #[serde(default, deserialize_with = "de_opt_string")]
    text: Option<String>,
    #[serde(default, deserialize_with = "de_opt_string")]
    raw: Option<String>,
    #[serde(default, deserialize_with = "de_opt_string")]
    url: Option<String>,
    #[serde(default, deserialize_with = "de_present")]
    data: Option<Value>,
    #[serde(default)]
    metadata: Option<Struct>,
    #[serde(default, deserialize_with = "de_string")]
    filename: String,
    #[serde(default, alias = "media_type", deserialize_with = "de_string")]
    media_type: String,
}

fn de_opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = PartWire::deserialize(d)?;
        let mut contents = Vec::with_capacity(1);
        if let Some(t) = w.text {
            contents.push(PartContent::Text(t));
        }
        if let Some(r) = w.raw {
            if !is_base64(&r) {
                return Err(de::Error::custom("raw is not base64"));
            }
            contents.push(PartContent::Raw(r));
        }
        if let Some(u) = w.url {
            contents.push(PartContent::Url(u));
        }
        if let Some(v) = w.data {
            contents.push(PartContent::Data(v));
        }
        if contents.len() > 1 {
            return Err(de::Error::custom(
                "a part holds exactly one of text, raw, url, data; found several",
            ));
        }
        let content = contents.pop().ok_or_else(|| {
            de::Error::custom("a part holds exactly one of text, raw, url, data; found none")
        })?;
        Ok(Part {
            content,
            metadata: w.metadata,
            filename: w.filename,
            media_type: w.media_type,
        })
    }
}

/// Standard or URL-safe base64, padded or not, as ProtoJSON parsers accept.
fn is_base64(s: &str) -> bool {
    let body = s.trim_end_matches('=');
    let pad = s.len() - body.len();
    pad <= 2
        && (pad == 0 || s.len() % 4 == 0)
        && body.len() % 4 != 1
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_'))
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// The conversation the message belongs to; empty lets the core choose one.
    #[serde(
        default,
        alias = "context_id",
        deserialize_with = "de_string",
        skip_serializing_if = "String::is_empty"
    )]
    pub context_id: String,
    /// Extension URIs the message uses.
    #[serde(
        default,
        deserialize_with = "de_strings",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub extensions: Vec<String>,
    /// The sender's id for the message; a resend with the same id is the same message.
    #[serde(default, alias = "message_id", deserialize_with = "de_string")]
    pub message_id: String,
    /// Free-form metadata, carried as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
    /// The content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Other tasks the message refers to.
    #[serde(
        default,
        alias = "reference_task_ids",
        deserialize_with = "de_strings",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reference_task_ids: Vec<String>,
    /// Who wrote it.
    #[serde(default)]
    pub role: Role,
    /// The task the message continues; empty starts a new one.
    #[serde(
        default,
        alias = "task_id",
        deserialize_with = "de_string",
        skip_serializing_if = "String::is_empty"
    )]
    pub task_id: String,
}

/// A task's current state.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// The agent's message with the state, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Arc<Message>>,
    /// Where the task is.
    pub state: TaskState,
    /// When it got there, RFC 3339.
    pub timestamp: String,
}

/// An output of a task. Deserialized only from agentd's own durable store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Unique within its task.
    pub artifact_id: String,
    /// A human-readable description.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Extension URIs the artifact uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
    /// A human-readable name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The content.
    pub parts: Vec<Part>,
}

/// The unit of work. Its messages and artifacts are shared with the task store, so a
/// snapshot for an answer copies none of their content, and an answer larger than the
/// connection's output bound is written from that snapshot as the peer reads it
/// ([`crate::a2a::piecewise`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// Its outputs so far.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Arc<Artifact>>,
    /// The conversation it belongs to.
    pub context_id: String,
    /// Its messages, oldest first (as many as the request asked for).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Arc<Message>>,
    /// The id the core gave it.
    pub id: String,
    /// Free-form metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Struct>,
    /// Its current state.
    pub status: TaskStatus,
}

/// A stream event: a task changed state.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    /// The task's conversation.
    pub context_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metadata: Option<Struct>,
    /// The new status.
    pub status: TaskStatus,
    /// The task that changed.
    pub task_id: String,
}

/// A stream event: a task produced an artifact, or another chunk of one.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) append: bool,
    pub(crate) artifact: Artifact,
    pub(crate) context_id: String,
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) last_chunk: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metadata: Option<Struct>,
    pub(crate) task_id: String,
}

/// One event of a stream, and the result of a send: exactly one member.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamResponse {
    /// The task, as it stands.
    Task(Task),
    /// A message that answers without a task.
    Message(Message),
    /// A change of state.
    StatusUpdate(TaskStatusUpdateEvent),
    /// A new artifact, or a chunk of one.
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

/// How the client wants a send answered.
#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    /// Media types the client accepts in the answer; empty accepts any.
    #[serde(
        default,
        alias = "accepted_output_modes",
        deserialize_with = "de_strings"
    )]
    pub accepted_output_modes: Vec<String>,
    /// A webhook to register for the task with the send, unparsed.
    #[serde(default, alias = "task_push_notification_config")]
    pub task_push_notification_config: Option<Value>,
    /// At most this many messages of history in the answered task.
    #[serde(default, alias = "history_length", deserialize_with = "de_opt_i32")]
    pub history_length: Option<i32>,
    /// Answer with the task at once instead of waiting for the turn to end.
    #[serde(default, alias = "return_immediately")]
    pub return_immediately: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SendMessageRequest {
    #[serde(default, deserialize_with = "de_string")]
    pub(crate) tenant: String,
    #[serde(default)]
    pub(crate) message: Option<Message>,
    #[serde(default)]
    pub(crate) configuration: Option<SendMessageConfiguration>,
    #[serde(default)]
    pub(crate) metadata: Option<Struct>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GetTaskRequest {
    #[serde(default, deserialize_with = "de_string")]
    pub(crate) tenant: String,
    #[serde(default, deserialize_with = "de_string")]
    pub(crate) id: String,
    #[serde(default, alias = "history_length", deserialize_with = "de_opt_i32")]
    pub(crate) history_length: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListTasksRequest {
    #[serde(default, deserialize_with = "de_string")]
    pub(crate) tenant: String,
    #[serde(default, alias = "context_id", deserialize_with = "de_string")]
    pub(crate) context_id: String,
    #[serde(default)]
    pub(crate) status: Option<TaskState>,
    #[serde(default, alias = "page_size", deserialize_with = "de_opt_i32")]
    pub(crate) page_size: Option<i32>,
    #[serde(default, alias = "page_token", deserialize_with = "de_string")]
    pub(crate) page_token: String,
    #[serde(default, alias = "history_length", deserialize_with = "de_opt_i32")]
    pub(crate) history_length: Option<i32>,
    #[serde(default, alias = "status_timestamp_after")]
    pub(crate) status_timestamp_after: Option<String>,
    #[serde(default, alias = "include_artifacts")]
    pub(crate) include_artifacts: Option<bool>,
}

/// The params of CancelTask and SubscribeToTask (and the task-id part of others).
#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TaskIdRequest {
    #[serde(default, deserialize_with = "de_string")]
    pub(crate) tenant: String,
    #[serde(default, deserialize_with = "de_string")]
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) metadata: Option<Struct>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parts_are_a_oneof() {
        let p: Part =
            serde_json::from_value(json!({"text":"hi","mediaType":"text/plain"})).unwrap();
        assert_eq!(p.content, PartContent::Text("hi".into()));
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"mediaType":"text/plain","text":"hi"})
        );
        let p: Part = serde_json::from_value(json!({"data": null})).unwrap();
        assert_eq!(p.content, PartContent::Data(Value::Null));
        let p: Part = serde_json::from_value(json!({"raw":"aGk","media_type":"a/b"})).unwrap();
        assert_eq!(p.media_type, "a/b");
        for bad in [
            json!({}),
            json!({"text":"a","data":1}),
            json!({"raw":"!!"}),
            json!({"text":5}),
            json!({"kind":"text"}),
        ] {
            assert!(
                serde_json::from_value::<Part>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn messages_accept_snake_case_and_enum_numbers() {
        let m: Message = serde_json::from_value(json!({
            "message_id":"m","role":1,"parts":[{"text":"x"}],"task_id":"t","unknown":true
        }))
        .unwrap();
        assert_eq!(
            (m.message_id.as_str(), m.role, m.task_id.as_str()),
            ("m", Role::User, "t")
        );
        assert!(serde_json::from_value::<Message>(json!({"role":"user"})).is_err());
        let out = serde_json::to_value(&m).unwrap();
        assert_eq!(
            out,
            json!({"messageId":"m","parts":[{"text":"x"}],"role":"ROLE_USER","taskId":"t"})
        );
    }

    #[test]
    fn int32_accepts_numeric_strings_only_in_range() {
        let r: GetTaskRequest =
            serde_json::from_value(json!({"id":"a","historyLength":"3"})).unwrap();
        assert_eq!(r.history_length, Some(3));
        for bad in [
            json!("x"),
            json!(1.5),
            json!(4_294_967_296_i64),
            json!(true),
        ] {
            assert!(serde_json::from_value::<GetTaskRequest>(
                json!({"id":"a","historyLength":bad})
            )
            .is_err());
        }
    }

    #[test]
    fn stream_response_has_exactly_one_member() {
        let m = Message {
            message_id: "x".into(),
            role: Role::Agent,
            ..Default::default()
        };
        let v = serde_json::to_value(StreamResponse::Message(m)).unwrap();
        assert_eq!(
            v,
            json!({"message":{"messageId":"x","parts":[],"role":"ROLE_AGENT"}})
        );
    }

    #[test]
    fn base64_forms() {
        for ok in ["", "aGk", "aGk=", "aGVsbG8-_w", "aGVsbG8+/w=="] {
            assert!(is_base64(ok), "{ok}");
        }
        for bad in ["a", "aGk==", "a===", "aGk=x", "a b"] {
            assert!(!is_base64(bad), "{bad}");
        }
    }
}
