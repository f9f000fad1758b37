//! Configuration reload on SIGHUP.
//!
//! A reload reads the file given with `--config` again (with none, the embedded default:
//! a reload then puts back every default, `admin.set` settings included) and checks all of
//! it exactly as start-up does. A file that fails (parse or validation) changes nothing: the
//! running configuration stays, and the error is logged as start-up would print it.
//!
//! A file that passes applies its reloadable keys ([`RELOADABLE`]) in one step (rules and
//! posture, CORS origins and introspection in the core, under the instance lock; approval
//! and peers in the runtime, under the same hold of it), and one `config` feed event with
//! `source: "reload"` names the keys whose value changed. Every other key needs a restart:
//! a change to one is logged as a warning and not applied.

use std::path::Path;
use std::sync::{Arc, Mutex};

use agentd_core::{Instance, InstanceConfig, Reloadable};
use toml::Value;

use crate::config::Config;
use crate::runtime::{Reload, ReloadHandle, Settings};

/// The keys a reload applies. Everything else is read only at start-up.
pub const RELOADABLE: &[&str] = &[
    "a2a.principals",
    "a2a.cors.origins",
    "a2a.introspection.enabled",
    "a2a.peers",
    "agent.approval",
];

/// A configuration read and checked as start-up checks it.
pub struct Checked {
    pub config: Config,
    pub instance: InstanceConfig,
    pub settings: Settings,
}

/// Reads and checks a configuration (the file, or the embedded default) as start-up does,
/// against the listeners already bound.
pub fn check(
    path: Option<&Path>,
    listen: &[String],
    listeners: Vec<agentd_core::ListenerInfo>,
) -> Result<Checked, String> {
    let mut config = match path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    config.override_listen(listen);
    let endpoints = config.endpoints()?;
    let settings = config.runtime_settings()?;
    config.declared_commands()?;
    let store = config.store.resolve()?;
    config.check_store(&store, &endpoints)?;
    let mut instance = config.instance_config(listeners)?;
    instance.tls = config.tls_listeners(&endpoints)?;
    Ok(Checked {
        config,
        instance,
        settings,
    })
}

/// The file's text as a TOML table (the embedded default is the empty one): what later
/// reloads compare against.
pub fn table(config: &Config) -> Value {
    config
        .source
        .as_ref()
        .and_then(|(_, text)| text.parse::<toml::Table>().ok())
        .map(Value::Table)
        .unwrap_or_else(|| Value::Table(toml::Table::new()))
}

/// The dotted paths whose value differs between two files: tables are walked, anything else
/// (arrays included) compares whole.
pub fn changed_paths(old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(Some(old), Some(new), "", &mut out);
    out
}

fn walk(a: Option<&Value>, b: Option<&Value>, path: &str, out: &mut Vec<String>) {
    let empty = toml::Table::new();
    fn table(v: Option<&Value>) -> Option<&toml::Table> {
        match v {
            Some(Value::Table(t)) => Some(t),
            _ => None,
        }
    }
    // A table on one side and nothing on the other is walked as against an empty table.
    let walkable = |v: Option<&Value>| v.is_none() || table(v).is_some();
    if walkable(a) && walkable(b) && (a.is_some() || b.is_some()) {
        let (x, y) = (table(a).unwrap_or(&empty), table(b).unwrap_or(&empty));
        let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            let sub = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            walk(x.get(k), y.get(k), &sub, out);
        }
    } else if a != b {
        out.push(path.to_owned());
    }
}

