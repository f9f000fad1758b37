//! The JSON-RPC methods: from a request body to a reply, against the instance's state.
//! HTTP concerns (statuses, framing, streams on the wire) stay in [`crate::conn`].

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::a2a::types::{
    GetTaskRequest, ListTasksRequest, Message, PartContent, Role, SendMessageRequest,
    StreamResponse, TaskIdRequest, TaskState,
};
use crate::a2a::{version_supported, CoreMethod, PROTOCOL_VERSION};
use crate::audit;
use crate::auth::Principal;
use crate::errors::{ErrorKind, RpcError};
use crate::ext::command::table::ReplyKind;
use crate::ext::command::{self, Checked};
use crate::ext::negotiate::{self, ExtSet};
use crate::ext::registry::{declared, Ext, Route, EVENTS_URI};
use crate::http::RequestHead;
use crate::instance::{CallId, CallMode, Effect, Instance, PendingCall, SubId};
use crate::jsonrpc::{self, RequestId};
use std::sync::Arc;

use crate::a2a::piecewise::TaskJson;
use crate::tasks::replay::Resume;
use crate::tasks::{decode_page_token, encode_page_token, StoreError, TaskRecord};
use crate::time::{parse_rfc3339, Now};
use crate::view::{ObjectKind, STATUS_LIST_MAX};

pub use crate::ext::registry::EVENTS_METHOD;

/// The media types every part agentd accepts is in.
const ACCEPTED_PART_TYPES: &str = "text/plain, application/json";

/// ListTasks page size when the client names none, and the largest it may name.
const DEFAULT_PAGE_SIZE: i32 = 50;
const MAX_PAGE_SIZE: i32 = 100;
/// Serialized bytes of the tasks one ListTasks page carries, at most: the connection's output
/// bound (`limits.max_output_bytes`), so that a slow reader of a page holds no more than any
/// other slow reader, and never above this. A page holds one task at least, whatever its
/// size: a task is bounded by the task limits.
pub const LIST_PAGE_BYTES: usize = 4 << 20;

/// What a request is answered with.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A finished result, already serialized.
    Result(Vec<u8>),
    /// A ListTasks page: its tasks' views taken under the instance, serialized (and the
    /// page cut at its byte bound) by the connection outside it.
    Page(Box<ListPage>),
    /// A result holding one task (a snapshot sharing the store's content), written by the
    /// connection whole or, when large, as the peer reads it.
    Task(Box<TaskJson>),
    /// A JSON-RPC error, already mapped to the A2A code.
    Error(RpcError),
    /// A blocking send: answer with the task once `sub` settles.
    Wait {
        sub: SubId,
        task_id: String,
        history_length: Option<usize>,
    },
    /// A stream: `frames` now, then the events of `sub` (none: `frames` are the whole
    /// stream).
    Stream {
        sub: Option<SubId>,
        /// The task whose stream this is: each frame's SSE id names its event in the task's
        /// sequence. None for a command's message reply, whose one frame has no id.
        task_id: Option<String>,
        /// Each frame with its event's number in the task's sequence (a `{task}` snapshot:
        /// the newest event it reflects).
        frames: Vec<(u64, Arc<StreamResponse>)>,
    },
    /// The events feed from a cursor: `hello`, the replay, live events, `goodbye`.
    Feed { from_seq: u64 },
    /// A command handed to the host: answer once it answers.
    Call {
        call: CallId,
        streaming: bool,
        history_length: Option<usize>,
    },
}

/// What a request resolved to: its id, the extensions it activated (echoed only on success)
/// and the reply.
pub(crate) struct Answer {
    pub(crate) id: RequestId,
    /// The method the request named, when it is one served here (for `/metrics`).
    pub(crate) route: Option<Route>,
    pub(crate) activated: ExtSet,
    pub(crate) reply: Reply,
}

/// Who asks, over which listener, with which headers.
pub(crate) struct CallContext<'a> {
    pub(crate) principal: &'a Principal,
    /// How the principal was established.
    pub(crate) via: crate::auth::Via,
    pub(crate) listener: usize,
    pub(crate) head: &'a RequestHead,
    pub(crate) now: Now,
    /// The device or launch session the caller's token belongs to (audit events carry it).
    pub(crate) sid: Option<&'a str>,
    /// The request's trace, as the work it hands out carries it ([`crate::trace`]).
    pub(crate) trace: Option<&'a crate::trace::TraceContext>,
}

/// Answers one JSON-RPC request body.
pub(crate) fn call(inst: &mut Instance, ctx: &CallContext<'_>, body: &[u8]) -> Answer {
    let req = match jsonrpc::parse_request(body) {
        Ok(r) => r,
        Err(refusal) => {
            return Answer {
                id: refusal.id,
                route: None,
                activated: ExtSet::EMPTY,
                reply: Reply::Error(refusal.error),
            }
        }
    };
    let id = req.id.clone();
    let mut activated = ExtSet::EMPTY;
    let reply = match dispatch(inst, ctx, &req.method, req.params, &mut activated) {
        Ok(r) => r,
        Err(e) => Reply::Error(e),
    };
    let outcome = match &reply {
        Reply::Call { .. } => audit::Outcome::HandedToHost,
        Reply::Error(e) => audit::Outcome::Refused(e.code()),
        _ => audit::Outcome::Answered,
    };
    let caller = audit::Caller {
        principal: ctx.principal,
        sid: ctx.sid,
        now: ctx.now,
    };
    audit::record(inst, &caller, &req.method, req.params, outcome);
    Answer {
        id,
        route: Route::from_name(&req.method),
        activated,
        reply,
    }
}

fn dispatch(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    method: &str,
    params: Option<&RawValue>,
    activated: &mut ExtSet,
) -> Result<Reply, RpcError> {
    if !ctx
        .head
        .header("a2a-version")
        .is_some_and(version_supported)
    {
        return Err(RpcError::new(
            ErrorKind::VersionNotSupported,
            format!("A2A-Version must name {PROTOCOL_VERSION}; this interface serves only {PROTOCOL_VERSION}"),
        )
        .with_meta("supportedVersions", PROTOCOL_VERSION));
    }
    rate_check(inst, ctx)?;
    let Some(route) = Route::from_name(method) else {
        return Err(RpcError::new(
            ErrorKind::MethodNotFound,
            format!("method not found: {method}"),
        ));
    };
    let events_enabled = inst.config.events_enabled;
    *activated = negotiate::activate(
        negotiate::requested(ctx.head.header_all("a2a-extensions")),
        route,
        events_enabled,
    );
    let m = match route {
        Route::Core(m) => m,
        // A method is part of its extension: answered only where declared and activated.
        Route::Events if !declared(Ext::Events, events_enabled) => {
            return Err(RpcError::new(
                ErrorKind::ExtensionNotDeclared,
                format!("{EVENTS_URI} is not offered by this instance"),
            )
            .with_meta("extension", EVENTS_URI)
            .with_meta("method", method))
        }
        Route::Events if !activated.contains(Ext::Events) => {
            return Err(RpcError::new(
                ErrorKind::MethodExtensionNotActivated,
                format!(
                    "method not available: activate {EVENTS_URI} with the A2A-Extensions header"
                ),
            )
            .with_meta("extension", EVENTS_URI)
            .with_meta("method", method))
        }
        Route::Events => {
            return Ok(Reply::Feed {
                from_seq: feed_params(params)?,
            })
        }
    };
    let annotate = activated.contains(Ext::TaskAnnotations);
    match m {
        CoreMethod::SendMessage | CoreMethod::SendStreamingMessage => {
            // Read as values, a repeated member of a command would silently keep its last.
            command::refuse_duplicate_members(params.map_or("{}", RawValue::get))?;
            let streaming = m == CoreMethod::SendStreamingMessage;
            send(inst, ctx, parse(params)?, streaming, *activated)
        }
        CoreMethod::GetTask => get_task(inst, ctx, parse(params)?, annotate),
        CoreMethod::ListTasks => list_tasks(inst, ctx, parse(params)?, annotate),
        CoreMethod::CancelTask => cancel_task(inst, ctx, parse(params)?, annotate),
        CoreMethod::SubscribeToTask => subscribe(inst, ctx, parse(params)?, annotate),
        CoreMethod::CreateTaskPushNotificationConfig
        | CoreMethod::GetTaskPushNotificationConfig
        | CoreMethod::ListTaskPushNotificationConfigs
        | CoreMethod::DeleteTaskPushNotificationConfig
            if !inst.config.push.enabled =>
        {
            Err(RpcError::new(
                ErrorKind::PushNotificationNotSupported,
                "push notifications are not supported by this instance (capabilities.pushNotifications is false)",
            ))
        }
        CoreMethod::CreateTaskPushNotificationConfig => push_create(inst, ctx, parse(params)?),
        CoreMethod::GetTaskPushNotificationConfig => push_get(inst, ctx, parse(params)?),
        CoreMethod::ListTaskPushNotificationConfigs => push_list(inst, ctx, parse(params)?),
        CoreMethod::DeleteTaskPushNotificationConfig => push_delete(inst, ctx, parse(params)?),
        CoreMethod::GetExtendedAgentCard => extended_card(inst, ctx),
    }
}

