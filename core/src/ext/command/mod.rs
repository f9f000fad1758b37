//! The command extension: a command is a DataPart `{"agentd": {"op": …, …args}}` in a send,
//! run only when the header activates the command URI AND `message.extensions` lists it.
//! [`check`] runs the refusals in their order; nothing refused runs and no task is created.

mod duplicates;
pub mod table;

pub(crate) use self::duplicates::refuse_duplicate_members;

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use self::table::{Floor, Gate, OpSpec, ReplyKind, ServedBy, REMOVED_OPS, RESERVED_PREFIX};
use super::negotiate::ExtSet;
use super::registry::{Ext, COMMAND_URI};
use crate::a2a::types::{Message, PartContent, SendMessageConfiguration};
use crate::auth::{Principal, Role};
use crate::errors::{ErrorKind, FieldViolation, RpcError};

/// The DataPart key that carries a command.
pub const DATA_PART_KEY: &str = "agentd";

/// A command op a host registered for a workflow whose start step declares it.
#[derive(Clone, Debug)]
pub struct DeclaredCommand {
    /// The op name callers send; must not be a built-in or removed op.
    pub op: String,
    /// The workflow a command of this op starts.
    pub workflow: String,
    /// The arguments' JSON Schema (without `op`).
    pub schema: Value,
    /// Roles the start step admits.
    pub roles: Vec<Role>,
}

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// Built-in op names are reserved, so a workflow can never shadow an operator control.
    Reserved(String),
    /// Another declared command already has the name.
    Duplicate(String),
    /// The op name is empty.
    EmptyName,
    /// The arguments' schema does not compile: the validator's reason.
    InvalidSchema(String),
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegisterError::Reserved(op) => write!(f, "{op:?} is a built-in op name"),
            RegisterError::Duplicate(op) => write!(f, "{op:?} is already declared"),
            RegisterError::EmptyName => f.write_str("the op name is empty"),
            RegisterError::InvalidSchema(why) => {
                write!(f, "the arguments' schema is invalid: {why}")
            }
        }
    }
}

impl std::error::Error for RegisterError {}

/// The compiled validators of the declared commands. The built-in ops' validators come from
/// the static table, so one process-wide set serves every instance; it is compiled on the
/// first command, which keeps start-up time and idle memory down.
pub struct Commands {
    declared: HashMap<String, (DeclaredCommand, jsonschema::Validator)>,
}

fn builtin_validators() -> &'static HashMap<&'static str, jsonschema::Validator> {
    static BUILTIN: std::sync::OnceLock<HashMap<&'static str, jsonschema::Validator>> =
        std::sync::OnceLock::new();
    BUILTIN.get_or_init(|| {
        table::OPS
            .iter()
            .map(|spec| {
                let v = jsonschema::draft202012::new(&table::envelope(spec)).unwrap_or_else(|e| {
                    panic!("the op table's schema for {} is invalid: {e}", spec.op)
                });
                (spec.op, v)
            })
            .collect()
    })
}

impl Default for Commands {
    fn default() -> Self {
        Self::new()
    }
}

impl Commands {
    /// No declared command; the built-in ops need no registration.
    pub fn new() -> Self {
        Commands {
            declared: HashMap::new(),
        }
    }

    /// Registers a workflow-declared command.
    pub fn register(&mut self, decl: DeclaredCommand) -> Result<(), RegisterError> {
        if decl.op.is_empty() {
            return Err(RegisterError::EmptyName);
        }
        if table::is_reserved(&decl.op) || REMOVED_OPS.iter().any(|(op, _)| *op == decl.op) {
            return Err(RegisterError::Reserved(decl.op));
        }
        if self.declared.contains_key(&decl.op) {
            return Err(RegisterError::Duplicate(decl.op));
        }
        let v = jsonschema::draft202012::new(&decl.schema)
            .map_err(|e| RegisterError::InvalidSchema(e.to_string()))?;
        self.declared.insert(decl.op.clone(), (decl, v));
        Ok(())
    }

    pub(crate) fn declared(&self) -> impl Iterator<Item = &DeclaredCommand> {
        self.declared.values().map(|(d, _)| d)
    }
}

