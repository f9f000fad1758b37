//! `agentd --print-config`: the effective configuration as a TOML file the daemon loads
//! back. The file's own keys stand as written (the listeners as `--listen` set them); every
//! key it leaves out that has a value is filled in with the value in force; a key whose
//! default is "none" (no agent, no certificate, the driver's connection bound) or the host's
//! (`limits.smol_threads`, one per CPU) stays out.
//! Values that may be secrets written into the file itself are redacted: the agents'
//! `env` and the peers' `headers`. Credentials are never in the file (only `{{secret:…}}`
//! references, which are printed as they are).

use agentd_core::InstanceConfig;
use toml::{Table, Value};

use crate::config::{Config, LogFormat};
use crate::runtime::Settings;

/// What a redacted value is replaced with: a string, so the output still loads.
pub const REDACTED: &str = "(redacted)";

/// The effective configuration, as TOML text.
pub fn render(config: &Config, ic: &InstanceConfig, settings: &Settings) -> Result<String, String> {
    let mut file = match crate::reload::table(config) {
        Value::Table(t) => t,
        _ => Table::new(),
    };
    // The listeners in force (`--listen` replaces the file's).
    let listen: Vec<Value> = config
        .listen_entries()?
        .into_iter()
        .map(|e| {
            if e.public_url.is_none() && !e.behind_proxy {
                return Value::String(e.url);
            }
            let mut t = Table::new();
            t.insert("url".into(), Value::String(e.url));
            if let Some(u) = e.public_url {
                t.insert("public_url".into(), Value::String(u));
            }
            if e.behind_proxy {
                t.insert("behind_proxy".into(), Value::Boolean(true));
            }
            Value::Table(t)
        })
        .collect();
    section(&mut file, "a2a").insert("listen".into(), Value::Array(listen));
    fill(&mut file, &defaults(config, ic, settings)?);
    if let Some(Value::Array(subs)) = file.get_mut("subagents") {
        for (s, spec) in subs.iter_mut().zip(&settings.subagents) {
            if let Value::Table(t) = s {
                t.entry("turn_timeout_ms")
                    .or_insert(int(spec.turn_timeout.as_millis() as u64));
                t.entry("env").or_insert(Value::Table(Table::new()));
            }
        }
    }
    redact(&mut file);
    let mut out = String::new();
    emit_table(&mut out, &mut Vec::new(), &file);
    Ok(out.trim_start().to_owned())
}

/// The table `key` of `t`, made if missing.
fn section<'a>(t: &'a mut Table, key: &str) -> &'a mut Table {
    let v = t
        .entry(key.to_owned())
        .or_insert_with(|| Value::Table(Table::new()));
    if !v.is_table() {
        *v = Value::Table(Table::new());
    }
    match v {
        Value::Table(t) => t,
        _ => unreachable!("made a table above"),
    }
}

fn int(n: u64) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn strings<'a>(items: impl IntoIterator<Item = &'a str>) -> Value {
    Value::Array(
        items
            .into_iter()
            .map(|s| Value::String(s.to_owned()))
            .collect(),
    )
}