/// The feed method's params: closed `{fromSeq?: u64}`; absent params or cursor mean "from
/// the start".
fn feed_params(params: Option<&RawValue>) -> Result<u64, RpcError> {
    let refuse = |field: String, detail: &str| {
        let mut e = RpcError::invalid_field(field, detail);
        e.message = format!(
            "invalid params for {EVENTS_METHOD} (it takes only fromSeq): {}",
            e.message
        );
        e
    };
    let Some(raw) = params else { return Ok(0) };
    let value: serde_json::Value =
        serde_json::from_str(raw.get()).map_err(|e| refuse("params".into(), &e.to_string()))?;
    let obj = match value {
        serde_json::Value::Null => return Ok(0),
        serde_json::Value::Object(obj) => obj,
        _ => return Err(refuse("params".into(), "must be an object")),
    };
    if let Some(other) = obj.keys().find(|k| *k != "fromSeq") {
        return Err(refuse(
            format!("params.{other}"),
            "is not a parameter of this method",
        ));
    }
    match obj.get("fromSeq") {
        None | Some(serde_json::Value::Null) => Ok(0),
        // as_u64 refuses negatives, fractions (2.0 included) and anything past u64.
        Some(v) => v.as_u64().ok_or_else(|| {
            refuse(
                "params.fromSeq".into(),
                "must be an integer from 0 to 2^64-1",
            )
        }),
    }
}

/// Reads `params` (absent reads as `{}`) into a request type, naming the offending field.
fn parse<T: DeserializeOwned>(params: Option<&RawValue>) -> Result<T, RpcError> {
    let text = params.map_or("{}", RawValue::get);
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "params".to_owned()
        } else {
            path
        };
        let inner = e.into_inner().to_string();
        // serde_json appends " at line L column C"; the field path says where.
        let description = inner.split(" at line ").next().unwrap_or(&inner).to_owned();
        RpcError::invalid_field(field, description)
    })
}

/// A result that is the task `t` (`wrapped`: as a send's result, `{"task":…}`), as
/// `history` and `annotate` show it.
fn task_reply(t: &TaskRecord, history: Option<usize>, annotate: bool, wrapped: bool) -> Reply {
    let (prefix, suffix) = if wrapped {
        (b"{\"task\":".to_vec(), b"}".to_vec())
    } else {
        (Vec::new(), Vec::new())
    };
    let task = t.view(history, true, annotate);
    Reply::Task(Box::new(TaskJson::new(
        task,
        prefix,
        suffix,
        t.answer_weight(),
    )))
}

fn serialize<T: Serialize>(value: &T) -> Reply {
    match serde_json::to_vec(value) {
        Ok(bytes) => Reply::Result(bytes),
        Err(e) => Reply::Error(unserializable(e)),
    }
}

/// A result that would not serialize: a bug, answered as an internal error.
fn unserializable(e: serde_json::Error) -> RpcError {
    RpcError::new(ErrorKind::Internal, format!("internal error: {e}"))
}

/// A new task refused for room: the bound reached, typed (`LIMIT_REACHED`, naming it), so a
/// caller knows to retry once tasks finish.
fn no_room(inst: &Instance, e: StoreError) -> RpcError {
    let limits = inst.config.tasks;
    let (key, max, what) = match e {
        StoreError::OverBudget => (
            "limits.tasks_bytes",
            limits.total_bytes,
            "the tasks held already take every byte",
        ),
        _ => (
            "limits.max_tasks",
            limits.max_tasks,
            "the task store is full",
        ),
    };
    RpcError::new(
        ErrorKind::LimitReached,
        format!("{what} ({key} = {max}) and none of them is finished; try again later"),
    )
    .with_meta("limit", key)
    .with_meta("max", max.to_string())
}

fn history_length(value: Option<i32>, field: &str) -> Result<Option<usize>, RpcError> {
    match value {
        None => Ok(None),
        Some(n) if n < 0 => Err(RpcError::invalid_field(field, "must not be negative")),
        Some(n) => Ok(Some(n as usize)),
    }
}

fn require_id(id: &str) -> Result<(), RpcError> {
    if id.is_empty() {
        return Err(RpcError::invalid_field("id", "is required"));
    }
    Ok(())
}

