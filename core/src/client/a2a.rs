//! The A2A side of the outbound client: the JSON-RPC documents agentd sends to a peer, the
//! decoding of its answers into the core's types, and the choice of interface on its card
//! (surface §7.13). Pure functions; the caller moves the bytes.

use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::request::OutRequest;
use super::response::ResponseHead;
use crate::a2a::types::{
    Artifact, Message, Part, Role, StreamResponse, Struct, Task, TaskArtifactUpdateEvent,
    TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use crate::a2a::{version_supported, CoreMethod, PROTOCOL_VERSION};
use crate::ext::registry::{Ext, COMMAND_URI, UNIX_BINDING_URI};

/// Where a peer serves its public card, under its origin.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The protocol binding name of JSON-RPC over HTTP on a card.
pub(crate) const JSONRPC_BINDING: &str = "JSONRPC";
/// The header that activates extensions on a request.
pub(crate) const EXTENSIONS_HEADER: &str = "A2A-Extensions";
/// The key of a command envelope in a message's data part (surface §3.1).
pub(crate) const COMMAND_KEY: &str = "agentd";

/// Longest a cached card is trusted, whatever the peer says (seconds).
pub(crate) const CARD_TTL_MAX_SECS: u64 = 300;
/// How long a card is cached when the peer names no max-age.
pub(crate) const CARD_TTL_DEFAULT_SECS: u64 = 60;
/// Cap for a peer on the same host (loopback, unix): it may be restarted with a new card.
pub(crate) const CARD_TTL_SAME_HOST_SECS: u64 = 5;

// ---------------------------------------------------------------------------------------
// Requests

/// `GET /.well-known/agent-card.json` on `host` (the tests' oracle for the card path).
#[cfg(test)]
pub(crate) fn card_request(host: &str) -> OutRequest {
    OutRequest::new("GET", host, CARD_PATH).header("Accept", "application/json")
}

/// A JSON-RPC POST to the peer's endpoint path, with `A2A-Version: 1.0`, and the
/// `A2A-Extensions` header only when `extensions` is not empty.
pub fn rpc_request(
    host: &str,
    path: &str,
    body: Vec<u8>,
    streaming: bool,
    extensions: &[&str],
) -> OutRequest {
    let accept = if streaming {
        "text/event-stream, application/json"
    } else {
        "application/json"
    };
    let mut r = OutRequest::new("POST", host, path)
        .header("Content-Type", "application/json")
        .header("Accept", accept)
        .header("A2A-Version", PROTOCOL_VERSION);
    if !extensions.is_empty() {
        r = r.header(EXTENSIONS_HEADER, &extensions.join(", "));
    }
    r.body(body)
}

/// How a send asks to be answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// The interface's tenant, echoed on every request.
    pub tenant: Option<String>,
    /// `configuration.returnImmediately`: answer with the task at once (then poll it).
    pub return_immediately: bool,
    /// `configuration.acceptedOutputModes`; empty means no preference (and is not sent).
    pub accepted_output_modes: Vec<String>,
}

fn envelope(id: u64, method: CoreMethod, params: Value) -> Vec<u8> {
    let doc = json!({"jsonrpc": "2.0", "id": id, "method": method.name(), "params": params});
    serde_json::to_vec(&doc).unwrap_or_default()
}

fn with_tenant(mut params: Map<String, Value>, tenant: Option<&str>) -> Value {
    if let Some(t) = tenant.filter(|t| !t.is_empty()) {
        params.insert("tenant".into(), Value::String(t.to_owned()));
    }
    Value::Object(params)
}

/// The body of `SendMessage` or (with `streaming`) `SendStreamingMessage`.
pub fn send_message_body(
    id: u64,
    streaming: bool,
    message: &Message,
    opts: &SendOptions,
) -> Vec<u8> {
    let mut params = Map::new();
    params.insert(
        "message".into(),
        serde_json::to_value(message).unwrap_or(Value::Null),
    );
    let mut config = Map::new();
    if opts.return_immediately && !streaming {
        config.insert("returnImmediately".into(), Value::Bool(true));
    }
    if !opts.accepted_output_modes.is_empty() {
        config.insert(
            "acceptedOutputModes".into(),
            json!(opts.accepted_output_modes),
        );
    }
    if !config.is_empty() {
        params.insert("configuration".into(), Value::Object(config));
    }
    let method = if streaming {
        CoreMethod::SendStreamingMessage
    } else {
        CoreMethod::SendMessage
    };
    envelope(id, method, with_tenant(params, opts.tenant.as_deref()))
}

