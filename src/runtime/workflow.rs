//! Workflows: named step graphs from the configuration file, checked at load, and the
//! templates their steps fill from a run's inputs and earlier outputs.
//!
//! ```toml
//! [[workflows]]
//! name = "release"
//! description = "Build, ask a person, ship"
//!
//! [[workflows.steps]]          # the start: declares the `release.start` command op
//! id = "start"
//! kind = "a2a"
//! command = "release.start"
//! roles = ["user"]
//! schema = { type = "object", properties = { tag = { type = "string" } }, required = ["tag"] }
//!
//! [[workflows.steps]]
//! id = "build"
//! kind = "exec"
//! program = "/bin/echo"
//! args = ["built", "{{steps.start.output.args.tag}}"]
//! timeout_ms = 30000
//!
//! [[workflows.steps]]
//! id = "approve"
//! kind = "human"
//! prompt = "Ship {{inputs.tag}}?"
//! schema = { type = "object", properties = { approve = { type = "boolean" } }, required = ["approve"] }
//! ```
//!
//! Steps run in list order unless a step names its `next` (a step id, or `end`). Every
//! edge must land on a step, the graph must be free of cycles (so every run ends), and every
//! `{{…}}` must name `inputs`, `run` or a step that exists; each mistake is a load error
//! naming the file and line.

use std::collections::{BTreeMap, HashMap};

use agentd_core::auth::Role;
use serde::Deserialize;
use serde_json::Value;

/// The step kinds, as written in `kind =`.
pub const STEP_KINDS: [&str; 6] = ["a2a", "exec", "human", "signal", "a2a.send", "a2a.delegate"];

/// `[[workflows]]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowDef {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of `workflow.run`'s `inputs`.
    pub inputs: Option<Value>,
    pub steps: Vec<toml::Spanned<StepDef>>,
}

/// `[[workflows.steps]]` as written: one flat table, checked per kind.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDef {
    pub id: String,
    pub kind: String,
    /// The step after this one: a step id, or `end`. Default: the next in the list.
    pub next: Option<String>,
    /// `a2a`: the command op the start declares. `a2a.delegate`: the op sent to the peer.
    pub command: Option<String>,
    /// `a2a`: the roles that may send the command.
    pub roles: Option<Vec<String>>,
    /// `a2a`: the command's argument schema. `human`: the answer's schema (`askSchema`).
    pub schema: Option<Value>,
    /// `exec`: the program to run (no shell).
    pub program: Option<String>,
    /// `exec`: its arguments (templates). `a2a.delegate`: the command's arguments.
    pub args: Option<Value>,
    /// `exec`, `signal`, `a2a.send`, `a2a.delegate`: how long the step may take, in ms
    /// (default [`DEFAULT_STEP_TIMEOUT_MS`], a signal none; 1 to
    /// [`crate::config::MAX_TIMEOUT_MS`], a day). The runtime adds it to a clock (an
    /// `Instant`, or the monotonic ms of a signal's wait), which the bound keeps from
    /// overflowing.
    pub timeout_ms: Option<u64>,
    /// `exec`: extra environment variables (templates).
    pub env: Option<BTreeMap<String, String>>,
    /// `exec`: how stdout becomes the output: `auto` (JSON when it parses), `json`, `text`.
    pub output: Option<String>,
    /// `human`: the question (a template).
    pub prompt: Option<String>,
    /// `human`: where the question is announced (`askChannel`).
    pub channel: Option<String>,
    /// `signal`: the signal name `workflow.signal` delivers.
    pub signal: Option<String>,
    /// `a2a.send` / `a2a.delegate`: the peer, by its `[[a2a.peers]]` name.
    pub peer: Option<String>,
    /// `a2a.send`: the message text (a template).
    pub text: Option<String>,
    /// `a2a.delegate`: the objective sent as a message (a template), instead of a command.
    pub objective: Option<String>,
}

/// How an exec step's stdout becomes its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputMode {
    Auto,
    Json,
    Text,
}

