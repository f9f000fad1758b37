//! `agentd card URL`: the agent card.

use serde_json::Value;

use super::super::args::Parsed;
use super::super::client::Client;
use super::super::output::{self, line, str_at, Style};
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd card URL [--json]

Reads the agent card (GET /.well-known/agent-card.json at URL's origin) and prints its
name, description, version, interfaces, capabilities, skills and extensions; --json
prints the card as served.
";

pub fn card(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &[], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url] = <[String; 1]>::try_from(p.exact(&["URL"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let mut client = Client::new(&common)?;
    let card = client.card()?;
    if common.json {
        output::json_pretty(&card);
        return Ok(());
    }
    let s = Style::detect();
    let mut title = s.bold(str_at(&card, &["name"]));
    let version = str_at(&card, &["version"]);
    if !version.is_empty() {
        title.push_str(&format!("  version {version}"));
    }
    line(&title);
    let desc = str_at(&card, &["description"]);
    if !desc.is_empty() {
        line(desc);
    }
    let provider = str_at(&card, &["provider", "organization"]);
    if !provider.is_empty() {
        line(&format!("provider: {provider}"));
    }
    let list = |key: &str| {
        card.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let interfaces = list("supportedInterfaces");
    if !interfaces.is_empty() {
        line(&s.dim("interfaces:"));
        for i in &interfaces {
            let mut l = format!(
                "  {} {}  {}",
                str_at(i, &["protocolBinding"]),
                str_at(i, &["protocolVersion"]),
                str_at(i, &["url"])
            );
            let tenant = str_at(i, &["tenant"]);
            if !tenant.is_empty() {
                l.push_str(&format!("  tenant {tenant}"));
            }
            line(&l);
        }
    }
    let caps = card.get("capabilities").cloned().unwrap_or_default();
    let on = |k: &str| caps.get(k).and_then(Value::as_bool) == Some(true);
    let mut said = Vec::new();
    for (key, word) in [
        ("streaming", "streaming"),
        ("pushNotifications", "push notifications"),
        ("extendedAgentCard", "extended card"),
    ] {
        if on(key) {
            said.push(word);
        }
    }
    if !said.is_empty() {
        line(&format!("{} {}", s.dim("capabilities:"), said.join(", ")));
    }
    let skills = list("skills");
    if !skills.is_empty() {
        line(&s.dim("skills:"));
        for k in &skills {
            let mut l = format!("  {}", s.bold(str_at(k, &["id"])));
            let name = str_at(k, &["name"]);
            if !name.is_empty() && name != str_at(k, &["id"]) {
                l.push_str(&format!("  {name}"));
            }
            let d = str_at(k, &["description"]);
            if !d.is_empty() {
                l.push_str(&format!(": {}", output::first_line(d, 100)));
            }
            line(&l);
        }
    }
    let exts = caps
        .get("extensions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !exts.is_empty() {
        line(&s.dim("extensions:"));
        for e in &exts {
            let required = e.get("required").and_then(Value::as_bool) == Some(true);
            line(&format!(
                "  {}{}",
                str_at(e, &["uri"]),
                if required { "  (required)" } else { "" }
            ));
        }
    }
    Ok(())
}