/// The body of `GetTask`.
pub fn get_task_body(id: u64, task_id: &str, tenant: Option<&str>) -> Vec<u8> {
    let mut params = Map::new();
    params.insert("id".into(), Value::String(task_id.to_owned()));
    envelope(id, CoreMethod::GetTask, with_tenant(params, tenant))
}

/// The body of `CancelTask`.
pub fn cancel_task_body(id: u64, task_id: &str, tenant: Option<&str>) -> Vec<u8> {
    let mut params = Map::new();
    params.insert("id".into(), Value::String(task_id.to_owned()));
    envelope(id, CoreMethod::CancelTask, with_tenant(params, tenant))
}

/// A plain user message: no extensions.
pub fn user_message(message_id: &str, parts: Vec<Part>, context_id: Option<&str>) -> Message {
    Message {
        message_id: message_id.to_owned(),
        role: Role::User,
        parts,
        context_id: context_id.unwrap_or_default().to_owned(),
        ..Message::default()
    }
}

/// A command message (surface §3.1): one data part `{"agentd": {"op": op, ...args}}`,
/// marked with the command URI. `args` may not hold `op` itself.
pub fn command_message(
    message_id: &str,
    op: &str,
    args: Map<String, Value>,
    context_id: Option<&str>,
) -> Result<Message, A2aError> {
    if op.is_empty() {
        return Err(A2aError::Invalid("a command needs a non-empty op".into()));
    }
    if args.contains_key("op") {
        return Err(A2aError::Invalid(
            "command args may not hold \"op\"; it is given on its own".into(),
        ));
    }
    let mut envelope = Map::with_capacity(args.len() + 1);
    envelope.insert("op".into(), Value::String(op.to_owned()));
    envelope.extend(args);
    let mut part = Part::data(json!({ COMMAND_KEY: Value::Object(envelope) }));
    part.media_type = "application/json".into();
    let mut m = user_message(message_id, vec![part], context_id);
    m.extensions = vec![COMMAND_URI.to_owned()];
    Ok(m)
}

// ---------------------------------------------------------------------------------------
// Responses

/// A JSON-RPC error object from the peer.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcErrorReply {
    /// The JSON-RPC error code (A2A's own are -32001 to -32099).
    pub code: i64,
    /// The peer's message, as sent.
    pub message: String,
    /// The error's `data` member, if any (A2A puts its `ErrorInfo` details there).
    pub data: Option<Value>,
}

/// Why an answer could not be turned into a result.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum A2aError {
    /// The peer answered with a JSON-RPC error.
    Rpc(RpcErrorReply),
    /// The answer is not the JSON-RPC response (or result) it should be.
    Malformed(String),
    /// What the caller asked to build is not valid.
    Invalid(String),
}

impl fmt::Display for A2aError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            A2aError::Rpc(e) => write!(f, "JSON-RPC error {}: {}", e.code, e.message),
            A2aError::Malformed(why) => write!(f, "malformed answer: {why}"),
            A2aError::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for A2aError {}

/// What a send answered: a task to follow, or a message that is the whole answer.
#[derive(Clone, Debug, PartialEq)]
pub enum SendResult {
    /// The task the send started or continued.
    Task(Task),
    /// A message that answers without a task.
    Message(Message),
}

/// Decodes the response to `SendMessage` (request id `id`).
pub fn decode_send_response(body: &[u8], id: u64) -> Result<SendResult, A2aError> {
    let result = rpc_result(body, id)?;
    match decode_stream_response(result)? {
        StreamResponse::Task(t) => Ok(SendResult::Task(t)),
        StreamResponse::Message(m) => Ok(SendResult::Message(m)),
        _ => Err(A2aError::Malformed(
            "a send answered with an update event instead of a task or message".into(),
        )),
    }
}

/// Decodes the response to `GetTask` or `CancelTask`: a Task (bare, as A2A 1.0 answers,
/// or wrapped as `{"task": ...}`).
pub fn decode_task_response(body: &[u8], id: u64) -> Result<Task, A2aError> {
    let result = rpc_result(body, id)?;
    let inner = match result {
        Value::Object(mut m) if m.len() == 1 && m.get("task").is_some_and(Value::is_object) => {
            m.remove("task").unwrap_or(Value::Null)
        }
        other => other,
    };
    task_from(from_value::<TaskWire>(inner, "Task")?)
}