/// Whether a changed path is one a reload applies.
pub fn is_reloadable(path: &str) -> bool {
    RELOADABLE.iter().any(|k| {
        path == *k
            || path
                .strip_prefix(k)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The reload thread's memory: the configuration the daemon started with (what restart-only
/// keys are compared against) and the one last applied.
pub struct State {
    pub path: Option<std::path::PathBuf>,
    /// `--listen`, which stands in for the file's `a2a.listen` at every reload too.
    pub listen: Vec<String>,
    pub started: Value,
    pub applied: Value,
}

impl State {
    pub fn new(path: Option<std::path::PathBuf>, listen: Vec<String>, started: &Config) -> State {
        State {
            path,
            listen,
            started: table(started),
            applied: table(started),
        }
    }
}

/// One SIGHUP: read, check, and hand what may change to the runtime; or log why not.
pub fn reload(state: &mut State, instance: &Arc<Mutex<Instance>>, runtime: &ReloadHandle) {
    let file = state
        .path
        .as_ref()
        .map_or("the embedded default".to_owned(), |p| {
            p.display().to_string()
        });
    let (listeners, running) = {
        let inst = instance.lock().unwrap_or_else(|p| p.into_inner());
        (inst.config().listeners.clone(), inst.config().clone())
    };
    let checked = match check(state.path.as_deref(), &state.listen, listeners) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(file = %file, "reload refused, the running configuration stays: {e}");
            return;
        }
    };
    let new_table = table(&checked.config);
    let mut restart: Vec<String> = changed_paths(&state.started, &new_table)
        .into_iter()
        .filter(|p| !is_reloadable(p))
        .collect();
    // The operator credential is restart-only, whatever its secret now holds.
    if checked.instance.auth.operator_bearer != running.auth.operator_bearer
        && !restart.iter().any(|p| p == "a2a.bearer")
    {
        restart.push("a2a.bearer".into());
    }
    let peers_changed = changed_paths(&state.applied, &new_table)
        .iter()
        .any(|p| p == "a2a.peers" || p.starts_with("a2a.peers."));
    // The running workflows were checked against the running peers; new workflows wait for a
    // restart, so the peers they name do too.
    let workflows_changed = restart
        .iter()
        .any(|p| p == "workflows" || p.starts_with("workflows."));
    if peers_changed && workflows_changed {
        restart.push("a2a.peers".into());
    }
    if !restart.is_empty() {
        tracing::warn!(
            file = %file,
            paths = %restart.join(", "),
            "reload: these keys changed and need a restart; they are not applied"
        );
    }
    let Checked {
        instance: new,
        settings,
        ..
    } = checked;
    let mut auth = new.auth;
    auth.operator_bearer = running.auth.operator_bearer;
    let mut document = running.config_document.clone();
    for key in ["principals", "cors", "introspection"] {
        if let (Some(doc), Some(v)) = (
            document["a2a"].as_object_mut(),
            new.config_document["a2a"].get(key),
        ) {
            doc.insert(key.into(), v.clone());
        }
    }
    runtime.reload(Reload {
        core: Reloadable {
            auth,
            cors: new.cors,
            introspection_enabled: new.introspection_enabled,
            config_document: document,
        },
        approval: settings.approval,
        peers: (peers_changed && !workflows_changed).then_some(settings.peers),
    });
    state.applied = new_table;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Value {
        let mut c: Config = toml::from_str(text).unwrap();
        c.source = Some(("agentd.toml".into(), text.into()));
        table(&c)
    }

    #[test]
    fn changed_paths_walk_tables_and_compare_arrays_whole() {
        let a = parse(
            "[a2a]\nlisten = \"http://127.0.0.1:1\"\n[[a2a.principals]]\nid = \"a\"\nrole = \"user\"\nmatch = { any = true }\n",
        );
        let b = parse(
            "[a2a]\nlisten = \"http://127.0.0.1:2\"\n[a2a.cors]\norigins = [\"http://x\"]\n[a2a.events]\nenabled = true\n[[a2a.principals]]\nid = \"b\"\nrole = \"user\"\nmatch = { any = true }\n",
        );
        let paths = changed_paths(&a, &b);
        assert_eq!(
            paths,
            vec![
                "a2a.cors.origins",
                "a2a.events.enabled",
                "a2a.listen",
                "a2a.principals"
            ]
        );
        let restart: Vec<_> = paths.iter().filter(|p| !is_reloadable(p)).collect();
        assert_eq!(restart, vec!["a2a.events.enabled", "a2a.listen"]);
        assert!(changed_paths(&a, &a).is_empty());
        assert_eq!(
            changed_paths(&table(&Config::default()), &a),
            vec!["a2a.listen", "a2a.principals"]
        );
        assert!(is_reloadable("agent.approval"));
        assert!(!is_reloadable("agent.approvals"));
        assert!(!is_reloadable("a2a.cors"), "only the origins are");
    }
}
