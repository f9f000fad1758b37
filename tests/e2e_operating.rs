//! Issue 18, items 3, 5 and 6 on the real binary: JSON log lines with stable fields (both
//! drivers); the card as the configuration describes it (public_url, skills, provider,
//! documentationUrl, iconUrl), checked against the A2A project's published schema; a
//! listener behind a trusted proxy (load-time rules, `X-Forwarded-For` for the failure
//! limiter only from the configured proxies, no implicit operator); HSTS on https listeners
//! only; and `--print-config`, whose output loads back with its secrets redacted.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{get, post, rpc_body, rpc_request, Daemon, Setup, Via, CARD};
use serde_json::{json, Value};

/// Stops the daemon the way an operator does and returns what it logged.
fn stop(mut d: Daemon) -> String {
    d.signal("TERM");
    assert!(
        d.wait_exit(Duration::from_secs(20)).is_some(),
        "{}: the daemon did not exit on TERM; stderr:\n{}",
        d.driver,
        d.stderr()
    );
    d.stderr()
}

/// Every stderr line as JSON: a line that does not parse fails the test.
fn json_lines(stderr: &str, what: &str) -> Vec<serde_json::Map<String, Value>> {
    stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => m,
            other => panic!("{what}: not a JSON object line: {l:?} ({other:?})"),
        })
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 27
        && s.ends_with('Z')
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && s.bytes()
            .enumerate()
            .all(|(i, c)| [4, 7, 10, 13, 16, 19, 26].contains(&i) || c.is_ascii_digit())
}

fn json_logs(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            env: vec![
                ("AGENTD_LOG".into(), "debug".into()),
                ("AGENTD_LOG_FORMAT".into(), "json".into()),
            ],
            ..Setup::default()
        },
    );
    let mut c = d.connect(Via::Tcp);
    assert_eq!(c.request(&get(CARD, &[])).status, 200);
    // A send (no agent: the task is rejected, but it is a task), then a GetTask of it with
    // a request id and a trace context.
    let params = json!({"message": {"role": "ROLE_USER", "messageId": common::fresh_id(), "parts": [{"text": "hi"}]}});
    let r = c.request(&rpc_request("1", "SendMessage", &params));
    assert_eq!(r.status, 200, "{driver}: {}", r.body_text());
    let task = r.json()["result"]["task"]["id"]
        .as_str()
        .expect("a task")
        .to_owned();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("traceparent: 00-{trace}-00f067aa0ba902b7-01");
    let headers = [
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        "X-Request-Id: req-from-proxy-42",
        traceparent.as_str(),
    ];
    let r = c.request(&post(
        &headers,
        &rpc_body("2", "GetTask", &json!({"id": task})),
    ));
    assert_eq!(r.status, 200, "{driver}: {}", r.body_text());
    drop(c);
    let stderr = stop(d);
    let lines = json_lines(&stderr, driver);
    assert!(lines.len() >= 4, "{driver}: {stderr}");
    for l in &lines {
        let keys: Vec<&str> = l.keys().map(String::as_str).take(4).collect();
        // serde_json's map is sorted here; the order on the line is checked below.
        for k in ["timestamp", "level", "target", "message"] {
            assert!(l.contains_key(k), "{driver}: no {k} in {l:?} ({keys:?})");
        }
        assert!(
            is_rfc3339_utc(l["timestamp"].as_str().unwrap()),
            "{driver}: {l:?}"
        );
        assert!(
            ["error", "warn", "info", "debug", "trace"].contains(&l["level"].as_str().unwrap()),
            "{driver}: {l:?}"
        );
    }
    for raw in stderr.lines() {
        assert!(
            raw.starts_with("{\"timestamp\":\"") && raw.contains("\",\"level\":\""),
            "{driver}: the stable keys come first: {raw}"
        );
    }
    let listening = lines
        .iter()
        .find(|l| l["message"] == "listening")
        .unwrap_or_else(|| panic!("{driver}: no listening line: {stderr}"));
    assert_eq!(listening["target"], "agentd");
    assert_eq!(listening["level"], "info");
    let requests: Vec<_> = lines
        .iter()
        .filter(|l| l["target"] == "agentd::request")
        .collect();
    assert_eq!(requests.len(), 3, "{driver}: {stderr}");
    for r in &requests {
        for k in [
            "request_id",
            "method",
            "route",
            "status",
            "duration_ms",
            "principal",
            "task_id",
            "trace_id",
        ] {
            assert!(r.contains_key(k), "{driver}: no {k} in {r:?}");
        }
        assert!(r["status"].is_u64(), "numbers stay numbers: {r:?}");
        assert_eq!(r["level"], "debug");
        assert_eq!(r["message"], "request");
    }
    let (card, send, get_task) = (requests[0], requests[1], requests[2]);
    assert_eq!(card["route"], "GET /.well-known/agent-card.json");
    assert_eq!(card["method"], "-");
    assert_eq!(send["method"], "SendMessage");
    assert_eq!(send["task_id"], task.as_str(), "{driver}: {send:?}");
    assert_eq!(send["principal"], "operator");
    assert_eq!(send["trace_id"], "-");
    assert_eq!(get_task["method"], "GetTask");
    assert_eq!(get_task["task_id"], task.as_str());
    assert_eq!(get_task["request_id"], "req-from-proxy-42");
    assert_eq!(get_task["trace_id"], trace);
    // Made-up request ids differ from request to request.
    let (a, b) = (
        card["request_id"].as_str().unwrap(),
        send["request_id"].as_str().unwrap(),
    );
    assert!(a != "-" && b != "-" && a != b, "{driver}: {a} {b}");
}