/// Decodes one SSE event's data: a JSON-RPC response whose result is a StreamResponse.
pub fn decode_stream_event(data: &str, id: u64) -> Result<StreamResponse, A2aError> {
    let result = rpc_result(data.as_bytes(), id)?;
    decode_stream_response(result)
}

#[derive(Deserialize)]
struct RpcResponseWire {
    #[serde(default)]
    jsonrpc: Option<String>,
    #[serde(default)]
    id: Value,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<RpcErrorWire>,
}

#[derive(Deserialize)]
struct RpcErrorWire {
    code: i64,
    #[serde(default, deserialize_with = "null_default")]
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

/// The `result` of a JSON-RPC response to request `id`, or its error.
pub(crate) fn rpc_result(body: &[u8], id: u64) -> Result<Value, A2aError> {
    let r: RpcResponseWire = serde_json::from_slice(body)
        .map_err(|e| A2aError::Malformed(format!("the answer is not a JSON-RPC response: {e}")))?;
    if r.jsonrpc.as_deref() != Some("2.0") {
        return Err(A2aError::Malformed(
            "the answer lacks \"jsonrpc\":\"2.0\"".into(),
        ));
    }
    match (r.result, r.error) {
        (None, Some(e)) => {
            // An error may carry a null id (the peer could not read ours).
            if !(r.id.is_null() || r.id.as_u64() == Some(id)) {
                return Err(A2aError::Malformed(format!(
                    "the error answers request id {} instead of {id}",
                    r.id
                )));
            }
            Err(A2aError::Rpc(RpcErrorReply {
                code: e.code,
                message: e.message,
                data: e.data,
            }))
        }
        (Some(result), None) => {
            if r.id.as_u64() != Some(id) {
                return Err(A2aError::Malformed(format!(
                    "the result answers request id {} instead of {id}",
                    r.id
                )));
            }
            Ok(result)
        }
        _ => Err(A2aError::Malformed(
            "a JSON-RPC response holds exactly one of result and error".into(),
        )),
    }
}

fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn from_value<T: DeserializeOwned>(v: Value, what: &str) -> Result<T, A2aError> {
    serde_json::from_value(v).map_err(|e| A2aError::Malformed(format!("not a valid {what}: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskStatusWire {
    #[serde(default, deserialize_with = "null_default")]
    state: TaskState,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default, deserialize_with = "null_default")]
    timestamp: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArtifactWire {
    #[serde(default, alias = "artifact_id", deserialize_with = "null_default")]
    artifact_id: String,
    #[serde(default, deserialize_with = "null_default")]
    description: String,
    #[serde(default, deserialize_with = "null_default")]
    extensions: Vec<String>,
    #[serde(default)]
    metadata: Option<Struct>,
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    #[serde(default, deserialize_with = "null_default")]
    parts: Vec<Part>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskWire {
    #[serde(default, deserialize_with = "null_default")]
    id: String,
    #[serde(default, alias = "context_id", deserialize_with = "null_default")]
    context_id: String,
    status: Option<TaskStatusWire>,
    #[serde(default, deserialize_with = "null_default")]
    artifacts: Vec<ArtifactWire>,
    #[serde(default, deserialize_with = "null_default")]
    history: Vec<Message>,
    #[serde(default)]
    metadata: Option<Struct>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusUpdateWire {
    #[serde(default, alias = "task_id", deserialize_with = "null_default")]
    task_id: String,
    #[serde(default, alias = "context_id", deserialize_with = "null_default")]
    context_id: String,
    status: Option<TaskStatusWire>,
    #[serde(default)]
    metadata: Option<Struct>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArtifactUpdateWire {
    #[serde(default, alias = "task_id", deserialize_with = "null_default")]
    task_id: String,
    #[serde(default, alias = "context_id", deserialize_with = "null_default")]
    context_id: String,
    artifact: Option<ArtifactWire>,
    #[serde(default, deserialize_with = "null_default")]
    append: bool,
    #[serde(default, alias = "last_chunk", deserialize_with = "null_default")]
    last_chunk: bool,
    #[serde(default)]
    metadata: Option<Struct>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamResponseWire {
    #[serde(default)]
    task: Option<TaskWire>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default, alias = "status_update")]
    status_update: Option<StatusUpdateWire>,
    #[serde(default, alias = "artifact_update")]
    artifact_update: Option<ArtifactUpdateWire>,
}

fn status_from(w: Option<TaskStatusWire>) -> Result<TaskStatus, A2aError> {
    let w = w.ok_or_else(|| A2aError::Malformed("a task without a status".into()))?;
    Ok(TaskStatus {
        state: w.state,
        message: w.message.map(Arc::new),
        timestamp: w.timestamp,
    })
}

fn artifact_from(w: ArtifactWire) -> Artifact {
    Artifact {
        artifact_id: w.artifact_id,
        description: w.description,
        extensions: w.extensions,
        metadata: w.metadata,
        name: w.name,
        parts: w.parts,
    }
}

fn task_from(w: TaskWire) -> Result<Task, A2aError> {
    if w.id.is_empty() {
        return Err(A2aError::Malformed("a task without an id".into()));
    }
    Ok(Task {
        id: w.id,
        context_id: w.context_id,
        status: status_from(w.status)?,
        artifacts: w
            .artifacts
            .into_iter()
            .map(|a| Arc::new(artifact_from(a)))
            .collect(),
        history: w.history.into_iter().map(Arc::new).collect(),
        metadata: w.metadata,
    })
}

/// A StreamResponse (exactly one of task, message, statusUpdate, artifactUpdate).
pub(crate) fn decode_stream_response(v: Value) -> Result<StreamResponse, A2aError> {
    let w: StreamResponseWire = from_value(v, "StreamResponse")?;
    let present = usize::from(w.task.is_some())
        + usize::from(w.message.is_some())
        + usize::from(w.status_update.is_some())
        + usize::from(w.artifact_update.is_some());
    if present != 1 {
        return Err(A2aError::Malformed(format!(
            "a StreamResponse holds exactly one of task, message, statusUpdate, artifactUpdate; found {present}"
        )));
    }
    if let Some(t) = w.task {
        return Ok(StreamResponse::Task(task_from(t)?));
    }
    if let Some(m) = w.message {
        return Ok(StreamResponse::Message(m));
    }
    if let Some(s) = w.status_update {
        return Ok(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: s.task_id,
            context_id: s.context_id,
            status: status_from(s.status)?,
            metadata: s.metadata,
        }));
    }
    let a = w
        .artifact_update
        .ok_or_else(|| A2aError::Malformed("empty StreamResponse".into()))?;
    let artifact = a
        .artifact
        .ok_or_else(|| A2aError::Malformed("an artifact update without an artifact".into()))?;
    Ok(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
        task_id: a.task_id,
        context_id: a.context_id,
        artifact: artifact_from(artifact),
        append: a.append,
        last_chunk: a.last_chunk,
        metadata: a.metadata,
    }))
}

/// Folds a stream event into the task being followed, as the peer's own store would:
/// a status update replaces the status, an artifact update adds or appends to an artifact.
/// Returns false when the event is for another task (it is then ignored).
pub fn apply_update(task: &mut Task, event: &StreamResponse) -> bool {
    match event {
        StreamResponse::Task(t) => {
            if t.id != task.id {
                return false;
            }
            *task = t.clone();
        }
        StreamResponse::StatusUpdate(s) => {
            if s.task_id != task.id {
                return false;
            }
            task.status = s.status.clone();
        }
        StreamResponse::ArtifactUpdate(a) => {
            if a.task_id != task.id {
                return false;
            }
            match task
                .artifacts
                .iter_mut()
                .find(|x| x.artifact_id == a.artifact.artifact_id)
            {
                Some(existing) if a.append => Arc::make_mut(existing)
                    .parts
                    .extend(a.artifact.parts.iter().cloned()),
                Some(existing) => *existing = Arc::new(a.artifact.clone()),
                None => task.artifacts.push(Arc::new(a.artifact.clone())),
            }
        }
        StreamResponse::Message(_) => return false,
    }
    true
}

// ---------------------------------------------------------------------------------------
// The peer's card

/// What the client reads of a peer's card; everything else is ignored.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerCard {
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) name: String,
    #[serde(
        default,
        alias = "supported_interfaces",
        deserialize_with = "null_default"
    )]
    pub(crate) supported_interfaces: Vec<PeerInterface>,
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) capabilities: PeerCapabilities,
    /// A 0.3 card names its version at the top.
    #[serde(default, alias = "protocol_version", deserialize_with = "null_default")]
    pub(crate) protocol_version: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PeerInterface {
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) url: String,
    #[serde(default, alias = "protocol_binding", deserialize_with = "null_default")]
    pub(crate) protocol_binding: String,
    #[serde(default, alias = "protocol_version", deserialize_with = "null_default")]
    pub(crate) protocol_version: String,
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) tenant: String,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PeerCapabilities {
    #[serde(default)]
    pub(crate) streaming: Option<bool>,
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) extensions: Vec<PeerExtension>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub(crate) struct PeerExtension {
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) uri: String,
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) required: bool,
}

