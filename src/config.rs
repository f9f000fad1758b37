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

use agentd_core::{InstanceConfig, ListenerInfo};
use agentd_io_common::Endpoint;
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
    /// `[log]`: how log lines are written.
    #[serde(default)]
    pub log: LogSection,
    /// `[telemetry]`: where spans are exported.
    #[serde(default)]
    pub telemetry: TelemetrySection,
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
    /// How long one turn may take, in ms (default 300000; 1 to [`MAX_TIMEOUT_MS`]).
    pub turn_timeout_ms: Option<u64>,
    /// Environment variables set for the agent on top of agentd's own.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The card's `documentationUrl`.
    pub documentation_url: Option<String>,
    /// The card's `iconUrl`.
    pub icon_url: Option<String>,
    /// `[agent.provider]`: the card's `provider`.
    pub provider: Option<ProviderSection>,
    /// `[[agent.skills]]`: the card's skills, after the conversation skill (listed when a
    /// conversation agent is configured).
    #[serde(default)]
    pub skills: Vec<SkillSection>,
}

/// `[agent.provider]`: who runs the agent, as the card's `provider` says.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    pub organization: String,
    pub url: String,
}

/// `[[agent.skills]]`: one skill on the card.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillSection {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub examples: Vec<String>,
    /// Media types the skill takes, when not the card's defaults.
    #[serde(default)]
    pub input_modes: Vec<String>,
    /// Media types the skill answers with, when not the card's defaults.
    #[serde(default)]
    pub output_modes: Vec<String>,
}

/// `[log]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` (the default) or `json` (one JSON object a line). `AGENTD_LOG_FORMAT`, when
    /// set, wins.
    pub format: Option<String>,
}

/// `[telemetry]`: traces (see `crate::telemetry`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// The OTLP/HTTP collector's base URL: spans are POSTed to `<it>/v1/traces`. Unset,
    /// nothing is exported (trace context is still carried on).
    pub otlp_endpoint: Option<String>,
    /// The spans' `service.name` (default `agentd`).
    pub service_name: Option<String>,
}

/// The default `telemetry.service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "agentd";

impl Config {
    /// `[telemetry]`, checked: `None` when no collector is configured.
    pub fn telemetry(&self) -> Result<Option<crate::telemetry::TelemetrySettings>, String> {
        let t = &self.telemetry;
        if let Some(name) = &t.service_name {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                return Err(format!(
                    "telemetry.service_name: {name:?} is not 1 to 128 printable characters"
                ));
            }
        }
        let Some(url) = &t.otlp_endpoint else {
            return Ok(None);
        };
        let otlp_endpoint = crate::telemetry::check_endpoint(url)
            .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
        Ok(Some(crate::telemetry::TelemetrySettings {
            otlp_endpoint,
            service_name: t
                .service_name
                .clone()
                .unwrap_or_else(|| DEFAULT_SERVICE_NAME.into()),
        }))
    }
}

/// `[a2a.proxy]`: the TLS-terminating proxies in front of `behind_proxy` listeners.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySection {
    /// The proxies' addresses (`10.0.0.5`, `10.0.0.0/24`, `fd00::/64`): `X-Forwarded-For`
    /// is read only on connections from them.
    #[serde(default)]
    pub trusted: Vec<String>,
}

/// `[[subagents]]`: a kind of named agent process `subagent.send` starts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubagentSection {
    pub name: String,
    pub command: Vec<String>,
    /// How long one turn may take, in ms (default 300000; 1 to [`MAX_TIMEOUT_MS`]).
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
    #[serde(default)]
    pub console: ConsoleSection,
    /// `[[a2a.peers]]`: the agents `a2a.send` and `a2a.delegate` steps call.
    #[serde(default)]
    pub peers: Vec<PeerSection>,
    #[serde(default)]
    pub push: PushSection,
    #[serde(default)]
    pub proxy: ProxySection,
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
    /// Attempts per notification before it is given up (default 5; 1 to
    /// [`MAX_PUSH_ATTEMPTS`]).
    pub max_attempts: Option<u32>,
    /// The wait before the first retry, in ms, doubling each time up to 30 s (default 500;
    /// 0 to [`MAX_PUSH_BACKOFF_MS`]: 0 retries at once).
    pub backoff_ms: Option<u64>,
    /// One attempt's deadline, in ms (default 10000; 1 to [`MAX_PUSH_TIMEOUT_MS`]).
    pub timeout_ms: Option<u64>,
    /// PEM CAs to trust for https webhooks (default: the system's).
    pub ca: Option<String>,
    /// Deliveries made at once (default 4; 1 to [`MAX_PUSH_WORKERS`]).
    pub workers: Option<usize>,
    /// Deliveries waiting for a worker; past it one is given up at once (default 1024; 1 to
    /// [`MAX_PUSH_QUEUE`]).
    pub queue: Option<usize>,
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

/// `[a2a.console]`: the web console at `/console/` (docs/console.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSection {
    #[serde(default)]
    pub enabled: bool,
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
    /// `Strict-Transport-Security: max-age=` of the https listeners' answers, in seconds
    /// (default a year, 31536000; 0 sends none; at most [`MAX_HSTS_MAX_AGE_S`]).
    pub hsts_max_age_s: Option<u64>,
}

/// `[a2a.device_grant]`: sign-in by the OAuth 2.0 device authorization grant.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGrantSection {
    #[serde(default)]
    pub enabled: bool,
    /// Scopes a device may be approved for: `user`, `operator` (default `["user"]`).
    pub scopes: Option<Vec<String>>,
    /// Seconds a session token lives (default 28800; [`TOKEN_TTL_S`]: 300 to 2592000).
    pub token_ttl_s: Option<u64>,
    /// Seconds a device code waits for a decision (default 600; [`CODE_TTL_S`]: 60 to 1800).
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
    /// Events kept for a reconnecting subscriber (default 1024; 1 to [`MAX_EVENTS_RING`]).
    /// The ring is allocated whole at start-up.
    pub ring: Option<usize>,
    /// A feed stream ends with `goodbye` `deadline` after this long, in ms (default 600000;
    /// 1 to [`MAX_TIMEOUT_MS`]).
    pub stream_deadline_ms: Option<u64>,
    /// Under a steady flow of events a subscriber takes them at most once per this many ms,
    /// or sooner once a batch waits (default 10; 0 to [`MAX_EVENTS_BATCH_MS`]; 0: at every
    /// event).
    pub batch_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum Listen {
    #[default]
    Unset,
    // A list is tried first: a table can be read from a list too (its fields in order).
    Many(Vec<ListenEntry>),
    One(ListenEntry),
}

/// One entry of `a2a.listen`: its URL, or a table that says more about the listener.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum ListenEntry {
    Url(String),
    Table(ListenTable),
}

/// `{ url = "...", public_url = "...", behind_proxy = true }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenTable {
    pub url: String,
    /// The URL the card names for this listener (default: the address it is bound to).
    pub public_url: Option<String>,
    /// The listener is reached through a trusted TLS-terminating proxy (see
    /// docs/security.md): never loopback-trusted, plaintext allowed on a non-loopback
    /// address with a credential rule or `a2a.proxy.trusted`.
    #[serde(default)]
    pub behind_proxy: bool,
}

