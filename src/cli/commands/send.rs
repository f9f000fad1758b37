//! `agentd send URL TEXT`: SendStreamingMessage (SendMessage with `--no-stream`, or when
//! the card says the server does not stream).

use agentd_io_common::OsEntropy;
use serde_json::{json, Map, Value};

use super::super::args::Parsed;
use super::super::client::{Client, StreamEnd};
use super::super::output::{self, Style};
use super::super::Failure;
use super::subscribe::{follow_task, Follower};

const USAGE: &str = "\
Usage: agentd send URL [TEXT] [--no-stream] [--task ID] [--context ID] [--data JSON]
                       [--json]

Sends a user message with TEXT as a text part (and --data JSON as a data part; one of
them is needed). By default the answer streams (SendStreamingMessage): status updates and
artifacts as they arrive, to a final state or one that waits for input; a dropped stream
is followed on with SubscribeToTask from its last event. --no-stream (or a server whose
card does not say it streams) sends SendMessage and prints the task once it settles.
--task continues a task waiting for input; --context continues a conversation.
";

pub fn send(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &["--task", "--context", "--data"], &["--no-stream"])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let (url, text) = match p.positional.as_slice() {
        [url] => (url.clone(), None),
        [url, text] => (url.clone(), Some(text.clone())),
        [] => return Err(Failure::Usage("missing URL".into())),
        [_, _, extra, ..] => return Err(Failure::Usage(format!("unexpected argument {extra:?}"))),
    };
    let common = p.common(&url)?;
    let mut parts = Vec::new();
    if let Some(t) = text {
        parts.push(json!({"text": t}));
    }
    if let Some(d) = p.value("--data") {
        let data: Value = serde_json::from_str(d)
            .map_err(|e| Failure::Usage(format!("--data is not JSON: {e}")))?;
        parts.push(json!({"data": data, "mediaType": "application/json"}));
    }
    if parts.is_empty() {
        return Err(Failure::Usage(
            "nothing to send: give TEXT or --data".into(),
        ));
    }
    let mut message = json!({
        "role": "ROLE_USER",
        "messageId": agentd_core::ids::uuid_v4(&mut OsEntropy),
        "parts": parts,
    });
    if let Some(t) = p.value("--task") {
        message["taskId"] = Value::from(t);
    }
    if let Some(c) = p.value("--context") {
        message["contextId"] = Value::from(c);
    }
    let mut params = Map::new();
    params.insert("message".into(), message);
    let mut client = Client::new(&common)?;
    if p.switch("--no-stream") || !client.streams()? {
        let result = client.call("SendMessage", params)?;
        if common.json {
            output::json_pretty(&result);
            return Ok(());
        }
        if let Some(m) = result.get("message") {
            output::message(Style::detect(), m);
            return Ok(());
        }
        return super::show_task(false, result, false);
    }
    let mut follow = Follower::new(common.json);
    let end = client.stream("SendStreamingMessage", params, None, |v, id| {
        Ok(follow.event(&v, id))
    })?;
    match end {
        StreamEnd::Finished => Ok(()),
        StreamEnd::Closed if follow.done => Ok(()),
        StreamEnd::Closed | StreamEnd::Dropped(_) if follow.task_id.is_some() => {
            let why = match end {
                StreamEnd::Dropped(why) => why,
                _ => "the server closed the stream before a final state".into(),
            };
            match &follow.last_id {
                Some(id) => eprintln!(
                    "agentd send: stream dropped ({why}); following the task with Last-Event-ID {id}"
                ),
                None => eprintln!("agentd send: stream dropped ({why}); following the task"),
            }
            follow_task(&mut client, &mut follow, "agentd send")
        }
        StreamEnd::Closed => Err(Failure::BadAnswer(
            "the stream ended before any task or message".into(),
        )),
        StreamEnd::Dropped(why) => Err(Failure::Connect(why)),
    }
}
