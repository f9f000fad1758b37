//! The command ops: every op agentd answers, with its reply kind, who may call it, when it is
//! served, and the JSON Schemas of its arguments and result. These values are what the
//! listener validates against AND what the published bundle (`agentd --extension-schema
//! command`, `schemas/command/schema.json`) is generated from, so the two cannot drift.

use serde_json::{json, Value};

use crate::auth::Role;

/// How an op answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// A read: a Message whose DataPart is the result document; no task.
    Message,
    /// Work: a Task; its result arrives as the `<taskId>.result` artifact.
    Task,
}

impl ReplyKind {
    /// The kind as the card's `params.ops` and the bundle name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReplyKind::Message => "message",
            ReplyKind::Task => "task",
        }
    }
}

/// Who may call an op at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// The operator only; no grant reaches it, not even `*`.
    Operator,
    /// Any authenticated principal.
    AnyNamed,
    /// The operator, the roles in `defaults`, or a principal whose grants name the op.
    Granted,
}

/// The switch that serves an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Served whatever the switches say.
    Always,
    /// While `a2a.introspection.enabled`; closed answers -32004 INTROSPECTION_DISABLED.
    Introspection,
    /// While `a2a.device_grant.enabled`; closed answers UNKNOWN_OP.
    DeviceGrant,
    /// On a TCP listener only; elsewhere UNKNOWN_OP.
    TcpListener,
}

/// Who answers an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServedBy {
    /// The core itself, from what it holds (`status`, `config`, the sign-in ops): served on
    /// every instance.
    Core,
    /// The host, as a typed [`crate::host::Op`] in an [`crate::Effect::Command`]: served only
    /// when the host declares it ([`crate::host::HostCapabilities::ops`]).
    Host,
}

/// An op of the table, by identity. [`OPS`] holds one row per variant, in this order (the
/// card's order), so a row is found without searching and the typed op a host receives
/// ([`crate::host::Op`]) names its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpId {
    /// `status`: Liveness and a snapshot of this instance as the caller may see it.
    Status,
    /// `config`: The effective configuration, credentials redacted to their secret references.
    Config,
    /// `workflow.run`: Start a workflow run; the result is the run's output once it finishes.
    WorkflowRun,
    /// `workflow.status`: One run's state, or every run the caller may see.
    WorkflowStatus,
    /// `workflow.cancel`: Cancel a run the caller owns.
    WorkflowCancel,
    /// `workflow.signal`: Deliver a named signal to one run, or to every waiter the caller owns.
    WorkflowSignal,
    /// `subagent.send`: Send a message to a subagent the caller owns.
    SubagentSend,
    /// `subagent.kill`: Stop a subagent the caller owns.
    SubagentKill,
    /// `subagent.status`: A subagent's state and, once it has one, its result.
    SubagentStatus,
    /// `plan.get`: A conversation's plan and progress; the root conversation without id.
    PlanGet,
    /// `conversation.get`: A conversation's state and its newest messages.
    ConversationGet,
    /// `run.get`: A run in detail: every step's state and the run's variables.
    RunGet,
    /// `subagent.get`: A subagent in detail: its instruction, attempts, tokens and result.
    SubagentGet,
    /// `debug.events`: Lines of the live log ring, across every principal.
    DebugEvents,
    /// `admin.drain`: Drain gracefully, then exit 0.
    AdminDrain,
    /// `admin.pause`: Pause one run, or the whole instance without run.
    AdminPause,
    /// `admin.resume`: Resume one paused run, or the whole instance without run.
    AdminResume,
    /// `admin.cancel`: Cancel any run, whoever started it.
    AdminCancel,
    /// `admin.set`: Change one live setting until the next reload.
    AdminSet,
    /// `auth.device.pending`: The device sign-ins waiting for approval.
    AuthDevicePending,
    /// `auth.device.approve`: Approve a device sign-in by its user code, naming the
    /// principal it becomes.
    AuthDeviceApprove,
    /// `auth.device.deny`: Deny one pending device sign-in, or all of them.
    AuthDeviceDeny,
    /// `auth.sessions`: The live sign-in sessions.
    AuthSessions,
    /// `auth.sessions.revoke`: Revoke one session by sid, every session of a name, or all of them.
    AuthSessionsRevoke,
    /// `_instance.result` (reserved): a `mode: sync` child's first result, recorded on the
    /// parent's handle.
    InstanceResult,
    /// `_instance.emit` (reserved): one event of a child's `mirror_streams` stream, appended
    /// to the parent's stream.
    InstanceEmit,
}

