//! What the core asks of its host, typed: the command ops a host answers ([`Op`], one
//! variant per host-served row of the op table, with its arguments as fields) and what a
//! host declares it serves ([`HostCapabilities`]: its ops and the card's skills).
//!
//! An op the host does not declare is refused by the core at once (never handed out to wait
//! for an answer that will not come) and is not listed on the card.

use serde_json::{Map, Value};

use crate::a2a::card::AgentSkill;
use crate::errors::{ErrorKind, FieldViolation, RpcError};
use crate::ext::command::table::OpId;

/// A set of ops of the table.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct OpSet(u32);

// Every op has its bit.
const _: () = assert!(OpId::COUNT <= 32);

impl OpSet {
    /// No op.
    pub const EMPTY: OpSet = OpSet(0);

    /// Every op the table leaves to the host (every [`Op`] but [`Op::Declared`]).
    pub fn host_ops() -> OpSet {
        OpId::ALL
            .into_iter()
            .filter(|id| id.host_served())
            .collect()
    }

    /// Whether `id` is in the set.
    pub fn contains(self, id: OpId) -> bool {
        self.0 & (1 << id as u32) != 0
    }

    /// Adds `id`.
    pub(crate) fn insert(&mut self, id: OpId) {
        self.0 |= 1 << id as u32;
    }

    /// Removes `id`.
    pub(crate) fn remove(&mut self, id: OpId) {
        self.0 &= !(1 << id as u32);
    }

    /// The set without `id`.
    pub fn without(mut self, id: OpId) -> OpSet {
        self.remove(id);
        self
    }

    /// The ops in the set, in table order.
    pub fn iter(self) -> impl Iterator<Item = OpId> {
        OpId::ALL.into_iter().filter(move |id| self.contains(*id))
    }

    /// Whether the set holds no op (a host that serves none).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromIterator<OpId> for OpSet {
    fn from_iter<I: IntoIterator<Item = OpId>>(iter: I) -> Self {
        let mut set = OpSet::EMPTY;
        for id in iter {
            set.insert(id);
        }
        set
    }
}

impl std::fmt::Debug for OpSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter().map(OpId::name)).finish()
    }
}

/// What a host serves, declared in [`crate::InstanceConfig::host`].
///
/// - `ops`: the host-served ops
///   ([`ServedBy::Host`](crate::ext::command::table::ServedBy::Host)) it answers. The card's
///   command params list only these (beside the ops the core answers itself), and a command
///   naming any other is refused at once: `-32602 UNKNOWN_OP` for a listed op, as a closed
///   switch is, and `-32004 OP_NOT_SERVED` for a reserved `_instance.*` report. Core-served
///   ops in the set change nothing: the core always answers them. Workflow-declared commands
///   are served by registering them ([`crate::Instance::register_command`]).
/// - `skills`: the card's `skills`, in this order (the extended card adds the workflows the
///   caller may run after them). Command ops are never skills.
///
/// The default serves no op and lists no skill: a host says what it does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostCapabilities {
    /// The host-served ops the host answers; any other host-served op is refused at once.
    pub ops: OpSet,
    /// The card's skills, in the order they are listed.
    pub skills: Vec<AgentSkill>,
}

impl HostCapabilities {
    /// A host that answers `ops` and lists `skills` on the card.
    pub fn new(ops: impl IntoIterator<Item = OpId>, skills: Vec<AgentSkill>) -> Self {
        HostCapabilities {
            ops: ops.into_iter().collect(),
            skills,
        }
    }

    /// Whether a command of this op is answered on this instance (by the core or the host).
    pub(crate) fn serves(&self, id: OpId) -> bool {
        !id.host_served() || self.ops.contains(id)
    }
}

/// A path `admin.set` changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettablePath {
    /// `agent.approval`.
    AgentApproval,
    /// `a2a.introspection.enabled`.
    IntrospectionEnabled,
}

impl SettablePath {
    /// The dotted configuration path as `admin.set` names it (and the audit log records it).
    pub fn as_str(self) -> &'static str {
        match self {
            SettablePath::AgentApproval => "agent.approval",
            SettablePath::IntrospectionEnabled => "a2a.introspection.enabled",
        }
    }

    pub(crate) fn parse(path: &str) -> Option<SettablePath> {
        [
            SettablePath::AgentApproval,
            SettablePath::IntrospectionEnabled,
        ]
        .into_iter()
        .find(|p| p.as_str() == path)
    }
}

