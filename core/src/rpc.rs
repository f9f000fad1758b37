//! The JSON-RPC methods: from a request body to a reply, against the instance's state.
//! HTTP concerns (statuses, framing, streams on the wire) stay in [`crate::conn`].

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::a2a::types::{
    GetTaskRequest, ListTasksRequest, ListTasksResponse, Message, PartContent, Role,
    SendMessageRequest, StreamResponse, TaskIdRequest, TaskState,
};
use crate::a2a::{version_supported, CoreMethod, PROTOCOL_VERSION};
use crate::auth::Principal;
use crate::errors::{ErrorKind, RpcError};
use crate::http::RequestHead;
use crate::instance::{Effect, Instance, SubId};
use crate::jsonrpc::{self, RequestId};
use crate::tasks::{decode_page_token, encode_page_token, StoreError};
use crate::time::{parse_rfc3339, Now};

/// The method the events extension adds; not served until that extension is declared.
pub const EVENTS_METHOD: &str = "agentd.events/SubscribeToEvents";

/// The media types every part agentd accepts is in.
const ACCEPTED_PART_TYPES: &str = "text/plain, application/json";

/// ListTasks page size when the client names none, and the largest it may name.
const DEFAULT_PAGE_SIZE: i32 = 50;
const MAX_PAGE_SIZE: i32 = 100;

/// What a request is answered with.
#[derive(Debug)]
pub enum Reply {
    /// A finished result, already serialized.
    Result(Vec<u8>),
    Error(RpcError),
    /// A blocking send: answer with the task once `sub` settles.
    Wait {
        sub: SubId,
        task_id: String,
        history_length: Option<usize>,
    },
    /// A stream: `first` now, then the events of `sub`.
    Stream {
        sub: SubId,
        first: Box<StreamResponse>,
    },
}

/// Who asks, over which listener, with which headers.
pub struct CallContext<'a> {
    pub principal: &'a Principal,
    pub listener: usize,
    pub head: &'a RequestHead,
    pub now: Now,
}

/// Answers one JSON-RPC request body.
pub fn call(inst: &mut Instance, ctx: &CallContext<'_>, body: &[u8]) -> (RequestId, Reply) {
    let req = match jsonrpc::parse_request(body) {
        Ok(r) => r,
        Err(refusal) => return (refusal.id, Reply::Error(refusal.error)),
    };
    let id = req.id.clone();
    let reply = match dispatch(inst, ctx, req.method, req.params) {
        Ok(r) => r,
        Err(e) => Reply::Error(e),
    };
    (id, reply)
}

