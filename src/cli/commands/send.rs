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
                       [--file PATH] [--json]

Sends a user message with TEXT as a text part, --data JSON as a data part and --file PATH
as a file part (its bytes in base64, its name, a media type from its extension); one of
them is needed. By default the answer streams (SendStreamingMessage): status updates and
artifacts as they arrive, to a final state or one that waits for input; a dropped stream
is followed on with SubscribeToTask from its last event. --no-stream (or a server whose
card does not say it streams) sends SendMessage and prints the task once it settles.
--task continues a task waiting for input; --context continues a conversation.
";

pub fn send(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(
        words,
        &["--task", "--context", "--data", "--file"],
        &["--no-stream"],
    )?;
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
    if let Some(path) = p.value("--file") {
        parts.push(file_part(std::path::Path::new(path))?);
    }
    if parts.is_empty() {
        return Err(Failure::Usage(
            "nothing to send: give TEXT, --data or --file".into(),
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
        let result = output::with_progress("waiting for the answer", common.json, || {
            client.call("SendMessage", params)
        })?;
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

/// A file as a part: `raw` (standard base64), `filename`, `mediaType` by extension.
fn file_part(path: &std::path::Path) -> Result<Value, Failure> {
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::Usage(format!("--file {}: {e}", path.display())))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let media = match ext.as_str() {
        "txt" | "text" | "log" => "text/plain",
        "md" => "text/markdown",
        "json" => "application/json",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        _ => "application/octet-stream",
    };
    Ok(json!({"raw": base64(&bytes), "filename": name, "mediaType": media}))
}

/// Standard base64 with padding (RFC 4648 section 4), as ProtoJSON writes bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_as_rfc_4648_says() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(super::base64(plain.as_bytes()), coded);
        }
        assert_eq!(super::base64(&[0xfb, 0xff]), "+/8=");
    }
}
