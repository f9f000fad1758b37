//! `agentd cancel URL TASK`: CancelTask.

use serde_json::{Map, Value};

use super::super::args::Parsed;
use super::super::client::Client;
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd cancel URL TASK [--json]

Cancels a task (CancelTask) and prints it as the server answers. A task that has already
ended is refused (-32002 TASK_NOT_CANCELABLE, exit 1).
";

pub fn cancel(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &[], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url, task] = <[String; 2]>::try_from(p.exact(&["URL", "TASK"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let mut client = Client::new(&common)?;
    let mut params = Map::new();
    params.insert("id".into(), Value::String(task));
    let result = client.call("CancelTask", params)?;
    super::show_task(common.json, result, false)
}