fn send(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: SendMessageRequest,
    streaming: bool,
    activated: ExtSet,
) -> Result<Reply, RpcError> {
    let annotate = activated.contains(Ext::TaskAnnotations);
    let mut message: Message = req
        .message
        .ok_or_else(|| RpcError::invalid_field("message", "is required"))?;
    if message.message_id.is_empty() {
        return Err(RpcError::invalid_field("message.messageId", "is required"));
    }
    if message.role != Role::User {
        return Err(RpcError::invalid_field("message.role", "must be ROLE_USER"));
    }
    if message.parts.is_empty() {
        return Err(RpcError::invalid_field(
            "message.parts",
            "must hold at least one part",
        ));
    }
    let max_parts = inst.config.tasks.max_message_parts;
    if message.parts.len() > max_parts {
        return Err(RpcError::invalid_field(
            "message.parts",
            format!(
                "holds {} parts; at most {max_parts} are accepted (limits.max_message_parts)",
                message.parts.len()
            ),
        ));
    }
    for (i, part) in message.parts.iter().enumerate() {
        if matches!(part.content, PartContent::Raw(_) | PartContent::Url(_)) {
            let kind = if matches!(part.content, PartContent::Raw(_)) {
                "raw"
            } else {
                "url"
            };
            let media = if part.media_type.is_empty() {
                "unnamed"
            } else {
                &part.media_type
            };
            return Err(RpcError::new(
                ErrorKind::ContentTypeNotSupported,
                format!("message.parts[{i}] is a {kind} part ({media}); this agent accepts {ACCEPTED_PART_TYPES}"),
            )
            .with_meta("mediaType", media)
            .with_meta("acceptedMediaTypes", ACCEPTED_PART_TYPES));
        }
    }
    let config = req.configuration.unwrap_or_default();
    let history = history_length(config.history_length, "configuration.historyLength")?;
    // An inline webhook is checked before anything exists, and bound to the new task.
    let inline_push = match config.task_push_notification_config.clone() {
        None => None,
        Some(_) if !inst.config.push.enabled => {
            return Err(RpcError::new(
                ErrorKind::PushNotificationNotSupported,
                "configuration.taskPushNotificationConfig: push notifications are not supported by this instance",
            ))
        }
        Some(raw) => {
            let wire: crate::push::WireConfig = serde_json::from_value(raw).map_err(|e| {
                RpcError::invalid_field("configuration.taskPushNotificationConfig", e.to_string())
            })?;
            let policy = inst.config.push;
            let c = crate::push::check_config(wire, "", policy, || inst.new_id()).map_err(
                |(field, why)| {
                    RpcError::invalid_field(
                        format!("configuration.taskPushNotificationConfig.{field}"),
                        why,
                    )
                },
            )?;
            Some(c)
        }
    };
    let mode = if streaming {
        CallMode::Stream
    } else if config.return_immediately == Some(true) {
        CallMode::Immediate
    } else {
        CallMode::Wait
    };
    let switches = inst.switches(ctx.listener);
    let checked = command::check(
        &message,
        &config,
        activated,
        ctx.principal,
        &inst.commands,
        switches,
    )?;
    // A message that makes or moves a task is idempotent per (caller, messageId); a read
    // (a command answered with a message) changes nothing, so it is not remembered.
    let digest = if checked.as_ref().is_none_or(|c| c.reply == ReplyKind::Task) {
        let digest = crate::tasks::message_digest(&message);
        if let Some(reply) = retried(inst, ctx, &message, &digest, mode, history, annotate)? {
            return Ok(reply);
        }
        Some(digest)
    } else {
        None
    };
    if let Some(checked) = checked {
        return run_command(inst, ctx, checked, message, mode, history, annotate, digest);
    }
    let digest = digest.unwrap_or_default();

    writable(inst)?;
    let task_id = if message.task_id.is_empty() {
        if inst.draining {
            return Err(draining(inst));
        }
        let task_id = inst.new_id();
        let context = inst.resolve_context(ctx.principal, &message.context_id);
        match inst.tasks.create(
            task_id.clone(),
            context.clone(),
            ctx.principal.clone(),
            message.clone(),
            ctx.now.epoch_ms,
        ) {
            Ok(_) => {}
            Err(e) => return Err(no_room(inst, e)),
        }
        inst.tasks
            .accept_message(&task_id, &ctx.principal.id, &message.message_id, digest);
        message.task_id = task_id.clone();
        message.context_id = context.key.clone();
        inst.task_changed(&task_id, ctx.now);
        if let Some(t) = ctx.trace {
            inst.remember_trace(&task_id, t);
        }
        inst.push_effect(Effect::Turn {
            task_id: task_id.clone(),
            context_id: context.key,
            context_name: context.name,
            message: Box::new(message),
            owner: ctx.principal.clone(),
            trace: ctx.trace.cloned(),
        });
        task_id
    } else {
        let task_id = message.task_id.clone();
        let t = inst
            .tasks
            .visible(&task_id, ctx.principal)
            .ok_or_else(|| RpcError::task_not_found(&task_id))?;
        if t.state.is_terminal() {
            return Err(RpcError::new(
                ErrorKind::UnsupportedOperation,
                format!(
                    "task {task_id} is {}; it accepts no further messages",
                    t.state.as_str()
                ),
            )
            .with_meta("taskId", &task_id));
        }
        // A task belongs to what tracks it (a turn, a run, a subagent) until it asks for
        // input. A message meanwhile would start a second turn beside the first, or take the
        // task from its run (a retried gate answer did): it is refused, and the task goes on
        // untouched.
        if !matches!(t.state, TaskState::InputRequired | TaskState::AuthRequired) {
            return Err(RpcError::new(
                ErrorKind::UnsupportedOperation,
                format!(
                    "task {task_id} is {} and takes a message only when it asks for input \
                     (TASK_STATE_INPUT_REQUIRED); send again then, or start a new task",
                    t.state.as_str()
                ),
            )
            .with_meta("taskId", &task_id)
            .with_meta("state", t.state.as_str()));
        }
        // In the caller's namespace: the owner names the context by its own name, an
        // operator by the internal key (its own tasks' keys are their names).
        let named = if ctx.principal.is_operator() {
            &t.context_key
        } else {
            &t.context_id
        };
        if !message.context_id.is_empty() && *message.context_id != **named {
            return Err(RpcError::invalid_field(
                "message.contextId",
                format!("task {task_id} belongs to another context"),
            ));
        }
        if t.state == TaskState::InputRequired {
            if t.gate().is_some_and(|g| g.operator_only) && !ctx.principal.is_operator() {
                return Err(RpcError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "task {task_id} waits for an operator's approval; its owner cannot give it"
                    ),
                )
                .with_meta("taskId", &task_id));
            }
            if let Some(schema) = t.gate().and_then(|g| g.schema.as_ref()) {
                check_gate_answer(schema, &message)?;
            }
        }
        let context = crate::tasks::ContextIds {
            name: t.context_id.to_string(),
            key: t.context_key.to_string(),
        };
        let owner = Principal::clone(&t.owner);
        inst.tasks
            .append_message(&task_id, message.clone())
            .map_err(|e| match e {
                StoreError::OverBudget => no_room(inst, e),
                _ => RpcError::task_not_found(&task_id),
            })?;
        inst.tasks
            .accept_message(&task_id, &ctx.principal.id, &message.message_id, digest);
        // The gate is answered: its question no longer stands.
        if let Some(t) = inst.tasks.get_mut(&task_id) {
            t.set_gate(None);
        }
        inst.set_status(&task_id, TaskState::Working, None, ctx.now)
            .map_err(|_| RpcError::task_not_found(&task_id))?;
        message.task_id = task_id.clone();
        message.context_id = context.key.clone();
        if let Some(t) = ctx.trace {
            inst.remember_trace(&task_id, t);
        }
        inst.push_effect(Effect::Turn {
            task_id: task_id.clone(),
            context_id: context.key,
            context_name: context.name,
            message: Box::new(message),
            owner,
            trace: ctx.trace.cloned(),
        });
        task_id
    };

    if let Some(mut c) = inline_push {
        c.task_id = task_id.clone();
        inst.push_configs
            .put(c)
            .map_err(|e| RpcError::invalid_field("configuration.taskPushNotificationConfig", e))?;
    }
    let snapshot = |inst: &Instance| {
        inst.tasks
            .get(&task_id)
            .map(|t| t.view(history, true, annotate))
            .ok_or_else(|| RpcError::task_not_found(&task_id))
    };
    if streaming {
        let first = StreamResponse::Task(snapshot(inst)?);
        let seq = inst.replay.last(&task_id);
        let sub = inst.subscribe(&task_id, false);
        return Ok(Reply::Stream {
            sub: Some(sub),
            task_id: Some(task_id),
            frames: vec![(seq, Arc::new(first))],
        });
    }
    if config.return_immediately == Some(true) {
        let t = inst
            .tasks
            .get(&task_id)
            .ok_or_else(|| RpcError::task_not_found(&task_id))?;
        return Ok(task_reply(t, history, annotate, true));
    }
    let sub = inst.subscribe(&task_id, true);
    Ok(Reply::Wait {
        sub,
        task_id,
        history_length: history,
    })
}