#[test]
fn json_logs_smol() {
    json_logs("smol");
}

#[test]
fn json_logs_std() {
    json_logs("std");
}

/// `log.format` in the file selects JSON; `AGENTD_LOG_FORMAT` wins over it; a bad value
/// is refused before anything starts.
#[test]
fn the_log_format_comes_from_the_file_and_the_environment_wins() {
    let d = Daemon::start_setup(
        "smol",
        &Setup {
            sections: "[log]\nformat = \"json\"\n".into(),
            ..Setup::default()
        },
    );
    let stderr = stop(d);
    let lines = json_lines(&stderr, "log.format = json");
    assert!(
        lines.iter().any(|l| l["message"] == "listening"),
        "{stderr}"
    );
    let d = Daemon::start_setup(
        "smol",
        &Setup {
            sections: "[log]\nformat = \"json\"\n".into(),
            env: vec![("AGENTD_LOG_FORMAT".into(), "text".into())],
            ..Setup::default()
        },
    );
    let stderr = stop(d);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" INFO agentd: listening")),
        "the environment wins: {stderr}"
    );
    assert!(!stderr.contains("{\"timestamp\""), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["--check-config"])
        .env("AGENTD_LOG_FORMAT", "yaml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("AGENTD_LOG_FORMAT") && err.contains("text or json"),
        "{err}"
    );
}

/// A scratch directory for config files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!(
            "agentd-e2e-operating-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the binary to completion: exit code, stdout, stderr.
fn agentd(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("AGENTD_LOG_FORMAT")
        .output()
        .expect("agentd runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check_config(path: &Path, env: &[(&str, &str)]) -> Result<(), String> {
    let (code, _, err) = agentd(&["--check-config", "--config", path.to_str().unwrap()], env);
    if code == 0 {
        Ok(())
    } else {
        assert_eq!(code, 2, "{err}");
        Err(err)
    }
}

const CARD_SECTIONS: &str = r#"
[agent]
name = "reviewer"
description = "Reviews changes"
documentation_url = "https://docs.example.com/reviewer"
icon_url = "https://example.com/reviewer.png"

[agent.provider]
organization = "Example Org"
url = "https://example.com"

[[agent.skills]]
id = "review"
name = "Review a change"
description = "Reads a diff and answers with findings"
tags = ["code", "review"]
examples = ["review this patch"]
input_modes = ["text/x-diff", "text/plain"]
output_modes = ["text/markdown"]

[[agent.skills]]
id = "summarize"
name = "Summarize"
description = "Summarizes a text"
tags = []
"#;

/// The published A2A schema's `Agent Card` definition, its `$ref`s pointed at the bundle's
/// own definitions (its references name per-file documents it does not contain), or
/// `None` when the reference schema is not here (outside CI).
fn reference_card_validator() -> Option<jsonschema::Validator> {
    let path = match std::env::var_os("AGENTD_SHARED") {
        Some(shared) => PathBuf::from(shared).join("reference/a2a/a2a-v1.0.1.schema.json"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/reference/a2a/a2a-v1.0.1.schema.json"),
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the A2A reference schema is missing at {}, and CI is set",
            path.display()
        );
        eprintln!(
            "notice: no A2A reference schema at {}; the card's schema check is skipped",
            path.display()
        );
        return None;
    };
    let bundle: Value = serde_json::from_str(&text).unwrap();
    let mut defs = bundle["definitions"].as_object().unwrap().clone();
    let names: Vec<String> = defs.keys().cloned().collect();
    fn rewrite(v: &mut Value, names: &[String]) {
        match v {
            Value::Object(m) => {
                m.remove("$schema");
                if let Some(Value::String(r)) = m.get_mut("$ref") {
                    let proto = r
                        .trim_end_matches(".jsonschema.json")
                        .rsplit('.')
                        .next()
                        .unwrap()
                        .to_owned();
                    let name = names
                        .iter()
                        .find(|n| n.replace(' ', "") == proto)
                        .unwrap_or_else(|| panic!("no definition for {r}"));
                    *r = format!("#/$defs/{}", name.replace(' ', "%20"));
                }
                m.values_mut().for_each(|v| rewrite(v, names));
            }
            Value::Array(a) => a.iter_mut().for_each(|v| rewrite(v, names)),
            _ => {}
        }
    }
    for v in defs.values_mut() {
        rewrite(v, &names);
    }
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/Agent%20Card",
        "$defs": defs,
    });
    Some(jsonschema::draft202012::new(&root).expect("the reference schema compiles"))
}