impl OpId {
    /// How many ops the table has.
    pub(crate) const COUNT: usize = 26;

    /// Every op, in table order.
    pub const ALL: [OpId; OpId::COUNT] = [
        OpId::Status,
        OpId::Config,
        OpId::WorkflowRun,
        OpId::WorkflowStatus,
        OpId::WorkflowCancel,
        OpId::WorkflowSignal,
        OpId::SubagentSend,
        OpId::SubagentKill,
        OpId::SubagentStatus,
        OpId::PlanGet,
        OpId::ConversationGet,
        OpId::RunGet,
        OpId::SubagentGet,
        OpId::DebugEvents,
        OpId::AdminDrain,
        OpId::AdminPause,
        OpId::AdminResume,
        OpId::AdminCancel,
        OpId::AdminSet,
        OpId::AuthDevicePending,
        OpId::AuthDeviceApprove,
        OpId::AuthDeviceDeny,
        OpId::AuthSessions,
        OpId::AuthSessionsRevoke,
        OpId::InstanceResult,
        OpId::InstanceEmit,
    ];

    /// The op's row of the table.
    pub(crate) fn spec(self) -> &'static OpSpec {
        // `OPS` has one row per variant in variant order (a compile-time check below).
        &OPS[self as usize]
    }

    /// The op's name on the wire (`"workflow.run"`).
    pub(crate) fn name(self) -> &'static str {
        self.spec().op
    }

    /// Whether the host answers it (else the core does).
    pub(crate) fn host_served(self) -> bool {
        self.spec().served_by == ServedBy::Host
    }
}

// The table has a row per [`OpId`], each at the index of its variant.
const _: () = {
    assert!(OPS.len() == OpId::COUNT);
    let mut i = 0;
    while i < OpId::COUNT {
        assert!(OPS[i].id as usize == i);
        assert!(OpId::ALL[i] as usize == i);
        i += 1;
    }
};

/// One op.
#[derive(Clone, Copy, Debug)]
pub struct OpSpec {
    /// Its identity; `OPS[id as usize]` is this row.
    pub id: OpId,
    /// The op's wire name, as the envelope's `op` carries it.
    pub op: &'static str,
    /// Whether the core or the host answers it.
    pub served_by: ServedBy,
    /// Whether it answers with a message or a task.
    pub reply: ReplyKind,
    /// Who may call it at all.
    pub floor: Floor,
    /// Roles that may call a `Granted` op without a grant.
    pub defaults: &'static [Role],
    /// The switch that serves it.
    pub gate: Gate,
    /// Listed in the card's `params.ops`; false for the reserved `_instance.*` reports.
    pub listed: bool,
    /// One line, for the bundle.
    pub description: &'static str,
    /// The arguments: a closed object schema (the envelope adds `op`).
    pub args: fn() -> Value,
    /// The result: for a message op the document its reply carries; for a task op the data
    /// of its result artifact, `false` when it leaves none.
    pub result: fn() -> Value,
}

/// Every name starting with this is reserved; only the listed `_instance.*` ops are served.
pub const RESERVED_PREFIX: &str = "_instance.";

/// Reserved names that are never served over A2A.
pub(crate) const RESERVED_UNSERVED: &[&str] = &["ask_human"];

/// Op names that once existed, with what to use instead (UNKNOWN_OP carries the hint).
pub const REMOVED_OPS: &[(&str, &str)] = &[
    ("interface.info", "read the agent card and the status op"),
    ("config.set", "use admin.set {path, value}"),
    (
        "pairing.code",
        "use the device grant: auth.device.approve {user_code, as}",
    ),
    ("admin.lameduck", "use admin.drain"),
];

/// What `auth.device.approve`'s `as` must match.
pub(crate) const PRINCIPAL_NAME_PATTERN: &str = "^[a-z0-9][a-z0-9._-]{0,63}$";

/// Names `auth.device.approve`'s `as` may never take.
pub const RESERVED_PRINCIPAL_NAMES: &[&str] = &[
    "operator",
    "anonymous",
    "unknown",
    "launcher",
    "runtime",
    "system",
];