/// A retry of a message `ctx.principal` already sent (same messageId): nothing runs again.
/// The same content gets the task it created or continued, answered as a first send of
/// this mode would be; other content under that id is refused and changes nothing. None:
/// the id is unused (or its task is gone), so the message is new.
#[allow(clippy::too_many_arguments)]
fn retried(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    message: &Message,
    digest: &crate::tasks::MessageDigest,
    mode: CallMode,
    history: Option<usize>,
    annotate: bool,
) -> Result<Option<Reply>, RpcError> {
    if let Some(first) = inst.pending_task_op(&ctx.principal.id, &message.message_id) {
        // The first send's task op is with the host, its task not started: a retry now
        // must not run it again, and cannot be answered with a task yet.
        if first != *digest {
            return Err(RpcError::invalid_field(
                "message.messageId",
                format!(
                    "{:?} was already used for a different message; a new message needs a new messageId",
                    message.message_id
                ),
            ));
        }
        return Err(RpcError::new(
            ErrorKind::InProgress,
            "the first send of this message is still starting its task; retry in a moment \
             to get that task",
        ));
    }
    let Some((t, first)) = inst
        .tasks
        .accepted_by(&ctx.principal.id, &message.message_id)
    else {
        return Ok(None);
    };
    if !ctx.principal.may_see(&t.owner) {
        return Ok(None);
    }
    let task_id = t.id.to_string();
    if first != *digest {
        return Err(RpcError::invalid_field(
            "message.messageId",
            format!(
                "{:?} was already used for a different message (task {task_id}); a new message needs a new messageId",
                message.message_id
            ),
        )
        .with_meta("taskId", &task_id));
    }
    let state = t.state;
    let snapshot = t.view(history, true, annotate);
    let settled = task_reply(t, history, annotate, true);
    // Counted as a change (the record is written again, the same): the answer then waits,
    // as the first one did, until the task is durable, so a retry that overtook the first
    // send's write never acknowledges a task a crash could still lose.
    inst.tasks.mark_changed(&task_id);
    Ok(Some(match mode {
        CallMode::Immediate => settled,
        // A blocking send answers once the task settles: at once if it already has.
        CallMode::Wait if state.ends_a_turn() => settled,
        CallMode::Wait => Reply::Wait {
            sub: inst.subscribe(&task_id, true),
            task_id,
            history_length: history,
        },
        // As SubscribeToTask streams it; a finished task is its one final snapshot.
        CallMode::Stream => Reply::Stream {
            sub: (!state.is_terminal()).then(|| inst.subscribe(&task_id, false)),
            frames: vec![(
                inst.replay.last(&task_id),
                Arc::new(StreamResponse::Task(snapshot)),
            )],
            task_id: Some(task_id),
        },
    }))
}

fn get_task(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: GetTaskRequest,
    annotate: bool,
) -> Result<Reply, RpcError> {
    require_id(&req.id)?;
    let history = history_length(req.history_length, "historyLength")?;
    let t = inst
        .tasks
        .visible(&req.id, ctx.principal)
        .ok_or_else(|| RpcError::task_not_found(&req.id))?;
    Ok(task_reply(t, history, annotate, false))
}

fn list_tasks(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: ListTasksRequest,
    annotate: bool,
) -> Result<Reply, RpcError> {
    let page_size = req.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    if !(1..=MAX_PAGE_SIZE).contains(&page_size) {
        return Err(RpcError::invalid_field(
            "pageSize",
            format!("must be between 1 and {MAX_PAGE_SIZE}"),
        ));
    }
    let history = history_length(req.history_length, "historyLength")?.unwrap_or(0);
    let after = if req.page_token.is_empty() {
        None
    } else {
        Some(decode_page_token(&req.page_token).ok_or_else(|| {
            RpcError::invalid_field("pageToken", "is not a token this server issued")
        })?)
    };
    let since = match &req.status_timestamp_after {
        None => None,
        Some(s) => Some(parse_rfc3339(s).ok_or_else(|| {
            RpcError::invalid_field("statusTimestampAfter", "is not an RFC 3339 timestamp")
        })?),
    };
    let status = req.status.filter(|s| *s != TaskState::Unspecified);
    let include_artifacts = req.include_artifacts == Some(true);
    let filter = crate::tasks::ListFilter {
        principal: ctx.principal,
        context_id: &req.context_id,
        state: status,
        since_ms: since,
    };
    // The store's indexes: the narrowest bucket for the caller and the filters, from the
    // page token's position on, and the count from its counters where they answer exactly.
    let total = inst.tasks.count(&filter);
    let page_bytes = inst.config.conn.max_output_bytes.min(LIST_PAGE_BYTES);
    let mut page = inst.tasks.list(&filter, after).peekable();
    // A page is bounded in bytes as well as in tasks: a small request must not build an
    // answer of any size. Past the page's bytes the page ends early (at least one task, so
    // the listing always moves on) and `nextPageToken` says where to go on.
    let mut views = Vec::new();
    let mut guessed = 0usize;
    while views.len() < page_size as usize {
        let Some(t) = page.peek() else { break };
        // Views share the store's content, save packed history messages made whole again
        // (a packed status message stays text until the page is written): their size is
        // bounded by a guess from the kept sizes, at twice the page's bytes, and the page
        // is cut exactly as it is serialized.
        let guess = t.view_weight(history, include_artifacts);
        if !views.is_empty() && guessed + guess > 2 * page_bytes {
            break;
        }
        let mut whole = None;
        if views.is_empty() && t.answer_weight() > page_bytes {
            whole = Some(t.view(Some(history), include_artifacts, annotate));
        }
        if let Some(shown) = whole.take_if(|w| crate::tasks::serialized_len(&*w) > page_bytes) {
            // One task larger than a page is the page alone, written as the peer reads it
            // (so the answer is never built whole).
            let weight = t.answer_weight();
            let Some(t) = page.next() else { break };
            let more = page.peek().is_some();
            let mut prefix = b"{\"nextPageToken\":".to_vec();
            let token = if more {
                encode_page_token(t)
            } else {
                String::new()
            };
            let _ = serde_json::to_writer(&mut prefix, &token);
            let shown_size = if more { 1 } else { page_size };
            prefix.extend_from_slice(format!(",\"pageSize\":{shown_size},\"tasks\":[").as_bytes());
            let total = i32::try_from(total).unwrap_or(i32::MAX);
            let suffix = format!("],\"totalSize\":{total}}}").into_bytes();
            return Ok(Reply::Task(Box::new(TaskJson::new(
                shown, prefix, suffix, weight,
            ))));
        }
        guessed += guess;
        let shown = match whole {
            Some(task) => task.into(),
            None => t.listed_view(Some(history), include_artifacts, annotate),
        };
        views.push((shown, t.position()));
        page.next();
    }
    Ok(Reply::Page(Box::new(ListPage {
        views,
        more: page.peek().is_some(),
        page_size,
        total_size: i32::try_from(total).unwrap_or(i32::MAX),
        page_bytes,
        guessed,
    })))
}

/// A ListTasks page as decided under the instance: the views of the tasks it may hold (in
/// listing order, with their listing positions), whether any task follows them, and the
/// bound on its bytes.
#[derive(Debug)]
pub(crate) struct ListPage {
    views: Vec<(crate::tasks::Listed, (u64, u64))>,
    more: bool,
    page_size: i32,
    total_size: i32,
    page_bytes: usize,
    /// The views' bytes as guessed from their kept sizes: what the page's buffer starts at.
    guessed: usize,
}

