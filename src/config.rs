//! The configuration file (TOML) and the embedded default.
//!
//! ```toml
//! [agent]
//! name = "reviewer"
//! description = "Reviews changes"
//!
//! [a2a]
//! listen = ["tcp://127.0.0.1:8420", "unix:///run/agentd/a.sock"]
//!
//! [limits]
//! max_body_bytes = 2097152
//! ```

use std::path::Path;

use agentd_core::{ConnLimits, InstanceConfig, ListenerInfo};
use agentd_io_std::Endpoint;
use serde::Deserialize;

/// The listener served when no configuration names one.
pub const DEFAULT_LISTEN: &str = "tcp://127.0.0.1:8420";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub agent: AgentSection,
    #[serde(default)]
    pub a2a: A2aSection,
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[[subagents]]`: the kinds of subagents.
    #[serde(default)]
    pub subagents: Vec<SubagentSection>,
    /// `[[workflows]]`: named step graphs, checked by [`Config::workflows`].
    #[serde(default)]
    pub workflows: Vec<toml::Spanned<crate::runtime::workflow::WorkflowDef>>,
    /// `[store]`: where tasks and sessions are kept (see `crate::durable`).
    #[serde(default)]
    pub store: crate::durable::StoreSection,
    /// The file's name and text, for `file:line` in load errors.
    #[serde(skip)]
    pub source: Option<(String, String)>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// The card's `name`.
    pub name: Option<String>,
    /// The card's `description`.
    pub description: Option<String>,
    /// `agent.approval`: `auto` (exec steps run), `ask` (each waits for an operator's
    /// approval) or `deny`. Settable at run time with `admin.set`.
    pub approval: Option<String>,
    /// The conversation agent: a program (and its arguments) that answers turns over the
    /// JSON-lines protocol of `docs/agent-protocol.md`. Without one, turns are rejected.
    pub command: Option<Vec<String>>,
    /// How long one turn may take (default 300000).
    pub turn_timeout_ms: Option<u64>,
    /// Environment variables set for the agent on top of agentd's own.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// `[[subagents]]`: a kind of named agent process `subagent.send` starts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubagentSection {
    pub name: String,
    pub command: Vec<String>,
    pub turn_timeout_ms: Option<u64>,
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aSection {
    /// One endpoint or a list: `tcp://host:port`, `http://host:port` or `unix:///path`.
    #[serde(default)]
    pub listen: Listen,
    #[serde(default)]
    pub events: EventsSection,
    /// The operator's bearer credential, as a secret reference.
    pub bearer: Option<String>,
    /// Who else may call, and what they may do.
    #[serde(default)]
    pub principals: Vec<PrincipalRule>,
    #[serde(default)]
    pub cors: CorsSection,
    #[serde(default)]
    pub device_grant: DeviceGrantSection,
    #[serde(default)]
    pub tls: TlsSection,
    #[serde(default)]
    pub introspection: IntrospectionSection,
    /// `[[a2a.peers]]`: the agents `a2a.send` and `a2a.delegate` steps call.
    #[serde(default)]
    pub peers: Vec<PeerSection>,
    #[serde(default)]
    pub push: PushSection,
}

/// `[a2a.push]`: push notifications to clients' webhooks.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushSection {
    /// Serves the four push-config methods; the card says `pushNotifications: true`.
    #[serde(default)]
    pub enabled: bool,
    /// Webhooks may point at private, loopback and link-local addresses.
    #[serde(default)]
    pub allow_private: bool,
    /// Attempts per notification before it is given up (default 5).
    pub max_attempts: Option<u32>,
    /// The wait before the first retry, doubling each time (default 500).
    pub backoff_ms: Option<u64>,
    /// One attempt's deadline (default 10000).
    pub timeout_ms: Option<u64>,
    /// PEM CAs to trust for https webhooks (default: the system's).
    pub ca: Option<String>,
}

/// `[[a2a.peers]]`: one peer agent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    /// `^[a-zA-Z0-9_-]+$`: how steps name it.
    pub name: String,
    /// `https://host[:port]`, `http://` on loopback only, or `unix:///absolute/path`.
    pub endpoint: String,
    /// The bearer credential sent to it, as a secret reference.
    pub bearer: Option<String>,
    /// Extra request headers.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// PEM CA certificates to trust for an `https://` peer (default: the system's).
    pub ca: Option<String>,
    /// PEM client certificate chain and key, for a peer that requires mutual TLS.
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
}

/// `[a2a.introspection]`: the introspection ops, `audit` events and the log ring.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntrospectionSection {
    #[serde(default)]
    pub enabled: bool,
}

/// `[a2a.tls]`: the certificate of `https://` listeners, and the CA that makes them mutual.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// PEM certificate chain.
    pub cert: Option<String>,
    /// PEM private key.
    pub key: Option<String>,
    /// PEM CA certificates client certificates must chain to: mutual TLS, mandatory.
    pub client_ca: Option<String>,
}