/// The paths `admin.set` accepts.
pub(crate) const SETTABLE_PATHS: &[&str] = &["agent.approval", "a2a.introspection.enabled"];

const NONE: &[Role] = &[];
const USER: &[Role] = &[Role::User];
const USER_AGENT: &[Role] = &[Role::User, Role::Agent];

/// An object schema that admits exactly these properties.
fn closed(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "properties": properties,
        "required": required,
    })
}

fn no_args() -> Value {
    closed(json!({}), &[])
}

fn non_empty() -> Value {
    json!({"type": "string", "minLength": 1})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn object() -> Value {
    json!({"type": "object"})
}

fn count() -> Value {
    json!({"type": "integer", "minimum": 0})
}

/// "str|null".
fn string_or_null() -> Value {
    json!({"type": ["string", "null"]})
}

/// "count|null".
fn count_or_null() -> Value {
    json!({"type": ["integer", "null"], "minimum": 0})
}

fn array_of(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

fn strings() -> Value {
    array_of(string())
}

/// Any value.
fn any() -> Value {
    json!(true)
}

/// The `const: true` of an `ok` member and of `{all: true}`.
fn yes() -> Value {
    json!({"const": true})
}

/// A closed object that takes exactly one of the `alternatives` (`oneOf`). Every member is in
/// the one `properties` map, so the envelope can add `op` beside them; each alternative only
/// says which member it requires (and, for `{all: true}`, restates the constant).
fn exactly_one_of(properties: Value, alternatives: &[Value]) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "properties": properties,
        "oneOf": alternatives,
    })
}

/// The `{all: true}` alternative of `auth.device.deny` and `auth.sessions.revoke`.
fn all_alternative() -> Value {
    json!({"required": ["all"], "properties": {"all": yes()}})
}

/// §4.4 `run` event data: a workflow run as the feed and `status` show it.
fn feed_run() -> Value {
    closed(
        json!({
            "id": string(),
            "workflow": string(),
            "status": string(),
            "start": string(),
            "steps": {"type": "object", "additionalProperties": count()},
            "tokens": count(),
            "created": count(),
            "updated": count(),
            "finished": count_or_null(),
            "output": any(),
            "error": string_or_null(),
            "task": string_or_null(),
            "principal": string_or_null(),
        }),
        &[
            "id",
            "workflow",
            "status",
            "start",
            "steps",
            "tokens",
            "created",
            "updated",
            "finished",
            "output",
            "error",
            "task",
            "principal",
        ],
    )
}

/// §4.4 `conversation` event data.
fn feed_conversation() -> Value {
    closed(
        json!({
            "id": string(),
            "contextId": string(),
            "kind": string(),
            "version": count(),
            "messages": count(),
            "est_tokens": count(),
            "turns": count(),
            "principal": string_or_null(),
            "skills": strings(),
            "plan": string_or_null(),
            "updated": count(),
        }),
        &[
            "id",
            "contextId",
            "kind",
            "version",
            "messages",
            "est_tokens",
            "turns",
            "principal",
            "skills",
            "plan",
            "updated",
        ],
    )
}

/// §4.4 `activity` event data: one model turn in flight.
fn feed_activity() -> Value {
    closed(
        json!({
            "id": string(),
            "task": string_or_null(),
            "ctx": string_or_null(),
            "phase": string(),
            "tool": string_or_null(),
            "round": count(),
            "tokens_in": count(),
            "tokens_out": count(),
            "started_ms": count(),
            "updated_ms": count(),
        }),
        &[
            "id",
            "task",
            "ctx",
            "phase",
            "tool",
            "round",
            "tokens_in",
            "tokens_out",
            "started_ms",
            "updated_ms",
        ],
    )
}

/// `run.get`'s run: the feed run with `steps` as step id → step detail, plus `vars`.
fn run_detail() -> Value {
    let step = closed(
        json!({
            "status": any(),
            "attempt": count(),
            "started": count_or_null(),
            "finished": count_or_null(),
            "error": string_or_null(),
            "wait": any(),
            "output": any(),
        }),
        &[
            "status", "attempt", "started", "finished", "error", "wait", "output",
        ],
    );
    let mut run = feed_run();
    run["properties"]["steps"] = json!({"type": "object", "additionalProperties": step});
    run["properties"]["vars"] = object();
    run["required"]
        .as_array_mut()
        .expect("closed() writes required")
        .push(json!("vars"));
    run
}