impl ListPage {
    /// The `ListTasksResponse`: each task serialized once, into the page as it is, while
    /// the page's bytes allow (at least one task, so the listing always moves on); past
    /// them the page ends early and `nextPageToken` says where to go on. The tasks are
    /// written into one buffer sized from the guess made under the instance, and the page
    /// around them, as serde_json writes a `ListTasksResponse`, once they are.
    pub(crate) fn render(self) -> Result<Vec<u8>, RpcError> {
        let held = self.views.len();
        let mut tasks = Vec::with_capacity(self.guessed.min(self.page_bytes) + 256);
        let mut shown = 0usize;
        let mut bytes = 0usize;
        let mut last = None;
        for (task, position) in self.views {
            let start = tasks.len();
            if shown > 0 {
                tasks.push(b',');
            }
            let at = tasks.len();
            task.write_json(&mut tasks).map_err(unserializable)?;
            let size = tasks.len() - at;
            if shown > 0 && bytes + size > self.page_bytes {
                tasks.truncate(start);
                break;
            }
            bytes += size;
            last = Some(position);
            shown += 1;
        }
        let more = self.more || shown < held;
        let shrunk = shown < self.page_size as usize && more;
        let token = match (last, more) {
            (Some(last), true) => crate::tasks::encode_position(last),
            _ => String::new(),
        };
        // The page size used: fewer than asked when the byte bound ended the page.
        let page_size = if shrunk {
            i32::try_from(shown).unwrap_or(self.page_size)
        } else {
            self.page_size
        };
        let mut page = Vec::with_capacity(tasks.len() + token.len() + 80);
        page.extend_from_slice(b"{\"nextPageToken\":");
        serde_json::to_writer(&mut page, &token).map_err(unserializable)?;
        page.extend_from_slice(format!(",\"pageSize\":{page_size},\"tasks\":[").as_bytes());
        page.extend_from_slice(&tasks);
        page.extend_from_slice(format!("],\"totalSize\":{}}}", self.total_size).as_bytes());
        Ok(page)
    }
}

fn cancel_task(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: TaskIdRequest,
    annotate: bool,
) -> Result<Reply, RpcError> {
    require_id(&req.id)?;
    let t = inst
        .tasks
        .visible(&req.id, ctx.principal)
        .ok_or_else(|| RpcError::task_not_found(&req.id))?;
    writable(inst)?;
    if t.state.is_terminal() {
        return Err(RpcError::new(
            ErrorKind::TaskNotCancelable,
            format!("task is already {}", t.state.as_str()),
        )
        .with_meta("taskId", &req.id));
    }
    match inst.set_status(&req.id, TaskState::Canceled, None, ctx.now) {
        Ok(()) => {}
        Err(StoreError::Terminal(s)) => {
            return Err(RpcError::new(
                ErrorKind::TaskNotCancelable,
                format!("task is already {}", s.as_str()),
            ))
        }
        Err(_) => return Err(RpcError::task_not_found(&req.id)),
    }
    inst.push_effect(Effect::Cancel {
        task_id: req.id.clone(),
    });
    let t = inst
        .tasks
        .get(&req.id)
        .ok_or_else(|| RpcError::task_not_found(&req.id))?;
    Ok(task_reply(t, None, annotate, false))
}

fn subscribe(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: TaskIdRequest,
    annotate: bool,
) -> Result<Reply, RpcError> {
    require_id(&req.id)?;
    let t = inst
        .tasks
        .visible(&req.id, ctx.principal)
        .ok_or_else(|| RpcError::task_not_found(&req.id))?;
    let terminal = t.state.is_terminal();
    let snapshot = Arc::new(StreamResponse::Task(t.view(None, true, annotate)));
    // SSE reconnection: the events after the client's last one, then live. An empty header
    // names no event (as an SSE client's empty last event id does).
    let resume = match ctx.head.header("last-event-id") {
        Some(v) if !v.trim_ascii().is_empty() => {
            let v = std::str::from_utf8(v.trim_ascii()).map_err(|_| {
                RpcError::invalid_field("Last-Event-ID", "is not UTF-8")
                    .with_meta("taskId", &req.id)
            })?;
            Some(inst.replay.parse(&req.id, v).map_err(|why| {
                RpcError::invalid_field("Last-Event-ID", why).with_meta("taskId", &req.id)
            })?)
        }
        _ => None,
    };
    let last = inst.replay.last(&req.id);
    let frames = match resume {
        None if terminal => {
            return Err(RpcError::new(
                ErrorKind::UnsupportedOperation,
                format!(
                    "task {} is {}; there is nothing left to subscribe to",
                    req.id,
                    t.state.as_str()
                ),
            )
            .with_meta("taskId", &req.id));
        }
        None => vec![(last, snapshot)],
        Some(Resume::After(n)) => match inst.replay.after(&req.id, n) {
            // A finished task the client has read to the end: its final snapshot (with the
            // id the client already holds), so that the request still gets a response.
            Some(events) if events.is_empty() && terminal => vec![(last, snapshot)],
            Some(events) => events,
            // Some of the events after `n` are no longer kept: the task as it stands now
            // stands in for all of them.
            None => vec![(last, snapshot)],
        },
        // The daemon restarted since: its numbering started again.
        Some(Resume::EarlierRun) => vec![(last, snapshot)],
    };
    let sub = (!terminal).then(|| inst.subscribe(&req.id, false));
    Ok(Reply::Stream {
        sub,
        task_id: Some(req.id),
        frames,
    })
}

/// Runs a command that passed every check: `status` and `config` in the core, everything
/// else handed to the host as an effect. `digest`: the message's, for a task op (its task
/// records the message as accepted once it exists).
#[allow(clippy::too_many_arguments)]
fn run_command(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    checked: Checked,
    mut message: Message,
    mode: CallMode,
    history: Option<usize>,
    annotate: bool,
    digest: Option<crate::tasks::MessageDigest>,
) -> Result<Reply, RpcError> {
    let context = inst.resolve_context(ctx.principal, &message.context_id);
    let context_id = context.name.clone();
    message.context_id = context_id.clone();
    if let Some(result) = sign_in_op(inst, ctx, &checked)? {
        let local = Local {
            mode,
            history,
            annotate,
            digest,
        };
        return complete_locally(inst, ctx, checked, message, local, result);
    }
    let local = match checked.op.as_str() {
        "status" => Some(status_document(inst, ctx)),
        "config" => Some(serde_json::json!({"config": inst.config.config_document})),
        "auth.device.pending" => Some(inst.sessions.pending(ctx.now.epoch_ms)),
        "auth.sessions" => Some(inst.sessions.list(ctx.now.epoch_ms)),
        _ => None,
    };
    if let Some(document) = local {
        let reply = command::reply_message(format!("msg-{}", inst.new_id()), context_id, document);
        let response = StreamResponse::Message(reply);
        return Ok(if mode == CallMode::Stream {
            Reply::Stream {
                sub: None,
                task_id: None,
                frames: vec![(0, Arc::new(response))],
            }
        } else {
            serialize(&response)
        });
    }
    // The host gets the op typed, its arguments as fields.
    let op = match (checked.builtin, &checked.workflow) {
        (Some(spec), _) => {
            crate::host::Op::parse(spec.id, &checked.args, &command::envelope_path(&message))?
        }
        (None, Some(workflow)) => crate::host::Op::Declared {
            op: checked.op.clone(),
            workflow: workflow.clone(),
            args: checked.args.clone(),
        },
        // `check` passes a built-in op or a declared command, nothing else.
        (None, None) => {
            return Err(RpcError::new(
                ErrorKind::OpNotServed,
                format!("command \"{}\" is not served by this instance", checked.op),
            )
            .with_meta("op", &checked.op))
        }
    };
    // Draining refuses new work only: starting a run or a subagent turn. Signals, cancels
    // and operator controls act on the work in flight, which a drain lets finish.
    let new_work = checked.builtin.is_none()
        || matches!(checked.op.as_str(), "workflow.run" | "subagent.send");
    if inst.draining && new_work {
        return Err(draining(inst));
    }
    // A task-reply op makes a task, which must be durable; message-reply ops are reads.
    if checked.reply == ReplyKind::Task {
        writable(inst)?;
    }
    let task_id = (checked.reply == ReplyKind::Task).then(|| inst.new_id());
    let checked_annotate = annotate;
    let call = PendingCall {
        op: checked.op.clone(),
        reply: checked.reply,
        mode,
        principal: ctx.principal.clone(),
        context: context.clone(),
        task_id: task_id.clone(),
        message,
        annotate: checked_annotate,
        history,
        conn: None,
        outcome: None,
        digest,
    };
    let principal = ctx.principal.clone();
    if let (Some(t), Some(task)) = (ctx.trace, &task_id) {
        inst.remember_trace(task, t);
    }
    let call = inst.start_call(call, |call| Effect::Command {
        call,
        op,
        args: checked.args,
        reply: checked.reply,
        principal,
        sid: ctx.sid.map(str::to_owned),
        context_id: context.key,
        context_name: context.name,
        task_id,
        trace: ctx.trace.cloned(),
    });
    Ok(Reply::Call {
        call,
        streaming: mode == CallMode::Stream,
        history_length: history,
    })
}