/// Why a peer's card does not let agentd talk to it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CardError {
    /// The body is not a card agentd can read: why.
    Malformed(String),
    /// No interface agentd can use: the bindings and versions the card names instead.
    NoInterface {
        /// Each interface the card offers, as `binding version`.
        offered: Vec<String>,
    },
    /// The peer requires an extension agentd does not know.
    RequiresUnknownExtension(String),
}

impl fmt::Display for CardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CardError::Malformed(why) => write!(f, "the peer's agent card is malformed: {why}"),
            CardError::NoInterface { offered } if offered.is_empty() => {
                f.write_str("the peer's agent card names no A2A 1.0 interface (an A2A 0.3 peer?)")
            }
            CardError::NoInterface { offered } => write!(
                f,
                "the peer's agent card offers no usable A2A 1.0 interface, only {}",
                offered.join(", ")
            ),
            CardError::RequiresUnknownExtension(uri) => {
                write!(
                    f,
                    "the peer requires extension {uri}, which agentd does not know"
                )
            }
        }
    }
}

impl std::error::Error for CardError {}

/// Reads a card body.
pub fn parse_card(body: &[u8]) -> Result<PeerCard, CardError> {
    serde_json::from_slice(body).map_err(|e| CardError::Malformed(e.to_string()))
}

