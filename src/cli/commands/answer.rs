//! `agentd answer URL TASK [--answer JSON | --field k=v ...]`: the answer to a task that waits
//! for input, checked against the question's `askSchema` before it is sent.

use std::io::{BufRead, IsTerminal, Write};

use agentd_core::ext::TASK_ANNOTATIONS_URI;
use agentd_io_common::OsEntropy;
use serde_json::{json, Map, Value};

use super::super::args::Parsed;
use super::super::client::Client;
use super::super::output::{self, str_at, Style};
use super::super::schema;
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd answer URL TASK [--answer JSON | --field NAME=VALUE ...] [--json]

Answers a task that waits for input (TASK_STATE_INPUT_REQUIRED): a workflow's human gate,
or an agent's question. The client reads the task (with agentd's task annotations, when
the card declares them, for the gate's askSchema: the JSON Schema the answer must match)
and prints the question. On a terminal, without --answer or --field, it asks for the
answer field by field (title, description, choices, default; * marks a required field).
Otherwise the answer is --answer JSON, or the --field NAME=VALUE words (each VALUE read as
the type the schema gives NAME). The answer is checked against the schema before it is
sent (a mismatch is a usage error naming the field, exit 2), then sent as a message on
the task (an object as a data part, anything else as JSON text), and the task's new state
is printed. A task that is not waiting for input is refused (exit 2).
";

pub fn answer(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &["--answer", "--field"], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url, task] = <[String; 2]>::try_from(p.exact(&["URL", "TASK"])?).unwrap_or_default();
    let fields = p.values("--field");
    if p.value("--answer").is_some() && !fields.is_empty() {
        return Err(Failure::Usage(
            "give --answer JSON or --field NAME=VALUE, not both".into(),
        ));
    }
    let common = p.common(&url)?;
    let mut client = Client::new(&common)?;
    let card = client.card()?;
    let annotated = super::declared(&card, TASK_ANNOTATIONS_URI).is_some();
    let exts: &[&str] = if annotated {
        &[TASK_ANNOTATIONS_URI]
    } else {
        &[]
    };
    let mut params = Map::new();
    params.insert("id".into(), Value::String(task.clone()));
    params.insert("historyLength".into(), Value::from(0));
    let t = super::task_of(client.call_ext("GetTask", params, exts)?)?;
    let state = str_at(&t, &["status", "state"]);
    if state != "TASK_STATE_INPUT_REQUIRED" {
        return Err(Failure::Usage(format!(
            "task {task} is not waiting for input: it is {}",
            output::state_word(state)
        )));
    }
    let question = output::parts_text(t.pointer("/status/message/parts"));
    let ask = t
        .get("metadata")
        .and_then(|m| m.get(TASK_ANNOTATIONS_URI))
        .and_then(|a| a.get("askSchema"))
        .cloned();
    let object_schema = ask.as_ref().is_some_and(|s| {
        schema::types(Some(s)).iter().any(|t| t == "object") || s.get("properties").is_some()
    });

    let answer = if let Some(j) = p.value("--answer") {
        serde_json::from_str::<Value>(j)
            .map_err(|e| Failure::Usage(format!("--answer is not JSON: {e}")))?
    } else if !fields.is_empty() {
        if ask.is_some() && !object_schema {
            return Err(Failure::Usage(
                "the question asks for one value, not fields: give --answer JSON".into(),
            ));
        }
        let mut m = Map::new();
        schema::pairs(&fields, ask.as_ref(), "--field", &mut m).map_err(Failure::Usage)?;
        Value::Object(m)
    } else if std::io::stdin().is_terminal() {
        prompt(&question, ask.as_ref())?
    } else {
        return Err(Failure::Usage(
            "stdin is not a terminal: give the answer with --answer JSON or --field NAME=VALUE"
                .into(),
        ));
    };
    if let Some(s) = &ask {
        check(s, &answer)?;
    }

    // An object travels as a data part; any other value as its JSON text, which the gate
    // reads back as JSON.
    let part = if answer.is_object() {
        json!({"data": answer, "mediaType": "application/json"})
    } else {
        json!({"text": serde_json::to_string(&answer).unwrap_or_default()})
    };
    let mut message = json!({
        "role": "ROLE_USER",
        "messageId": agentd_core::ids::uuid_v4(&mut OsEntropy),
        "taskId": task,
        "parts": [part],
    });
    let ctx = str_at(&t, &["contextId"]);
    if !ctx.is_empty() {
        message["contextId"] = Value::from(ctx);
    }
    let mut params = Map::new();
    params.insert("message".into(), message);
    let result = output::with_progress("waiting for the task", common.json, || {
        client.call("SendMessage", params)
    })?;
    super::show_task(common.json, result, false)
}