/// GetExtendedAgentCard: the public card narrowed to this instance and this caller. It
/// exists only where authentication means something: on a listener that declares a scheme,
/// for a caller named through it.
fn extended_card(inst: &Instance, ctx: &CallContext<'_>) -> Result<Reply, RpcError> {
    use crate::ext::command::table::{self as ops, Gate};
    let config = inst.config();
    if !config.declares_scheme(ctx.listener) {
        return Err(RpcError::new(
            ErrorKind::UnsupportedOperation,
            "this listener declares no authentication scheme, so it has no extended agent card",
        ));
    }
    if !ctx.via.declared_scheme() {
        return Err(RpcError::new(
            ErrorKind::Unauthenticated,
            "the extended agent card is served to a caller named by a declared scheme",
        ));
    }
    let p = ctx.principal;
    let switches = inst.switches(ctx.listener);
    let served = |spec: &ops::OpSpec| {
        config.host.serves(spec.id)
            && match spec.gate {
                Gate::Always => true,
                Gate::Introspection => switches.introspection,
                Gate::DeviceGrant => switches.device_grant,
                Gate::TcpListener => switches.tcp_listener,
            }
    };
    let mut card = crate::instance::build_card(config, ctx.listener);
    let may = |spec: &ops::OpSpec| command::may_command(p, spec);
    let visible_ops: Vec<serde_json::Value> = ops::OPS
        .iter()
        .filter(|s| s.listed && served(s) && may(s))
        .map(|s| serde_json::json!({"op": s.op, "reply": s.reply.as_str()}))
        .collect();
    let declared: Vec<&command::DeclaredCommand> = inst
        .commands
        .declared()
        .filter(|d| p.is_operator() || (p.granted(&d.op) && d.roles.contains(&p.role)))
        .collect();
    for ext in card.capabilities.extensions.iter_mut() {
        let Some(params) = ext
            .params
            .as_mut()
            .and_then(serde_json::Value::as_object_mut)
        else {
            continue;
        };
        match Ext::from_uri(&ext.uri) {
            Some(Ext::Command) => {
                params.insert("ops".into(), serde_json::Value::Array(visible_ops.clone()));
                let commands: Vec<serde_json::Value> = declared
                    .iter()
                    .map(|d| serde_json::json!({"op": d.op, "workflow": d.workflow, "schema": d.schema}))
                    .collect();
                if !commands.is_empty() {
                    params.insert("commands".into(), serde_json::Value::Array(commands));
                }
                if ops::find("admin.set").is_some_and(|s| served(s) && may(s)) {
                    params.insert("settable".into(), serde_json::json!(ops::SETTABLE_PATHS));
                }
            }
            Some(Ext::Events) => {
                params.insert("ring".into(), serde_json::json!(config.events_ring));
                let kinds: Vec<&str> = crate::ext::events_schema::kinds_for(
                    p.is_operator(),
                    config.introspection_enabled,
                )
                .collect();
                params.insert("kinds".into(), serde_json::json!(kinds));
            }
            _ => {}
        }
    }
    // Every workflow the caller may start: through a command its start declares, or through
    // `workflow.run` (the same rule `status` and `workflow.run` apply), so the card never
    // disagrees with what the caller may run.
    let runs_any = ops::find("workflow.run").is_some_and(|s| served(s) && may(s));
    let mut workflows: Vec<&str> = declared
        .iter()
        .map(|d| d.workflow.as_str())
        .chain(
            inst.view
                .workflows()
                .iter()
                .filter(|w| runs_any && w.may_run(p))
                .map(|w| w.name.as_str()),
        )
        .collect();
    workflows.sort_unstable();
    workflows.dedup();
    for w in workflows {
        card.skills.push(crate::a2a::card::AgentSkill {
            description: format!("Run the {w} workflow"),
            examples: Vec::new(),
            input_modes: Vec::new(),
            output_modes: Vec::new(),
            id: format!("workflow:{w}"),
            name: w.to_owned(),
            tags: vec!["workflow".into()],
        });
    }
    Ok(serialize(&card))
}

/// The sign-in task ops, whose state (codes, sessions) the core holds: their result, or
/// `None` for any other op.
fn sign_in_op(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    checked: &Checked,
) -> Result<Option<serde_json::Value>, RpcError> {
    use crate::sessions::{ApproveError, Scope};
    let now = ctx.now;
    let arg = |name: &str| checked.args.get(name).and_then(serde_json::Value::as_str);
    let field = |name: &str| format!("message.parts[0].data.agentd.{name}");
    let refuse = |name: &str, why: &str| {
        let mut e = RpcError::new(
            ErrorKind::InvalidCommandArgs,
            format!("command \"{}\": {why}", checked.op),
        )
        .with_meta("op", &checked.op);
        e.violations.push(crate::errors::FieldViolation {
            field: field(name),
            description: why.to_owned(),
        });
        e
    };
    let result = match checked.op.as_str() {
        "auth.device.approve" => {
            let (Some(user_code), Some(name)) = (arg("user_code"), arg("as")) else {
                return Ok(None);
            };
            let declared = format!("user:{name}");
            if inst
                .config
                .auth
                .bearers
                .iter()
                .any(|r| r.principal.id == declared)
                || inst
                    .config
                    .auth
                    .any
                    .as_ref()
                    .is_some_and(|p| p.id == declared)
            {
                return Err(refuse("as", "names a principal the configuration declares"));
            }
            let scope = arg("scope").and_then(Scope::parse);
            let grant = inst.config.device_grant.clone();
            let approved = inst
                .sessions
                .approve(user_code, name, scope, ctx.principal, &grant, now.epoch_ms)
                .map_err(|e| match e {
                    ApproveError::UnknownCode => {
                        refuse("user_code", "no pending sign-in has this user code")
                    }
                    ApproveError::ScopeNotAllowed => {
                        refuse("scope", "this scope is not allowed for this sign-in")
                    }
                })?;
            let a = &approved["approved"];
            let pushed = inst.push_feed(
                crate::feed::FeedEvent::Other {
                    kind: "auth",
                    data: serde_json::json!({"event": "approved", "client_id": a["client_id"], "scope": a["scope"],
                                             "user_code": a["user_code"], "name": name}),
                    owner: None,
                },
                now,
            );
            debug_assert!(pushed.is_ok(), "auth events match their schema: {pushed:?}");
            approved
        }
        "auth.device.deny" => {
            let denied = inst.sessions.deny(arg("user_code"), now.epoch_ms);
            for (user_code, client_id, scope) in &denied {
                let pushed = inst.push_feed(
                    crate::feed::FeedEvent::Other {
                        kind: "auth",
                        data: serde_json::json!({"event": "denied", "client_id": client_id,
                                                 "scope": scope.as_str(), "user_code": user_code}),
                        owner: None,
                    },
                    now,
                );
                debug_assert!(pushed.is_ok(), "auth events match their schema: {pushed:?}");
            }
            serde_json::json!({"denied": denied.len()})
        }
        "auth.sessions.revoke" => {
            let all = checked.args.get("all").and_then(serde_json::Value::as_bool) == Some(true);
            let gone = inst.sessions.revoke(arg("sid"), arg("name"), all);
            let n = gone.len();
            inst.sessions_revoked(gone, now);
            serde_json::json!({"revoked": n})
        }
        _ => return Ok(None),
    };
    Ok(Some(result))
}