/// `[a2a.device_grant]`: sign-in by the OAuth 2.0 device authorization grant.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGrantSection {
    #[serde(default)]
    pub enabled: bool,
    /// Scopes a device may be approved for: `user`, `operator` (default `["user"]`).
    pub scopes: Option<Vec<String>>,
    /// Seconds a session token lives (default 28800; 300 to 2592000).
    pub token_ttl_s: Option<u64>,
    /// Seconds a device code waits for a decision (default 600; 60 to 1800).
    pub code_ttl_s: Option<u64>,
    /// `"<burst>/<per>s"`: the request rate of each device name's sessions (unset: none).
    pub rate: Option<String>,
}

/// `[a2a.cors]`: browser origins served.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsSection {
    /// Exact origins (`scheme://host[:port]`); `*` and paths are refused.
    #[serde(default)]
    pub origins: Vec<String>,
}

/// `[[a2a.principals]]`: one rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalRule {
    pub id: Option<String>,
    #[serde(rename = "match")]
    pub matcher: RuleMatch,
    pub role: String,
    #[serde(default)]
    pub grants: Vec<String>,
    pub quotas: Option<Quotas>,
}

/// A rule's `quotas`: only `rate` is served. `budget` is read so that it can be refused by
/// name rather than as an unknown field.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// `"<burst>/<per>s"`, e.g. `"20/60s"`.
    pub rate: Option<String>,
    pub budget: Option<toml::Value>,
}

/// What a rule matches: a bearer credential (a secret reference), or anyone (`any = true`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleMatch {
    pub bearer_ref: Option<String>,
    pub any: Option<bool>,
    pub san: Option<String>,
    pub sub: Option<String>,
}

/// `[a2a.events]`: the instance-wide observation feed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsSection {
    /// Declares the events extension and builds the feed.
    #[serde(default)]
    pub enabled: bool,
    /// Events kept for a reconnecting subscriber (default 1024).
    pub ring: Option<usize>,
    /// A feed stream ends with `goodbye` `deadline` after this long (default 600000).
    pub stream_deadline_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum Listen {
    #[default]
    Unset,
    One(String),
    Many(Vec<String>),
}

/// Every bound of a connection, overriding the defaults of [`ConnLimits::DEFAULT`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub max_header_bytes: Option<usize>,
    pub max_headers: Option<usize>,
    pub max_body_bytes: Option<usize>,
    pub idle_timeout_ms: Option<u64>,
    pub header_timeout_ms: Option<u64>,
    pub body_timeout_ms: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub write_timeout_ms: Option<u64>,
    pub sse_keepalive_ms: Option<u64>,
    pub stream_queue: Option<usize>,
    /// Stream events kept per task for `Last-Event-ID` reconnection.
    pub replay_events_per_task: Option<usize>,
    /// Stream events kept over all tasks.
    pub replay_events: Option<usize>,
    /// Serialized bytes of stream events kept over all tasks.
    pub replay_bytes: Option<usize>,
    pub max_tasks: Option<usize>,
    /// Serialized bytes of one task's artifacts together.
    pub task_artifact_bytes: Option<usize>,
    pub max_connections: Option<usize>,
}

/// The most `limits.task_artifact_bytes` may be: with a task's history and status it keeps
/// the largest task record well inside the store's largest append (16 MiB).
pub const MAX_TASK_ARTIFACT_BYTES: usize = 8 << 20;