fn assert_valid_card(card: &Value, what: &str) {
    if let Some(v) = reference_card_validator() {
        let errors: Vec<String> = v
            .iter_errors(card)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{what}: {errors:?}\n{card:#}");
        // The check can fail: a misspelled field is refused.
        let mut bad = card.clone();
        bad["documentation_link"] = json!("x");
        assert!(!v.is_valid(&bad), "the schema refuses unknown fields");
        if card["skills"].as_array().is_some_and(|s| !s.is_empty()) {
            let mut bad = card.clone();
            bad["skills"][0]["inputMode"] = json!(["text/plain"]);
            assert!(!v.is_valid(&bad), "and unknown skill fields");
        }
    }
}

fn configured_card(driver: &str) {
    let d = Daemon::start_setup(
        driver,
        &Setup {
            tcp_entry: Some(
                r#"{ url = "tcp://127.0.0.1:0", public_url = "https://agent.example.com/a2a/" }"#
                    .into(),
            ),
            sections: CARD_SECTIONS.into(),
            ..Setup::default()
        },
    );
    let card = d.connect(Via::Tcp).request(&get(CARD, &[])).json();
    assert_eq!(card["name"], "reviewer");
    assert_eq!(
        card["documentationUrl"],
        "https://docs.example.com/reviewer"
    );
    assert_eq!(card["iconUrl"], "https://example.com/reviewer.png");
    assert_eq!(
        card["provider"],
        json!({"organization": "Example Org", "url": "https://example.com"})
    );
    assert_eq!(
        card["supportedInterfaces"][0]["url"], "https://agent.example.com/a2a/",
        "{driver}: the public URL, not the bound address"
    );
    // No agent is configured: no conversation skill, only the configured ones, in order.
    let skills = card["skills"].as_array().unwrap();
    assert_eq!(skills.len(), 2, "{driver}: {card:#}");
    assert_eq!(
        skills[0],
        json!({
            "id": "review",
            "name": "Review a change",
            "description": "Reads a diff and answers with findings",
            "tags": ["code", "review"],
            "examples": ["review this patch"],
            "inputModes": ["text/x-diff", "text/plain"],
            "outputModes": ["text/markdown"],
        })
    );
    assert_eq!(
        skills[1],
        json!({"id": "summarize", "name": "Summarize", "description": "Summarizes a text", "tags": []})
    );
    assert_valid_card(&card, driver);
    // The unix listener has no public_url: its card names its path.
    let unix_card = d.connect(Via::Unix).request(&get(CARD, &[])).json();
    assert_eq!(
        unix_card["supportedInterfaces"][0]["url"],
        format!("unix://{}", d.unix.display())
    );
    assert_valid_card(&unix_card, driver);
}

#[test]
fn configured_card_smol() {
    configured_card("smol");
}

#[test]
fn configured_card_std() {
    configured_card("std");
}

/// With a conversation agent the conversation skill leads, then the configured ones; the
/// default card (no agent, no keys) lists no skill and validates too.
#[test]
fn the_conversation_skill_comes_with_an_agent_only() {
    let agent = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/agents/echo_agent.py");
    let sections = CARD_SECTIONS.replace(
        "icon_url",
        &format!(
            "command = [\"python3\", {:?}]\nicon_url",
            agent.display().to_string()
        ),
    );
    let d = Daemon::start_setup(
        "smol",
        &Setup {
            sections,
            ..Setup::default()
        },
    );
    let card = d.connect(Via::Tcp).request(&get(CARD, &[])).json();
    let ids: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["conversation", "review", "summarize"]);
    assert_valid_card(&card, "with an agent");
    drop(d);
    let d = Daemon::start("smol");
    let card = d.connect(Via::Tcp).request(&get(CARD, &[])).json();
    assert_eq!(card["skills"], json!([]));
    assert!(card.get("provider").is_none() && card.get("documentationUrl").is_none());
    assert_valid_card(&card, "the default card");
}