impl ListenEntry {
    /// The entry as a table.
    pub fn table(&self) -> ListenTable {
        match self {
            ListenEntry::Url(url) => ListenTable {
                url: url.clone(),
                public_url: None,
                behind_proxy: false,
            },
            ListenEntry::Table(t) => t.clone(),
        }
    }
}

/// Every bound of a connection, overriding the defaults of
/// [`agentd_core::ConnLimits::DEFAULT`]. Each key has a range, checked at load by
/// [`in_range`] (a value outside it is a load error naming the key); the defaults are inside.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Request line plus headers, in bytes (default 16384; 1 to [`MAX_HEADER_BYTES`]).
    pub max_header_bytes: Option<usize>,
    /// Header fields in one request (default 64; 1 to [`MAX_HEADERS`]).
    pub max_headers: Option<usize>,
    /// Decoded body bytes (default 2097152; 1 to [`MAX_BODY_BYTES`]).
    pub max_body_bytes: Option<usize>,
    /// In ms, as every `*_timeout_ms` and `sse_keepalive_ms` here (default 60000; 1 to
    /// [`MAX_TIMEOUT_MS`]).
    pub idle_timeout_ms: Option<u64>,
    /// Default 10000; 1 to [`MAX_TIMEOUT_MS`].
    pub header_timeout_ms: Option<u64>,
    /// Default 30000; 1 to [`MAX_TIMEOUT_MS`].
    pub body_timeout_ms: Option<u64>,
    /// Default 120000; 1 to [`MAX_TIMEOUT_MS`].
    pub request_timeout_ms: Option<u64>,
    /// Default 30000; 1 to [`MAX_TIMEOUT_MS`].
    pub write_timeout_ms: Option<u64>,
    /// Default 15000; 1 to [`MAX_TIMEOUT_MS`].
    pub sse_keepalive_ms: Option<u64>,
    /// Events queued for one slow stream reader (default 256; 1 to [`MAX_STREAM_QUEUE`]).
    pub stream_queue: Option<usize>,
    /// Unsent bytes of answers larger than a connection's output bound, over all
    /// connections (default 64 MiB; 1 to [`MAX_LARGE_ANSWERS_BYTES`]).
    pub large_answers_bytes: Option<usize>,
    /// Stream events kept per task for `Last-Event-ID` reconnection (default 64; 1 to
    /// [`MAX_REPLAY_EVENTS_PER_TASK`]).
    pub replay_events_per_task: Option<usize>,
    /// Stream events kept over all tasks (default 4096; 1 to [`MAX_REPLAY_EVENTS`]).
    pub replay_events: Option<usize>,
    /// Serialized bytes of stream events kept over all tasks (default 4194304; 1 to
    /// [`MAX_REPLAY_BYTES`]).
    pub replay_bytes: Option<usize>,
    /// Tasks held (default 10000; 1 to [`MAX_TASKS`]).
    pub max_tasks: Option<usize>,
    /// Serialized bytes of one task's artifacts together (1 to [`MAX_TASK_ARTIFACT_BYTES`]).
    pub task_artifact_bytes: Option<usize>,
    /// Parts one message may carry (default 256; 1 to [`MAX_MESSAGE_PARTS`]).
    pub max_message_parts: Option<usize>,
    /// Bytes of all tasks together, history and artifacts (default 512 MiB;
    /// [`MIN_TASKS_BYTES`] to [`MAX_TASKS_BYTES`]).
    pub tasks_bytes: Option<usize>,
    /// Live subagents of one principal (default 8; 1 to [`MAX_SUBAGENTS`]).
    pub max_subagents_per_principal: Option<usize>,
    /// Live subagents in all (default 64; 1 to [`MAX_SUBAGENTS`]).
    pub max_subagents: Option<usize>,
    /// Connections held at once (default: the driver's, 10000 or 1024; 1 to
    /// [`MAX_CONNECTIONS`]).
    pub max_connections: Option<usize>,
    /// The listen backlog of every listener: connects the kernel queues before the accept
    /// loop takes them (default [`DEFAULT_LISTEN_BACKLOG`]; 1 to [`MAX_LISTEN_BACKLOG`];
    /// the kernel lowers it to `net.core.somaxconn`).
    pub listen_backlog: Option<usize>,
    /// Threads of the smol driver's executor, which serve every connection (default: one
    /// per CPU the process may use; 1 to [`MAX_SMOL_THREADS`]). The std driver runs a
    /// thread per connection and does not read it.
    pub smol_threads: Option<usize>,
}

impl LimitsSection {
    /// The smol driver's executor threads: as configured, else one per CPU the process may
    /// use (`available_parallelism`: its affinity mask and its cgroup's CPU quota).
    pub fn smol_threads(&self) -> usize {
        self.smol_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .clamp(1, MAX_SMOL_THREADS)
    }

    /// The listen backlog every listener is bound with.
    pub fn listen_backlog(&self) -> u32 {
        // In range once loaded ([`Config::check_ranges`]); the clamp keeps an unchecked
        // value from wrapping.
        self.listen_backlog
            .unwrap_or(DEFAULT_LISTEN_BACKLOG)
            .clamp(1, MAX_LISTEN_BACKLOG) as u32
    }
}

/// The most any timeout or interval in milliseconds may be: a day. It also keeps every
/// `now + timeout` (a monotonic `u64` of ms, or an `Instant`) far from overflowing.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// The most `limits.max_header_bytes` may be (1 MiB).
pub const MAX_HEADER_BYTES: usize = 1 << 20;

/// The most `limits.max_headers` may be: the HTTP parser has room for 128 header fields, so a
/// larger bound would be lowered to it silently.
pub const MAX_HEADERS: usize = 128;

/// The most `limits.max_body_bytes` may be (4 MiB). One message is stored whole in its task's
/// record, beside the task's history, status and up to [`MAX_TASK_ARTIFACT_BYTES`] of
/// artifacts, and the store's largest append is 16 MiB: a larger body could make a task
/// record the store cannot write.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// The most `limits.stream_queue` may be.
pub const MAX_STREAM_QUEUE: usize = 65_536;

/// The most `limits.large_answers_bytes` may be (64 GiB).
pub const MAX_LARGE_ANSWERS_BYTES: usize = 64 << 30;

/// The most `limits.replay_events_per_task` may be.
pub const MAX_REPLAY_EVENTS_PER_TASK: usize = 65_536;

/// The most `limits.replay_events` may be.
pub const MAX_REPLAY_EVENTS: usize = 1 << 20;

/// The most `limits.replay_bytes` may be (1 GiB).
pub const MAX_REPLAY_BYTES: usize = 1 << 30;

/// The most `limits.max_tasks` may be.
pub const MAX_TASKS: usize = 1_000_000;

/// The most `limits.task_artifact_bytes` may be: with a task's history and status it keeps
/// the largest task record well inside the store's largest append (16 MiB).
pub const MAX_TASK_ARTIFACT_BYTES: usize = 8 << 20;

/// The least `limits.tasks_bytes` may be: room for the largest single task.
pub const MIN_TASKS_BYTES: usize = 16 << 20;

