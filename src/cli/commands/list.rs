//! `agentd list URL`: ListTasks, a page at a time.

use serde_json::{Map, Value};

use super::super::args::Parsed;
use super::super::client::Client;
use super::super::output::{self, line, str_at, Style};
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd list URL [--context ID] [--state STATE] [--page-size N] [--page-token TOKEN]
                       [--json]

Lists the caller's tasks (ListTasks), newest first, as a table; when there are more, the
last line names the token of the next page. STATE is completed, working,
input-required, ... (or TASK_STATE_COMPLETED, ...).
";

pub fn list(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(
        words,
        &["--context", "--state", "--page-size", "--page-token"],
        &[],
    )?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url] = <[String; 1]>::try_from(p.exact(&["URL"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let mut params = Map::new();
    if let Some(c) = p.value("--context") {
        params.insert("contextId".into(), Value::from(c));
    }
    if let Some(s) = p.value("--state") {
        params.insert("status".into(), Value::from(output::state_wire(s)));
    }
    if let Some(n) = p.number("--page-size")? {
        params.insert("pageSize".into(), Value::from(n));
    }
    if let Some(t) = p.value("--page-token") {
        params.insert("pageToken".into(), Value::from(t));
    }
    let mut client = Client::new(&common)?;
    let result = client.call("ListTasks", params)?;
    if common.json {
        output::json_pretty(&result);
        return Ok(());
    }
    let Some(tasks) = result.get("tasks").and_then(Value::as_array) else {
        return Err(Failure::BadAnswer("the answer has no tasks list".into()));
    };
    let s = Style::detect();
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                str_at(t, &["id"]).to_owned(),
                output::state_word(str_at(t, &["status", "state"])),
                str_at(t, &["status", "timestamp"]).to_owned(),
                output::first_line(&output::parts_text(t.pointer("/status/message/parts")), 60),
            ]
        })
        .collect();
    if rows.is_empty() {
        line("no tasks");
    } else {
        output::table(s, &["TASK", "STATE", "UPDATED", "MESSAGE"], &rows, Some(1));
    }
    if let Some(total) = result.get("totalSize").and_then(Value::as_u64) {
        line(&s.dim(&format!("{} of {total} tasks", rows.len())));
    }
    let next = str_at(&result, &["nextPageToken"]);
    if !next.is_empty() {
        line(&format!("next page: --page-token {next}"));
    }
    Ok(())
}