/// Every card key is checked at load, with the key named.
#[test]
fn bad_card_keys_are_load_errors() {
    let dir = Scratch::new("card-keys");
    for (text, needle) in [
        (
            "[agent]\ndocumentation_url = \"docs\"",
            "agent.documentation_url: \"docs\" is not an http:// or https:// URL",
        ),
        ("[agent]\nicon_url = \"ftp://x/y.png\"", "agent.icon_url"),
        (
            "[agent.provider]\norganization = \" \"\nurl = \"https://x\"",
            "agent.provider.organization",
        ),
        (
            "[agent.provider]\norganization = \"X\"\nurl = \"https:// x\"",
            "agent.provider.url",
        ),
        (
            "[[agent.skills]]\nid = \"a b\"\nname = \"n\"\ndescription = \"d\"",
            "agent.skills[0].id",
        ),
        (
            "[[agent.skills]]\nid = \"a\"\nname = \"n\"\ndescription = \"d\"\n[[agent.skills]]\nid = \"a\"\nname = \"n\"\ndescription = \"d\"",
            "agent.skills[1].id: \"a\" is already a skill",
        ),
        (
            "[agent]\ncommand = [\"true\"]\n[[agent.skills]]\nid = \"conversation\"\nname = \"n\"\ndescription = \"d\"",
            "(the conversation agent's)",
        ),
        (
            "[[agent.skills]]\nid = \"a\"\nname = \"\"\ndescription = \"d\"",
            "agent.skills[0].name",
        ),
        (
            "[[agent.skills]]\nid = \"a\"\nname = \"n\"\ndescription = \"d\"\ninput_modes = [\"text\"]",
            "agent.skills[0].input_modes: \"text\" is not a media type",
        ),
        (
            "[a2a]\nlisten = [{ url = \"tcp://127.0.0.1:1\", public_url = \"agent.example.com\" }]",
            "public_url: \"agent.example.com\" is not an http:// or https:// URL",
        ),
        (
            "[a2a.tls]\nhsts_max_age_s = 63072001",
            "a2a.tls.hsts_max_age_s: must be from 0 to 63072000, not 63072001",
        ),
        ("[log]\nformat = \"xml\"", "log.format: \"xml\" is not text or json"),
    ] {
        let path = dir.write("c.toml", &format!("{text}\n[store]\nkind = \"memory\"\n"));
        let err = check_config(&path, &[]).expect_err(text);
        assert!(err.contains(needle), "{text}: {err}");
    }
}