/// Where the instance stands on the switches that gate ops.
#[derive(Clone, Copy, Debug, Default)]
pub struct Switches {
    /// `a2a.introspection.enabled`: serves the introspection ops.
    pub introspection: bool,
    /// `a2a.device_grant.enabled`: serves the device sign-in ops.
    pub device_grant: bool,
    /// Whether the request came on a TCP listener (the session ops are served only there).
    pub tcp_listener: bool,
    /// The host-served ops the host declares ([`crate::host::HostCapabilities::ops`]).
    pub host_ops: crate::host::OpSet,
}

/// A command that passed every check.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The op name, as sent.
    pub op: String,
    /// The envelope without `op`.
    pub args: Map<String, Value>,
    /// Whether the answer is a message or a task.
    pub reply: ReplyKind,
    /// The built-in op, or `None` for a workflow-declared command.
    pub builtin: Option<&'static OpSpec>,
    /// The workflow a declared command starts.
    pub workflow: Option<String>,
}

/// Where a command message carries its envelope: `message.parts[<i>].data.agentd`, `i` the
/// first part with one (a message with more is refused before it runs).
pub(crate) fn envelope_path(message: &Message) -> String {
    let index = message
        .parts
        .iter()
        .position(|p| matches!(&p.content, PartContent::Data(Value::Object(m)) if m.contains_key(DATA_PART_KEY)))
        .unwrap_or(0);
    envelope_at(index)
}

fn envelope_at(index: usize) -> String {
    format!("message.parts[{index}].data.{DATA_PART_KEY}")
}

/// Checks a send for a command. `Ok(None)`: not a command, an ordinary message.
pub fn check(
    message: &Message,
    config: &SendMessageConfiguration,
    activated: ExtSet,
    principal: &Principal,
    commands: &Commands,
    switches: Switches,
) -> Result<Option<Checked>, RpcError> {
    let carriers: Vec<(usize, &Value)> = message
        .parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match &p.content {
            PartContent::Data(Value::Object(m)) => m.get(DATA_PART_KEY).map(|env| (i, env)),
            _ => None,
        })
        .collect();
    let Some(&(index, envelope)) = carriers.first() else {
        return Ok(None);
    };
    let at = envelope_at(index);
    if !activated.contains(Ext::Command) {
        return Err(refusal(
            ErrorKind::ExtensionNotActivated,
            format!("activate {COMMAND_URI} with the A2A-Extensions header to send a command"),
            &at,
        )
        .with_meta("extension", COMMAND_URI));
    }
    if !message.extensions.iter().any(|e| e == COMMAND_URI) {
        return Err(refusal(
            ErrorKind::ExtensionNotMarked,
            format!("a command message lists {COMMAND_URI} in message.extensions"),
            "message.extensions",
        )
        .with_meta("extension", COMMAND_URI));
    }
    if carriers.len() > 1 {
        return Err(refusal(
            ErrorKind::CommandEnvelopeAmbiguous,
            format!(
                "a message carries one command; this one carries {}",
                carriers.len()
            ),
            "message.parts",
        ));
    }
    let op = match envelope.get("op") {
        Some(Value::String(op)) if !op.is_empty() => op.clone(),
        _ => {
            return Err(refusal(
                ErrorKind::UnknownOp,
                "a command names its op: a non-empty string under \"op\"",
                &format!("{at}.op"),
            ))
        }
    };
    if !message.task_id.is_empty() {
        return Err(refusal(
            ErrorKind::CommandTaskId,
            format!("command \"{op}\" starts its own task; a command message cannot name a taskId"),
            "message.taskId",
        )
        .with_meta("op", &op));
    }
    if !config.accepted_output_modes.is_empty()
        && !config.accepted_output_modes.iter().any(|m| is_json(m))
    {
        return Err(refusal(
            ErrorKind::ContentTypeNotSupported,
            format!("command \"{op}\" answers with application/json, which acceptedOutputModes does not accept"),
            "configuration.acceptedOutputModes",
        )
        .with_meta("op", &op));
    }
    let Value::Object(envelope_map) = envelope else {
        return Err(
            refusal(ErrorKind::InvalidCommandArgs, "a command is an object", &at)
                .with_meta("op", &op),
        );
    };
    let mut args = envelope_map.clone();
    args.remove("op");
    // Clients built on protobuf's Struct send every number as a double (`42.0`). The schema
    // accepts an integral double as an integer; the host gets it as the integer it is.
    for v in args.values_mut() {
        integral_doubles_to_integers(v);
    }

    let (reply, builtin, workflow) = if let Some(spec) = table::find(&op) {
        validate(builtin_validators().get(spec.op), envelope, &op, &at)?;
        if spec.op == "auth.device.approve" {
            check_principal_name(&args, &op, &at)?;
        }
        if !may_command(principal, spec) {
            return Err(permission_denied(&op, principal));
        }
        // An op the host does not serve is refused now, as a closed switch is: it would
        // otherwise wait for an answer that never comes.
        if spec.served_by == ServedBy::Host && !switches.host_ops.contains(spec.id) {
            return Err(not_served(spec, &at));
        }
        match spec.gate {
            Gate::Always => {}
            Gate::Introspection if switches.introspection => {}
            Gate::Introspection => {
                return Err(RpcError::new(
                    ErrorKind::IntrospectionDisabled,
                    format!("command \"{op}\" needs a2a.introspection.enabled, which is off"),
                )
                .with_meta("op", &op))
            }
            Gate::DeviceGrant if switches.device_grant => {}
            Gate::TcpListener if switches.tcp_listener => {}
            Gate::DeviceGrant | Gate::TcpListener => return Err(unknown_op(&op, &at)),
        }
        (spec.reply, Some(spec), None)
    } else if let Some((decl, validator)) = commands.declared.get(&op) {
        validate(Some(validator), &Value::Object(args.clone()), &op, &at)?;
        let admitted = principal.is_operator()
            || (principal.role != Role::Anonymous
                && principal.granted(&op)
                && decl.roles.contains(&principal.role));
        if !admitted {
            return Err(permission_denied(&op, principal));
        }
        (ReplyKind::Task, None, Some(decl.workflow.clone()))
    } else {
        return Err(unknown_op(&op, &at));
    };
    Ok(Some(Checked {
        op,
        args,
        reply,
        builtin,
        workflow,
    }))
}