impl Config {
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut config: Config =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        config.source = Some((path.display().to_string(), text));
        // Checked at load, so a mistake in a workflow is a load error, not a failed run.
        config.workflows()?;
        config.runtime_settings()?;
        Ok(config)
    }

    /// The workflows, checked.
    pub fn workflows(&self) -> Result<Vec<crate::runtime::workflow::Workflow>, String> {
        let (file, text) = self
            .source
            .as_ref()
            .map(|(f, t)| (f.as_str(), t.as_str()))
            .unwrap_or(("<config>", ""));
        let peers: Vec<String> = self.a2a.peers.iter().map(|p| p.name.clone()).collect();
        crate::runtime::workflow::check_all(&self.workflows, &peers, file, text)
    }

    /// What the runtime is configured with.
    pub fn runtime_settings(&self) -> Result<crate::runtime::Settings, String> {
        let approval = match self.agent.approval.as_deref() {
            None => crate::runtime::Approval::Auto,
            Some(a) => crate::runtime::Approval::parse(a)
                .ok_or_else(|| format!("agent.approval: {a:?} is not auto, ask or deny"))?,
        };
        let spec = |key: &str,
                    name: &str,
                    command: &[String],
                    timeout: Option<u64>,
                    env: &std::collections::BTreeMap<String, String>|
         -> Result<crate::runtime::agent::AgentSpec, String> {
            if command.first().is_none_or(|p| p.is_empty()) {
                return Err(format!(
                    "{key}.command: names the program to run, then its arguments"
                ));
            }
            let mut spec = crate::runtime::agent::AgentSpec::new(name, command.to_vec());
            if let Some(ms) = timeout {
                if ms == 0 {
                    return Err(format!("{key}.turn_timeout_ms: must be greater than 0"));
                }
                spec.turn_timeout = std::time::Duration::from_millis(ms);
            }
            spec.env = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            Ok(spec)
        };
        let agent = match &self.agent.command {
            Some(cmd) => Some(spec(
                "agent",
                crate::runtime::CONVERSATION_AGENT,
                cmd,
                self.agent.turn_timeout_ms,
                &self.agent.env,
            )?),
            None => None,
        };
        let mut subagents = Vec::new();
        for (i, s) in self.subagents.iter().enumerate() {
            let key = format!("subagents[{i}]");
            let ok_name = !s.name.is_empty()
                && s.name.len() <= 64
                && s.name
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
            if !ok_name || s.name == crate::runtime::CONVERSATION_AGENT {
                return Err(format!(
                    "{key}.name: {:?} must be 1-64 of [a-zA-Z0-9._-] and not \"{}\"",
                    s.name,
                    crate::runtime::CONVERSATION_AGENT
                ));
            }
            if subagents
                .iter()
                .any(|x: &crate::runtime::agent::AgentSpec| x.name == s.name)
            {
                return Err(format!("{key}.name: {:?} is defined twice", s.name));
            }
            subagents.push(spec(&key, &s.name, &s.command, s.turn_timeout_ms, &s.env)?);
        }
        Ok(crate::runtime::Settings {
            workflows: self.workflows()?,
            approval,
            agent,
            subagents,
            peers: self.peers()?,
            push: self.push_delivery()?,
            limits: crate::runtime::RuntimeLimits::default(),
        })
    }

    fn push_delivery(&self) -> Result<crate::runtime::push::DeliveryOptions, String> {
        let p = &self.a2a.push;
        let mut o = crate::runtime::push::DeliveryOptions {
            policy: agentd_core::push::PushPolicy {
                enabled: p.enabled,
                allow_private: p.allow_private,
            },
            ..Default::default()
        };
        if let Some(n) = p.max_attempts {
            if n == 0 {
                return Err("a2a.push.max_attempts: must be greater than 0".into());
            }
            o.max_attempts = n;
        }
        if let Some(ms) = p.backoff_ms {
            o.first_backoff = std::time::Duration::from_millis(ms);
        }
        if let Some(ms) = p.timeout_ms {
            if ms == 0 {
                return Err("a2a.push.timeout_ms: must be greater than 0".into());
            }
            o.timeout = std::time::Duration::from_millis(ms);
        }
        if let Some(ca) = &p.ca {
            o.ca = Some(std::fs::read(ca).map_err(|e| format!("a2a.push.ca: {ca}: {e}"))?);
        }
        Ok(o)
    }

    /// The peer clients, their credentials and certificates read.
    fn peers(&self) -> Result<Vec<crate::runtime::peer::PeerClient>, String> {
        use crate::runtime::peer::{PeerClient, PeerConfig};
        let mut out: Vec<PeerClient> = Vec::new();
        for (i, p) in self.a2a.peers.iter().enumerate() {
            let key = format!("a2a.peers[{i}]");
            let ok = !p.name.is_empty()
                && p.name
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'));
            if !ok {
                return Err(format!(
                    "{key}.name: {:?} must match ^[a-zA-Z0-9_-]+$",
                    p.name
                ));
            }
            if self.a2a.peers[..i].iter().any(|q| q.name == p.name) {
                return Err(format!("{key}.name: {:?} is defined twice", p.name));
            }
            let bearer = match &p.bearer {
                Some(r) => Some(resolve_secret(&format!("{key}.bearer"), r)?),
                None => None,
            };
            let mut client = PeerClient::new(PeerConfig {
                name: p.name.clone(),
                endpoint: p.endpoint.clone(),
                bearer,
                headers: p
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            })
            .map_err(|e| format!("{key}: {e}"))?;
            let read = |what: &str, path: &str| {
                std::fs::read(path).map_err(|e| format!("{key}.{what}: {path}: {e}"))
            };
            if let Some(ca) = &p.ca {
                client = client
                    .with_tls_roots(&read("ca", ca)?)
                    .map_err(|e| format!("{key}.ca: {e}"))?;
            }
            match (&p.client_cert, &p.client_key) {
                (Some(c), Some(k)) => {
                    client = client
                        .with_client_cert(&read("client_cert", c)?, &read("client_key", k)?)
                        .map_err(|e| format!("{key}.client_cert: {e}"))?;
                }
                (None, None) => {}
                _ => return Err(format!("{key}: client_cert and client_key go together")),
            }
            out.push(client);
        }
        Ok(out)
    }

    /// The declared commands of the workflows' starts, for the core's registry.
    pub fn declared_commands(
        &self,
    ) -> Result<Vec<agentd_core::ext::command::DeclaredCommand>, String> {
        Ok(self
            .workflows()?
            .into_iter()
            .filter_map(|w| {
                let c = w.command?;
                Some(agentd_core::ext::command::DeclaredCommand {
                    op: c.op,
                    workflow: w.name,
                    schema: c.schema.unwrap_or(serde_json::json!({"type": "object"})),
                    roles: c.roles,
                })
            })
            .collect())
    }

    /// `--listen`: the listeners named on the command line replace `a2a.listen` (none given:
    /// the file's stand).
    pub fn override_listen(&mut self, listen: &[String]) {
        if !listen.is_empty() {
            self.a2a.listen = Listen::Many(listen.to_vec());
        }
    }

    /// The endpoints to listen on, validated.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, String> {
        let list = match &self.a2a.listen {
            Listen::Unset => vec![DEFAULT_LISTEN.to_owned()],
            Listen::One(s) => vec![s.clone()],
            Listen::Many(v) if v.is_empty() => return Err("a2a.listen names no endpoint".into()),
            Listen::Many(v) => v.clone(),
        };
        let scheme = self.a2a.bearer.is_some()
            || self
                .a2a
                .principals
                .iter()
                .any(|r| r.matcher.bearer_ref.is_some())
            || self.a2a.tls.client_ca.is_some();
        list.iter()
            .map(|s| {
                let ep: Endpoint = s.parse().map_err(|e| format!("a2a.listen: {e}"))?;
                match &ep {
                    Endpoint::Tcp(addr) if !addr.ip().is_loopback() => {
                        return Err(format!(
                            "a2a.listen: {s}: plaintext is served only on loopback; use https:// with a2a.tls"
                        ))
                    }
                    Endpoint::Https(addr) => {
                        if self.a2a.tls.cert.is_none() || self.a2a.tls.key.is_none() {
                            return Err(format!("a2a.listen: {s}: https needs a2a.tls.cert and a2a.tls.key"));
                        }
                        if !addr.ip().is_loopback() && !scheme {
                            return Err(format!(
                                "a2a.listen: {s}: a non-loopback listener needs an authentication scheme \
                                 (a2a.bearer, a bearer_ref rule, or a2a.tls.client_ca), and none is configured"
                            ));
                        }
                    }
                    _ => {}
                }
                Ok(ep)
            })
            .collect()
    }

    /// Refuses a memory store behind a listener other clients reach.
    pub fn check_store(
        &self,
        store: &crate::durable::StoreKind,
        endpoints: &[Endpoint],
    ) -> Result<(), String> {
        if *store != crate::durable::StoreKind::Memory {
            return Ok(());
        }
        // Whatever a remote client is told was done must survive a restart.
        if let Some(ep) = endpoints.iter().find(|ep| match ep {
            Endpoint::Tcp(a) | Endpoint::Https(a) => !a.ip().is_loopback(),
            Endpoint::Unix(_) => false,
        }) {
            return Err(format!(
                "store.kind = \"memory\" loses every task at a restart; {ep} is not loopback: \
                 use the file store for a listener other clients reach"
            ));
        }
        Ok(())
    }

    /// The TLS of each `https://` endpoint, by listener index.
    pub fn tls_listeners(
        &self,
        endpoints: &[Endpoint],
    ) -> Result<std::collections::HashMap<usize, agentd_core::tls::TlsListener>, String> {
        let mut map = std::collections::HashMap::new();
        if !endpoints.iter().any(Endpoint::is_tls) {
            return Ok(map);
        }
        let read = |key: &str, path: &Option<String>| -> Result<Option<Vec<u8>>, String> {
            path.as_ref()
                .map(|p| std::fs::read(p).map_err(|e| format!("a2a.tls.{key}: {p}: {e}")))
                .transpose()
        };
        let cert = read("cert", &self.a2a.tls.cert)?.ok_or("a2a.tls.cert: required for https")?;
        let key = read("key", &self.a2a.tls.key)?.ok_or("a2a.tls.key: required for https")?;
        let ca = read("client_ca", &self.a2a.tls.client_ca)?;
        let tls = agentd_core::tls::listener(&cert, &key, ca.as_deref())
            .map_err(|e| format!("a2a.tls: {e}"))?;
        for (i, ep) in endpoints.iter().enumerate() {
            if ep.is_tls() {
                map.insert(i, tls.clone());
            }
        }
        Ok(map)
    }

    pub fn instance_config(&self, listeners: Vec<ListenerInfo>) -> Result<InstanceConfig, String> {
        let mut c = InstanceConfig::new(listeners);
        if let Some(n) = &self.agent.name {
            c.name = n.clone();
        }
        // Without an agent every turn is rejected: the card offers no conversation.
        c.converses = self.agent.command.is_some();
        if let Some(d) = &self.agent.description {
            c.description = d.clone();
        }
        let l = &self.limits;
        let mut conn = ConnLimits::DEFAULT;
        macro_rules! set {
            ($($field:ident).+ = $value:expr) => {
                if let Some(v) = $value {
                    if v == 0 {
                        return Err(format!("limits.{}: must be greater than 0", stringify!($($field).+).rsplit('.').next().unwrap_or("")));
                    }
                    conn.$($field).+ = v;
                }
            };
        }
        set!(http.max_header_bytes = l.max_header_bytes);
        set!(http.max_headers = l.max_headers);
        set!(http.max_body_bytes = l.max_body_bytes);
        set!(idle_timeout_ms = l.idle_timeout_ms);
        set!(header_timeout_ms = l.header_timeout_ms);
        set!(body_timeout_ms = l.body_timeout_ms);
        set!(request_timeout_ms = l.request_timeout_ms);
        set!(write_timeout_ms = l.write_timeout_ms);
        set!(sse_keepalive_ms = l.sse_keepalive_ms);
        set!(stream_queue = l.stream_queue);
        c.conn = conn;
        if let Some(n) = l.max_tasks {
            if n == 0 {
                return Err("limits.max_tasks: must be greater than 0".into());
            }
            c.tasks.max_tasks = n;
        }
        if let Some(n) = l.task_artifact_bytes {
            if n == 0 || n > MAX_TASK_ARTIFACT_BYTES {
                return Err(format!(
                    "limits.task_artifact_bytes: must be from 1 to {MAX_TASK_ARTIFACT_BYTES} \
                     (a task is stored as one record), not {n}"
                ));
            }
            c.tasks.artifact_bytes = n;
        }
        for (name, value, field) in [
            (
                "replay_events_per_task",
                l.replay_events_per_task,
                &mut c.replay.per_task,
            ),
            ("replay_events", l.replay_events, &mut c.replay.events),
            ("replay_bytes", l.replay_bytes, &mut c.replay.bytes),
        ] {
            match value {
                Some(0) => return Err(format!("limits.{name}: must be greater than 0")),
                Some(n) => *field = n,
                None => {}
            }
        }
        c.introspection_enabled = self.a2a.introspection.enabled;
        c.push = agentd_core::push::PushPolicy {
            enabled: self.a2a.push.enabled,
            allow_private: self.a2a.push.allow_private,
        };
        let ev = &self.a2a.events;
        c.events_enabled = ev.enabled;
        if let Some(n) = ev.ring {
            if n == 0 {
                return Err("a2a.events.ring: must be greater than 0".into());
            }
            c.events_ring = n;
        }
        if let Some(ms) = ev.stream_deadline_ms {
            if ms == 0 {
                return Err("a2a.events.stream_deadline_ms: must be greater than 0".into());
            }
            c.events_stream_deadline_ms = ms;
        }
        c.auth = self.auth_config()?;
        c.cors = agentd_core::http::cors::CorsPolicy::from_list(&self.a2a.cors.origins)?;
        c.device_grant = self.device_grant(&c.auth)?;
        c.config_document = effective_document(&c, self.limits.max_connections);
        if let Some(obj) = c.config_document["a2a"].as_object_mut() {
            // Credentials appear only as their references.
            obj.insert("bearer".into(), serde_json::json!(self.a2a.bearer));
            let rules: Vec<serde_json::Value> = self
                .a2a
                .principals
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "id": r.id,
                        "role": r.role,
                        "grants": r.grants,
                        "match": {"bearer_ref": r.matcher.bearer_ref, "any": r.matcher.any},
                        "quotas": {"rate": r.quotas.as_ref().and_then(|q| q.rate.clone())},
                    })
                })
                .collect();
            obj.insert("principals".into(), serde_json::Value::Array(rules));
            obj.insert(
                "cors".into(),
                serde_json::json!({"origins": self.a2a.cors.origins}),
            );
        }
        Ok(c)
    }

    fn device_grant(
        &self,
        auth: &agentd_core::auth::AuthConfig,
    ) -> Result<agentd_core::sessions::DeviceGrantConfig, String> {
        use agentd_core::sessions::{DeviceGrantConfig, Scope};
        let d = &self.a2a.device_grant;
        let mut g = DeviceGrantConfig {
            enabled: d.enabled,
            ..Default::default()
        };
        if let Some(scopes) = &d.scopes {
            let mut parsed = Vec::new();
            for s in scopes {
                let scope = Scope::parse(s).ok_or_else(|| {
                    format!("a2a.device_grant.scopes: {s:?} is not user or operator")
                })?;
                if parsed.contains(&scope) {
                    return Err(format!("a2a.device_grant.scopes: {s} is listed twice"));
                }
                parsed.push(scope);
            }
            if parsed.is_empty() {
                return Err("a2a.device_grant.scopes: names no scope".into());
            }
            g.scopes = parsed;
        }
        if let Some(t) = d.token_ttl_s {
            if !(300..=2_592_000).contains(&t) {
                return Err("a2a.device_grant.token_ttl_s: must be 300 to 2592000".into());
            }
            g.token_ttl_ms = t * 1000;
        }
        if let Some(t) = d.code_ttl_s {
            if !(60..=1800).contains(&t) {
                return Err("a2a.device_grant.code_ttl_s: must be 60 to 1800".into());
            }
            g.code_ttl_ms = t * 1000;
        }
        if let Some(rate) = &d.rate {
            g.rate = Some(
                agentd_core::limits::Rate::parse(rate)
                    .map_err(|e| format!("a2a.device_grant.rate: {e}"))?,
            );
        }
        let operator_credential = auth.operator_bearer.is_some()
            || auth.bearers.iter().any(|r| r.principal.is_operator());
        if g.enabled && self.a2a.tls.client_ca.is_some() {
            return Err("a2a.device_grant.enabled: refused beside a2a.tls.client_ca (mutual TLS admits no other sign-in)".into());
        }
        if g.enabled && !operator_credential {
            // Someone must be able to approve sign-ins, and it cannot be the implicit operator.
            return Err("a2a.device_grant.enabled needs an operator credential: a2a.bearer, or an operator rule with bearer_ref".into());
        }
        Ok(g)
    }

    /// Credentials and rules, resolved from their secret references and checked.
    fn auth_config(&self) -> Result<agentd_core::auth::AuthConfig, String> {
        use agentd_core::auth::{AuthConfig, BearerRule, Principal, Role};
        use agentd_core::ext::command::table::{self, Floor, REMOVED_OPS};
        let mut auth = AuthConfig::default();
        let mut secrets: Vec<(String, String)> = Vec::new();
        if let Some(reference) = &self.a2a.bearer {
            let secret = resolve_secret("a2a.bearer", reference)?;
            auth.operator_bearer = Some(AuthConfig::digest(&secret));
            secrets.push(("a2a.bearer".into(), secret));
        }
        let mut ids = std::collections::HashSet::new();
        for (i, rule) in self.a2a.principals.iter().enumerate() {
            let at = format!("a2a.principals[{i}]");
            let role = match rule.role.as_str() {
                "operator" => Role::Operator,
                "user" => Role::User,
                "agent" => Role::Agent,
                "anonymous" => Role::Anonymous,
                other => {
                    return Err(format!(
                        "{at}.role: {other:?} is not operator, user, agent or anonymous"
                    ))
                }
            };
            for grant in &rule.grants {
                if let Some((_, hint)) = REMOVED_OPS.iter().find(|(op, _)| op == grant) {
                    return Err(format!("{at}.grants: {grant} was removed ({hint})"));
                }
                let floor_op = table::find(grant).is_some_and(|s| s.floor == Floor::Operator)
                    || grant.starts_with(table::RESERVED_PREFIX);
                if floor_op && role != Role::Operator {
                    return Err(format!(
                        "{at}.grants: {grant} is operator-only, and no grant reaches it for role {}",
                        role.as_str()
                    ));
                }
            }
            let id = rule
                .id
                .clone()
                .ok_or_else(|| format!("{at}.id: required"))?;
            let valid = !id.is_empty()
                && id.len() <= 128
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._@:/+-".contains(&b));
            if !valid {
                return Err(format!(
                    "{at}.id: {id:?} must be 1-128 of [A-Za-z0-9._@:/+-]"
                ));
            }
            if !ids.insert(id.clone()) {
                return Err(format!("{at}.id: {id:?} is declared twice"));
            }
            let mut rate = None;
            if let Some(q) = &rule.quotas {
                if q.budget.is_some() {
                    return Err(format!(
                        "{at}.quotas.budget: not supported by this agentd (only quotas.rate is)"
                    ));
                }
                if let Some(spec) = &q.rate {
                    rate = Some(
                        agentd_core::limits::Rate::parse(spec)
                            .map_err(|e| format!("{at}.quotas.rate: {e}"))?,
                    );
                }
            }
            let principal = match role {
                // Operators are exempt from rates: a rate on an operator rule is kept for the
                // config op only.
                Role::Operator => Principal::operator(),
                r => Principal::new(format!("{}:{id}", r.as_str()), r, rule.grants.clone())
                    .with_rate(rate),
            };
            let m = &rule.matcher;
            if m.san.is_some() || m.sub.is_some() {
                if self.a2a.tls.client_ca.is_none() {
                    return Err(format!(
                        "{at}.match: certificate rules (san, sub) need a2a.tls.client_ca"
                    ));
                }
                let matcher = match (&m.san, &m.sub, &m.bearer_ref, m.any) {
                    (Some(glob), None, None, None) => {
                        agentd_core::tls::CertMatch::San(glob.clone())
                    }
                    (None, Some(cn), None, None) => agentd_core::tls::CertMatch::Sub(cn.clone()),
                    _ => {
                        return Err(format!(
                            "{at}.match: exactly one of san, sub, bearer_ref or any = true"
                        ))
                    }
                };
                auth.cert_rules
                    .push(agentd_core::tls::CertRule { matcher, principal });
                continue;
            }
            match (&m.bearer_ref, m.any) {
                (Some(reference), None) => {
                    let secret = resolve_secret(&format!("{at}.match.bearer_ref"), reference)?;
                    if let Some((other, _)) = secrets.iter().find(|(_, s)| *s == secret) {
                        return Err(format!("{at}.match.bearer_ref: the same secret as {other}"));
                    }
                    auth.bearers.push(BearerRule {
                        digest: AuthConfig::digest(&secret),
                        principal,
                    });
                    secrets.push((at, secret));
                }
                (None, Some(true)) => {
                    if role == Role::Operator {
                        return Err(format!("{at}: an any rule never names the operator"));
                    }
                    if auth.any.is_some() {
                        return Err(format!("{at}: only one rule may match any"));
                    }
                    auth.any = Some(principal);
                }
                _ => {
                    return Err(format!(
                        "{at}.match: exactly one of bearer_ref or any = true"
                    ))
                }
            }
        }
        Ok(auth)
    }
}