/// What a delegate step asks of its peer.
#[derive(Clone, Debug, PartialEq)]
pub enum DelegateTarget {
    Objective(String),
    Command { op: String, args: Value },
}

/// A checked step.
#[derive(Clone, Debug, PartialEq)]
pub enum StepKind {
    /// The `a2a` start: its output is `{args: <the command's arguments or the inputs>}`.
    Start,
    Exec {
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        timeout_ms: u64,
        output: OutputMode,
    },
    Human {
        prompt: String,
        schema: Option<Value>,
        channel: Option<String>,
    },
    Signal {
        name: String,
        timeout_ms: Option<u64>,
    },
    Send {
        peer: String,
        text: String,
        timeout_ms: u64,
    },
    Delegate {
        peer: String,
        target: DelegateTarget,
        timeout_ms: u64,
    },
}

impl StepKind {
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Start => "a2a",
            StepKind::Exec { .. } => "exec",
            StepKind::Human { .. } => "human",
            StepKind::Signal { .. } => "signal",
            StepKind::Send { .. } => "a2a.send",
            StepKind::Delegate { .. } => "a2a.delegate",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub id: String,
    pub kind: StepKind,
    /// Index of the next step; `None` ends the run.
    pub next: Option<usize>,
}

/// The command a workflow's start declares.
#[derive(Clone, Debug, PartialEq)]
pub struct StartCommand {
    pub op: String,
    pub roles: Vec<Role>,
    pub schema: Option<Value>,
}

/// A checked workflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Workflow {
    pub name: String,
    pub description: String,
    pub inputs_schema: Option<Value>,
    pub command: Option<StartCommand>,
    pub steps: Vec<Step>,
}

impl Workflow {
    /// The `status.workflows` item.
    pub fn status_doc(&self) -> Value {
        let mut doc = serde_json::json!({
            "name": self.name,
            "description": self.description,
            "steps": self.steps.len(),
        });
        if let Some(c) = &self.command {
            doc["command"] = Value::String(c.op.clone());
        }
        doc
    }

    pub fn roles(&self) -> Vec<Role> {
        self.command
            .as_ref()
            .map(|c| c.roles.clone())
            .unwrap_or_default()
    }
}

/// Default time an exec or peer step may take, in ms (inside the range a step's `timeout_ms`
/// is held to, 1 to [`crate::config::MAX_TIMEOUT_MS`]).
pub const DEFAULT_STEP_TIMEOUT_MS: u64 = 120_000;
const _: () = assert!(DEFAULT_STEP_TIMEOUT_MS <= crate::config::MAX_TIMEOUT_MS);

/// Checks every workflow. `source` is the file's text and `file` its name, for `file:line`
/// in errors; `peers` are the configured peer names.
pub fn check_all(
    defs: &[toml::Spanned<WorkflowDef>],
    peers: &[String],
    file: &str,
    source: &str,
) -> Result<Vec<Workflow>, String> {
    let mut out: Vec<Workflow> = Vec::with_capacity(defs.len());
    let mut commands: HashMap<String, String> = HashMap::new();
    for def in defs {
        let at = |span: std::ops::Range<usize>| format!("{file}:{}", line_of(source, span.start));
        let w = check_one(def.get_ref(), peers, &|span| at(span), at(def.span()))?;
        if out.iter().any(|o| o.name == w.name) {
            return Err(format!(
                "{}: workflow {:?} is defined twice",
                at(def.span()),
                w.name
            ));
        }
        if let Some(c) = &w.command {
            if let Some(other) = commands.insert(c.op.clone(), w.name.clone()) {
                return Err(format!(
                    "{}: workflow {:?} declares command {:?}, which workflow {other:?} declares too",
                    at(def.span()),
                    w.name,
                    c.op
                ));
            }
        }
        out.push(w);
    }
    Ok(out)
}