/// Whether the caller's role and grants reach a built-in op.
pub fn may_command(p: &Principal, spec: &OpSpec) -> bool {
    if p.role == Role::Anonymous {
        return false;
    }
    if spec.op.starts_with(RESERVED_PREFIX) {
        return p.is_operator();
    }
    match spec.floor {
        Floor::Operator => p.is_operator(),
        Floor::AnyNamed => true,
        Floor::Granted => p.is_operator() || spec.defaults.contains(&p.role) || p.granted(spec.op),
    }
}

fn refusal(kind: ErrorKind, message: impl Into<String>, field: &str) -> RpcError {
    let message = message.into();
    let mut e = RpcError::new(kind, message.clone());
    e.violations.push(FieldViolation {
        field: field.to_owned(),
        description: message,
    });
    e
}

fn unknown_op(op: &str, at: &str) -> RpcError {
    let hint = REMOVED_OPS
        .iter()
        .find(|(name, _)| *name == op)
        .map(|(_, hint)| format!(" (removed: {hint})"))
        .unwrap_or_default();
    refusal(
        ErrorKind::UnknownOp,
        format!("unknown command \"{op}\"{hint}"),
        &format!("{at}.op"),
    )
    .with_meta("op", op)
}

/// A built-in op this instance's host does not serve: `UNKNOWN_OP` for an op the card would
/// list (no op of that name is served here), `OP_NOT_SERVED` for a reserved report.
fn not_served(spec: &OpSpec, at: &str) -> RpcError {
    let op = spec.op;
    if !spec.listed {
        return RpcError::new(
            ErrorKind::OpNotServed,
            format!("command \"{op}\" is not served by this instance"),
        )
        .with_meta("op", op);
    }
    refusal(
        ErrorKind::UnknownOp,
        format!("unknown command \"{op}\": this instance does not serve it"),
        &format!("{at}.op"),
    )
    .with_meta("op", op)
}

fn permission_denied(op: &str, p: &Principal) -> RpcError {
    RpcError::new(
        ErrorKind::PermissionDenied,
        format!(
            "{} (role {}) may not run command \"{op}\"",
            p.id,
            p.role.as_str()
        ),
    )
    .with_meta("op", op)
}