fn dispatch(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    method: &str,
    params: Option<&RawValue>,
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
    let Some(m) = CoreMethod::from_name(method) else {
        if method == EVENTS_METHOD {
            return Err(RpcError::new(
                ErrorKind::ExtensionNotDeclared,
                format!("method not found: {method}: this instance does not declare the events extension"),
            ));
        }
        return Err(RpcError::new(
            ErrorKind::MethodNotFound,
            format!("method not found: {method}"),
        ));
    };
    match m {
        CoreMethod::SendMessage => send(inst, ctx, parse(params)?, false),
        CoreMethod::SendStreamingMessage => send(inst, ctx, parse(params)?, true),
        CoreMethod::GetTask => get_task(inst, ctx, parse(params)?),
        CoreMethod::ListTasks => list_tasks(inst, ctx, parse(params)?),
        CoreMethod::CancelTask => cancel_task(inst, ctx, parse(params)?),
        CoreMethod::SubscribeToTask => subscribe(inst, ctx, parse(params)?),
        CoreMethod::CreateTaskPushNotificationConfig
        | CoreMethod::GetTaskPushNotificationConfig
        | CoreMethod::ListTaskPushNotificationConfigs
        | CoreMethod::DeleteTaskPushNotificationConfig => Err(RpcError::new(
            ErrorKind::PushNotificationNotSupported,
            "push notifications are not supported by this instance (capabilities.pushNotifications is false)",
        )),
        CoreMethod::GetExtendedAgentCard => Err(RpcError::new(
            ErrorKind::UnsupportedOperation,
            "this listener declares no authentication scheme, so it has no extended agent card",
        )),
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

fn serialize<T: Serialize>(value: &T) -> Reply {
    match serde_json::to_vec(value) {
        Ok(bytes) => Reply::Result(bytes),
        Err(e) => Reply::Error(RpcError::new(
            ErrorKind::Internal,
            format!("internal error: {e}"),
        )),
    }
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
) -> Result<Reply, RpcError> {
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
    if config.task_push_notification_config.is_some() {
        return Err(RpcError::new(
            ErrorKind::PushNotificationNotSupported,
            "configuration.taskPushNotificationConfig: push notifications are not supported by this instance",
        ));
    }

    let task_id = if message.task_id.is_empty() {
        let task_id = inst.new_id();
        if message.context_id.is_empty() {
            message.context_id = inst.new_id();
        }
        let context_id = message.context_id.clone();
        match inst.tasks.create(
            task_id.clone(),
            context_id.clone(),
            ctx.principal.clone(),
            message.clone(),
            ctx.now.epoch_ms,
        ) {
            Ok(_) => {}
            Err(_) => {
                return Err(RpcError::new(
                    ErrorKind::Internal,
                    "the task store is full of unfinished tasks; try again later",
                ))
            }
        }
        message.task_id = task_id.clone();
        inst.push_effect(Effect::Turn {
            task_id: task_id.clone(),
            context_id,
            message: Box::new(message),
            owner: ctx.principal.clone(),
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
        if !message.context_id.is_empty() && message.context_id != t.context_id {
            return Err(RpcError::invalid_field(
                "message.contextId",
                format!("task {task_id} belongs to another context"),
            ));
        }
        let context_id = t.context_id.clone();
        let owner = t.owner.clone();
        inst.tasks
            .append_message(&task_id, message.clone())
            .map_err(|_| RpcError::task_not_found(&task_id))?;
        inst.set_status(&task_id, TaskState::Working, None, ctx.now)
            .map_err(|_| RpcError::task_not_found(&task_id))?;
        message.context_id = context_id.clone();
        inst.push_effect(Effect::Turn {
            task_id: task_id.clone(),
            context_id,
            message: Box::new(message),
            owner,
        });
        task_id
    };

    let snapshot = |inst: &Instance| {
        inst.tasks
            .get(&task_id)
            .map(|t| t.to_task(history, true))
            .ok_or_else(|| RpcError::task_not_found(&task_id))
    };
    if streaming {
        let first = StreamResponse::Task(snapshot(inst)?);
        let sub = inst.subscribe(&task_id, false);
        return Ok(Reply::Stream {
            sub,
            first: Box::new(first),
        });
    }
    if config.return_immediately == Some(true) {
        return Ok(serialize(&StreamResponse::Task(snapshot(inst)?)));
    }
    let sub = inst.subscribe(&task_id, true);
    Ok(Reply::Wait {
        sub,
        task_id,
        history_length: history,
    })
}

fn get_task(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: GetTaskRequest,
) -> Result<Reply, RpcError> {
    require_id(&req.id)?;
    let history = history_length(req.history_length, "historyLength")?;
    let t = inst
        .tasks
        .visible(&req.id, ctx.principal)
        .ok_or_else(|| RpcError::task_not_found(&req.id))?;
    Ok(serialize(&t.to_task(history, true)))
}

fn list_tasks(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: ListTasksRequest,
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
    let matches = |t: &&crate::tasks::TaskRecord| {
        ctx.principal.may_see(&t.owner)
            && (req.context_id.is_empty() || t.context_id == req.context_id)
            && status.is_none_or(|s| t.state == s)
            && since.is_none_or(|ms| t.status_ms >= ms)
    };
    let total = inst.tasks.newest_first(None).filter(matches).count();
    let mut page = inst.tasks.newest_first(after).filter(matches);
    let tasks: Vec<_> = page.by_ref().take(page_size as usize).collect();
    let next_page_token = match (tasks.last(), page.next()) {
        (Some(last), Some(_)) => encode_page_token(last),
        _ => String::new(),
    };
    let response = ListTasksResponse {
        next_page_token,
        page_size,
        tasks: tasks
            .into_iter()
            .map(|t| t.to_task(Some(history), include_artifacts))
            .collect(),
        total_size: i32::try_from(total).unwrap_or(i32::MAX),
    };
    Ok(serialize(&response))
}

fn cancel_task(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: TaskIdRequest,
) -> Result<Reply, RpcError> {
    require_id(&req.id)?;
    let t = inst
        .tasks
        .visible(&req.id, ctx.principal)
        .ok_or_else(|| RpcError::task_not_found(&req.id))?;
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
    Ok(serialize(&t.to_task(None, true)))
}

fn subscribe(
    inst: &mut Instance,
    ctx: &CallContext<'_>,
    req: TaskIdRequest,
) -> Result<Reply, RpcError> {
    require_id(&req.id)?;
    let t = inst
        .tasks
        .visible(&req.id, ctx.principal)
        .ok_or_else(|| RpcError::task_not_found(&req.id))?;
    if t.state.is_terminal() {
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
    let first = StreamResponse::Task(t.to_task(None, true));
    let sub = inst.subscribe(&req.id, false);
    Ok(Reply::Stream {
        sub,
        first: Box::new(first),
    })
}