/// Every key with a value in force, as the daemon runs it.
fn defaults(config: &Config, ic: &InstanceConfig, s: &Settings) -> Result<Table, String> {
    let mut root = Table::new();
    let agent = section(&mut root, "agent");
    agent.insert("name".into(), Value::String(ic.name.clone()));
    agent.insert("description".into(), Value::String(ic.description.clone()));
    agent.insert("approval".into(), Value::String(s.approval.as_str().into()));
    let turn_ms = s
        .agent
        .as_ref()
        .map_or(300_000, |a| a.turn_timeout.as_millis() as u64);
    agent.insert("turn_timeout_ms".into(), int(turn_ms));
    agent.insert("env".into(), Value::Table(Table::new()));

    let a2a = section(&mut root, "a2a");
    let events = section(a2a, "events");
    events.insert("enabled".into(), Value::Boolean(ic.events_enabled));
    events.insert("ring".into(), int(ic.events_ring as u64));
    events.insert(
        "stream_deadline_ms".into(),
        int(ic.events_stream_deadline_ms),
    );
    events.insert("batch_ms".into(), int(ic.events_batch_ms));
    section(a2a, "introspection")
        .insert("enabled".into(), Value::Boolean(ic.introspection_enabled));
    section(a2a, "console").insert("enabled".into(), Value::Boolean(!ic.console.is_empty()));
    section(a2a, "cors").insert("origins".into(), Value::Array(Vec::new()));
    let dg = section(a2a, "device_grant");
    dg.insert("enabled".into(), Value::Boolean(ic.device_grant.enabled));
    dg.insert(
        "scopes".into(),
        strings(ic.device_grant.scopes.iter().map(|s| s.as_str())),
    );
    dg.insert(
        "token_ttl_s".into(),
        int(ic.device_grant.token_ttl_ms / 1000),
    );
    dg.insert("code_ttl_s".into(), int(ic.device_grant.code_ttl_ms / 1000));
    section(a2a, "tls").insert("hsts_max_age_s".into(), int(ic.hsts_max_age_s));
    section(a2a, "proxy").insert("trusted".into(), Value::Array(Vec::new()));
    let push = section(a2a, "push");
    let p = &s.push;
    push.insert("enabled".into(), Value::Boolean(p.policy.enabled));
    push.insert(
        "allow_private".into(),
        Value::Boolean(p.policy.allow_private),
    );
    push.insert("max_attempts".into(), int(u64::from(p.max_attempts)));
    push.insert("backoff_ms".into(), int(p.first_backoff.as_millis() as u64));
    push.insert("timeout_ms".into(), int(p.timeout.as_millis() as u64));
    push.insert("workers".into(), int(p.workers as u64));
    push.insert("queue".into(), int(p.queue as u64));

    let limits = section(&mut root, "limits");
    let l = &ic.conn;
    for (key, value) in [
        ("max_header_bytes", l.http.max_header_bytes as u64),
        ("max_headers", l.http.max_headers as u64),
        ("max_body_bytes", l.http.max_body_bytes as u64),
        ("idle_timeout_ms", l.idle_timeout_ms),
        ("header_timeout_ms", l.header_timeout_ms),
        ("body_timeout_ms", l.body_timeout_ms),
        ("request_timeout_ms", l.request_timeout_ms),
        ("write_timeout_ms", l.write_timeout_ms),
        ("sse_keepalive_ms", l.sse_keepalive_ms),
        ("stream_queue", l.stream_queue as u64),
        ("large_answers_bytes", l.large_answers_bytes as u64),
        ("replay_events_per_task", ic.replay.per_task as u64),
        ("replay_events", ic.replay.events as u64),
        ("replay_bytes", ic.replay.bytes as u64),
        ("max_tasks", ic.tasks.max_tasks as u64),
        ("task_artifact_bytes", ic.tasks.artifact_bytes as u64),
        ("max_message_parts", ic.tasks.max_message_parts as u64),
        ("tasks_bytes", ic.tasks.total_bytes as u64),
        (
            "max_subagents_per_principal",
            s.limits.max_subagents_per_principal as u64,
        ),
        ("max_subagents", s.limits.max_subagents as u64),
        ("listen_backlog", u64::from(config.limits.listen_backlog())),
    ] {
        limits.insert(key.into(), int(value));
    }

    let store = section(&mut root, "store");
    match config.store.resolve()? {
        crate::durable::StoreKind::Memory => {
            store.insert("kind".into(), Value::String("memory".into()));
        }
        crate::durable::StoreKind::File(dir) => {
            store.insert("kind".into(), Value::String("file".into()));
            store.insert("dir".into(), Value::String(dir.display().to_string()));
        }
    }
    let format = match &config.log.format {
        Some(f) => LogFormat::parse(f)?,
        None => LogFormat::Text,
    };
    section(&mut root, "log").insert("format".into(), Value::String(format.as_str().into()));
    // `otlp_endpoint` has no default (nothing is exported): it stays out unless set.
    section(&mut root, "telemetry").insert(
        "service_name".into(),
        Value::String(crate::config::DEFAULT_SERVICE_NAME.into()),
    );
    Ok(root)
}