/// The proxy trust rules, at load.
#[test]
fn proxy_trust_rules_are_enforced_at_load() {
    let dir = Scratch::new("proxy-rules");
    let env = [("E2E_OP", "op-token")];
    for (text, outcome) in [
        // A non-loopback plaintext listener: only behind a proxy...
        (
            "[a2a]\nlisten = \"tcp://0.0.0.0:8420\"\nbearer = \"{{secret:E2E_OP}}\"",
            Err("plaintext is served only on loopback; use https:// with a2a.tls, or for a TLS-terminating proxy in front of it { url = \"tcp://0.0.0.0:8420\", behind_proxy = true }"),
        ),
        // ...and there with a credential rule or the proxies' addresses.
        (
            "[a2a]\nlisten = [{ url = \"tcp://0.0.0.0:8420\", behind_proxy = true }]",
            Err("needs a credential rule (a2a.bearer or a bearer_ref rule) or the proxies' addresses in a2a.proxy.trusted, and neither is configured"),
        ),
        (
            "[a2a]\nlisten = [{ url = \"tcp://0.0.0.0:8420\", behind_proxy = true }]\nbearer = \"{{secret:E2E_OP}}\"",
            Ok(()),
        ),
        (
            "[a2a]\nlisten = [{ url = \"tcp://0.0.0.0:8420\", behind_proxy = true }]\nproxy = { trusted = [\"10.0.0.5\", \"fd00::/64\"] }",
            Ok(()),
        ),
        // The proxies are read only for listeners behind one.
        (
            "[a2a]\nlisten = \"tcp://127.0.0.1:8420\"\nproxy = { trusted = [\"10.0.0.5\"] }",
            Err("a2a.proxy.trusted: no listener is behind_proxy"),
        ),
        (
            "[a2a]\nlisten = [{ url = \"tcp://127.0.0.1:8420\", behind_proxy = true }]\nproxy = { trusted = [\"0.0.0.0/0\"] }",
            Err("a2a.proxy.trusted[0]: \"0.0.0.0/0\" trusts every address"),
        ),
        (
            "[a2a]\nlisten = [{ url = \"tcp://127.0.0.1:8420\", behind_proxy = true }]\nproxy = { trusted = [\"10.0.0.300\"] }",
            Err("a2a.proxy.trusted[0]: \"10.0.0.300\" is not an IP address"),
        ),
        (
            "[a2a]\nlisten = [{ url = \"tcp://127.0.0.1:8420\", behind_proxy = true }]\nproxy = { trusted = [\"10.1.2.3/8\"] }",
            Err("bits set past the /8 prefix"),
        ),
        (
            "[a2a]\nlisten = [{ url = \"unix:///tmp/agentd-e2e-x.sock\", behind_proxy = true }]",
            Err("behind_proxy is for TCP listeners"),
        ),
    ] {
        let store = if text.contains("0.0.0.0:8420") {
            format!("[store]\ndir = {:?}\n", dir.0.join("data").display().to_string())
        } else {
            "[store]\nkind = \"memory\"\n".into()
        };
        let path = dir.write("p.toml", &format!("{text}\n{store}"));
        match (check_config(&path, &env), outcome) {
            (Ok(()), Ok(())) => {}
            (Err(err), Err(needle)) => assert!(err.contains(needle), "{text}:\n{err}"),
            (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
        }
    }
}

/// A bad bearer from `addr` (as `X-Forwarded-For` says) to the TCP listener.
fn bad_bearer(d: &Daemon, token: &str, forwarded: Option<&str>) -> common::Response {
    let auth = format!("Authorization: Bearer {token}");
    let xff = forwarded.map(|a| format!("X-Forwarded-For: 198.51.100.99, {a}"));
    let mut headers = vec![
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        auth.as_str(),
    ];
    if let Some(x) = &xff {
        headers.push(x.as_str());
    }
    d.connect(Via::Tcp)
        .request(&post(&headers, &rpc_body("1", "ListTasks", &json!({}))))
}

fn proxy_setup(trusted: &str) -> Setup {
    Setup {
        tcp_entry: Some(r#"{ url = "tcp://127.0.0.1:0", behind_proxy = true }"#.into()),
        a2a: format!("bearer = \"{{{{secret:E2E_OP}}}}\"\nproxy = {{ trusted = [\"{trusted}\"] }}"),
        env: vec![
            ("E2E_OP".into(), "op-token".into()),
            ("AGENTD_LOG".into(), "debug".into()),
        ],
        ..Setup::default()
    }
}

/// From a trusted proxy, the failure limiter counts the client `X-Forwarded-For` names:
/// one client's 20 failures shut that client out, not the next one. From an address that
/// is not a configured proxy the header is not read: the failures count against the peer.
fn forwarded_for(driver: &str) {
    let d = Daemon::start_setup(driver, &proxy_setup("127.0.0.1"));
    for i in 0..20 {
        let r = bad_bearer(&d, &format!("guess-{i}"), Some("203.0.113.7"));
        assert_eq!(r.status, 401, "{driver}: failure {i}: {}", r.body_text());
    }
    let r = bad_bearer(&d, "guess-20", Some("203.0.113.7"));
    assert_eq!(r.status, 429, "{driver}: {}", r.body_text());
    // Another client behind the same proxy is not limited: its failure is a 401.
    let r = bad_bearer(&d, "guess-21", Some("203.0.113.8"));
    assert_eq!(r.status, 401, "{driver}: {}", r.body_text());
    // And the right credential from it is served.
    let auth = "Authorization: Bearer op-token";
    let headers = [
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        auth,
        "X-Forwarded-For: 203.0.113.8",
    ];
    let r = d
        .connect(Via::Tcp)
        .request(&post(&headers, &rpc_body("1", "ListTasks", &json!({}))));
    assert_eq!(r.status, 200, "{driver}: {}", r.body_text());
    // Behind a proxy the loopback listener has no implicit operator: nothing presented is
    // a 401, where a plain loopback listener would serve the operator.
    let r = d
        .connect(Via::Tcp)
        .request(&rpc_request("1", "ListTasks", &json!({})));
    assert_eq!(r.status, 401, "{driver}: {}", r.body_text());
    let stderr = stop(d);
    assert!(
        stderr.contains("limiter=\"source-failures\" source=203.0.113.7"),
        "{driver}: the refusal names the forwarded client: {stderr}"
    );

    // The peer (127.0.0.1) is not a configured proxy: the header is not read.
    let d = Daemon::start_setup(driver, &proxy_setup("10.9.9.9"));
    for i in 0..20 {
        let client = format!("203.0.113.{}", 100 + i);
        let r = bad_bearer(&d, &format!("guess-{i}"), Some(&client));
        assert_eq!(r.status, 401, "{driver}: failure {i}");
    }
    let r = bad_bearer(&d, "guess-20", Some("203.0.113.200"));
    assert_eq!(
        r.status,
        429,
        "{driver}: a fresh X-Forwarded-For from an untrusted peer changes nothing: {}",
        r.body_text()
    );
}

#[test]
fn forwarded_for_smol() {
    forwarded_for("smol");
}

#[test]
fn forwarded_for_std() {
    forwarded_for("std");
}

/// The header lines of a raw HTTP answer, lower-cased names.
fn header_of(answer: &str, name: &str) -> Option<String> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// A GET of the card over TLS (trusting `ca_pem`): the whole answer.
fn https_get(addr: std::net::SocketAddr, ca_pem: &str) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use std::io::{Read, Write};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(
        std::sync::Arc::new(config),
        ServerName::IpAddress(addr.ip().into()),
    )
    .unwrap();
    let sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(
        b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => panic!("TLS read: {e}"),
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hsts(driver: &str) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.self_signed(&key).unwrap();
    let dir = Scratch::new(&format!("hsts-{driver}"));
    let cert_path = dir.write("cert.pem", &cert.pem());
    let key_path = dir.write("key.pem", &key.serialize_pem());
    let tls = |extra: &str| Setup {
        https: true,
        sections: format!(
            "\n[a2a.tls]\ncert = {:?}\nkey = {:?}\n{extra}",
            cert_path.display().to_string(),
            key_path.display().to_string()
        ),
        ..Setup::default()
    };
    let d = Daemon::start_setup(driver, &tls(""));
    let answer = https_get(d.tcp, &cert.pem());
    assert!(answer.starts_with("HTTP/1.1 200"), "{driver}: {answer}");
    assert_eq!(
        header_of(&answer, "strict-transport-security").as_deref(),
        Some("max-age=31536000"),
        "{driver}: {answer}"
    );
    // The unix listener of the same daemon is not https: no HSTS.
    let r = d.connect(Via::Unix).request(&get(CARD, &[]));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("strict-transport-security"), None, "{driver}");
    drop(d);
    // A configured max-age, and 0 sends none.
    let d = Daemon::start_setup(driver, &tls("hsts_max_age_s = 600\n"));
    let answer = https_get(d.tcp, &cert.pem());
    assert_eq!(
        header_of(&answer, "strict-transport-security").as_deref(),
        Some("max-age=600")
    );
    drop(d);
    let d = Daemon::start_setup(driver, &tls("hsts_max_age_s = 0\n"));
    let answer = https_get(d.tcp, &cert.pem());
    assert!(answer.starts_with("HTTP/1.1 200"), "{driver}: {answer}");
    assert_eq!(header_of(&answer, "strict-transport-security"), None);
    drop(d);
    // A plaintext listener never sends it.
    let d = Daemon::start(driver);
    let r = d.connect(Via::Tcp).request(&get(CARD, &[]));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("strict-transport-security"), None, "{driver}");
}

