//! One file per subcommand.

mod answer;
mod cancel;
mod card;
mod get;
mod list;
mod login;
mod probe;
mod run;
mod send;
mod subscribe;
mod watch;

pub use answer::answer;
pub use cancel::cancel;
pub use card::card;
pub use get::get;
pub use list::list;
pub use login::{login, logout};
pub use probe::probe;
pub use run::run;
pub use send::send;
pub use subscribe::subscribe;
pub use watch::watch;

use serde_json::Value;

use super::output::{self, Style};
use super::Failure;

/// Prints a subcommand's usage when `--help` was given; true if it was.
fn help(p: &super::args::Parsed, usage: &str) -> bool {
    if p.help() {
        output::say(usage);
        return true;
    }
    false
}

/// The extension `uri` as the card declares it (`capabilities.extensions[]`), if it does.
fn declared(card: &Value, uri: &str) -> Option<Value> {
    card.pointer("/capabilities/extensions")?
        .as_array()?
        .iter()
        .find(|e| e.get("uri").and_then(Value::as_str) == Some(uri))
        .cloned()
}

/// A Task answer, bare (as A2A 1.0 answers `GetTask` and `CancelTask`) or `{"task": …}`.
fn task_of(result: Value) -> Result<Value, Failure> {
    let t = match result {
        Value::Object(mut m) if !m.contains_key("id") && m.contains_key("task") => {
            m.remove("task").unwrap_or_default()
        }
        other => other,
    };
    if t.get("id").and_then(Value::as_str).is_none() {
        return Err(Failure::BadAnswer(
            "the answer is not a task (no id)".into(),
        ));
    }
    Ok(t)
}

/// Prints a task answer: as served with `--json`, else for people.
fn show_task(json: bool, result: Value, with_history: bool) -> Result<(), Failure> {
    if json {
        output::json_pretty(&result);
        return Ok(());
    }
    let t = task_of(result)?;
    output::task(Style::detect(), &t, with_history);
    Ok(())
}