/// How a locally completed task op is answered, and the digest its task accepts.
struct Local {
    mode: CallMode,
    history: Option<usize>,
    annotate: bool,
    digest: Option<crate::tasks::MessageDigest>,
}

/// A task op the core did itself: its task is created, carries the result as its
/// `<taskId>.result` artifact, and is completed, then answered like any task.
fn complete_locally(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    checked: Checked,
    message: Message,
    local: Local,
    result: serde_json::Value,
) -> Result<Reply, RpcError> {
    let Local {
        mode,
        history,
        annotate,
        digest,
    } = local;
    let task_id = inst.new_id();
    let context = inst.resolve_context(ctx.principal, &message.context_id);
    let message_id = message.message_id.clone();
    let created = inst.tasks.create(
        task_id.clone(),
        context,
        ctx.principal.clone(),
        message,
        ctx.now.epoch_ms,
    );
    if let Err(e) = created {
        return Err(no_room(inst, e));
    }
    if let Some(digest) = digest {
        inst.tasks
            .accept_message(&task_id, &ctx.principal.id, &message_id, digest);
    }
    let link = crate::ext::annotations::Link {
        kind: crate::ext::annotations::LinkKind::Run,
        id: task_id.clone(),
    };
    inst.tasks
        .set_origin(&task_id, link, Some(checked.op.clone()));
    let mut part = crate::a2a::types::Part::data(result);
    part.media_type = "application/json".into();
    let artifact = crate::a2a::types::Artifact {
        artifact_id: format!("{task_id}.result"),
        description: String::new(),
        extensions: vec![crate::ext::COMMAND_URI.to_owned()],
        metadata: None,
        name: "result".into(),
        parts: vec![part],
    };
    let _ = inst.tasks.put_artifact(&task_id, artifact, false);
    inst.set_status(&task_id, TaskState::Completed, None, ctx.now)
        .map_err(|_| RpcError::task_not_found(&task_id))?;
    let task = inst
        .tasks
        .get(&task_id)
        .map(|t| t.view(history, true, annotate))
        .ok_or_else(|| RpcError::task_not_found(&task_id))?;
    let response = StreamResponse::Task(task);
    Ok(if mode == CallMode::Stream {
        Reply::Stream {
            sub: None,
            frames: vec![(inst.replay.last(&task_id), Arc::new(response))],
            task_id: Some(task_id),
        }
    } else {
        serialize(&response)
    })
}

/// The `status` op: this instance as the caller may see it.
fn status_document(inst: &Instance, ctx: &CallContext<'_>) -> serde_json::Value {
    // From the store's counters (the whole store for an operator, the caller's own tasks
    // for anyone else), never a walk of the tasks.
    let counts = inst.tasks.counts(ctx.principal);
    let visible = counts.tasks;
    let by_state: serde_json::Map<String, serde_json::Value> = counts
        .nonzero()
        .map(|(s, n)| (s.as_str().to_owned(), serde_json::json!(n)))
        .collect();
    let p = ctx.principal;
    let view = &inst.view;
    // The host's workflows come from its configuration: as many as it declares.
    let workflows: Vec<&serde_json::Value> = view
        .workflows()
        .iter()
        .filter(|w| w.may_run(p))
        .map(|w| &w.doc)
        .collect();
    // The rest grows with use: the newest STATUS_LIST_MAX of each the caller may see, read
    // off an ordered index (never a walk), and how many it may see in `counts`.
    let runs = view.page(ObjectKind::Run, p, STATUS_LIST_MAX);
    let conversations = view.page(ObjectKind::Conversation, p, STATUS_LIST_MAX);
    let activity = view.page(ObjectKind::Activity, p, STATUS_LIST_MAX);
    serde_json::json!({
        "instance": inst.config.name,
        "uptime_ms": ctx.now.mono_ms.saturating_sub(inst.started().mono_ms),
        "draining": inst.draining,
        "paused": inst.paused,
        "store": match inst.store_unavailable() {
            None => serde_json::json!({"state": "ok"}),
            Some(why) => serde_json::json!({"state": "degraded", "reason": why}),
        },
        "model": view.model(),
        "version": inst.config.version,
        "skills": [],
        "skill_prefix": "",
        "values": {},
        "workflows": workflows,
        "runs": runs.items,
        "conversations": conversations.items,
        "activity": activity.items,
        "counts": {
            "tasks": visible,
            "tasksByState": by_state,
            "streams": inst.subscription_count(),
            "pendingCommands": inst.pending_calls(),
            "runs": runs.total,
            "conversations": conversations.total,
            "activity": activity.total,
        },
    })
}

/// Step 7 of the pipeline: one token from the caller's rate, before anything is routed, so
/// a refused request reaches neither a handler nor the runtime. Operators are exempt; a
/// device session's rate is `a2a.device_grant.rate`, a rule's is its `quotas.rate`.
fn rate_check(inst: &mut Instance, ctx: &CallContext<'_>) -> Result<(), RpcError> {
    let p = ctx.principal;
    if p.is_operator() {
        return Ok(());
    }
    let rate = if ctx.via == crate::auth::Via::Session {
        inst.config.device_grant.rate
    } else {
        p.rate
    };
    let Some(rate) = rate else {
        return Ok(());
    };
    inst.limits
        .rates
        .take(&p.id, rate, ctx.now.mono_ms)
        .map_err(|wait| {
            let secs = crate::limits::retry_after_secs(wait);
            RpcError::rate_limited(
                format!(
                    "rate limit {rate} reached for {}: try again in {secs} s",
                    p.id
                ),
                secs,
            )
        })
}

/// The refusal of new work while the instance drains.
/// Refuses a change while the host's store cannot write: it could not be made durable, so
/// nothing may acknowledge it (reads are still answered).
fn writable(inst: &Instance) -> Result<(), RpcError> {
    match inst.store_unavailable() {
        None => Ok(()),
        Some(why) => Err(RpcError::new(
            ErrorKind::StoreUnavailable,
            format!(
                "the store cannot write ({why}): changes are refused until it heals by \
                 itself; reads are answered"
            ),
        )),
    }
}

fn draining(inst: &Instance) -> RpcError {
    let why = if inst.lifecycle_reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", inst.lifecycle_reason)
    };
    RpcError::new(
        ErrorKind::Draining,
        format!(
            "the agent is draining{why}: it finishes the work in flight and accepts no new work"
        ),
    )
}