/// Refuses an answer the schema does not admit, naming the field.
fn check(ask: &Value, answer: &Value) -> Result<(), Failure> {
    let problems = schema::problems(ask, answer);
    let Some((at, why)) = problems.first() else {
        return Ok(());
    };
    let field = at.trim_start_matches('/').replace('/', ".");
    let mut msg = if field.is_empty() {
        format!("the answer does not match the question's schema: {why}")
    } else {
        format!("field {field}: {why}")
    };
    if problems.len() > 1 {
        msg.push_str(&format!(" (and {} more)", problems.len() - 1));
    }
    Err(Failure::Usage(msg))
}

/// Asks on the terminal: the question, then each field of an object schema (required ones
/// first), or one value. stderr carries the prompts, so stdout stays the task.
fn prompt(question: &str, ask: Option<&Value>) -> Result<Value, Failure> {
    let s = Style::detect_stderr();
    eprintln!(
        "{}",
        s.bold(if question.is_empty() {
            "(no question)"
        } else {
            question
        })
    );
    let mut lines = std::io::stdin().lock();
    let mut read = |label: &str| -> Result<String, Failure> {
        let mut err = std::io::stderr();
        let _ = write!(err, "{label}");
        let _ = err.flush();
        let mut l = String::new();
        match lines.read_line(&mut l) {
            Ok(0) => Err(Failure::Usage("no answer: stdin ended".into())),
            Ok(_) => Ok(l.trim_end_matches(['\n', '\r']).to_owned()),
            Err(e) => Err(Failure::Usage(format!("stdin: {e}"))),
        }
    };
    let props = ask
        .and_then(|a| a.get("properties"))
        .and_then(Value::as_object);
    let Some(props) = props else {
        // One value: JSON when it parses, else the text as a string (as the gate reads text).
        let raw = read("answer: ")?;
        return Ok(match ask {
            Some(a) => schema::coerce(&raw, Some(a)).unwrap_or(Value::String(raw)),
            None => serde_json::from_str(&raw).unwrap_or(Value::String(raw)),
        });
    };
    let required: Vec<&str> = ask
        .and_then(|a| a.get("required"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut names: Vec<&String> = props.keys().collect();
    names.sort_by_key(|n| !required.contains(&n.as_str()));
    let mut out = Map::new();
    for name in names {
        let f = &props[name.as_str()];
        let needed = required.contains(&name.as_str());
        let title = f.get("title").and_then(Value::as_str).unwrap_or(name);
        let mut label = format!("{}{}", s.bold(title), if needed { " *" } else { "" });
        if title != name {
            label.push_str(&s.dim(&format!(" ({name})")));
        }
        if let Some(d) = f.get("description").and_then(Value::as_str) {
            label.push_str(&format!(" {}", s.dim(&format!("- {d}"))));
        }
        let choices: Vec<String> = f
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(schema::enum_word)
            .collect();
        let kinds = schema::types(Some(f));
        if !choices.is_empty() {
            label.push_str(&format!(" [{}]", choices.join("/")));
        } else if kinds.iter().any(|k| k == "boolean") {
            label.push_str(" [y/n]");
        } else if !kinds.is_empty() {
            label.push_str(&s.dim(&format!(" ({})", kinds.join("|"))));
        }
        let default = f.get("default");
        if let Some(d) = default {
            label.push_str(&format!(" default {}", schema::enum_word(d)));
        }
        label.push_str(": ");
        loop {
            let raw = read(&label)?;
            if raw.is_empty() {
                if let Some(d) = default {
                    out.insert(name.clone(), d.clone());
                    break;
                }
                if !needed {
                    break;
                }
                eprintln!("  {name} is required");
                continue;
            }
            match schema::coerce(&raw, Some(f)) {
                Ok(v) => match schema::problems(f, &v).into_iter().next() {
                    None => {
                        out.insert(name.clone(), v);
                        break;
                    }
                    Some((_, why)) => {
                        eprintln!("  {why}");
                    }
                },
                Err(want) => {
                    eprintln!("  {name} takes {want}");
                }
            }
        }
    }
    Ok(Value::Object(out))
}