/// The interface agentd uses on a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectedInterface {
    /// The URL the card names (informational: the dial always goes to the configured URL).
    pub(crate) url: String,
    /// Echoed as `tenant` on every request, when the interface has one.
    pub tenant: Option<String>,
    /// The card says the peer streams.
    pub streaming: bool,
}

/// Surface §7.13: for a `unix://` endpoint the unix binding, otherwise `JSONRPC`, at
/// protocol version 1.0; among those the first whose URL equals the configured endpoint
/// (ignoring one trailing `/`), else the first. A peer requiring an extension outside
/// agentd's registry is refused.
pub fn select_interface(card: &PeerCard, endpoint: &str) -> Result<SelectedInterface, CardError> {
    if let Some(ext) = card
        .capabilities
        .extensions
        .iter()
        .find(|e| e.required && Ext::from_uri(&e.uri).is_none())
    {
        return Err(CardError::RequiresUnknownExtension(ext.uri.clone()));
    }
    let binding = if endpoint.starts_with("unix:") {
        UNIX_BINDING_URI
    } else {
        JSONRPC_BINDING
    };
    let usable: Vec<&PeerInterface> = card
        .supported_interfaces
        .iter()
        .filter(|i| {
            i.protocol_binding == binding && version_supported(i.protocol_version.as_bytes())
        })
        .collect();
    let same = |u: &str| u.trim_end_matches('/') == endpoint.trim_end_matches('/');
    let chosen = usable
        .iter()
        .find(|i| same(&i.url))
        .or_else(|| usable.first())
        .ok_or_else(|| CardError::NoInterface {
            offered: card
                .supported_interfaces
                .iter()
                .map(|i| format!("{} {}", i.protocol_binding, i.protocol_version))
                .collect(),
        })?;
    Ok(SelectedInterface {
        url: chosen.url.clone(),
        tenant: Some(chosen.tenant.clone()).filter(|t| !t.is_empty()),
        streaming: card.capabilities.streaming == Some(true),
    })
}