/// A command the host runs: the op and its arguments, checked against the op's schema
/// before the host sees them. One variant per host-served row of the op table (the doc of
/// each names it), plus [`Op::Declared`] for a workflow-declared command. New ops may be
/// added: a host refuses one it does not know with `OP_NOT_SERVED` (it cannot receive one
/// it did not declare).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// `workflow.run`.
    WorkflowRun {
        /// The workflow to start.
        workflow: String,
        /// Its inputs, as sent; the host checks them against the workflow's.
        inputs: Option<Map<String, Value>>,
    },
    /// `workflow.status`: one run, or every run the caller may see.
    WorkflowStatus {
        /// The run to report; `None` for every run the caller may see.
        run: Option<String>,
    },
    /// `workflow.cancel`.
    WorkflowCancel {
        /// The run to cancel.
        run: String,
    },
    /// `workflow.signal`: to one run, or every waiter the caller owns.
    WorkflowSignal {
        /// The signal's name, as a waiting step names it.
        name: String,
        /// What the signal carries to the waiter.
        payload: Option<Value>,
        /// The run to signal; `None` for every waiter the caller owns.
        run: Option<String>,
    },
    /// `subagent.send`.
    SubagentSend {
        /// The subagent, by the handle its spawn returned.
        handle: String,
        /// The text to send it.
        message: String,
    },
    /// `subagent.kill`.
    SubagentKill {
        /// The subagent, by the handle its spawn returned.
        handle: String,
        /// Why, as the caller gave it.
        reason: Option<String>,
    },
    /// `subagent.status`.
    SubagentStatus {
        /// The subagent, by the handle its spawn returned.
        handle: String,
    },
    /// `plan.get`: the conversation as the caller names it; the root one without.
    PlanGet {
        /// The conversation; `None` for the root one.
        id: Option<String>,
    },
    /// `conversation.get`.
    ConversationGet {
        /// The conversation.
        id: String,
        /// At most this many of its latest entries; the host's bound without.
        limit: Option<u64>,
    },
    /// `run.get`.
    RunGet {
        /// The run.
        run: String,
    },
    /// `subagent.get`.
    SubagentGet {
        /// The subagent, by the handle its spawn returned.
        handle: String,
    },
    /// `debug.events`.
    DebugEvents {
        /// Only lines after this sequence number (an earlier answer's `newest_seq`).
        after: Option<u64>,
        /// At most this many lines; the host's bound without.
        limit: Option<u64>,
        /// A level filter, as the host's log ring names levels.
        level: Option<String>,
        /// A prefix filter on the lines, as the host's log ring applies it.
        prefix: Option<String>,
    },
    /// `admin.drain`.
    AdminDrain {
        /// Why, as the caller gave it.
        reason: Option<String>,
    },
    /// `admin.pause`: one run, or the instance without.
    AdminPause {
        /// The run to pause; `None` pauses the instance.
        run: Option<String>,
        /// Why, as the caller gave it.
        reason: Option<String>,
    },
    /// `admin.resume`: one run, or the instance without.
    AdminResume {
        /// The run to resume; `None` resumes the instance.
        run: Option<String>,
    },
    /// `admin.cancel`.
    AdminCancel {
        /// The run to cancel.
        run: String,
        /// Why, as the caller gave it.
        reason: Option<String>,
    },
    /// `admin.set`: `value` as sent; the host parses it with the path's own type.
    AdminSet {
        /// The setting to change.
        path: SettablePath,
        /// Its new value, unparsed.
        value: Value,
    },
    /// `_instance.result` (reserved).
    InstanceResult {
        /// The handle the reporting child was started under, on its parent.
        handle: String,
        /// Its status, as it reports it.
        status: Option<Value>,
        /// Its output, as it reports it.
        output: Option<Value>,
    },
    /// `_instance.emit` (reserved).
    InstanceEmit {
        /// The handle the emitting child was started under, on its parent.
        handle: String,
        /// The stream the event belongs to.
        stream: String,
        /// The event itself.
        event: Map<String, Value>,
    },
    /// A workflow-declared command: starts `workflow` with `args` as its inputs.
    Declared {
        /// The command's op name, as the workflow declared it.
        op: String,
        /// The workflow the command starts.
        workflow: String,
        /// The command's arguments, checked against the declared schema.
        args: Map<String, Value>,
    },
}