/// Reads a secret reference: `{{secret:NAME}}` (the environment variable NAME) or
/// `{{secret-file:PATH}}` (the file's content, trimmed). A credential never sits in the
/// configuration file itself, so the `config` op can show the file without redacting it.
fn resolve_secret(key: &str, reference: &str) -> Result<String, String> {
    let inner = reference
        .strip_prefix("{{")
        .and_then(|r| r.strip_suffix("}}"))
        .ok_or_else(|| format!("{key}: a credential is a {{{{secret:NAME}}}} or {{{{secret-file:PATH}}}} reference"))?;
    let secret = if let Some(name) = inner.strip_prefix("secret:") {
        std::env::var(name)
            .map_err(|_| format!("{key}: the environment variable {name} is not set"))?
    } else if let Some(path) = inner.strip_prefix("secret-file:") {
        std::fs::read_to_string(path)
            .map_err(|e| format!("{key}: {path}: {e}"))?
            .trim()
            .to_owned()
    } else {
        return Err(format!("{key}: {reference} is not a secret reference"));
    };
    if secret.is_empty() {
        return Err(format!("{key}: the secret is empty"));
    }
    if secret.starts_with("agentd_at_") {
        return Err(format!(
            "{key}: agentd_at_ is the prefix of session tokens, not of configured secrets"
        ));
    }
    Ok(secret)
}