/// How long a card answered with `head` may be cached, in seconds: its `max-age` capped at
/// 300, 60 without one, 0 for `no-store` or `no-cache`, and at most 5 for a peer on the same
/// host.
pub fn card_ttl_secs(head: &ResponseHead, same_host: bool) -> u64 {
    let mut max_age = None;
    for (_, v) in head.headers.iter().filter(|(n, _)| n == "cache-control") {
        let Ok(v) = std::str::from_utf8(v) else {
            continue;
        };
        for directive in v.split(',') {
            let d = directive.trim();
            if d.eq_ignore_ascii_case("no-store") || d.eq_ignore_ascii_case("no-cache") {
                return 0;
            }
            if let Some((k, val)) = d.split_once('=') {
                if k.trim().eq_ignore_ascii_case("max-age") {
                    let val = val.trim().trim_matches('"');
                    if !val.is_empty() && val.bytes().all(|b| b.is_ascii_digit()) {
                        max_age = Some(val.parse::<u64>().unwrap_or(u64::MAX));
                    }
                }
            }
        }
    }
    let ttl = max_age
        .unwrap_or(CARD_TTL_DEFAULT_SECS)
        .min(CARD_TTL_MAX_SECS);
    if same_host {
        ttl.min(CARD_TTL_SAME_HOST_SECS)
    } else {
        ttl
    }
}