/// The most `limits.tasks_bytes` may be (64 GiB).
pub const MAX_TASKS_BYTES: usize = 64 << 30;

/// The most `limits.max_message_parts` may be.
pub const MAX_MESSAGE_PARTS: usize = 4096;

/// The most `limits.max_subagents` (and `max_subagents_per_principal`) may be: each is a
/// process with three threads of its own.
pub const MAX_SUBAGENTS: usize = 1024;

/// The most `a2a.push.workers` may be.
pub const MAX_PUSH_WORKERS: usize = 256;

/// The most `a2a.push.queue` may be.
pub const MAX_PUSH_QUEUE: usize = 1 << 20;

/// The most `limits.max_connections` may be (Linux's default ceiling of open files).
pub const MAX_CONNECTIONS: usize = 1 << 20;

/// The most `limits.smol_threads` may be.
pub const MAX_SMOL_THREADS: usize = 1024;

/// `limits.listen_backlog` when unset: a burst of a few thousand connects queues whole.
pub const DEFAULT_LISTEN_BACKLOG: usize = agentd_io_common::os::DEFAULT_LISTEN_BACKLOG as usize;

/// The most `limits.listen_backlog` may be (the kernel caps it at `net.core.somaxconn`).
pub const MAX_LISTEN_BACKLOG: usize = agentd_io_common::os::MAX_LISTEN_BACKLOG as usize;

/// The most `a2a.events.ring` may be: the ring is allocated whole at start-up.
pub const MAX_EVENTS_RING: usize = 65_536;

/// The most `a2a.events.batch_ms` may be: the longest an event may wait for a batch.
pub const MAX_EVENTS_BATCH_MS: u64 = 1000;

/// The most `a2a.tls.hsts_max_age_s` may be: two years.
pub const MAX_HSTS_MAX_AGE_S: u64 = 63_072_000;

/// The most `a2a.push.max_attempts` may be.
pub const MAX_PUSH_ATTEMPTS: u32 = 20;

/// The most `a2a.push.backoff_ms` may be: the backoff doubles up to 30 s, so a first wait
/// past that would be the longest.
pub const MAX_PUSH_BACKOFF_MS: u64 = 30_000;

/// The most `a2a.push.timeout_ms` may be (5 minutes).
pub const MAX_PUSH_TIMEOUT_MS: u64 = 300_000;

/// `a2a.device_grant.token_ttl_s`: 5 minutes to 30 days.
pub const TOKEN_TTL_S: (u64, u64) = (300, 2_592_000);

/// `a2a.device_grant.code_ttl_s`: 1 to 30 minutes.
pub const CODE_TTL_S: (u64, u64) = (60, 1800);