#[test]
fn hsts_smol() {
    hsts("smol");
}

#[test]
fn hsts_std() {
    hsts("std");
}

/// `--print-config` prints a configuration the daemon loads and runs, every default filled
/// in, the secrets written into the file redacted, and printing it again gives it back.
#[test]
fn print_config_round_trips_with_secrets_redacted() {
    let dir = Scratch::new("print-config");
    let unix = dir.0.join("a.sock");
    let agent = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/agents/echo_agent.py");
    let text = format!(
        r#"
[agent]
name = "printed"
command = ["python3", {agent:?}]
env = {{ API_KEY = "sk-agent-secret-1" }}
documentation_url = "https://docs.example.com/"

[[agent.skills]]
id = "review"
name = "Review"
description = "Reviews"
tags = ["x"]

[[subagents]]
name = "helper"
command = ["python3", {agent:?}]
env = {{ TOKEN = "sk-sub-secret-2" }}

[a2a]
listen = [{{ url = "tcp://127.0.0.1:0", public_url = "https://printed.example.com/", behind_proxy = true }}, "unix://{unix}"]
bearer = "{{{{secret:E2E_PRINT_OP}}}}"
proxy = {{ trusted = ["127.0.0.1"] }}

[[a2a.peers]]
name = "other"
endpoint = "https://other.example.com"
headers = {{ X-Api-Key = "sk-peer-secret-3" }}

[[workflows]]
name = "ship"

[[workflows.steps]]
id = "upload"
kind = "exec"
program = "/bin/true"
env = {{ UPLOAD_TOKEN = "sk-step-secret-5" }}

[limits]
max_body_bytes = 1048576

[store]
kind = "memory"
"#,
        agent = agent.display().to_string(),
        unix = unix.display(),
    );
    let path = dir.write("in.toml", &text);
    let env = [("E2E_PRINT_OP", "op-secret-token-4")];
    let (code, printed, err) = agentd(
        &["--print-config", "--config", path.to_str().unwrap()],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    for secret in [
        "sk-agent-secret-1",
        "sk-sub-secret-2",
        "sk-peer-secret-3",
        "op-secret-token-4",
        "sk-step-secret-5",
    ] {
        assert!(!printed.contains(secret), "{secret} printed:\n{printed}");
    }
    assert_eq!(printed.matches("\"(redacted)\"").count(), 4, "{printed}");
    // The reference stays a reference; set keys stand; defaults are filled in.
    for line in [
        "bearer = \"{{secret:E2E_PRINT_OP}}\"",
        "max_body_bytes = 1048576",
        "idle_timeout_ms = 60000",
        "max_tasks = 10000",
        "turn_timeout_ms = 300000",
        "hsts_max_age_s = 31536000",
        "format = \"text\"",
        "service_name = \"agentd\"",
        "ring = 1024",
        "public_url = \"https://printed.example.com/\"",
    ] {
        assert!(printed.contains(line), "no {line:?} in:\n{printed}");
    }
    // It loads back, and printing it again gives the same text.
    let again = dir.write("printed.toml", &printed);
    check_config(&again, &env).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    let (code, twice, err) = agentd(
        &["--print-config", "--config", again.to_str().unwrap()],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(twice, printed);
    // The daemon runs on it: its card says what the original said.
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(["--config", again.to_str().unwrap()])
        .envs(env.iter().copied())
        .env_remove("AGENTD_LOG_FORMAT")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let child = Kill(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening http://")
        .unwrap_or_else(|| panic!("{line:?}"))
        .trim_end_matches('/')
        .to_owned();
    let s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = common::Client::new(s);
    let card = c.request(&get(CARD, &[])).json();
    assert_eq!(card["name"], "printed");
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        "https://printed.example.com/"
    );
    let ids: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["conversation", "review"]);
    drop(child);
    // With no file: the embedded default, printed, loads too.
    let (code, printed, err) = agentd(&["--print-config"], &[]);
    assert_eq!(code, 0, "{err}");
    let default = dir.write("default.toml", &printed);
    check_config(&default, &[]).unwrap();
    // An invalid file prints nothing and exits 2 with the load error.
    let bad = dir.write("bad.toml", "[limits]\nmax_body_bytes = 0\n");
    let (code, out, err) = agentd(&["--print-config", "--config", bad.to_str().unwrap()], &[]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("limits.max_body_bytes"), "{err}");
}