/// Adds to `dst` every key of `defaults` it lacks, walking into tables both have.
fn fill(dst: &mut Table, defaults: &Table) {
    for (k, v) in defaults {
        match (dst.get_mut(k), v) {
            (None, v) => {
                dst.insert(k.clone(), v.clone());
            }
            (Some(Value::Table(d)), Value::Table(v)) => fill(d, v),
            _ => {}
        }
    }
}

/// Replaces the values of `agent.env`, `subagents[].env` and `a2a.peers[].headers`.
fn redact(root: &mut Table) {
    fn values(t: Option<&mut Value>) {
        if let Some(Value::Table(t)) = t {
            for (_, v) in t.iter_mut() {
                *v = Value::String(REDACTED.into());
            }
        }
    }
    if let Some(Value::Table(agent)) = root.get_mut("agent") {
        values(agent.get_mut("env"));
    }
    if let Some(Value::Array(subs)) = root.get_mut("subagents") {
        for s in subs {
            if let Value::Table(s) = s {
                values(s.get_mut("env"));
            }
        }
    }
    // An exec step's env is where a program's own credentials go, as for an agent.
    if let Some(Value::Array(workflows)) = root.get_mut("workflows") {
        for w in workflows {
            if let Some(Value::Array(steps)) = w.as_table_mut().and_then(|w| w.get_mut("steps")) {
                for step in steps {
                    if let Value::Table(step) = step {
                        values(step.get_mut("env"));
                    }
                }
            }
        }
    }
    if let Some(Value::Table(a2a)) = root.get_mut("a2a") {
        if let Some(Value::Array(peers)) = a2a.get_mut("peers") {
            for p in peers {
                if let Value::Table(p) = p {
                    values(p.get_mut("headers"));
                }
            }
        }
    }
}

/// A key, bare when it can be.
fn key(k: &str) -> String {
    if !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        k.to_owned()
    } else {
        quoted(k)
    }
}

/// A TOML basic string: JSON's escapes are all TOML escapes too.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn is_table_array(v: &Value) -> bool {
    matches!(v, Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_table))
}

/// A table written under its own `[header]` (an empty one is written inline, `{}`).
fn is_section(v: &Value) -> bool {
    matches!(v, Value::Table(t) if !t.is_empty())
}

/// A table's plain keys, then its tables as `[a.b]` and arrays of tables as `[[a.b]]`.
fn emit_table(out: &mut String, path: &mut Vec<String>, t: &Table) {
    for (k, v) in t {
        if !is_section(v) && !is_table_array(v) {
            out.push_str(&format!("{} = {}\n", key(k), inline(v)));
        }
    }
    for (k, v) in t {
        path.push(key(k));
        match v {
            Value::Table(sub) if is_section(v) => {
                out.push_str(&format!("\n[{}]\n", path.join(".")));
                emit_table(out, path, sub);
            }
            Value::Array(items) if is_table_array(v) => {
                for item in items {
                    out.push_str(&format!("\n[[{}]]\n", path.join(".")));
                    if let Value::Table(sub) = item {
                        emit_table(out, path, sub);
                    }
                }
            }
            _ => {}
        }
        path.pop();
    }
}

fn inline(v: &Value) -> String {
    match v {
        Value::String(s) => quoted(s),
        Value::Integer(n) => n.to_string(),
        Value::Float(f) if f.is_nan() => "nan".into(),
        Value::Float(f) => format!("{f:?}"),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => d.to_string(),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Table(t) => {
            let parts: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", key(k), inline(v)))
                .collect();
            if parts.is_empty() {
                "{}".into()
            } else {
                format!("{{ {} }}", parts.join(", "))
            }
        }
    }
}