impl Op {
    /// The op's row of the table; `None` for a workflow-declared command.
    pub fn id(&self) -> Option<OpId> {
        Some(match self {
            Op::WorkflowRun { .. } => OpId::WorkflowRun,
            Op::WorkflowStatus { .. } => OpId::WorkflowStatus,
            Op::WorkflowCancel { .. } => OpId::WorkflowCancel,
            Op::WorkflowSignal { .. } => OpId::WorkflowSignal,
            Op::SubagentSend { .. } => OpId::SubagentSend,
            Op::SubagentKill { .. } => OpId::SubagentKill,
            Op::SubagentStatus { .. } => OpId::SubagentStatus,
            Op::PlanGet { .. } => OpId::PlanGet,
            Op::ConversationGet { .. } => OpId::ConversationGet,
            Op::RunGet { .. } => OpId::RunGet,
            Op::SubagentGet { .. } => OpId::SubagentGet,
            Op::DebugEvents { .. } => OpId::DebugEvents,
            Op::AdminDrain { .. } => OpId::AdminDrain,
            Op::AdminPause { .. } => OpId::AdminPause,
            Op::AdminResume { .. } => OpId::AdminResume,
            Op::AdminCancel { .. } => OpId::AdminCancel,
            Op::AdminSet { .. } => OpId::AdminSet,
            Op::InstanceResult { .. } => OpId::InstanceResult,
            Op::InstanceEmit { .. } => OpId::InstanceEmit,
            Op::Declared { .. } => return None,
        })
    }

    /// The op's name on the wire.
    pub fn name(&self) -> &str {
        match (self, self.id()) {
            (Op::Declared { op, .. }, _) => op,
            (_, Some(id)) => id.name(),
            (_, None) => "",
        }
    }

    /// The typed op of a host-served built-in op, from its arguments (the envelope without
    /// `op`, already checked against the op's schema). `at` is where the envelope sits in
    /// the request, for the field of a refusal. A core-served op is no host op:
    /// `OP_NOT_SERVED`.
    pub(crate) fn parse(id: OpId, args: &Map<String, Value>, at: &str) -> Result<Op, RpcError> {
        let a = Args { id, args, at };
        Ok(match id {
            OpId::WorkflowRun => Op::WorkflowRun {
                workflow: a.string("workflow")?,
                inputs: a.opt_object("inputs")?,
            },
            OpId::WorkflowStatus => Op::WorkflowStatus {
                run: a.opt_string("run")?,
            },
            OpId::WorkflowCancel => Op::WorkflowCancel {
                run: a.string("run")?,
            },
            OpId::WorkflowSignal => Op::WorkflowSignal {
                name: a.string("name")?,
                payload: args.get("payload").cloned(),
                run: a.opt_string("run")?,
            },
            OpId::SubagentSend => Op::SubagentSend {
                handle: a.string("handle")?,
                message: a.string("message")?,
            },
            OpId::SubagentKill => Op::SubagentKill {
                handle: a.string("handle")?,
                reason: a.opt_string("reason")?,
            },
            OpId::SubagentStatus => Op::SubagentStatus {
                handle: a.string("handle")?,
            },
            OpId::PlanGet => Op::PlanGet {
                id: a.opt_string("id")?,
            },
            OpId::ConversationGet => Op::ConversationGet {
                id: a.string("id")?,
                limit: a.opt_count("limit")?,
            },
            OpId::RunGet => Op::RunGet {
                run: a.string("run")?,
            },
            OpId::SubagentGet => Op::SubagentGet {
                handle: a.string("handle")?,
            },
            OpId::DebugEvents => Op::DebugEvents {
                after: a.opt_count("after")?,
                limit: a.opt_count("limit")?,
                level: a.opt_string("level")?,
                prefix: a.opt_string("prefix")?,
            },
            OpId::AdminDrain => Op::AdminDrain {
                reason: a.opt_string("reason")?,
            },
            OpId::AdminPause => Op::AdminPause {
                run: a.opt_string("run")?,
                reason: a.opt_string("reason")?,
            },
            OpId::AdminResume => Op::AdminResume {
                run: a.opt_string("run")?,
            },
            OpId::AdminCancel => Op::AdminCancel {
                run: a.string("run")?,
                reason: a.opt_string("reason")?,
            },
            OpId::AdminSet => Op::AdminSet {
                path: SettablePath::parse(&a.string("path")?)
                    .ok_or_else(|| a.refuse("path", "is not a settable path"))?,
                value: args.get("value").cloned().unwrap_or(Value::Null),
            },
            OpId::InstanceResult => Op::InstanceResult {
                handle: a.string("handle")?,
                status: args.get("status").cloned(),
                output: args.get("output").cloned(),
            },
            OpId::InstanceEmit => Op::InstanceEmit {
                handle: a.string("handle")?,
                stream: a.string("stream")?,
                event: a.opt_object("event")?.unwrap_or_default(),
            },
            OpId::Status
            | OpId::Config
            | OpId::AuthDevicePending
            | OpId::AuthDeviceApprove
            | OpId::AuthDeviceDeny
            | OpId::AuthSessions
            | OpId::AuthSessionsRevoke => {
                return Err(RpcError::new(
                    ErrorKind::OpNotServed,
                    format!("command \"{}\" is answered by the core", id.name()),
                )
                .with_meta("op", id.name()))
            }
        })
    }
}