fn validate(
    validator: Option<&jsonschema::Validator>,
    instance: &Value,
    op: &str,
    at: &str,
) -> Result<(), RpcError> {
    let Some(v) = validator else { return Ok(()) };
    let mut violations = Vec::new();
    for err in v.iter_errors(instance) {
        let base = json_pointer_to_field(at, &err.instance_path().to_string());
        match err.kind() {
            jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } => {
                for name in unexpected {
                    violations.push(FieldViolation {
                        field: format!("{base}.{name}"),
                        description: "is not an argument of this op".into(),
                    });
                }
            }
            jsonschema::error::ValidationErrorKind::Required { property } => {
                let name = property
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| property.to_string());
                violations.push(FieldViolation {
                    field: format!("{base}.{name}"),
                    description: "is required".into(),
                });
            }
            _ => violations.push(FieldViolation {
                field: base,
                description: err.to_string(),
            }),
        }
    }
    if violations.is_empty() {
        return Ok(());
    }
    let summary: Vec<String> = violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect();
    let mut e = RpcError::new(
        ErrorKind::InvalidCommandArgs,
        format!(
            "command \"{op}\" arguments do not match its schema: {}",
            summary.join("; ")
        ),
    )
    .with_meta("op", op);
    e.violations = violations;
    Err(e)
}

/// `/a/0/b` under `message.parts[0].data.agentd` → `message.parts[0].data.agentd.a.0.b`.
fn json_pointer_to_field(at: &str, pointer: &str) -> String {
    let mut field = at.to_owned();
    for seg in pointer.split('/').skip(1) {
        field.push('.');
        field.push_str(&seg.replace("~1", "/").replace("~0", "~"));
    }
    field
}

/// The `as` of `auth.device.approve`: a principal name agentd can mint.
fn check_principal_name(args: &Map<String, Value>, op: &str, at: &str) -> Result<(), RpcError> {
    const RESERVED: &[&str] = table::RESERVED_PRINCIPAL_NAMES;
    let Some(Value::String(name)) = args.get("as") else {
        return Ok(());
    };
    let ok = name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
        && !RESERVED.contains(&name.as_str());
    if ok {
        return Ok(());
    }
    let mut e = RpcError::new(
        ErrorKind::InvalidCommandArgs,
        format!("command \"{op}\" arguments do not match its schema: as must match ^[a-z0-9][a-z0-9._-]{{0,63}}$ and not be a reserved name"),
    )
    .with_meta("op", op);
    e.violations.push(FieldViolation {
        field: format!("{at}.as"),
        description: "must match ^[a-z0-9][a-z0-9._-]{0,63}$ and not be a reserved name".into(),
    });
    Err(e)
}

/// `application/json` in any case, with or without parameters.
fn is_json(media: &str) -> bool {
    media
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case("application/json")
}

/// The public card's command params: the vocabulary this instance serves (the ops the core
/// answers and those its host declares), whatever its switches say.
pub fn public_params(host: &crate::host::HostCapabilities) -> Value {
    let ops: Vec<Value> = table::OPS
        .iter()
        .filter(|s| s.listed && host.serves(s.id))
        .map(|s| json!({"op": s.op, "reply": s.reply.as_str()}))
        .collect();
    json!({
        "dataPartKey": DATA_PART_KEY,
        "schema": Ext::Command.schema_url(),
        "ops": ops,
    })
}

/// The reply Message of a message op: the result document as its one DataPart.
pub(crate) fn reply_message(message_id: String, context_id: String, result: Value) -> Message {
    let mut part = crate::a2a::types::Part::data(result);
    part.media_type = "application/json".into();
    Message {
        context_id,
        extensions: vec![COMMAND_URI.to_owned()],
        message_id,
        parts: vec![part],
        role: crate::a2a::types::Role::Agent,
        ..Message::default()
    }
}

/// Rewrites every integral floating-point number (`42.0`) as an integer (`42`), in place.
pub fn integral_doubles_to_integers(v: &mut Value) {
    match v {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64() {
                if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 {
                    *v = if f < 0.0 {
                        Value::from(f as i64)
                    } else {
                        Value::from(f as u64)
                    };
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(integral_doubles_to_integers),
        Value::Object(o) => o.values_mut().for_each(integral_doubles_to_integers),
        _ => {}
    }
}

#[cfg(test)]
mod integral_tests {
    use super::*;

    #[test]
    fn integral_doubles_become_integers_and_others_stay() {
        let mut v: Value =
            serde_json::from_str(r#"{"a": 42.0, "b": [-3.0, 2.5], "c": {"d": 1e3}, "e": "7.0"}"#)
                .unwrap();
        integral_doubles_to_integers(&mut v);
        assert_eq!(
            v.to_string(),
            r#"{"a":42,"b":[-3,2.5],"c":{"d":1000},"e":"7.0"}"#
        );
    }
}