fn line_of(source: &str, offset: usize) -> usize {
    source
        .as_bytes()
        .iter()
        .take(offset)
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

fn check_one(
    def: &WorkflowDef,
    peers: &[String],
    at: &dyn Fn(std::ops::Range<usize>) -> String,
    here: String,
) -> Result<Workflow, String> {
    if !valid_name(&def.name) {
        return Err(format!(
            "{here}: workflow name {:?} must match [a-zA-Z0-9][a-zA-Z0-9._-]{{0,63}}",
            def.name
        ));
    }
    let wf = format!("workflow {:?}", def.name);
    if def.steps.is_empty() {
        return Err(format!("{here}: {wf} has no steps"));
    }
    if let Some(schema) = &def.inputs {
        check_schema(schema).map_err(|e| format!("{here}: {wf}: inputs: {e}"))?;
    }
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, s) in def.steps.iter().enumerate() {
        let step = s.get_ref();
        if !valid_name(&step.id) || step.id == "end" {
            return Err(format!(
                "{}: {wf}: step id {:?} must match [a-zA-Z0-9][a-zA-Z0-9._-]{{0,63}} and not be \"end\"",
                at(s.span()),
                step.id
            ));
        }
        if index.insert(&step.id, i).is_some() {
            return Err(format!(
                "{}: {wf}: step id {:?} is used twice",
                at(s.span()),
                step.id
            ));
        }
    }
    let mut steps = Vec::with_capacity(def.steps.len());
    let mut command = None;
    for (i, s) in def.steps.iter().enumerate() {
        let d = s.get_ref();
        let where_ = format!("{}: {wf} step {:?}", at(s.span()), d.id);
        let kind =
            check_step(d, i, peers, &index, &mut command).map_err(|e| format!("{where_}: {e}"))?;
        let next = match d.next.as_deref() {
            None => (i + 1 < def.steps.len()).then_some(i + 1),
            Some("end") => None,
            Some(id) => Some(*index.get(id).ok_or_else(|| {
                format!("{where_}: next names {id:?}, which is not a step of this workflow")
            })?),
        };
        steps.push(Step {
            id: d.id.clone(),
            kind,
            next,
        });
    }
    // Every run must end: the graph of `next` edges has no cycle. Each step has at most one
    // successor, so walking from each step either ends or revisits a step.
    for start in 0..steps.len() {
        let mut seen = vec![false; steps.len()];
        let mut at_step = Some(start);
        while let Some(i) = at_step {
            if seen[i] {
                return Err(format!(
                    "{}: {wf}: the steps loop back to {:?}; a workflow must end",
                    at(def.steps[i].span()),
                    steps[i].id
                ));
            }
            seen[i] = true;
            at_step = steps[i].next;
        }
    }
    Ok(Workflow {
        name: def.name.clone(),
        description: def.description.clone(),
        inputs_schema: def.inputs.clone(),
        command,
        steps,
    })
}

