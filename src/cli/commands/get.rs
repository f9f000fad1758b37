//! `agentd get URL TASK`: GetTask.

use serde_json::{Map, Value};

use super::super::args::Parsed;
use super::super::client::Client;
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd get URL TASK [--history N] [--json]

Prints one task (GetTask): its state, status message and artifacts; --history N adds its
newest N history messages.
";

pub fn get(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &["--history"], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url, task] = <[String; 2]>::try_from(p.exact(&["URL", "TASK"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let history = p.number("--history")?;
    let mut client = Client::new(&common)?;
    let mut params = Map::new();
    params.insert("id".into(), Value::String(task));
    if let Some(n) = history {
        params.insert("historyLength".into(), Value::from(n));
    }
    let result = client.call("GetTask", params)?;
    super::show_task(common.json, result, history.is_some_and(|n| n > 0))
}