/// Reads the checked arguments of one op. The schema already held them to their types, so
/// a refusal here means the schema and this reading disagree: it is still a typed refusal,
/// never a panic.
struct Args<'a> {
    id: OpId,
    args: &'a Map<String, Value>,
    at: &'a str,
}

impl Args<'_> {
    fn refuse(&self, name: &str, why: &str) -> RpcError {
        let op = self.id.name();
        let mut e = RpcError::new(
            ErrorKind::InvalidCommandArgs,
            format!("command \"{op}\" arguments do not match its schema: {name} {why}"),
        )
        .with_meta("op", op);
        e.violations.push(FieldViolation {
            field: format!("{}.{name}", self.at),
            description: why.to_owned(),
        });
        e
    }

    fn opt_string(&self, name: &str) -> Result<Option<String>, RpcError> {
        match self.args.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.refuse(name, "is not a string")),
        }
    }

    fn string(&self, name: &str) -> Result<String, RpcError> {
        self.opt_string(name)?
            .ok_or_else(|| self.refuse(name, "is required"))
    }

    fn opt_count(&self, name: &str) -> Result<Option<u64>, RpcError> {
        match self.args.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.refuse(name, "is not a count")),
        }
    }

    fn opt_object(&self, name: &str) -> Result<Option<Map<String, Value>>, RpcError> {
        match self.args.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m.clone())),
            Some(_) => Err(self.refuse(name, "is not an object")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_host_op_has_its_variant_and_its_name() {
        for id in OpSet::host_ops().iter() {
            // The smallest arguments the op's schema admits.
            let args = match id {
                OpId::WorkflowRun => json!({"workflow": "w"}),
                OpId::WorkflowCancel | OpId::RunGet | OpId::AdminCancel => json!({"run": "r"}),
                OpId::WorkflowSignal => json!({"name": "n"}),
                OpId::SubagentSend => json!({"handle": "h", "message": "m"}),
                OpId::SubagentKill
                | OpId::SubagentStatus
                | OpId::SubagentGet
                | OpId::InstanceResult => json!({"handle": "h"}),
                OpId::ConversationGet => json!({"id": "c"}),
                OpId::AdminSet => json!({"path": "agent.approval", "value": "ask"}),
                OpId::InstanceEmit => json!({"handle": "h", "stream": "s", "event": {}}),
                _ => json!({}),
            };
            let Value::Object(args) = args else {
                unreachable!()
            };
            let op = Op::parse(id, &args, "at").unwrap_or_else(|e| panic!("{id:?}: {e:?}"));
            assert_eq!(op.id(), Some(id));
            assert_eq!(op.name(), id.name());
        }
        assert_eq!(OpSet::host_ops().iter().count(), 19);
    }

    #[test]
    fn core_ops_are_no_host_ops() {
        for id in OpId::ALL.into_iter().filter(|id| !id.host_served()) {
            let e = Op::parse(id, &Map::new(), "at").unwrap_err();
            assert_eq!(e.kind, ErrorKind::OpNotServed);
        }
    }

    #[test]
    fn a_mistyped_argument_is_a_typed_refusal() {
        let Value::Object(args) = json!({"run": 7}) else {
            unreachable!()
        };
        let e = Op::parse(OpId::WorkflowCancel, &args, "message.parts[0].data.agentd").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidCommandArgs);
        assert_eq!(e.violations[0].field, "message.parts[0].data.agentd.run");
    }

    #[test]
    fn settable_paths_are_the_tables() {
        let ours = [
            SettablePath::AgentApproval,
            SettablePath::IntrospectionEnabled,
        ]
        .map(SettablePath::as_str);
        assert_eq!(ours, crate::ext::command::table::SETTABLE_PATHS);
        for p in ours {
            assert_eq!(SettablePath::parse(p).map(SettablePath::as_str), Some(p));
        }
        assert_eq!(SettablePath::parse("agent.model"), None);
    }

    #[test]
    fn op_sets() {
        let set: OpSet = [OpId::RunGet, OpId::WorkflowRun].into_iter().collect();
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [OpId::WorkflowRun, OpId::RunGet]
        );
        assert!(set.contains(OpId::RunGet) && !set.contains(OpId::Status));
        assert!(!set.without(OpId::RunGet).contains(OpId::RunGet));
        assert_eq!(format!("{set:?}"), r#"{"workflow.run", "run.get"}"#);
        let caps = HostCapabilities::new([OpId::WorkflowRun], Vec::new());
        assert!(caps.serves(OpId::Status), "the core answers status");
        assert!(caps.serves(OpId::WorkflowRun));
        assert!(!caps.serves(OpId::RunGet));
    }
}