fn check_step(
    d: &StepDef,
    index_in_list: usize,
    peers: &[String],
    ids: &HashMap<&str, usize>,
    command: &mut Option<StartCommand>,
) -> Result<StepKind, String> {
    // Which fields each kind takes; any other field set is a mistake worth an error.
    let allowed: &[&str] = match d.kind.as_str() {
        "a2a" => &["command", "roles", "schema"],
        "exec" => &["program", "args", "timeout_ms", "env", "output"],
        "human" => &["prompt", "schema", "channel"],
        "signal" => &["signal", "timeout_ms"],
        "a2a.send" => &["peer", "text", "timeout_ms"],
        "a2a.delegate" => &["peer", "objective", "command", "args", "timeout_ms"],
        other => {
            return Err(format!(
                "unknown step kind {other:?}; the kinds are {}",
                STEP_KINDS.join(", ")
            ))
        }
    };
    let set: [(&str, bool); 13] = [
        ("command", d.command.is_some()),
        ("roles", d.roles.is_some()),
        ("schema", d.schema.is_some()),
        ("program", d.program.is_some()),
        ("args", d.args.is_some()),
        ("timeout_ms", d.timeout_ms.is_some()),
        ("env", d.env.is_some()),
        ("output", d.output.is_some()),
        ("prompt", d.prompt.is_some()),
        ("channel", d.channel.is_some()),
        ("signal", d.signal.is_some()),
        ("peer", d.peer.is_some()),
        (
            "text",
            d.text.is_some() || d.objective.is_some() && !allowed.contains(&"objective"),
        ),
    ];
    for (field, present) in set {
        if present && !allowed.contains(&field) {
            return Err(format!("a {} step does not take {field}", d.kind));
        }
    }
    if d.objective.is_some() && !allowed.contains(&"objective") {
        return Err(format!("a {} step does not take objective", d.kind));
    }
    if let Some(ms) = d.timeout_ms {
        crate::config::in_range("timeout_ms", ms, 1, crate::config::MAX_TIMEOUT_MS)?;
    }
    let templates = |t: &str| check_template(t, ids);
    let peer = |p: &Option<String>| -> Result<String, String> {
        let p = p.clone().ok_or("needs peer")?;
        if !peers.contains(&p) {
            return Err(format!(
                "peer {p:?} is not one of [[a2a.peers]] ({})",
                if peers.is_empty() {
                    "none are configured".to_owned()
                } else {
                    peers.join(", ")
                }
            ));
        }
        Ok(p)
    };
    Ok(match d.kind.as_str() {
        "a2a" => {
            if index_in_list != 0 {
                return Err("an a2a start step must be the first step".into());
            }
            if let Some(op) = &d.command {
                check_command_name(op)?;
                let mut roles = Vec::new();
                for r in d.roles.iter().flatten() {
                    roles.push(match r.as_str() {
                        "operator" => Role::Operator,
                        "user" => Role::User,
                        "agent" => Role::Agent,
                        other => {
                            return Err(format!(
                                "roles: {other:?} is not a role that may send commands (operator, user, agent)"
                            ))
                        }
                    });
                }
                if let Some(schema) = &d.schema {
                    check_schema(schema).map_err(|e| format!("schema: {e}"))?;
                    if schema.get("type").and_then(Value::as_str) != Some("object") {
                        return Err("schema: a command's arguments are an object, so the schema needs type = \"object\"".into());
                    }
                }
                *command = Some(StartCommand {
                    op: op.clone(),
                    roles,
                    schema: d.schema.clone(),
                });
            } else if d.roles.is_some() || d.schema.is_some() {
                return Err(
                    "roles and schema describe the start's command; name it with command".into(),
                );
            }
            StepKind::Start
        }
        "exec" => {
            let program = d.program.clone().ok_or("needs program")?;
            if program.is_empty() {
                return Err("program is empty".into());
            }
            let args = match &d.args {
                None => Vec::new(),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|a| {
                        a.as_str()
                            .map(str::to_owned)
                            .ok_or("args: every argument is a string")
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => return Err("args: a list of strings".into()),
            };
            for a in &args {
                templates(a)?;
            }
            let env: Vec<(String, String)> =
                d.env.clone().unwrap_or_default().into_iter().collect();
            for (_, v) in &env {
                templates(v)?;
            }
            let output = match d.output.as_deref() {
                None | Some("auto") => OutputMode::Auto,
                Some("json") => OutputMode::Json,
                Some("text") => OutputMode::Text,
                Some(o) => return Err(format!("output: {o:?} is not auto, json or text")),
            };
            StepKind::Exec {
                program,
                args,
                env,
                timeout_ms: d.timeout_ms.unwrap_or(DEFAULT_STEP_TIMEOUT_MS),
                output,
            }
        }
        "human" => {
            let prompt = d
                .prompt
                .clone()
                .ok_or("needs prompt: the question a person answers")?;
            templates(&prompt)?;
            if let Some(schema) = &d.schema {
                check_schema(schema).map_err(|e| format!("schema: {e}"))?;
            }
            StepKind::Human {
                prompt,
                schema: d.schema.clone(),
                channel: d.channel.clone(),
            }
        }
        "signal" => StepKind::Signal {
            name: d
                .signal
                .clone()
                .filter(|s| !s.is_empty())
                .ok_or("needs signal: the name workflow.signal delivers")?,
            timeout_ms: d.timeout_ms,
        },
        "a2a.send" => {
            let text = d.text.clone().ok_or("needs text")?;
            templates(&text)?;
            StepKind::Send {
                peer: peer(&d.peer)?,
                text,
                timeout_ms: d.timeout_ms.unwrap_or(DEFAULT_STEP_TIMEOUT_MS),
            }
        }
        "a2a.delegate" => {
            let target = match (&d.objective, &d.command) {
                (Some(o), None) => {
                    if d.args.is_some() {
                        return Err("args go with command, not objective".into());
                    }
                    templates(o)?;
                    DelegateTarget::Objective(o.clone())
                }
                (None, Some(op)) => {
                    if op.is_empty() {
                        return Err("command is empty".into());
                    }
                    let args = d.args.clone().unwrap_or(Value::Object(Default::default()));
                    if !args.is_object() {
                        return Err("args: the command's arguments are a table".into());
                    }
                    for t in strings_in(&args) {
                        templates(t)?;
                    }
                    DelegateTarget::Command {
                        op: op.clone(),
                        args,
                    }
                }
                _ => return Err("needs exactly one of objective or command".into()),
            };
            StepKind::Delegate {
                peer: peer(&d.peer)?,
                target,
                timeout_ms: d.timeout_ms.unwrap_or(DEFAULT_STEP_TIMEOUT_MS),
            }
        }
        _ => unreachable!("kinds checked above"),
    })
}

fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// A declared command may not take a reserved name: every op of the table, the whole
/// `_instance.` prefix, `ask_human` and the removed names.
fn check_command_name(op: &str) -> Result<(), String> {
    if op.is_empty() {
        return Err("command is empty".into());
    }
    use agentd_core::ext::command::table::{is_reserved, REMOVED_OPS};
    if is_reserved(op) {
        return Err(format!(
            "command {op:?} is a reserved op name; a workflow cannot declare it"
        ));
    }
    // The core refuses to register a removed name too (it would shadow the hint UNKNOWN_OP
    // gives); found by the `config_file` fuzz target, where such a file passed these checks
    // and then failed at registration without its file and line.
    if let Some((_, hint)) = REMOVED_OPS.iter().find(|(name, _)| *name == op) {
        return Err(format!(
            "command {op:?} is a removed op name ({hint}); a workflow cannot declare it"
        ));
    }
    Ok(())
}

fn check_schema(schema: &Value) -> Result<(), String> {
    jsonschema::draft202012::new(schema)
        .map(|_| ())
        .map_err(|e| format!("not a valid JSON Schema: {e}"))
}

fn strings_in(v: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(v, &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// Templates: `{{ path }}` where path is `inputs.a.b`, `run.id`, `run.workflow`,
// `run.principal` or `steps.<id>.output.a.b`. Array items are addressed by index (`.0`).

/// The `{{…}}` expressions in a template, or why it is malformed.
fn expressions(t: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("template {t:?} opens {{{{ without closing it"))?;
        out.push(after[..close].trim());
        rest = &after[close + 2..];
    }
    Ok(out)
}

fn check_template(t: &str, ids: &HashMap<&str, usize>) -> Result<(), String> {
    for expr in expressions(t)? {
        let mut parts = expr.split('.');
        match parts.next() {
            Some("inputs") => {}
            Some("run") => match parts.next() {
                Some("id" | "workflow" | "principal" | "task") => {}
                other => {
                    return Err(format!(
                        "template {{{{{expr}}}}}: run has id, workflow, principal and task, not {other:?}"
                    ))
                }
            },
            Some("steps") => {
                let id = parts.next().unwrap_or("");
                if !ids.contains_key(id) {
                    return Err(format!(
                        "template {{{{{expr}}}}} names step {id:?}, which is not a step of this workflow"
                    ));
                }
                if parts.next() != Some("output") {
                    return Err(format!(
                        "template {{{{{expr}}}}}: a step is read as steps.<id>.output"
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "template {{{{{expr}}}}} must start with inputs, run or steps"
                ))
            }
        }
    }
    Ok(())
}

/// Looks a path up in the run's variables.
fn lookup<'a>(vars: &'a Value, expr: &str) -> Option<&'a Value> {
    let mut v = vars;
    for key in expr.split('.') {
        v = match v {
            Value::Object(o) => o.get(key)?,
            Value::Array(a) => a.get(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Fills a template as text: strings as they are, other values as JSON.
pub fn render(t: &str, vars: &Value) -> Result<String, String> {
    let mut out = String::with_capacity(t.len());
    let mut rest = t;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or("unclosed {{")?;
        let expr = after[..close].trim();
        let v =
            lookup(vars, expr).ok_or_else(|| format!("{{{{{expr}}}}} has no value in this run"))?;
        out.push_str(&as_text(v));
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Fills every string in a JSON value; a string that is exactly one `{{…}}` takes the
/// value's own type, so `{ n = "{{inputs.n}}" }` stays a number.
pub fn render_value(v: &Value, vars: &Value) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => {
            let trimmed = s.trim();
            let whole = trimmed.starts_with("{{")
                && trimmed.ends_with("}}")
                && expressions(trimmed).map(|e| e.len()) == Ok(1);
            if whole {
                let expr = trimmed[2..trimmed.len() - 2].trim();
                lookup(vars, expr)
                    .cloned()
                    .ok_or_else(|| format!("{{{{{expr}}}}} has no value in this run"))?
            } else {
                Value::String(render(s, vars)?)
            }
        }
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|x| render_value(x, vars))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), render_value(x, vars)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Deserialize)]
    struct File {
        workflows: Vec<toml::Spanned<WorkflowDef>>,
    }

    fn load(src: &str) -> Result<Vec<Workflow>, String> {
        let f: File = toml::from_str(src).map_err(|e| e.to_string())?;
        check_all(&f.workflows, &["worker".to_owned()], "w.toml", src)
    }

    const GOOD: &str = r#"
[[workflows]]
name = "release"

[[workflows.steps]]
id = "start"
kind = "a2a"
command = "release.start"
roles = ["user"]
schema = { type = "object", properties = { tag = { type = "string" } } }

[[workflows.steps]]
id = "build"
kind = "exec"
program = "/bin/echo"
args = ["{{steps.start.output.args.tag}}"]

[[workflows.steps]]
id = "ask"
kind = "human"
prompt = "ship {{inputs.tag}}?"

[[workflows.steps]]
id = "ship"
kind = "a2a.delegate"
peer = "worker"
command = "deploy"
args = { tag = "{{inputs.tag}}" }
"#;

    #[test]
    fn a_good_workflow_loads_with_its_edges() {
        let w = &load(GOOD).unwrap()[0];
        assert_eq!(w.steps.len(), 4);
        assert_eq!(w.steps[0].next, Some(1));
        assert_eq!(w.steps[3].next, None);
        assert_eq!(w.command.as_ref().unwrap().op, "release.start");
        assert_eq!(w.command.as_ref().unwrap().roles, vec![Role::User]);
    }

    #[test]
    fn mistakes_are_load_errors_with_the_line() {
        let cases = [
            (
                GOOD.replace("kind = \"exec\"", "kind = \"shell\""),
                "w.toml:12:",
                "unknown step kind \"shell\"",
            ),
            (
                GOOD.replace(
                    "prompt = \"ship {{inputs.tag}}?\"",
                    "prompt = \"x\"\nnext = \"nowhere\"",
                ),
                "w.toml:18:",
                "next names \"nowhere\"",
            ),
            (
                GOOD.replace("command = \"release.start\"", "command = \"admin.drain\""),
                "w.toml:5:",
                "reserved op name",
            ),
            (
                GOOD.replace("command = \"release.start\"", "command = \"_instance.x\""),
                "w.toml:5:",
                "reserved op name",
            ),
            (
                GOOD.replace("command = \"release.start\"", "command = \"config.set\""),
                "w.toml:5:",
                "removed op name (use admin.set {path, value})",
            ),
            (
                GOOD.replace("{{steps.start.output.args.tag}}", "{{steps.nope.output}}"),
                "w.toml:12:",
                "names step \"nope\"",
            ),
            (
                GOOD.replace("peer = \"worker\"", "peer = \"ghost\""),
                "w.toml:23:",
                "peer \"ghost\"",
            ),
            (
                GOOD.replace(
                    "properties = { tag = { type = \"string\" } }",
                    "properties = 3",
                ),
                "w.toml:5:",
                "not a valid JSON Schema",
            ),
            (
                GOOD.replace(
                    "prompt = \"ship {{inputs.tag}}?\"",
                    "prompt = \"x\"\nprogram = \"/bin/true\"",
                ),
                "w.toml:18:",
                "does not take program",
            ),
            (
                GOOD.replace("id = \"ask\"", "id = \"build\""),
                "w.toml:18:",
                "used twice",
            ),
            (
                GOOD.replace(
                    "prompt = \"ship {{inputs.tag}}?\"",
                    "prompt = \"x\"\nnext = \"build\"",
                ),
                "w.toml:",
                "loop back",
            ),
        ];
        for (src, line, what) in cases {
            let err = load(&src).unwrap_err();
            assert!(err.starts_with(line) && err.contains(what), "{err}");
        }
    }

    /// Issue 15, item 10: `Instant::now() + Duration::from_millis(u64::MAX)` panics when the
    /// step runs (and a signal's `now + timeout_ms` overflows), so every step kind that takes
    /// `timeout_ms` refuses one past a day at load, naming the key.
    #[test]
    fn step_timeouts_are_checked_against_their_range() {
        const MAX: &str = "18446744073709551615";
        let signal = GOOD.replace(
            "kind = \"human\"\nprompt = \"ship {{inputs.tag}}?\"",
            "kind = \"signal\"\nsignal = \"go\"",
        );
        let send = GOOD
            .replace(
                "command = \"deploy\"\nargs = { tag = \"{{inputs.tag}}\" }",
                "text = \"hi\"",
            )
            .replace("kind = \"a2a.delegate\"", "kind = \"a2a.send\"");
        for (src, anchor, line) in [
            (GOOD.to_owned(), "program = \"/bin/echo\"", "w.toml:12:"),
            (signal, "signal = \"go\"", "w.toml:18:"),
            (send, "text = \"hi\"", "w.toml:23:"),
            (GOOD.to_owned(), "peer = \"worker\"", "w.toml:23:"),
        ] {
            for (value, ok) in [
                (MAX, false),
                ("86400001", false),
                ("0", false),
                ("86400000", true),
                ("1", true),
            ] {
                let src = src.replace(anchor, &format!("{anchor}\ntimeout_ms = {value}"));
                match load(&src) {
                    Ok(_) => assert!(ok, "{value} loaded: {src}"),
                    Err(err) => {
                        assert!(!ok, "{value}: {err}");
                        assert!(
                            err.starts_with(line)
                                && err.ends_with(&format!(
                                    "timeout_ms: must be from 1 to 86400000, not {value}"
                                )),
                            "{err}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn templates_fill_text_and_keep_types() {
        let vars = json!({"inputs": {"n": 3, "s": "x", "list": [1, 2]}, "steps": {"a": {"output": {"k": true}}}});
        assert_eq!(
            render("n={{inputs.n}} s={{ inputs.s }}", &vars).unwrap(),
            "n=3 s=x"
        );
        assert_eq!(render("{{inputs.list.1}}", &vars).unwrap(), "2");
        assert_eq!(
            render_value(
                &json!({"n": "{{inputs.n}}", "t": "v{{inputs.n}}", "k": ["{{steps.a.output.k}}"]}),
                &vars
            )
            .unwrap(),
            json!({"n": 3, "t": "v3", "k": [true]})
        );
        assert!(render("{{inputs.missing}}", &vars)
            .unwrap_err()
            .contains("no value"));
    }
}
