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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// The card's `name`.
    pub name: Option<String>,
    /// The card's `description`.
    pub description: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct A2aSection {
    /// One endpoint or a list: `tcp://host:port`, `http://host:port` or `unix:///path`.
    #[serde(default)]
    pub listen: Listen,
    #[serde(default)]
    pub events: EventsSection,
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
    pub max_tasks: Option<usize>,
    pub max_connections: Option<usize>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The endpoints to listen on, validated.
    pub fn endpoints(&self) -> Result<Vec<Endpoint>, String> {
        let list = match &self.a2a.listen {
            Listen::Unset => vec![DEFAULT_LISTEN.to_owned()],
            Listen::One(s) => vec![s.clone()],
            Listen::Many(v) if v.is_empty() => return Err("a2a.listen names no endpoint".into()),
            Listen::Many(v) => v.clone(),
        };
        list.iter()
            .map(|s| {
                let ep: Endpoint = s.parse().map_err(|e| format!("a2a.listen: {e}"))?;
                if let Endpoint::Tcp(addr) = &ep {
                    // Until authentication schemes exist, every caller is the operator: only
                    // a loopback listener may serve that way.
                    if !addr.ip().is_loopback() {
                        return Err(format!(
                            "a2a.listen: {s}: a non-loopback listener needs an authentication scheme, \
                             and none is configured"
                        ));
                    }
                }
                Ok(ep)
            })
            .collect()
    }

    pub fn instance_config(&self, listeners: Vec<ListenerInfo>) -> Result<InstanceConfig, String> {
        let mut c = InstanceConfig::new(listeners);
        if let Some(n) = &self.agent.name {
            c.name = n.clone();
        }
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
        c.config_document = effective_document(&c, self.limits.max_connections);
        Ok(c)
    }
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
            "device_grant": {"enabled": c.device_grant_enabled},
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
            "max_tasks": c.tasks.max_tasks,
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
            ("[a2a]\nlisten = \"tcp://0.0.0.0:1\"", "authentication"),
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