/// The text of a message's text parts, joined with newlines (for error reports).
pub fn message_text(m: &Message) -> String {
    crate::a2a::types::Part::joined_text(&m.parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::response::{ResponseEvent, ResponseLimits, ResponseParser};

    fn head(extra: &str) -> ResponseHead {
        let mut p = ResponseParser::new(ResponseLimits::DEFAULT);
        p.push(format!("HTTP/1.1 200 OK\r\n{extra}Content-Length: 0\r\n\r\n").as_bytes())
            .unwrap();
        match p.next_event().unwrap() {
            Some(ResponseEvent::Head(h)) => h,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn request_documents() {
        let m = user_message("m-1", vec![Part::text("hi")], Some("ctx"));
        let opts = SendOptions {
            tenant: Some("t1".into()),
            return_immediately: true,
            accepted_output_modes: vec![],
        };
        let body: Value = serde_json::from_slice(&send_message_body(7, false, &m, &opts)).unwrap();
        assert_eq!(
            body,
            json!({"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{
                "tenant":"t1",
                "configuration":{"returnImmediately":true},
                "message":{"contextId":"ctx","messageId":"m-1","parts":[{"text":"hi"}],"role":"ROLE_USER"}}})
        );
        let body: Value =
            serde_json::from_slice(&send_message_body(8, true, &m, &SendOptions::default()))
                .unwrap();
        assert_eq!(body["method"], "SendStreamingMessage");
        assert!(body["params"].get("configuration").is_none());
        assert!(body["params"].get("tenant").is_none());

        let body: Value = serde_json::from_slice(&get_task_body(9, "task-1", None)).unwrap();
        assert_eq!(
            body,
            json!({"jsonrpc":"2.0","id":9,"method":"GetTask","params":{"id":"task-1"}})
        );
        let body: Value =
            serde_json::from_slice(&cancel_task_body(10, "task-1", Some("t"))).unwrap();
        assert_eq!(
            body,
            json!({"jsonrpc":"2.0","id":10,"method":"CancelTask","params":{"id":"task-1","tenant":"t"}})
        );

        let r = rpc_request("h", "/", b"{}".to_vec(), true, &[]);
        assert_eq!(r.header_value("a2a-version"), Some("1.0"));
        assert_eq!(r.header_value("a2a-extensions"), None);
        let r = rpc_request("h", "/", b"{}".to_vec(), false, &[COMMAND_URI]);
        assert_eq!(r.header_value("A2A-Extensions"), Some(COMMAND_URI));
        assert!(card_request("h")
            .encode()
            .unwrap()
            .starts_with(b"GET /.well-known/agent-card.json HTTP/1.1\r\n"));
    }

    #[test]
    fn command_envelope() {
        let mut args = Map::new();
        args.insert("workflow".into(), json!("triage"));
        let m = command_message("m", "workflow.run", args, None).unwrap();
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"extensions":[COMMAND_URI],"messageId":"m","role":"ROLE_USER","parts":[
                {"data":{"agentd":{"op":"workflow.run","workflow":"triage"}},"mediaType":"application/json"}]})
        );
        let mut bad = Map::new();
        bad.insert("op".into(), json!("x"));
        assert!(command_message("m", "status", bad, None).is_err());
        assert!(command_message("m", "", Map::new(), None).is_err());
    }

    #[test]
    fn responses_decode_into_core_types() {
        let task = json!({"id":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING","timestamp":"x"},
            "artifacts":[{"artifactId":"a","parts":[{"text":"out"}]}]});
        let body = json!({"jsonrpc":"2.0","id":3,"result":{"task":task}});
        let SendResult::Task(t) = decode_send_response(body.to_string().as_bytes(), 3).unwrap()
        else {
            panic!()
        };
        assert_eq!((t.id.as_str(), t.status.state), ("t", TaskState::Working));
        assert_eq!(t.artifacts[0].parts, vec![Part::text("out")]);

        let body = json!({"jsonrpc":"2.0","id":3,"result":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[{"text":"hi"}]}}});
        let SendResult::Message(m) = decode_send_response(body.to_string().as_bytes(), 3).unwrap()
        else {
            panic!()
        };
        assert_eq!(message_text(&m), "hi");

        // GetTask answers the bare task; wrapped is accepted too.
        for result in [task.clone(), json!({"task": task})] {
            let body = json!({"jsonrpc":"2.0","id":4,"result":result});
            assert_eq!(
                decode_task_response(body.to_string().as_bytes(), 4)
                    .unwrap()
                    .id,
                "t"
            );
        }

        let err = json!({"jsonrpc":"2.0","id":5,"error":{"code":-32001,"message":"Task not found","data":[{"reason":"TASK_NOT_FOUND"}]}});
        assert_eq!(
            decode_task_response(err.to_string().as_bytes(), 5),
            Err(A2aError::Rpc(RpcErrorReply {
                code: -32001,
                message: "Task not found".into(),
                data: Some(json!([{"reason":"TASK_NOT_FOUND"}])),
            }))
        );
        let null_id = json!({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}});
        assert!(matches!(
            decode_task_response(null_id.to_string().as_bytes(), 5),
            Err(A2aError::Rpc(_))
        ));

        for bad in [
            "".to_owned(),
            "[]".to_owned(),
            json!({"id":5,"result":task}).to_string(),
            json!({"jsonrpc":"2.0","id":6,"result":task}).to_string(),
            json!({"jsonrpc":"2.0","id":5}).to_string(),
            json!({"jsonrpc":"2.0","id":5,"result":{"id":""}}).to_string(),
            json!({"jsonrpc":"2.0","id":5,"result":{"id":"t"}}).to_string(),
            json!({"jsonrpc":"2.0","id":5,"result":{"id":"t","status":{"state":"NOPE"}}})
                .to_string(),
        ] {
            assert!(
                matches!(
                    decode_task_response(bad.as_bytes(), 5),
                    Err(A2aError::Malformed(_))
                ),
                "{bad}"
            );
        }
        for bad in [json!({}), json!({"task":task,"message":{"messageId":"m"}})] {
            let body = json!({"jsonrpc":"2.0","id":1,"result":bad}).to_string();
            assert!(decode_stream_event(&body, 1).is_err());
        }
    }

    #[test]
    fn stream_updates_fold_into_the_task() {
        let first = json!({"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","contextId":"c","status":{"state":"TASK_STATE_SUBMITTED"}}}});
        let StreamResponse::Task(mut task) = decode_stream_event(&first.to_string(), 1).unwrap()
        else {
            panic!()
        };
        let events = [
            json!({"artifactUpdate":{"taskId":"t","contextId":"c","artifact":{"artifactId":"a","parts":[{"text":"1"}]}}}),
            json!({"artifactUpdate":{"taskId":"t","contextId":"c","append":true,"lastChunk":true,"artifact":{"artifactId":"a","parts":[{"text":"2"}]}}}),
            json!({"artifactUpdate":{"taskId":"other","artifact":{"artifactId":"z","parts":[]}}}),
            json!({"statusUpdate":{"taskId":"t","contextId":"c","status":{"state":"TASK_STATE_COMPLETED"}}}),
        ];
        let mut applied = 0;
        for e in events {
            let doc = json!({"jsonrpc":"2.0","id":1,"result":e}).to_string();
            applied += usize::from(apply_update(
                &mut task,
                &decode_stream_event(&doc, 1).unwrap(),
            ));
        }
        assert_eq!(applied, 3);
        assert_eq!(task.status.state, TaskState::Completed);
        assert_eq!(task.artifacts.len(), 1);
        assert_eq!(
            task.artifacts[0].parts,
            vec![Part::text("1"), Part::text("2")]
        );
    }

    fn card(v: Value) -> PeerCard {
        parse_card(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn interface_selection() {
        let c = card(
            json!({"name":"p","capabilities":{"streaming":true},"supportedInterfaces":[
            {"url":"http://10.0.0.1:1/","protocolBinding":"JSONRPC","protocolVersion":"1.0"},
            {"url":"http://127.0.0.1:8420/","protocolBinding":"JSONRPC","protocolVersion":"1.0","tenant":"acme"},
            {"url":"http://127.0.0.1:8420/","protocolBinding":"GRPC","protocolVersion":"1.0"},
            {"url":"unix:///run/a.sock","protocolBinding":UNIX_BINDING_URI,"protocolVersion":"1.0"}]}),
        );
        let s = select_interface(&c, "http://127.0.0.1:8420").unwrap();
        assert_eq!(s.tenant.as_deref(), Some("acme"));
        assert!(s.streaming);
        let s = select_interface(&c, "http://localhost:9/").unwrap();
        assert_eq!((s.url.as_str(), s.tenant), ("http://10.0.0.1:1/", None));
        let s = select_interface(&c, "unix:///elsewhere.sock").unwrap();
        assert_eq!(s.url, "unix:///run/a.sock");

        // A unix listener's card is never JSONRPC, so a TCP dial cannot use it, and back.
        let unix_only = card(
            json!({"supportedInterfaces":[{"url":"unix:///a","protocolBinding":UNIX_BINDING_URI,"protocolVersion":"1.0"}]}),
        );
        assert!(matches!(
            select_interface(&unix_only, "http://127.0.0.1:1"),
            Err(CardError::NoInterface { .. })
        ));
        let tcp_only = card(
            json!({"supportedInterfaces":[{"url":"http://x/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}]}),
        );
        assert!(select_interface(&tcp_only, "unix:///a").is_err());

        // 0.3 peers: a top-level url/protocolVersion, or 0.3 interfaces only.
        let v03 = card(json!({"url":"http://x/","protocolVersion":"0.3.0","capabilities":{}}));
        assert_eq!(
            select_interface(&v03, "http://x/"),
            Err(CardError::NoInterface { offered: vec![] })
        );
        let v03b = card(
            json!({"supportedInterfaces":[{"url":"http://x/","protocolBinding":"JSONRPC","protocolVersion":"0.3"}]}),
        );
        assert!(select_interface(&v03b, "http://x/")
            .unwrap_err()
            .to_string()
            .contains("JSONRPC 0.3"));

        // Required extensions: known ones are fine, unknown ones refuse the peer.
        let known = card(
            json!({"capabilities":{"extensions":[{"uri":COMMAND_URI,"required":true},{"uri":"https://x/opt"}]},
            "supportedInterfaces":[{"url":"http://x/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}]}),
        );
        assert!(!select_interface(&known, "http://x/").unwrap().streaming);
        let unknown = card(
            json!({"capabilities":{"extensions":[{"uri":"https://x/must","required":true}]},
            "supportedInterfaces":[{"url":"http://x/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}]}),
        );
        assert_eq!(
            select_interface(&unknown, "http://x/"),
            Err(CardError::RequiresUnknownExtension("https://x/must".into()))
        );
        assert!(matches!(
            parse_card(b"{\"supportedInterfaces\":5}"),
            Err(CardError::Malformed(_))
        ));
        assert!(parse_card(b"not json").is_err());
    }

    #[test]
    fn card_cache_lifetimes() {
        assert_eq!(card_ttl_secs(&head(""), false), 60);
        assert_eq!(
            card_ttl_secs(&head("Cache-Control: public, max-age=60\r\n"), false),
            60
        );
        assert_eq!(
            card_ttl_secs(&head("Cache-Control: max-age=100000\r\n"), false),
            300
        );
        assert_eq!(
            card_ttl_secs(&head("Cache-Control: max-age=\"30\"\r\n"), false),
            30
        );
        assert_eq!(
            card_ttl_secs(
                &head("Cache-Control: max-age=99999999999999999999999\r\n"),
                false
            ),
            300
        );
        assert_eq!(
            card_ttl_secs(&head("Cache-Control: max-age=oops\r\n"), false),
            60
        );
        assert_eq!(
            card_ttl_secs(&head("Cache-Control: no-store\r\n"), false),
            0
        );
        assert_eq!(
            card_ttl_secs(&head("Cache-Control: max-age=60\r\n"), true),
            5
        );
        assert_eq!(
            card_ttl_secs(&head("Cache-Control: max-age=2\r\n"), true),
            2
        );
    }
}