/// The answer to an input-required gate, as its `askSchema` sees it: the data of the
/// message's data part; else its text, read as JSON when it parses (so a plain-text client
/// can answer `{"approve": true}`) and as a string otherwise.
pub fn gate_answer(message: &Message) -> serde_json::Value {
    for part in &message.parts {
        if let PartContent::Data(d) = &part.content {
            // Protobuf-Struct clients send `1` as `1.0`; the answer keeps integers whole.
            let mut d = d.clone();
            crate::ext::command::integral_doubles_to_integers(&mut d);
            return d;
        }
    }
    let text = crate::a2a::types::Part::joined_text(&message.parts);
    serde_json::from_str(text.trim()).unwrap_or(serde_json::Value::String(text))
}

/// Refuses an answer its gate's schema does not admit: the gate stays open.
fn check_gate_answer(schema: &serde_json::Value, message: &Message) -> Result<(), RpcError> {
    // The host validated the schema when it opened the gate; one it could not compile
    // admits any answer rather than trapping the task.
    let Ok(validator) = jsonschema::draft202012::new(schema) else {
        return Ok(());
    };
    let answer = gate_answer(message);
    let problems: Vec<String> = validator
        .iter_errors(&answer)
        .take(4)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    Err(RpcError::invalid_field(
        "message.parts",
        format!(
            "the answer does not match the question's askSchema ({}); the task still waits for an answer",
            problems.join("; ")
        ),
    ))
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PushConfigRef {
    // ProtoJSON parsers accept the proto field names too (the A2A TCK sends them).
    #[serde(default, alias = "task_id")]
    task_id: String,
    #[serde(default)]
    id: String,
    #[serde(default, alias = "page_size")]
    page_size: Option<i64>,
    #[serde(default, alias = "page_token")]
    page_token: String,
}

/// The task a push-config call names, if the caller may see it.
fn push_task(inst: &Instance, ctx: &CallContext<'_>, task_id: &str) -> Result<(), RpcError> {
    if task_id.is_empty() {
        return Err(RpcError::invalid_field("taskId", "is required"));
    }
    inst.tasks
        .visible(task_id, ctx.principal)
        .map(|_| ())
        .ok_or_else(|| RpcError::task_not_found(task_id))
}

fn push_config_not_found(task_id: &str, id: &str) -> RpcError {
    RpcError::new(
        ErrorKind::TaskNotFound,
        format!("push notification config not found: {id} (task {task_id})"),
    )
    .with_meta("taskId", task_id)
    .with_meta("id", id)
}

fn push_create(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    wire: crate::push::WireConfig,
) -> Result<Reply, RpcError> {
    let task_id = wire.task_id.clone();
    push_task(inst, ctx, &task_id)?;
    writable(inst)?;
    let policy = inst.config.push;
    let c = crate::push::check_config(wire, &task_id, policy, || inst.new_id())
        .map_err(|(field, why)| RpcError::invalid_field(field, why))?;
    let back = c.to_wire();
    inst.push_configs
        .put(c)
        .map_err(|e| RpcError::invalid_field("taskId", e))?;
    Ok(serialize(&back))
}

fn push_get(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: PushConfigRef,
) -> Result<Reply, RpcError> {
    push_task(inst, ctx, &req.task_id)?;
    require_id(&req.id)?;
    let c = inst
        .push_configs
        .get(&req.task_id, &req.id)
        .ok_or_else(|| push_config_not_found(&req.task_id, &req.id))?;
    Ok(serialize(&c.to_wire()))
}

fn push_list(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: PushConfigRef,
) -> Result<Reply, RpcError> {
    push_task(inst, ctx, &req.task_id)?;
    let size = match req.page_size {
        None => 50,
        Some(n @ 1..=100) => n as usize,
        Some(_) => return Err(RpcError::invalid_field("pageSize", "must be 1-100")),
    };
    // The token is the offset of the next page, as this server wrote it.
    let offset = if req.page_token.is_empty() {
        0
    } else {
        req.page_token
            .strip_prefix("pc-")
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or_else(|| {
                RpcError::invalid_field("pageToken", "is not a token this server issued")
            })?
    };
    let all = inst.push_configs.list(&req.task_id);
    let page: Vec<_> = all.iter().skip(offset).take(size).cloned().collect();
    let next = if offset + page.len() < all.len() {
        format!("pc-{:x}", offset + page.len())
    } else {
        String::new()
    };
    let doc = crate::push::list_page(&page, &next);
    Ok(serialize(&doc))
}

fn push_delete(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: PushConfigRef,
) -> Result<Reply, RpcError> {
    push_task(inst, ctx, &req.task_id)?;
    require_id(&req.id)?;
    writable(inst)?;
    // Idempotent: deleting what is gone answers the same.
    inst.push_configs.delete(&req.task_id, &req.id);
    Ok(serialize(&serde_json::json!({})))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde::Serialize;

    use super::ListPage;
    use crate::a2a::types::{Artifact, Part, Task, TaskState, TaskStatus};

    /// A page as serde_json writes a `ListTasksResponse` of whole tasks.
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Page<'a> {
        next_page_token: String,
        page_size: i32,
        tasks: &'a [Task],
        total_size: i32,
    }

    fn task(i: u64, pad: usize) -> Task {
        Task {
            artifacts: vec![Arc::new(Artifact {
                artifact_id: format!("a{i}"),
                description: String::new(),
                extensions: Vec::new(),
                metadata: None,
                name: String::new(),
                parts: vec![Part::text("x".repeat(pad))],
            })],
            context_id: format!("ctx \"{i}\""),
            history: Vec::new(),
            id: format!("task-{i}"),
            metadata: None,
            status: TaskStatus {
                message: None,
                state: TaskState::Completed,
                timestamp: "2026-12-06T00:00:00.000Z".into(),
            },
        }
    }

    /// `render` writes what serde_json writes for the response of the tasks it shows, byte
    /// for byte: all of them, or as many as the page's bytes allow (then `pageSize` says how
    /// many and `nextPageToken` goes on after the last one shown); the last page's token is
    /// empty.
    #[test]
    fn a_rendered_page_is_the_serialized_list_tasks_response() {
        let tasks: Vec<Task> = (0..4).map(|i| task(i, 100 + 50 * i as usize)).collect();
        let one = serde_json::to_vec(&tasks[0]).unwrap().len();
        let two = one + serde_json::to_vec(&tasks[1]).unwrap().len();
        for (page_bytes, more, shown) in [
            (1 << 20, false, 4),
            (1 << 20, true, 4),
            (one, false, 1),
            (one - 1, false, 1),
            // The tasks' own bytes count, not the commas between them.
            (two, false, 2),
            (two - 1, true, 1),
        ] {
            let page = ListPage {
                views: tasks
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.clone().into(), (10 - i as u64, 1)))
                    .collect(),
                more,
                page_size: 7,
                total_size: 12,
                page_bytes,
                guessed: 16,
            };
            let cut = shown < tasks.len();
            let want = Page {
                next_page_token: if more || cut {
                    crate::tasks::encode_position((10 - shown as u64 + 1, 1))
                } else {
                    String::new()
                },
                // Fewer than the 7 asked for, with more to come: says how many.
                page_size: if more || cut { shown as i32 } else { 7 },
                tasks: &tasks[..shown],
                total_size: 12,
            };
            assert_eq!(
                String::from_utf8(page.render().unwrap()).unwrap(),
                serde_json::to_string(&want).unwrap(),
                "page bytes {page_bytes}, more {more}"
            );
        }
    }
}