/// Checks a numeric key against its range, `min..=max`: the one check every numeric key of
/// the file goes through, so each refusal reads alike and names the key.
pub fn in_range<T: Copy + PartialOrd + std::fmt::Display>(
    key: &str,
    value: T,
    min: T,
    max: T,
) -> Result<T, String> {
    if min <= value && value <= max {
        Ok(value)
    } else {
        Err(format!("{key}: must be from {min} to {max}, not {value}"))
    }
}

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
        self.check_ranges()?;
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
                let ms = in_range(&format!("{key}.turn_timeout_ms"), ms, 1, MAX_TIMEOUT_MS)?;
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
            limits: self.runtime_limits()?,
        })
    }

    fn runtime_limits(&self) -> Result<crate::runtime::RuntimeLimits, String> {
        let mut r = crate::runtime::RuntimeLimits::default();
        let l = &self.limits;
        if let Some(n) = l.max_subagents_per_principal {
            r.max_subagents_per_principal =
                in_range("limits.max_subagents_per_principal", n, 1, MAX_SUBAGENTS)?;
        }
        if let Some(n) = l.max_subagents {
            r.max_subagents = in_range("limits.max_subagents", n, 1, MAX_SUBAGENTS)?;
        }
        Ok(r)
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
            o.max_attempts = in_range("a2a.push.max_attempts", n, 1, MAX_PUSH_ATTEMPTS)?;
        }
        if let Some(ms) = p.backoff_ms {
            let ms = in_range("a2a.push.backoff_ms", ms, 0, MAX_PUSH_BACKOFF_MS)?;
            o.first_backoff = std::time::Duration::from_millis(ms);
        }
        if let Some(ms) = p.timeout_ms {
            let ms = in_range("a2a.push.timeout_ms", ms, 1, MAX_PUSH_TIMEOUT_MS)?;
            o.timeout = std::time::Duration::from_millis(ms);
        }
        if let Some(ca) = &p.ca {
            o.ca = Some(std::fs::read(ca).map_err(|e| format!("a2a.push.ca: {ca}: {e}"))?);
        }
        if let Some(n) = p.workers {
            o.workers = in_range("a2a.push.workers", n, 1, MAX_PUSH_WORKERS)?;
        }
        if let Some(n) = p.queue {
            o.queue = in_range("a2a.push.queue", n, 1, MAX_PUSH_QUEUE)?;
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
            self.a2a.listen = Listen::Many(listen.iter().cloned().map(ListenEntry::Url).collect());
        }
    }

    /// The entries of `a2a.listen` (the default one when unset).
    pub fn listen_entries(&self) -> Result<Vec<ListenTable>, String> {
        Ok(match &self.a2a.listen {
            Listen::Unset => vec![ListenEntry::Url(DEFAULT_LISTEN.to_owned()).table()],
            Listen::One(e) => vec![e.table()],
            Listen::Many(v) if v.is_empty() => return Err("a2a.listen names no endpoint".into()),
            Listen::Many(v) => v.iter().map(ListenEntry::table).collect(),
        })
    }

    /// The endpoints to listen on, validated: the URLs, and the proxy trust rules (see
    /// docs/security.md).
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, String> {
        let list = self.listen_entries()?;
        let credential = self.a2a.bearer.is_some()
            || self
                .a2a
                .principals
                .iter()
                .any(|r| r.matcher.bearer_ref.is_some());
        let scheme = credential || self.a2a.tls.client_ca.is_some();
        let trusted = self.trusted_proxies()?;
        if !trusted.is_empty() && !list.iter().any(|e| e.behind_proxy) {
            return Err(
                "a2a.proxy.trusted: no listener is behind_proxy; the proxies' \
                        X-Forwarded-For is read only on listeners marked behind_proxy = true"
                    .into(),
            );
        }
        list.iter()
            .map(|entry| {
                let s = &entry.url;
                let ep: Endpoint = s.parse().map_err(|e| format!("a2a.listen: {e}"))?;
                if let Some(url) = &entry.public_url {
                    check_url(&format!("a2a.listen: {s}: public_url"), url)?;
                }
                match &ep {
                    Endpoint::Unix(_) if entry.behind_proxy => {
                        return Err(format!(
                            "a2a.listen: {s}: behind_proxy is for TCP listeners: a unix socket's \
                             callers are the operator, so a proxy in front of it would make every \
                             caller the operator"
                        ))
                    }
                    Endpoint::Tcp(addr) if !addr.ip().is_loopback() && !entry.behind_proxy => {
                        return Err(format!(
                            "a2a.listen: {s}: plaintext is served only on loopback; use https:// \
                             with a2a.tls, or for a TLS-terminating proxy in front of it \
                             {{ url = \"{s}\", behind_proxy = true }}"
                        ))
                    }
                    Endpoint::Tcp(addr)
                        if !addr.ip().is_loopback() && !credential && trusted.is_empty() =>
                    {
                        return Err(format!(
                            "a2a.listen: {s}: a non-loopback plaintext listener behind a proxy \
                             needs a credential rule (a2a.bearer or a bearer_ref rule) or the \
                             proxies' addresses in a2a.proxy.trusted, and neither is configured"
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

    /// `a2a.proxy.trusted`, parsed.
    pub fn trusted_proxies(&self) -> Result<Vec<agentd_core::proxy::IpNet>, String> {
        self.a2a
            .proxy
            .trusted
            .iter()
            .enumerate()
            .map(|(i, t)| {
                agentd_core::proxy::IpNet::parse(t)
                    .map_err(|e| format!("a2a.proxy.trusted[{i}]: {e}"))
            })
            .collect()
    }

    /// The card's skills beyond the host's: `[[agent.skills]]`, checked.
    fn card_skills(
        &self,
        host: &[agentd_core::a2a::card::AgentSkill],
    ) -> Result<Vec<agentd_core::a2a::card::AgentSkill>, String> {
        let mut out: Vec<agentd_core::a2a::card::AgentSkill> = Vec::new();
        for (i, s) in self.agent.skills.iter().enumerate() {
            let key = format!("agent.skills[{i}]");
            let ok_id = !s.id.is_empty()
                && s.id.len() <= 64
                && s.id
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
            if !ok_id {
                return Err(format!(
                    "{key}.id: {:?} must be 1-64 of [a-zA-Z0-9._-]",
                    s.id
                ));
            }
            if host.iter().chain(&out).any(|x| x.id == s.id) {
                return Err(format!(
                    "{key}.id: {:?} is already a skill of the card{}",
                    s.id,
                    if s.id == "conversation" {
                        " (the conversation agent's)"
                    } else {
                        ""
                    }
                ));
            }
            for (field, text, max) in [
                ("name", &s.name, 128),
                ("description", &s.description, 4096),
            ] {
                if text.trim().is_empty() || text.len() > max {
                    return Err(format!(
                        "{key}.{field}: must be 1 to {max} bytes, not blank"
                    ));
                }
            }
            for (field, modes) in [
                ("input_modes", &s.input_modes),
                ("output_modes", &s.output_modes),
            ] {
                for m in modes {
                    let ok = m.split_once('/').is_some_and(|(t, sub)| {
                        !t.is_empty()
                            && !sub.is_empty()
                            && m.bytes().all(|c| c.is_ascii_graphic())
                            && !sub.contains('/')
                    });
                    if !ok {
                        return Err(format!(
                            "{key}.{field}: {m:?} is not a media type (type/subtype)"
                        ));
                    }
                }
            }
            out.push(agentd_core::a2a::card::AgentSkill {
                description: s.description.clone(),
                examples: s.examples.clone(),
                id: s.id.clone(),
                input_modes: s.input_modes.clone(),
                name: s.name.clone(),
                output_modes: s.output_modes.clone(),
                tags: s.tags.clone(),
            });
        }
        Ok(out)
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

    pub fn instance_config(
        &self,
        mut listeners: Vec<ListenerInfo>,
    ) -> Result<InstanceConfig, String> {
        self.check_ranges()?;
        // A listener's public URL is what its card names; one behind a proxy is never
        // loopback-trusted (its callers are the proxy's). Entries beyond the listeners
        // given (none, in unit tests) are ignored.
        let mut proxy = agentd_core::proxy::ProxyTrust {
            listeners: Vec::new(),
            trusted: self.trusted_proxies()?,
        };
        for (i, entry) in self.listen_entries()?.iter().enumerate() {
            let Some(l) = listeners.get_mut(i) else { break };
            if let Some(url) = &entry.public_url {
                check_url(&format!("a2a.listen: {}: public_url", entry.url), url)?;
                l.url = url.clone();
            }
            if entry.behind_proxy {
                l.loopback = false;
                proxy.listeners.push(i);
            }
        }
        let mut c = InstanceConfig::new(listeners);
        c.proxy = proxy;
        if let Some(n) = self.a2a.tls.hsts_max_age_s {
            c.hsts_max_age_s = n;
        }
        if let Some(n) = &self.agent.name {
            c.name = n.clone();
        }
        // Every op the runtime serves; without an agent every turn is rejected, so the card
        // offers no conversation.
        c.host = crate::runtime::capabilities(self.agent.command.is_some());
        let extra = self.card_skills(&c.host.skills)?;
        c.host.skills.extend(extra);
        if let Some(u) = &self.agent.documentation_url {
            check_url("agent.documentation_url", u)?;
            c.documentation_url = Some(u.clone());
        }
        if let Some(u) = &self.agent.icon_url {
            check_url("agent.icon_url", u)?;
            c.icon_url = Some(u.clone());
        }
        if let Some(p) = &self.agent.provider {
            if p.organization.trim().is_empty() {
                return Err("agent.provider.organization: must not be blank".into());
            }
            check_url("agent.provider.url", &p.url)?;
            c.provider = Some(agentd_core::a2a::card::AgentProvider {
                organization: p.organization.clone(),
                url: p.url.clone(),
            });
        }
        if let Some(d) = &self.agent.description {
            c.description = d.clone();
        }
        // Every value below was checked against its range by `check_ranges`.
        let l = &self.limits;
        let conn = &mut c.conn;
        let set = |field: &mut usize, value: Option<usize>| {
            if let Some(v) = value {
                *field = v;
            }
        };
        set(&mut conn.http.max_header_bytes, l.max_header_bytes);
        set(&mut conn.http.max_headers, l.max_headers);
        set(&mut conn.http.max_body_bytes, l.max_body_bytes);
        set(&mut conn.stream_queue, l.stream_queue);
        set(&mut conn.large_answers_bytes, l.large_answers_bytes);
        for (field, value) in [
            (&mut conn.idle_timeout_ms, l.idle_timeout_ms),
            (&mut conn.header_timeout_ms, l.header_timeout_ms),
            (&mut conn.body_timeout_ms, l.body_timeout_ms),
            (&mut conn.request_timeout_ms, l.request_timeout_ms),
            (&mut conn.write_timeout_ms, l.write_timeout_ms),
            (&mut conn.sse_keepalive_ms, l.sse_keepalive_ms),
        ] {
            if let Some(v) = value {
                *field = v;
            }
        }
        set(&mut c.tasks.max_tasks, l.max_tasks);
        // The bound keeps a task record inside the store's largest append.
        set(&mut c.tasks.artifact_bytes, l.task_artifact_bytes);
        set(&mut c.tasks.max_message_parts, l.max_message_parts);
        set(&mut c.tasks.total_bytes, l.tasks_bytes);
        set(&mut c.replay.per_task, l.replay_events_per_task);
        set(&mut c.replay.events, l.replay_events);
        set(&mut c.replay.bytes, l.replay_bytes);
        c.introspection_enabled = self.a2a.introspection.enabled;
        if self.a2a.console.enabled {
            c.console = &crate::console::FILES;
        }
        c.push = agentd_core::push::PushPolicy {
            enabled: self.a2a.push.enabled,
            allow_private: self.a2a.push.allow_private,
        };
        let ev = &self.a2a.events;
        c.events_enabled = ev.enabled;
        if let Some(n) = ev.ring {
            c.events_ring = n;
        }
        if let Some(ms) = ev.stream_deadline_ms {
            c.events_stream_deadline_ms = ms;
        }
        if let Some(ms) = ev.batch_ms {
            c.events_batch_ms = ms;
        }
        c.auth = self.auth_config()?;
        c.cors = agentd_core::http::cors::CorsPolicy::from_list(&self.a2a.cors.origins)?;
        c.device_grant = self.device_grant(&c.auth)?;
        c.config_document = effective_document(&c, &self.limits);
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

    /// Checks every numeric key of the file against its range (see the field docs), with
    /// [`in_range`]. Run by [`Config::runtime_settings`] (so by [`Config::load`]) and
    /// [`Config::instance_config`]; the workflow steps' `timeout_ms` are checked with their
    /// workflow (`crate::runtime::workflow`).
    pub fn check_ranges(&self) -> Result<(), String> {
        let l = &self.limits;
        let sizes: [(&str, Option<usize>, usize); 14] = [
            (
                "limits.max_header_bytes",
                l.max_header_bytes,
                MAX_HEADER_BYTES,
            ),
            ("limits.max_headers", l.max_headers, MAX_HEADERS),
            ("limits.max_body_bytes", l.max_body_bytes, MAX_BODY_BYTES),
            ("limits.stream_queue", l.stream_queue, MAX_STREAM_QUEUE),
            (
                "limits.large_answers_bytes",
                l.large_answers_bytes,
                MAX_LARGE_ANSWERS_BYTES,
            ),
            (
                "limits.replay_events_per_task",
                l.replay_events_per_task,
                MAX_REPLAY_EVENTS_PER_TASK,
            ),
            ("limits.replay_events", l.replay_events, MAX_REPLAY_EVENTS),
            ("limits.replay_bytes", l.replay_bytes, MAX_REPLAY_BYTES),
            ("limits.max_tasks", l.max_tasks, MAX_TASKS),
            (
                "limits.task_artifact_bytes",
                l.task_artifact_bytes,
                MAX_TASK_ARTIFACT_BYTES,
            ),
            (
                "limits.max_message_parts",
                l.max_message_parts,
                MAX_MESSAGE_PARTS,
            ),
            ("limits.max_connections", l.max_connections, MAX_CONNECTIONS),
            (
                "limits.listen_backlog",
                l.listen_backlog,
                MAX_LISTEN_BACKLOG,
            ),
            ("limits.smol_threads", l.smol_threads, MAX_SMOL_THREADS),
        ];
        for (key, value, max) in sizes {
            if let Some(v) = value {
                in_range(key, v, 1, max)?;
            }
        }
        if let Some(n) = self.a2a.events.ring {
            in_range("a2a.events.ring", n, 1, MAX_EVENTS_RING)?;
        }
        if let Some(ms) = self.a2a.events.batch_ms {
            in_range("a2a.events.batch_ms", ms, 0, MAX_EVENTS_BATCH_MS)?;
        }
        self.runtime_limits()?;
        if let Some(n) = l.tasks_bytes {
            in_range("limits.tasks_bytes", n, MIN_TASKS_BYTES, MAX_TASKS_BYTES)?;
        }
        if let Some(n) = self.a2a.push.workers {
            in_range("a2a.push.workers", n, 1, MAX_PUSH_WORKERS)?;
        }
        if let Some(n) = self.a2a.push.queue {
            in_range("a2a.push.queue", n, 1, MAX_PUSH_QUEUE)?;
        }
        let mut timeouts: Vec<(String, Option<u64>)> = vec![
            ("limits.idle_timeout_ms".into(), l.idle_timeout_ms),
            ("limits.header_timeout_ms".into(), l.header_timeout_ms),
            ("limits.body_timeout_ms".into(), l.body_timeout_ms),
            ("limits.request_timeout_ms".into(), l.request_timeout_ms),
            ("limits.write_timeout_ms".into(), l.write_timeout_ms),
            ("limits.sse_keepalive_ms".into(), l.sse_keepalive_ms),
            (
                "a2a.events.stream_deadline_ms".into(),
                self.a2a.events.stream_deadline_ms,
            ),
            ("agent.turn_timeout_ms".into(), self.agent.turn_timeout_ms),
        ];
        for (i, s) in self.subagents.iter().enumerate() {
            timeouts.push((format!("subagents[{i}].turn_timeout_ms"), s.turn_timeout_ms));
        }
        for (key, value) in timeouts {
            if let Some(ms) = value {
                in_range(&key, ms, 1, MAX_TIMEOUT_MS)?;
            }
        }
        let p = &self.a2a.push;
        if let Some(n) = p.max_attempts {
            in_range("a2a.push.max_attempts", n, 1, MAX_PUSH_ATTEMPTS)?;
        }
        if let Some(ms) = p.backoff_ms {
            in_range("a2a.push.backoff_ms", ms, 0, MAX_PUSH_BACKOFF_MS)?;
        }
        if let Some(ms) = p.timeout_ms {
            in_range("a2a.push.timeout_ms", ms, 1, MAX_PUSH_TIMEOUT_MS)?;
        }
        if let Some(n) = self.a2a.tls.hsts_max_age_s {
            in_range("a2a.tls.hsts_max_age_s", n, 0, MAX_HSTS_MAX_AGE_S)?;
        }
        if let Some(f) = &self.log.format {
            LogFormat::parse(f).map_err(|e| format!("log.format: {e}"))?;
        }
        self.telemetry()?;
        let d = &self.a2a.device_grant;
        if let Some(t) = d.token_ttl_s {
            in_range(
                "a2a.device_grant.token_ttl_s",
                t,
                TOKEN_TTL_S.0,
                TOKEN_TTL_S.1,
            )?;
        }
        if let Some(t) = d.code_ttl_s {
            in_range("a2a.device_grant.code_ttl_s", t, CODE_TTL_S.0, CODE_TTL_S.1)?;
        }
        Ok(())
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
            let (min, max) = TOKEN_TTL_S;
            g.token_ttl_ms = in_range("a2a.device_grant.token_ttl_s", t, min, max)? * 1000;
        }
        if let Some(t) = d.code_ttl_s {
            let (min, max) = CODE_TTL_S;
            g.code_ttl_ms = in_range("a2a.device_grant.code_ttl_s", t, min, max)? * 1000;
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
        use agentd_core::ext::command::table::{self, REMOVED_OPS};
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
                if role == Role::Operator {
                    continue;
                }
                // A grant that names an operator-only op, by name or by a pattern
                // (`admin.*`, `auth.*`, `config:x`), is refused rather than left to grant
                // nothing: the rule would not do what it says. `*` is the exception: it
                // means every op the role may be granted, never an operator-only one.
                let mut reached = table::operator_only_ops_granted_by(grant);
                if reached.is_empty() && grant.starts_with(table::RESERVED_PREFIX) {
                    reached.push(grant.as_str());
                }
                if !reached.is_empty() {
                    let rule_name = rule
                        .id
                        .as_deref()
                        .map_or(String::new(), |id| format!(" (rule {id:?})"));
                    return Err(format!(
                        "{at}.grants: {grant:?}{rule_name} would grant the operator-only {} {} \
                         to role {}; no grant reaches an operator-only op (a \"*\" grant never does)",
                        if reached.len() == 1 { "op" } else { "ops" },
                        reached.join(", "),
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

/// Checks a URL the card publishes: `http://` or `https://`, a host, no spaces or control
/// characters, at most 2048 bytes.
fn check_url(key: &str, url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let host = rest.map(|r| r.split(['/', '?', '#']).next().unwrap_or(""));
    let ok = url.len() <= 2048
        && host.is_some_and(|h| !h.is_empty() && !h.starts_with(':'))
        && url.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{key}: {url:?} is not an http:// or https:// URL with a host"
        ))
    }
}

/// How log lines are written: `log.format`, or `AGENTD_LOG_FORMAT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (the default).
    Text,
    /// One JSON object per line: see `crate::logjson`.
    Json,
}

impl LogFormat {
    pub fn parse(text: &str) -> Result<LogFormat, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("{text:?} is not text or json")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
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
fn effective_document(c: &InstanceConfig, limits: &LimitsSection) -> serde_json::Value {
    let l = &c.conn;
    serde_json::json!({
        "agent": {
            "name": c.name,
            "description": c.description,
            "documentation_url": c.documentation_url,
            "icon_url": c.icon_url,
            "provider": c.provider.as_ref().map(|p| serde_json::json!({"organization": p.organization, "url": p.url})),
            "skills": c.host.skills.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        },
        "a2a": {
            "listen": c.listeners.iter().map(|l| l.url.clone()).collect::<Vec<_>>(),
            "events": {
                "enabled": c.events_enabled,
                "ring": c.events_ring,
                "stream_deadline_ms": c.events_stream_deadline_ms,
                "batch_ms": c.events_batch_ms,
            },
            "introspection": {"enabled": c.introspection_enabled},
            "console": {"enabled": !c.console.is_empty()},
            "proxy": {
                "listeners": c.proxy.listeners,
                "trusted": c.proxy.trusted.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            },
            "tls": {"hsts_max_age_s": c.hsts_max_age_s},
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
            "large_answers_bytes": l.large_answers_bytes,
            "replay_events_per_task": c.replay.per_task,
            "replay_events": c.replay.events,
            "replay_bytes": c.replay.bytes,
            "max_tasks": c.tasks.max_tasks,
            "task_artifact_bytes": c.tasks.artifact_bytes,
            "max_message_parts": c.tasks.max_message_parts,
            "tasks_bytes": c.tasks.total_bytes,
            "max_connections": limits.max_connections,
            "listen_backlog": limits.listen_backlog(),
            "smol_threads": limits.smol_threads(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_is_checked_at_load() {
        let t = |text: &str| toml::from_str::<Config>(text).unwrap().telemetry();
        assert_eq!(t("").unwrap(), None, "no collector: nothing exported");
        let s = t("[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/\"")
            .unwrap()
            .unwrap();
        assert_eq!(s.otlp_endpoint, "http://127.0.0.1:4318");
        assert_eq!(s.service_name, "agentd");
        let s = t("[telemetry]\notlp_endpoint = \"http://[::1]:4318\"\nservice_name = \"front\"")
            .unwrap()
            .unwrap();
        assert_eq!(s.service_name, "front");
        for (bad, says) in [
            (
                "otlp_endpoint = \"http://10.0.0.5:4318\"",
                "telemetry.otlp_endpoint",
            ),
            (
                "otlp_endpoint = \"grpc://h:4317\"",
                "telemetry.otlp_endpoint",
            ),
            ("service_name = \"\"", "telemetry.service_name"),
            ("service_name = \"a\\nb\"", "telemetry.service_name"),
        ] {
            let e = t(&format!("[telemetry]\n{bad}")).unwrap_err();
            assert!(e.starts_with(says), "{bad}: {e}");
            // The same error stops the load (and --check-config).
            let c: Config = toml::from_str(&format!("[telemetry]\n{bad}")).unwrap();
            assert!(c.runtime_settings().is_err(), "{bad}");
        }
        assert!(toml::from_str::<Config>("[telemetry]\nendpoint = \"x\"").is_err());
    }

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
        assert_eq!(d["a2a"]["tls"]["hsts_max_age_s"], 31_536_000);
        assert_eq!(d["a2a"]["proxy"]["trusted"], serde_json::json!([]));
        assert_eq!(d["agent"]["skills"], serde_json::json!([]));
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

    /// Writes `text` to a fresh file and loads it as the daemon does.
    fn load_text(name: &str, text: &str) -> Result<Config, String> {
        let dir = std::env::temp_dir().join(format!("agentd-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agentd.toml");
        std::fs::write(&path, text).unwrap();
        let loaded = Config::load(&path);
        let _ = std::fs::remove_dir_all(&dir);
        loaded
    }

    /// Issue 15, item 10: a value no bound can honour (a ring of 10^12 allocated whole, a
    /// timeout of 2^64-1 ms added to a clock) is a load error naming the key and its range.
    #[test]
    fn every_numeric_key_is_checked_against_its_range_at_load() {
        const MAX: &str = "18446744073709551615";
        let cases: Vec<(String, String)> = [
            (
                "[limits]\nmax_header_bytes = 1048577",
                "limits.max_header_bytes: must be from 1 to 1048576, not 1048577",
            ),
            (
                "[limits]\nmax_header_bytes = 0",
                "limits.max_header_bytes: must be from 1 to 1048576, not 0",
            ),
            (
                "[limits]\nmax_headers = 129",
                "limits.max_headers: must be from 1 to 128, not 129",
            ),
            (
                "[limits]\nmax_body_bytes = 4194305",
                "limits.max_body_bytes: must be from 1 to 4194304, not 4194305",
            ),
            (
                "[limits]\nmax_message_parts = 0",
                "limits.max_message_parts: must be from 1 to 4096, not 0",
            ),
            (
                "[limits]\ntasks_bytes = 1000",
                "limits.tasks_bytes: must be from 16777216 to 68719476736, not 1000",
            ),
            (
                "[limits]\nmax_subagents = 1025",
                "limits.max_subagents: must be from 1 to 1024, not 1025",
            ),
            (
                "[limits]\nmax_subagents_per_principal = 0",
                "limits.max_subagents_per_principal: must be from 1 to 1024, not 0",
            ),
            (
                "[a2a.push]\nworkers = 0",
                "a2a.push.workers: must be from 1 to 256, not 0",
            ),
            (
                "[a2a.push]\nqueue = 1048577",
                "a2a.push.queue: must be from 1 to 1048576, not 1048577",
            ),
            (
                "[limits]\nidle_timeout_ms = {MAX}",
                "limits.idle_timeout_ms: must be from 1 to 86400000, not {MAX}",
            ),
            (
                "[limits]\nidle_timeout_ms = 0",
                "limits.idle_timeout_ms: must be from 1 to 86400000, not 0",
            ),
            (
                "[limits]\nheader_timeout_ms = 86400001",
                "limits.header_timeout_ms: must be from 1 to 86400000, not 86400001",
            ),
            (
                "[limits]\nbody_timeout_ms = {MAX}",
                "limits.body_timeout_ms: must be from 1 to 86400000, not {MAX}",
            ),
            (
                "[limits]\nrequest_timeout_ms = {MAX}",
                "limits.request_timeout_ms: must be from 1 to 86400000, not {MAX}",
            ),
            (
                "[limits]\nwrite_timeout_ms = 86400001",
                "limits.write_timeout_ms: must be from 1 to 86400000, not 86400001",
            ),
            (
                "[limits]\nsse_keepalive_ms = 86400001",
                "limits.sse_keepalive_ms: must be from 1 to 86400000, not 86400001",
            ),
            (
                "[limits]\nstream_queue = 65537",
                "limits.stream_queue: must be from 1 to 65536, not 65537",
            ),
            (
                "[limits]\nreplay_events_per_task = 65537",
                "limits.replay_events_per_task: must be from 1 to 65536, not 65537",
            ),
            (
                "[limits]\nreplay_events = 1048577",
                "limits.replay_events: must be from 1 to 1048576, not 1048577",
            ),
            (
                "[limits]\nreplay_bytes = 1073741825",
                "limits.replay_bytes: must be from 1 to 1073741824, not 1073741825",
            ),
            (
                "[limits]\nmax_tasks = 1000001",
                "limits.max_tasks: must be from 1 to 1000000, not 1000001",
            ),
            (
                "[limits]\ntask_artifact_bytes = 8388609",
                "limits.task_artifact_bytes: must be from 1 to 8388608, not 8388609",
            ),
            (
                "[limits]\nmax_connections = 0",
                "limits.max_connections: must be from 1 to 1048576, not 0",
            ),
            (
                "[limits]\nlisten_backlog = 0",
                "limits.listen_backlog: must be from 1 to 65535, not 0",
            ),
            (
                "[limits]\nlisten_backlog = 65536",
                "limits.listen_backlog: must be from 1 to 65535, not 65536",
            ),
            (
                "[limits]\nsmol_threads = 0",
                "limits.smol_threads: must be from 1 to 1024, not 0",
            ),
            (
                "[limits]\nsmol_threads = 1025",
                "limits.smol_threads: must be from 1 to 1024, not 1025",
            ),
            (
                "[limits]\nmax_connections = 1048577",
                "limits.max_connections: must be from 1 to 1048576, not 1048577",
            ),
            (
                "[a2a.events]\nring = 1000000000000",
                "a2a.events.ring: must be from 1 to 65536, not 1000000000000",
            ),
            (
                "[a2a.events]\nstream_deadline_ms = {MAX}",
                "a2a.events.stream_deadline_ms: must be from 1 to 86400000, not {MAX}",
            ),
            (
                "[a2a.push]\nmax_attempts = 0",
                "a2a.push.max_attempts: must be from 1 to 20, not 0",
            ),
            (
                "[a2a.push]\nmax_attempts = 4294967295",
                "a2a.push.max_attempts: must be from 1 to 20, not 4294967295",
            ),
            (
                "[a2a.push]\nbackoff_ms = {MAX}",
                "a2a.push.backoff_ms: must be from 0 to 30000, not {MAX}",
            ),
            (
                "[a2a.push]\ntimeout_ms = {MAX}",
                "a2a.push.timeout_ms: must be from 1 to 300000, not {MAX}",
            ),
            (
                "[a2a.device_grant]\ntoken_ttl_s = 299",
                "a2a.device_grant.token_ttl_s: must be from 300 to 2592000, not 299",
            ),
            (
                "[a2a.device_grant]\ntoken_ttl_s = {MAX}",
                "a2a.device_grant.token_ttl_s: must be from 300 to 2592000, not {MAX}",
            ),
            (
                "[a2a.device_grant]\ncode_ttl_s = 1801",
                "a2a.device_grant.code_ttl_s: must be from 60 to 1800, not 1801",
            ),
            (
                "[agent]\ncommand = [\"x\"]\nturn_timeout_ms = {MAX}",
                "agent.turn_timeout_ms: must be from 1 to 86400000, not {MAX}",
            ),
            (
                "[[subagents]]\nname = \"s\"\ncommand = [\"x\"]\nturn_timeout_ms = 0",
                "subagents[0].turn_timeout_ms: must be from 1 to 86400000, not 0",
            ),
        ]
        .iter()
        .map(|(t, e)| (t.replace("{MAX}", MAX), e.replace("{MAX}", MAX)))
        .collect();
        let listener = || {
            vec![agentd_core::ListenerInfo {
                kind: agentd_core::ListenerKind::Tcp,
                url: "http://127.0.0.1:1/".into(),
                loopback: true,
            }]
        };
        for (i, (text, want)) in cases.iter().enumerate() {
            let err = load_text(&format!("range-{i}"), text)
                .map(|_| ())
                .expect_err(text);
            assert_eq!(&err, want, "{text}");
            // instance_config checks alike, for a Config not read by load.
            let c: Config = toml::from_str(text).unwrap();
            assert_eq!(
                c.instance_config(listener()).map(|_| ()).unwrap_err(),
                *want
            );
        }
        // Both ends of each range load.
        let edges =
            "[limits]\nmax_header_bytes = 1048576\nmax_headers = 128\nmax_body_bytes = 4194304\n\
            idle_timeout_ms = 86400000\nrequest_timeout_ms = 1\nstream_queue = 65536\n\
            replay_events = 1048576\nreplay_bytes = 1073741824\nmax_tasks = 1000000\n\
            task_artifact_bytes = 8388608\nmax_connections = 1048576\nlisten_backlog = 65535\n\
            smol_threads = 1024\n\
            [a2a.events]\nring = 65536\nstream_deadline_ms = 86400000\n\
            [a2a.push]\nmax_attempts = 20\nbackoff_ms = 0\ntimeout_ms = 300000\n";
        let c = load_text("edges", edges).unwrap();
        let ic = c.instance_config(listener()).unwrap();
        assert_eq!(ic.conn.http.max_body_bytes, MAX_BODY_BYTES);
        assert_eq!(ic.conn.idle_timeout_ms, MAX_TIMEOUT_MS);
        assert_eq!(ic.events_ring, MAX_EVENTS_RING);
    }

    /// The defaults sit inside the ranges the file is held to.
    #[test]
    fn the_defaults_are_inside_their_ranges() {
        let d = agentd_core::ConnLimits::DEFAULT;
        for (value, max) in [
            (d.http.max_header_bytes, MAX_HEADER_BYTES),
            (d.http.max_headers, MAX_HEADERS),
            (d.http.max_body_bytes, MAX_BODY_BYTES),
            (d.stream_queue, MAX_STREAM_QUEUE),
        ] {
            assert!((1..=max).contains(&value), "{value} > {max}");
        }
        for ms in [
            d.idle_timeout_ms,
            d.header_timeout_ms,
            d.body_timeout_ms,
            d.request_timeout_ms,
            d.write_timeout_ms,
            d.sse_keepalive_ms,
        ] {
            assert!((1..=MAX_TIMEOUT_MS).contains(&ms), "{ms}");
        }
        let ic = Config::default().instance_config(vec![]).unwrap();
        assert!((1..=MAX_EVENTS_RING).contains(&ic.events_ring));
        assert!((1..=MAX_TIMEOUT_MS).contains(&ic.events_stream_deadline_ms));
        assert!((1..=MAX_TASKS).contains(&ic.tasks.max_tasks));
        assert!((1..=MAX_TASK_ARTIFACT_BYTES).contains(&ic.tasks.artifact_bytes));
        assert!((1..=MAX_MESSAGE_PARTS).contains(&ic.tasks.max_message_parts));
        assert!((MIN_TASKS_BYTES..=MAX_TASKS_BYTES).contains(&ic.tasks.total_bytes));
        let r = crate::runtime::RuntimeLimits::default();
        assert!((1..=MAX_SUBAGENTS).contains(&r.max_subagents));
        assert!((1..=MAX_SUBAGENTS).contains(&r.max_subagents_per_principal));
        let p = crate::runtime::push::DeliveryOptions::default();
        assert!((1..=MAX_PUSH_WORKERS).contains(&p.workers));
        assert!((1..=MAX_PUSH_QUEUE).contains(&p.queue));
        assert!((1..=MAX_REPLAY_EVENTS_PER_TASK).contains(&ic.replay.per_task));
        assert!((1..=MAX_REPLAY_EVENTS).contains(&ic.replay.events));
        assert!((1..=MAX_REPLAY_BYTES).contains(&ic.replay.bytes));
        let g = &ic.device_grant;
        assert!((TOKEN_TTL_S.0..=TOKEN_TTL_S.1).contains(&(g.token_ttl_ms / 1000)));
        assert!((CODE_TTL_S.0..=CODE_TTL_S.1).contains(&(g.code_ttl_ms / 1000)));
        let push = crate::runtime::push::DeliveryOptions::default();
        assert!((1..=MAX_PUSH_ATTEMPTS).contains(&push.max_attempts));
        assert!(push.first_backoff.as_millis() <= u128::from(MAX_PUSH_BACKOFF_MS));
        assert!(push.timeout.as_millis() <= u128::from(MAX_PUSH_TIMEOUT_MS));
    }

    /// Issue 15, item 10: a pattern that would match an operator-only op is refused like the
    /// op's own name, naming the rule and what it would grant; `*` loads, and never reaches
    /// those ops.
    #[test]
    fn grant_patterns_that_reach_operator_only_ops_are_load_errors() {
        let rule = |role: &str, grants: &str| {
            format!(
                "[[a2a.principals]]\nid = \"u\"\nrole = \"{role}\"\ngrants = {grants}\nmatch = {{ any = true }}\n"
            )
        };
        for (role, grants, reached) in [
            ("user", r#"["admin.*"]"#, "ops admin.drain, admin.pause, admin.resume, admin.cancel, admin.set"),
            ("agent", r#"["auth.*"]"#, "ops auth.device.pending, auth.device.approve, auth.device.deny, auth.sessions, auth.sessions.revoke"),
            ("user", r#"["auth.device.*"]"#, "ops auth.device.pending, auth.device.approve, auth.device.deny"),
            ("user", r#"["workflow.run", "debug.*"]"#, "op debug.events"),
            ("agent", r#"["config:x"]"#, "op config"),
            ("user", r#"["_instance.*"]"#, "ops _instance.result, _instance.emit"),
            ("user", r#"["config"]"#, "op config"),
        ] {
            let text = rule(role, grants);
            let c: Config = toml::from_str(&text).unwrap();
            let err = c.instance_config(vec![]).map(|_| ()).unwrap_err();
            assert!(
                err.starts_with("a2a.principals[0].grants: ")
                    && err.contains("(rule \"u\")")
                    && err.contains(&format!("the operator-only {reached} to role {role}")),
                "{text}: {err}"
            );
        }
        // `*` and patterns that reach only grantable ops load; `*` does not reach `config`.
        for grants in [r#"["*"]"#, r#"["workflow.*", "subagent.*"]"#] {
            let c: Config = toml::from_str(&rule("user", grants)).unwrap();
            let ic = c.instance_config(vec![]).unwrap();
            let p = ic.auth.any.as_ref().unwrap();
            let config_op = agentd_core::ext::command::table::find("config").unwrap();
            assert!(
                !agentd_core::ext::command::may_command(p, config_op),
                "{grants}"
            );
        }
        // An operator rule may carry any grant: it has every op anyway.
        std::env::set_var("AGENTD_TEST_GRANT_OP", "op-token-grant");
        let text = "[[a2a.principals]]\nid = \"o\"\nrole = \"operator\"\ngrants = [\"admin.*\"]\n\
                    match = { bearer_ref = \"{{secret:AGENTD_TEST_GRANT_OP}}\" }\n";
        let c: Config = toml::from_str(text).unwrap();
        c.instance_config(vec![]).unwrap();
    }

    /// A list of listeners stays a list (a table can be read from a list too), and an
    /// entry may be a table.
    #[test]
    fn listen_lists_and_tables_parse() {
        let c: Config =
            toml::from_str("[a2a]\nlisten = [\"tcp://127.0.0.1:1\", \"unix:///tmp/x.sock\"]")
                .unwrap();
        let e = c.listen_entries().unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].url, "unix:///tmp/x.sock");
        assert!(e[0].public_url.is_none() && !e[0].behind_proxy);
        let c: Config = toml::from_str(
            "[a2a]\nlisten = { url = \"tcp://127.0.0.1:1\", public_url = \"https://a.example/\" }",
        )
        .unwrap();
        let e = c.listen_entries().unwrap();
        assert_eq!(e[0].public_url.as_deref(), Some("https://a.example/"));
        let listener = agentd_core::ListenerInfo {
            kind: agentd_core::ListenerKind::Tcp,
            url: "http://127.0.0.1:1/".into(),
            loopback: true,
        };
        let ic = c.instance_config(vec![listener.clone()]).unwrap();
        assert_eq!(ic.listeners[0].url, "https://a.example/");
        assert!(ic.listeners[0].loopback);
        let c: Config = toml::from_str(
            "[a2a]\nlisten = [{ url = \"tcp://127.0.0.1:1\", behind_proxy = true }]\nproxy = { trusted = [\"127.0.0.1\"] }",
        )
        .unwrap();
        c.endpoints().unwrap();
        let ic = c.instance_config(vec![listener]).unwrap();
        assert!(
            !ic.listeners[0].loopback,
            "behind a proxy: never loopback-trusted"
        );
        assert_eq!(ic.proxy.listeners, vec![0]);
        assert!(ic.proxy.trusts("127.0.0.1".parse().unwrap()));
        assert!(
            toml::from_str::<Config>("[a2a]\nlisten = [{ url = \"x\", publik_url = \"y\" }]")
                .is_err()
        );
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
            (
                "[limits]\nmax_body_bytes = 0",
                "limits.max_body_bytes: must be from 1 to 4194304, not 0",
            ),
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
