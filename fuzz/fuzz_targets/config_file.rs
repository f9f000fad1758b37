//! The daemon's configuration loader (`agentd::config::Config`) on arbitrary text: the TOML
//! reading, then every check the daemon runs before it binds anything.
//!
//! Input: the configuration file's text (inputs that are not UTF-8 are skipped: the daemon
//! refuses them before parsing).
//!
//! Runs what `Config::load` runs, from the string instead of a file (`toml::from_str`, then
//! `source` set as `load` sets it), then `workflows`, `runtime_settings`,
//! `declared_commands` (each registered in a command set, as the daemon does), `endpoints`
//! and `instance_config` with listeners made from the endpoints, never bound. Not run:
//! `tls_listeners`, which reads the files `a2a.tls` names, and `instance_config` when a
//! credential is a `{{secret-file:PATH}}` reference (it reads PATH). `{{secret:NAME}}` reads
//! an environment variable, which is harmless.
//!
//! Properties checked: no panic, no hang, bounded memory; `workflows` answers the same
//! twice (the checks are pure); a load error is a message (for the text's own errors, with
//! the file's name); what loads is self-consistent: a declared command's op is not a
//! reserved or removed name and registers as the daemon registers it, each
//! endpoint makes one listener, and the effective configuration document the `config` op
//! serves is a JSON object.

#![no_main]

use agentd::config::Config;
use agentd_core::ext::command::Commands;
use agentd_core::{ListenerInfo, ListenerKind};
use agentd_io_common::Endpoint;
use libfuzzer_sys::fuzz_target;

const FILE: &str = "fuzz.toml";

fn listener(ep: &Endpoint) -> ListenerInfo {
    match ep {
        Endpoint::Tcp(addr) => ListenerInfo {
            kind: ListenerKind::Tcp,
            url: format!("http://{addr}/"),
            loopback: addr.ip().is_loopback(),
        },
        Endpoint::Https(addr) => ListenerInfo {
            kind: ListenerKind::Tcp,
            url: format!("https://{addr}/"),
            loopback: addr.ip().is_loopback(),
        },
        Endpoint::Unix(path) => ListenerInfo {
            kind: ListenerKind::Unix(path.display().to_string()),
            url: format!("unix://{}", path.display()),
            loopback: false,
        },
    }
}

/// Whether any credential reference would read a file.
fn reads_files(c: &Config) -> bool {
    let refs = c.a2a.bearer.iter().chain(
        c.a2a
            .principals
            .iter()
            .filter_map(|r| r.matcher.bearer_ref.as_ref()),
    );
    refs.into_iter().any(|r| r.contains("secret-file:"))
}

/// Whether the runtime settings would read a file the text names (a peer's credential,
/// CA or client certificate, the webhook CA): `/dev/zero` must not become a hang.
fn runtime_reads_files(c: &Config) -> bool {
    c.a2a.push.ca.is_some()
        || c.a2a.peers.iter().any(|p| {
            p.ca.is_some()
                || p.client_cert.is_some()
                || p.client_key.is_some()
                || p.bearer.as_deref().is_some_and(|b| b.contains("secret-file:"))
        })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut config: Config = match toml::from_str(text) {
        Ok(c) => c,
        Err(e) => {
            // The error renders (with its span into the text) without panicking.
            let _ = e.to_string();
            return;
        }
    };
    config.source = Some((FILE.into(), text.into()));

    let workflows = config.workflows();
    assert_eq!(
        workflows.as_ref().map(Vec::len),
        config.workflows().as_ref().map(Vec::len),
        "workflows() is not deterministic"
    );
    if let Err(e) = &workflows {
        assert!(!e.is_empty());
    }
    if !runtime_reads_files(&config) {
        let _ = config.runtime_settings();
    }

    if let Ok(declared) = config.declared_commands() {
        let mut commands = Commands::new();
        for d in declared {
            let op = d.op.clone();
            // The workflow checks passed, so the daemon's registration must too.
            if let Err(e) = commands.register(d) {
                panic!("the workflow checks let command {op:?} through; registering it: {e:?}");
            }
        }
    }

    let Ok(endpoints) = config.endpoints() else {
        return;
    };
    if reads_files(&config) {
        return;
    }
    let listeners: Vec<ListenerInfo> = endpoints.iter().map(listener).collect();
    assert_eq!(listeners.len(), endpoints.len());
    if let Ok(instance) = config.instance_config(listeners) {
        assert!(instance.config_document.is_object());
        assert_eq!(instance.listeners.len(), endpoints.len());
    }
});