/// The effective configuration, every default filled in, as the `config` op reports it.
/// Nothing secret is configurable yet; a credential will appear here only as its
/// `{{secret:…}}` reference.
fn effective_document(c: &InstanceConfig, max_connections: Option<usize>) -> serde_json::Value {
    let l = &c.conn;
    serde_json::json!({
        "agent": {"name": c.name, "description": c.description},
        "a2a": {
            "listen": c.listeners.iter().map(|l| l.url.clone()).collect::<Vec<_>>(),
            "events": {
                "enabled": c.events_enabled,
                "ring": c.events_ring,
                "stream_deadline_ms": c.events_stream_deadline_ms,
            },
            "introspection": {"enabled": c.introspection_enabled},
            "device_grant": {
                "enabled": c.device_grant.enabled,
                "scopes": c.device_grant.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                "token_ttl_s": c.device_grant.token_ttl_ms / 1000,
                "code_ttl_s": c.device_grant.code_ttl_ms / 1000,
                "rate": c.device_grant.rate.map(|r| r.to_string()),
            },
        },
        "limits": {
            "max_header_bytes": l.http.max_header_bytes,
            "max_headers": l.http.max_headers,
            "max_body_bytes": l.http.max_body_bytes,
            "idle_timeout_ms": l.idle_timeout_ms,
            "header_timeout_ms": l.header_timeout_ms,
            "body_timeout_ms": l.body_timeout_ms,
            "request_timeout_ms": l.request_timeout_ms,
            "write_timeout_ms": l.write_timeout_ms,
            "sse_keepalive_ms": l.sse_keepalive_ms,
            "stream_queue": l.stream_queue,
            "replay_events_per_task": c.replay.per_task,
            "replay_events": c.replay.events,
            "replay_bytes": c.replay.bytes,
            "max_tasks": c.tasks.max_tasks,
            "task_artifact_bytes": c.tasks.artifact_bytes,
            "max_connections": max_connections,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_op_reports_effective_values() {
        let c: Config =
            toml::from_str("[agent]\nname = \"reviewer\"\n[limits]\nmax_body_bytes = 1024")
                .unwrap();
        let listener = agentd_core::ListenerInfo {
            kind: agentd_core::ListenerKind::Tcp,
            url: "http://127.0.0.1:1/".into(),
            loopback: true,
        };
        let ic = c.instance_config(vec![listener]).unwrap();
        let d = &ic.config_document;
        assert_eq!(d["agent"]["name"], "reviewer");
        assert_eq!(d["a2a"]["listen"][0], "http://127.0.0.1:1/");
        assert_eq!(d["limits"]["max_body_bytes"], 1024);
        assert_eq!(
            d["limits"]["idle_timeout_ms"], 60_000,
            "defaults are filled in"
        );
        assert_eq!(d["limits"]["replay_events_per_task"], 64);
    }

    #[test]
    fn replay_bounds_are_read_and_zero_is_refused() {
        let listener = || {
            vec![agentd_core::ListenerInfo {
                kind: agentd_core::ListenerKind::Tcp,
                url: "http://127.0.0.1:1/".into(),
                loopback: true,
            }]
        };
        let c: Config = toml::from_str(
            "[limits]\nreplay_events_per_task = 8\nreplay_events = 100\nreplay_bytes = 5000",
        )
        .unwrap();
        let ic = c.instance_config(listener()).unwrap();
        assert_eq!(
            (ic.replay.per_task, ic.replay.events, ic.replay.bytes),
            (8, 100, 5000)
        );
        assert_eq!(ic.config_document["limits"]["replay_bytes"], 5000);
        let c: Config = toml::from_str("[limits]\nreplay_events = 0").unwrap();
        let err = c.instance_config(listener()).unwrap_err();
        assert!(err.contains("limits.replay_events"), "{err}");
    }

    #[test]
    fn credentials_load_from_references_and_bad_rules_are_load_errors() {
        std::env::set_var("AGENTD_TEST_OP", "op-token");
        std::env::set_var("AGENTD_TEST_PEER", "peer-token");
        let listener = || {
            vec![agentd_core::ListenerInfo {
                kind: agentd_core::ListenerKind::Tcp,
                url: "http://127.0.0.1:1/".into(),
                loopback: true,
            }]
        };
        let good = r#"
            [a2a]
            bearer = "{{secret:AGENTD_TEST_OP}}"
            [[a2a.principals]]
            id = "peer-a"
            role = "agent"
            grants = ["workflow.signal"]
            match = { bearer_ref = "{{secret:AGENTD_TEST_PEER}}" }
        "#;
        let c: Config = toml::from_str(good).unwrap();
        let ic = c.instance_config(listener()).unwrap();
        assert!(ic.auth.operator_bearer.is_some());
        assert_eq!(ic.auth.bearers[0].principal.id, "agent:peer-a");
        let shown = ic.config_document.to_string();
        assert!(
            !shown.contains("op-token") && !shown.contains("peer-token"),
            "secrets never shown: {shown}"
        );
        assert!(shown.contains("{{secret:AGENTD_TEST_OP}}"));
        for (text, needle) in [
            (
                r#"[a2a]
bearer = "op-token""#,
                "reference",
            ),
            (
                r#"[a2a]
bearer = "{{secret:AGENTD_TEST_UNSET_XYZ}}""#,
                "not set",
            ),
            (
                r#"[[a2a.principals]]
id = "u"
role = "user"
grants = ["admin.drain"]
match = { any = true }"#,
                "operator-only",
            ),
            (
                r#"[[a2a.principals]]
id = "u"
role = "user"
grants = ["config.set"]
match = { any = true }"#,
                "removed",
            ),
            (
                r#"[[a2a.principals]]
role = "user"
match = { any = true }"#,
                "id: required",
            ),
            (
                r#"[[a2a.principals]]
id = "u u"
role = "user"
match = { any = true }"#,
                "must be",
            ),
            (
                r#"[[a2a.principals]]
id = "u"
role = "root"
match = { any = true }"#,
                "not operator",
            ),
            (
                r#"[[a2a.principals]]
id = "u"
role = "user"
match = { sub = "x" }"#,
                "client_ca",
            ),
            (
                r#"[a2a]
bearer = "{{secret:AGENTD_TEST_OP}}"
[[a2a.principals]]
id = "u"
role = "user"
match = { bearer_ref = "{{secret:AGENTD_TEST_OP}}" }"#,
                "same secret",
            ),
        ] {
            let c: Config = toml::from_str(text).unwrap();
            let err = c.instance_config(listener()).map(|_| ()).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn quotas_rate_loads_and_bad_specs_and_budget_are_load_errors() {
        std::env::set_var("AGENTD_TEST_RATE_OP", "op-token-rate");
        let listener = || {
            vec![agentd_core::ListenerInfo {
                kind: agentd_core::ListenerKind::Tcp,
                url: "http://127.0.0.1:1/".into(),
                loopback: true,
            }]
        };
        let good = r#"
            [a2a]
            bearer = "{{secret:AGENTD_TEST_RATE_OP}}"
            device_grant = { enabled = true, rate = "30/60s" }
            [[a2a.principals]]
            id = "guest"
            role = "user"
            match = { any = true }
            quotas = { rate = "2/60s" }
        "#;
        let c: Config = toml::from_str(good).unwrap();
        let ic = c.instance_config(listener()).unwrap();
        let rate = agentd_core::limits::Rate {
            burst: 2,
            per_s: 60,
        };
        assert_eq!(ic.auth.any.as_ref().unwrap().rate, Some(rate));
        assert_eq!(
            ic.device_grant.rate.map(|r| r.to_string()).as_deref(),
            Some("30/60s")
        );
        assert_eq!(
            ic.config_document["a2a"]["principals"][0]["quotas"]["rate"],
            "2/60s"
        );
        for (quotas, needle) in [
            (r#"{ rate = "2/60" }"#, "a2a.principals[0].quotas.rate"),
            (r#"{ rate = "0/60s" }"#, "a2a.principals[0].quotas.rate"),
            (r#"{ rate = "x" }"#, "<burst>/<per>s"),
            (
                r#"{ budget = 100 }"#,
                "a2a.principals[0].quotas.budget: not supported",
            ),
        ] {
            let text = format!(
                "[[a2a.principals]]\nid = \"g\"\nrole = \"user\"\nmatch = {{ any = true }}\nquotas = {quotas}\n"
            );
            let c: Config = toml::from_str(&text).unwrap();
            let err = c.instance_config(listener()).map(|_| ()).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let text = "[[a2a.principals]]\nid = \"g\"\nrole = \"user\"\nmatch = { any = true }\nquotas = { burst = 1 }\n";
        assert!(
            toml::from_str::<Config>(text).is_err(),
            "unknown quota keys stay refused"
        );
        let text = r#"
            [a2a]
            bearer = "{{secret:AGENTD_TEST_RATE_OP}}"
            device_grant = { enabled = true, rate = "fast" }
        "#;
        let c: Config = toml::from_str(text).unwrap();
        let err = c.instance_config(listener()).map(|_| ()).unwrap_err();
        assert!(err.starts_with("a2a.device_grant.rate: "), "{err}");
    }

    #[test]
    fn default_is_loopback_8420() {
        let c = Config::default();
        assert_eq!(
            c.endpoints().unwrap(),
            vec![Endpoint::Tcp("127.0.0.1:8420".parse().unwrap())]
        );
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        for (text, needle) in [
            ("[a2a]\nlisten = \"tcp://0.0.0.0:1\"", "plaintext"),
            ("[a2a]\nlisten = \"https://127.0.0.1:1\"", "a2a.tls.cert"),
            ("[a2a]\nlisten = []", "no endpoint"),
            ("[a2a]\nlisten = \"ftp://x\"", "expected"),
            ("[limits]\nmax_body_bytes = 0", "greater than 0"),
        ] {
            let c: Config = toml::from_str(text).unwrap();
            let err = c
                .endpoints()
                .and_then(|_| c.instance_config(vec![]).map(|_| ()))
                .unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let err = toml::from_str::<Config>("[a2a]\nlisen = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lisen"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }
}