/// The result of `subagent.send` and `subagent.kill` (not closed).
fn subagent_ack() -> Value {
    json!({
        "type": "object",
        "required": ["ok"],
        "properties": {"ok": boolean(), "handle": string()},
    })
}

/// The `scope` of a device sign-in.
fn scope() -> Value {
    json!({"enum": ["user", "operator"]})
}

/// The op table, in the order the card lists it.
pub static OPS: &[OpSpec] = &[
    OpSpec {
        id: OpId::Status,
        op: "status",
        served_by: ServedBy::Core,
        reply: ReplyKind::Message,
        floor: Floor::AnyNamed,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Liveness and a snapshot of this instance as the caller may see it",
        args: no_args,
        // Not closed: the operator's document carries extra internals.
        result: || {
            json!({
                "type": "object",
                "required": ["instance", "uptime_ms", "draining", "paused", "model", "version",
                             "skills", "skill_prefix", "values", "workflows", "runs",
                             "conversations", "activity"],
                "properties": {
                    "instance": string(),
                    "uptime_ms": count(),
                    "draining": boolean(),
                    "paused": boolean(),
                    "model": string(),
                    "version": string(),
                    "skills": strings(),
                    "skill_prefix": string(),
                    "values": object(),
                    "workflows": array_of(json!({
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": string()},
                    })),
                    "runs": array_of(feed_run()),
                    "conversations": array_of(feed_conversation()),
                    "activity": array_of(feed_activity()),
                }
            })
        },
    },
    OpSpec {
        id: OpId::Config,
        op: "config",
        served_by: ServedBy::Core,
        reply: ReplyKind::Message,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "The effective configuration, credentials redacted to their secret references",
        args: no_args,
        result: || closed(json!({"config": object()}), &["config"]),
    },
    OpSpec {
        id: OpId::WorkflowRun,
        op: "workflow.run",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Granted,
        defaults: USER_AGENT,
        gate: Gate::Always,
        listed: true,
        description: "Start a workflow run; the result is the run's output once it finishes",
        args: || {
            closed(
                json!({"workflow": non_empty(), "inputs": object()}),
                &["workflow"],
            )
        },
        result: any,
    },
    OpSpec {
        id: OpId::WorkflowStatus,
        op: "workflow.status",
        served_by: ServedBy::Host,
        reply: ReplyKind::Message,
        floor: Floor::Granted,
        defaults: USER_AGENT,
        gate: Gate::Always,
        listed: true,
        description: "One run's state, or every run the caller may see",
        args: || closed(json!({"run": non_empty()}), &[]),
        result: || {
            let item = closed(
                json!({
                    "run": string(),
                    "workflow": string(),
                    "status": string(),
                    "output": any(),
                    "error": string_or_null(),
                }),
                &["run", "workflow", "status", "output", "error"],
            );
            closed(json!({"runs": array_of(item)}), &["runs"])
        },
    },
    OpSpec {
        id: OpId::WorkflowCancel,
        op: "workflow.cancel",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Granted,
        defaults: USER,
        gate: Gate::Always,
        listed: true,
        description: "Cancel a run the caller owns",
        args: || closed(json!({"run": non_empty()}), &["run"]),
        result: || json!(false),
    },
    OpSpec {
        id: OpId::WorkflowSignal,
        op: "workflow.signal",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Granted,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Deliver a named signal to one run, or to every waiter the caller owns",
        args: || {
            closed(
                json!({"name": non_empty(), "payload": any(), "run": non_empty()}),
                &["name"],
            )
        },
        result: || {
            closed(
                json!({"signal": string(), "delivered": count()}),
                &["signal", "delivered"],
            )
        },
    },
    OpSpec {
        id: OpId::SubagentSend,
        op: "subagent.send",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Granted,
        defaults: USER,
        gate: Gate::Always,
        listed: true,
        description: "Send a message to a subagent the caller owns",
        args: || closed(json!({"handle": string(), "message": string()}), &["handle", "message"]),
        result: subagent_ack,
    },
    OpSpec {
        id: OpId::SubagentKill,
        op: "subagent.kill",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Granted,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Stop a subagent the caller owns",
        args: || closed(json!({"handle": string(), "reason": string()}), &["handle"]),
        result: subagent_ack,
    },
    OpSpec {
        id: OpId::SubagentStatus,
        op: "subagent.status",
        served_by: ServedBy::Host,
        reply: ReplyKind::Message,
        floor: Floor::Granted,
        defaults: USER,
        gate: Gate::Always,
        listed: true,
        description: "A subagent's state and, once it has one, its result",
        args: || closed(json!({"handle": string()}), &["handle"]),
        // Not closed.
        result: || {
            json!({
                "type": "object",
                "required": ["handle", "status"],
                "properties": {
                    "handle": string(),
                    "status": string(),
                    "mode": string(),
                    "result": any(),
                    "error": string(),
                },
            })
        },
    },
    OpSpec {
        id: OpId::PlanGet,
        op: "plan.get",
        served_by: ServedBy::Host,
        reply: ReplyKind::Message,
        floor: Floor::Granted,
        defaults: USER,
        gate: Gate::Always,
        listed: true,
        description: "A conversation's plan and progress; the root conversation without id",
        args: || closed(json!({"id": non_empty()}), &[]),
        result: || {
            closed(
                json!({
                    "conversation": string(),
                    "plan": {"type": ["object", "null"]},
                    "progress": string_or_null(),
                }),
                &["conversation", "plan", "progress"],
            )
        },
    },
    OpSpec {
        id: OpId::ConversationGet,
        op: "conversation.get",
        served_by: ServedBy::Host,
        reply: ReplyKind::Message,
        floor: Floor::Granted,
        defaults: USER,
        gate: Gate::Introspection,
        listed: true,
        description: "A conversation's state and its newest messages",
        args: || closed(json!({"id": non_empty(), "limit": count()}), &["id"]),
        result: || {
            let conversation = closed(
                json!({
                    "id": string(),
                    "kind": any(),
                    "version": count(),
                    "turns": count(),
                    "est_tokens": count(),
                    "principal": string_or_null(),
                    "task": string_or_null(),
                    "skills": strings(),
                    "plan": any(),
                    "summary": any(),
                    "total_messages": count(),
                    "messages": array_of(any()),
                    "updated": count(),
                }),
                &["id", "kind", "version", "turns", "est_tokens", "principal", "task", "skills",
                  "plan", "summary", "total_messages", "messages", "updated"],
            );
            closed(json!({"conversation": conversation}), &["conversation"])
        },
    },
    OpSpec {
        id: OpId::RunGet,
        op: "run.get",
        served_by: ServedBy::Host,
        reply: ReplyKind::Message,
        floor: Floor::Granted,
        defaults: USER,
        gate: Gate::Introspection,
        listed: true,
        description: "A run in detail: every step's state and the run's variables",
        args: || closed(json!({"run": non_empty()}), &["run"]),
        result: || closed(json!({"run": run_detail()}), &["run"]),
    },
    OpSpec {
        id: OpId::SubagentGet,
        op: "subagent.get",
        served_by: ServedBy::Host,
        reply: ReplyKind::Message,
        floor: Floor::Granted,
        defaults: USER,
        gate: Gate::Introspection,
        listed: true,
        description: "A subagent in detail: its instruction, attempts, tokens and result",
        args: || closed(json!({"handle": non_empty()}), &["handle"]),
        result: || {
            let subagent = closed(
                json!({
                    "handle": string(),
                    "mode": any(),
                    "status": any(),
                    "attempt": count(),
                    "tokens": count(),
                    "instruction": any(),
                    "result": any(),
                    "error": string_or_null(),
                    "requested_by": string_or_null(),
                    "created": count(),
                    "updated": count(),
                    "node": count_or_null(),
                }),
                &["handle", "mode", "status", "attempt", "tokens", "instruction", "result",
                  "error", "requested_by", "created", "updated", "node"],
            );
            closed(json!({"subagent": subagent}), &["subagent"])
        },
    },
    OpSpec {
        id: OpId::DebugEvents,
        op: "debug.events",
        served_by: ServedBy::Host,
        reply: ReplyKind::Message,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Introspection,
        listed: true,
        description: "Lines of the live log ring, across every principal",
        args: || {
            closed(
                json!({"after": count(), "limit": count(), "level": string(), "prefix": string()}),
                &[],
            )
        },
        result: || {
            closed(
                json!({
                    "events": array_of(object()),
                    "newest_seq": count(),
                    "oldest_seq": count(),
                    "dropped": count(),
                }),
                &["events", "newest_seq", "oldest_seq", "dropped"],
            )
        },
    },
    OpSpec {
        id: OpId::AdminDrain,
        op: "admin.drain",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Drain gracefully, then exit 0",
        args: || closed(json!({"reason": string()}), &[]),
        result: || {
            closed(
                json!({"ok": yes(), "state": {"const": "draining"}, "reason": string()}),
                &["ok", "state", "reason"],
            )
        },
    },
    OpSpec {
        id: OpId::AdminPause,
        op: "admin.pause",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Pause one run, or the whole instance without run",
        args: || closed(json!({"run": non_empty(), "reason": string()}), &[]),
        result: || {
            json!({"oneOf": [
                closed(json!({"ok": yes(), "paused": string()}), &["ok", "paused"]),
                closed(
                    json!({"ok": yes(), "state": {"const": "paused"}, "reason": string()}),
                    &["ok", "state", "reason"],
                ),
            ]})
        },
    },
    OpSpec {
        id: OpId::AdminResume,
        op: "admin.resume",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Resume one paused run, or the whole instance without run",
        args: || closed(json!({"run": non_empty()}), &[]),
        result: || {
            json!({"oneOf": [
                closed(json!({"ok": yes(), "resumed": string()}), &["ok", "resumed"]),
                closed(json!({"ok": yes(), "state": {"const": "running"}}), &["ok", "state"]),
            ]})
        },
    },
    OpSpec {
        id: OpId::AdminCancel,
        op: "admin.cancel",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Cancel any run, whoever started it",
        args: || closed(json!({"run": non_empty(), "reason": string()}), &["run"]),
        result: || {
            closed(json!({"ok": yes(), "cancelled": string()}), &["ok", "cancelled"])
        },
    },
    OpSpec {
        id: OpId::AdminSet,
        op: "admin.set",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: true,
        description: "Change one live setting until the next reload",
        args: || {
            closed(
                json!({"path": {"enum": SETTABLE_PATHS}, "value": any()}),
                &["path", "value"],
            )
        },
        result: || {
            closed(
                json!({"path": {"enum": SETTABLE_PATHS}, "value": any()}),
                &["path", "value"],
            )
        },
    },
    OpSpec {
        id: OpId::AuthDevicePending,
        op: "auth.device.pending",
        served_by: ServedBy::Core,
        reply: ReplyKind::Message,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::DeviceGrant,
        listed: true,
        description: "The device sign-ins waiting for approval",
        args: no_args,
        result: || {
            let item = closed(
                json!({
                    "user_code": string(),
                    "client_id": string(),
                    "scope": scope(),
                    "peer": string_or_null(),
                    "requested_at": count(),
                    "expires_at": count(),
                }),
                &["user_code", "client_id", "scope", "peer", "requested_at", "expires_at"],
            );
            closed(json!({"pending": array_of(item)}), &["pending"])
        },
    },
    OpSpec {
        id: OpId::AuthDeviceApprove,
        op: "auth.device.approve",
        served_by: ServedBy::Core,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::DeviceGrant,
        listed: true,
        description: "Approve a device sign-in by its user code, naming the principal it becomes",
        args: || {
            closed(
                json!({
                    "user_code": non_empty(),
                    // The pattern is enforced by agentd itself, outside the validator (§3.1).
                    "as": {
                        "type": "string",
                        "pattern": PRINCIPAL_NAME_PATTERN,
                        "not": {"enum": RESERVED_PRINCIPAL_NAMES},
                    },
                    "scope": scope(),
                }),
                &["user_code", "as"],
            )
        },
        result: || {
            let approved = closed(
                json!({
                    "user_code": string(),
                    "client_id": string(),
                    "scope": scope(),
                    "peer": string_or_null(),
                    "principal": string(),
                    "existing": boolean(),
                }),
                &["user_code", "client_id", "scope", "peer", "principal", "existing"],
            );
            closed(json!({"approved": approved}), &["approved"])
        },
    },
    OpSpec {
        id: OpId::AuthDeviceDeny,
        op: "auth.device.deny",
        served_by: ServedBy::Core,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::DeviceGrant,
        listed: true,
        description: "Deny one pending device sign-in, or all of them",
        args: || {
            // `all` is `const: true` on the object itself, so `{user_code, all: false}` is
            // refused too: exactly one of `{user_code}` or `{all: true}` (§3.3).
            exactly_one_of(
                json!({"user_code": non_empty(), "all": yes()}),
                &[json!({"required": ["user_code"]}), all_alternative()],
            )
        },
        result: || closed(json!({"denied": count()}), &["denied"]),
    },
    OpSpec {
        id: OpId::AuthSessions,
        op: "auth.sessions",
        served_by: ServedBy::Core,
        reply: ReplyKind::Message,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::TcpListener,
        listed: true,
        description: "The live sign-in sessions",
        args: no_args,
        result: || {
            let item = closed(
                json!({
                    "sid": string(),
                    // "device" or "launch"; the spec states no enum.
                    "kind": string(),
                    "principal": string(),
                    "role": string(),
                    "client_id": string(),
                    "created_at": count(),
                    "expires_at": count_or_null(),
                    "approved_by": string(),
                    "name": string(),
                    "approved_rule": string(),
                }),
                &["sid", "kind", "principal", "role", "client_id", "created_at", "expires_at",
                  "approved_by"],
            );
            closed(json!({"sessions": array_of(item)}), &["sessions"])
        },
    },
    OpSpec {
        id: OpId::AuthSessionsRevoke,
        op: "auth.sessions.revoke",
        served_by: ServedBy::Core,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::TcpListener,
        listed: true,
        description: "Revoke one session by sid, every session of a name, or all of them",
        args: || {
            // As for `auth.device.deny`: `all` is `const: true` on the object itself.
            exactly_one_of(
                json!({"sid": non_empty(), "name": non_empty(), "all": yes()}),
                &[json!({"required": ["sid"]}), json!({"required": ["name"]}), all_alternative()],
            )
        },
        result: || closed(json!({"revoked": count()}), &["revoked"]),
    },
    OpSpec {
        id: OpId::InstanceResult,
        op: "_instance.result",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: false,
        description: "reserved: a mode: sync child's first result, recorded on the parent's handle",
        args: || {
            closed(
                json!({"handle": non_empty(), "status": any(), "output": any()}),
                &["handle"],
            )
        },
        result: || json!(false),
    },
    OpSpec {
        id: OpId::InstanceEmit,
        op: "_instance.emit",
        served_by: ServedBy::Host,
        reply: ReplyKind::Task,
        floor: Floor::Operator,
        defaults: NONE,
        gate: Gate::Always,
        listed: false,
        description: "reserved: one event of a child's mirror_streams stream, appended to the parent's stream",
        args: || {
            closed(
                json!({"handle": non_empty(), "stream": non_empty(), "event": object()}),
                &["handle", "stream", "event"],
            )
        },
        result: || json!(false),
    },
];

/// The op of this name, if the table has it (listed or reserved-and-served).
pub fn find(op: &str) -> Option<&'static OpSpec> {
    OPS.iter().find(|s| s.op == op)
}

/// The operator-only ops (the `Operator` floor, and the reserved `_instance.*` reports) that a
/// grant would name, in table order. A non-operator rule whose grant names any of them is a
/// load error. `*` names none: it means "every op this role may be granted", and the
/// operator-only ops are never granted ([`Floor::Operator`]), so it never reaches them.
pub fn operator_only_ops_granted_by(grant: &str) -> Vec<&'static str> {
    if grant == "*" {
        return Vec::new();
    }
    OPS.iter()
        .filter(|s| s.floor == Floor::Operator || s.op.starts_with(RESERVED_PREFIX))
        .filter(|s| crate::auth::grant_matches(grant, s.op))
        .map(|s| s.op)
        .collect()
}

/// Whether a name is reserved for agentd's own ops: every table row, the whole
/// `_instance.` prefix, and the never-served reserved names.
pub fn is_reserved(op: &str) -> bool {
    find(op).is_some() || op.starts_with(RESERVED_PREFIX) || RESERVED_UNSERVED.contains(&op)
}

/// The envelope schema of an op: its arguments plus `op` itself, first in `required`.
pub fn envelope(spec: &OpSpec) -> Value {
    let mut schema = (spec.args)();
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("op".into(), json!({"const": spec.op}));
    }
    let mut required = vec![json!("op")];
    if let Some(r) = schema.get("required").and_then(Value::as_array) {
        required.extend(r.iter().cloned());
    }
    schema["required"] = Value::Array(required);
    schema
}
