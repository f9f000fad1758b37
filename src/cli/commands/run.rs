//! `agentd run URL OP [--arg k=v ...] [--args JSON]`: one op of agentd's command extension,
//! its arguments checked against the op's schema before it is sent.

use agentd_core::ext::bundle::bundle;
use agentd_core::ext::{Ext, COMMAND_URI};
use agentd_io_common::OsEntropy;
use serde_json::{json, Map, Value};

use super::super::args::Parsed;
use super::super::client::Client;
use super::super::output::{self, line, str_at, Style};
use super::super::schema;
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd run URL OP [--arg NAME=VALUE ...] [--args JSON] [--json]

Runs OP, an op of agentd's command extension (https://agentd.dev/a2a/ext/command): a
built-in one (status, workflow.run, admin.drain, ...) or a workflow's command
(deploy.start, ...). The arguments are --args JSON (an object) and then each --arg
NAME=VALUE, whose VALUE is read as the type the op's schema gives NAME (integer, number,
boolean, string; JSON for an object or an array). They are checked against that schema
before anything is sent; a bad one is a usage error naming it (exit 2). The schema of a
built-in op is the command extension's own; a workflow command's is on the extended card
(read with the bearer token when the card says there is one). A server whose card does not
declare the command extension is refused (exit 2).

Prints an op's answer for people: a read op's result, or a work op's task and its result;
--json prints the JSON-RPC result as served.
";

pub fn run(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &["--arg", "--args"], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url, op] = <[String; 2]>::try_from(p.exact(&["URL", "OP"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let mut client = Client::new(&common)?;
    let card = client.card()?;
    let Some(ext) = super::declared(&card, COMMAND_URI) else {
        return Err(Failure::Usage(format!(
            "{url} does not declare agentd's command extension ({COMMAND_URI}) on its card: \
             it runs no command ops"
        )));
    };
    let found = find_op(&mut client, &card, &ext, &op)?;
    // The arguments: --args first, each --arg over it.
    let mut args = match p.value("--args") {
        None => Map::new(),
        Some(j) => match serde_json::from_str::<Value>(j) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(Failure::Usage("--args must be a JSON object".into())),
            Err(e) => return Err(Failure::Usage(format!("--args is not JSON: {e}"))),
        },
    };
    if args.contains_key("op") {
        return Err(Failure::Usage(
            "the arguments cannot set \"op\": OP names it".into(),
        ));
    }
    let arg_schema = found.args_schema();
    schema::pairs(&p.values("--arg"), arg_schema.as_ref(), "--arg", &mut args)
        .map_err(Failure::Usage)?;
    found.check(&op, &args)?;
    if let Found::Unlisted(why) = &found {
        eprintln!("agentd run: {why}; sending {op} unchecked (the server checks its arguments)");
    }

    let mut envelope = Map::new();
    envelope.insert("op".into(), Value::String(op.clone()));
    envelope.extend(args);
    let message = json!({
        "role": "ROLE_USER",
        "messageId": agentd_core::ids::uuid_v4(&mut OsEntropy),
        "extensions": [COMMAND_URI],
        "parts": [{"data": {"agentd": envelope}, "mediaType": "application/json"}],
    });
    let mut params = Map::new();
    params.insert("message".into(), message);
    let result = output::with_progress("waiting for the answer", common.json, || {
        client.call_ext("SendMessage", params, &[COMMAND_URI])
    })?;
    if common.json {
        output::json_pretty(&result);
        return Ok(());
    }
    let s = Style::detect();
    if let Some(m) = result.get("message") {
        show_parts(m.get("parts"));
        return Ok(());
    }
    let t = super::task_of(result)?;
    output::task(s, &t, false);
    let state = str_at(&t, &["status", "state"]);
    if state == "TASK_STATE_INPUT_REQUIRED" {
        line(&s.dim(&format!(
            "the task waits for an answer: agentd answer {url} {}",
            str_at(&t, &["id"])
        )));
    }
    Ok(())
}

/// A message's parts for people: data as indented `key: value` lines, text as it is.
fn show_parts(parts: Option<&Value>) {
    for part in parts.and_then(Value::as_array).into_iter().flatten() {
        if let Some(d) = part.get("data") {
            line(&schema::render(d));
        } else {
            let t = output::parts_text(Some(&Value::Array(vec![part.clone()])));
            if !t.is_empty() {
                line(&t);
            }
        }
    }
}

/// Where the op was found, and so what its arguments are checked against.
enum Found {
    /// A built-in op: the command extension's schema bundle, and the op's envelope in it.
    Builtin { bundle: Value, envelope: Value },
    /// A workflow's command: the schema of its arguments, from the (extended) card.
    Workflow { schema: Value },
    /// Not on any card this caller could read: why.
    Unlisted(String),
}

impl Found {
    /// The schema of the arguments alone (the envelope without `op`), for coercion.
    fn args_schema(&self) -> Option<Value> {
        match self {
            Found::Builtin { envelope, .. } => Some(envelope.clone()),
            Found::Workflow { schema } => Some(schema.clone()),
            Found::Unlisted(_) => None,
        }
    }

    /// Refuses arguments the op's schema does not admit, naming the first bad one.
    fn check(&self, op: &str, args: &Map<String, Value>) -> Result<(), Failure> {
        let (schema, instance, prefix) = match self {
            Found::Builtin { bundle, .. } => {
                let mut env = args.clone();
                env.insert("op".into(), Value::String(op.to_owned()));
                (bundle.clone(), json!({"agentd": env}), "/agentd")
            }
            Found::Workflow { schema } => (schema.clone(), Value::Object(args.clone()), ""),
            Found::Unlisted(_) => return Ok(()),
        };
        // The commonest mistakes, said by name: an argument the op does not take, one it needs.
        if let Some(s) = self.args_schema() {
            let props = s.get("properties").and_then(Value::as_object);
            let takes: Vec<&str> = props
                .into_iter()
                .flatten()
                .map(|(k, _)| k.as_str())
                .filter(|k| *k != "op")
                .collect();
            let closed = s.get("additionalProperties") == Some(&Value::Bool(false));
            if let Some(extra) = args.keys().find(|k| closed && !takes.contains(&k.as_str())) {
                return Err(Failure::Usage(format!(
                    "argument {extra}: {op} takes no such argument (it takes {})",
                    if takes.is_empty() {
                        "none".to_owned()
                    } else {
                        takes.join(", ")
                    }
                )));
            }
            let required = s.get("required").and_then(Value::as_array);
            if let Some(missing) = required
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .find(|r| *r != "op" && !args.contains_key(*r))
            {
                return Err(Failure::Usage(format!(
                    "argument {missing}: {op} needs it (--arg {missing}=VALUE)"
                )));
            }
        }
        let problems = schema::problems(&schema, &instance);
        let Some((at, why)) = problems.first() else {
            return Ok(());
        };
        let at = at.strip_prefix(prefix).unwrap_or(at);
        let name = at.trim_start_matches('/');
        let mut msg = if name.is_empty() {
            format!("the arguments of {op} do not match its schema: {why}")
        } else {
            format!(
                "argument {}: {why}",
                name.replace('/', ".").replace("~1", "/").replace("~0", "~")
            )
        };
        if problems.len() > 1 {
            msg.push_str(&format!(" (and {} more)", problems.len() - 1));
        }
        Err(Failure::Usage(msg))
    }
}

/// A JSON pointer token.
fn escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Finds `op` on the card: a workflow command with its schema (the public card, else the
/// extended card), or a built-in op of the vocabulary.
fn find_op(client: &mut Client, card: &Value, ext: &Value, op: &str) -> Result<Found, Failure> {
    let command_schema = |params: &Value| -> Option<Value> {
        params
            .get("commands")?
            .as_array()?
            .iter()
            .find(|c| c.get("op").and_then(Value::as_str) == Some(op))
            .map(|c| c.get("schema").cloned().unwrap_or(json!({})))
    };
    let lists_op = |params: &Value| {
        params
            .get("ops")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|o| o.get("op").and_then(Value::as_str) == Some(op))
    };
    let params = ext.get("params").cloned().unwrap_or_default();
    if let Some(schema) = command_schema(&params) {
        return Ok(Found::Workflow { schema });
    }
    let builtin = |params: &Value| -> Result<Found, Failure> {
        let b = bundle(Ext::Command);
        // The card names the schema its ops follow; the client knows that one.
        let named = params.get("schema").and_then(Value::as_str);
        if named.is_some_and(|n| Some(n) != b.get("$id").and_then(Value::as_str)) {
            return Ok(Found::Unlisted(format!(
                "the card's command schema is {}, not the one this client knows",
                named.unwrap_or_default()
            )));
        }
        let Some(envelope) = b
            .pointer(&format!("/$defs/envelopes/$defs/{}", escape(op)))
            .cloned()
        else {
            return Ok(Found::Unlisted(format!(
                "{op} is on the card but not in this client's command schema"
            )));
        };
        Ok(Found::Builtin {
            bundle: b,
            envelope,
        })
    };
    let extended = card.pointer("/capabilities/extendedAgentCard") == Some(&Value::Bool(true));
    let mut why_unlisted = format!(
        "{op} is not on the public card (a workflow's command is listed on the extended card"
    );
    if extended {
        match client.call("GetExtendedAgentCard", Map::new()) {
            Ok(xcard) => {
                let xparams = super::declared(&xcard, COMMAND_URI)
                    .and_then(|e| e.get("params").cloned())
                    .unwrap_or_default();
                if let Some(schema) = command_schema(&xparams) {
                    return Ok(Found::Workflow { schema });
                }
                if lists_op(&xparams) {
                    return builtin(&xparams);
                }
                let mut may: Vec<String> = xparams
                    .get("ops")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .chain(
                        xparams
                            .get("commands")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten(),
                    )
                    .filter_map(|o| o.get("op").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect();
                may.sort();
                return Err(Failure::Usage(format!(
                    "{op} is not an op this caller may run here; the extended card lists: {}",
                    if may.is_empty() {
                        "none".to_owned()
                    } else {
                        may.join(", ")
                    }
                )));
            }
            Err(e) => why_unlisted.push_str(&format!(", which could not be read: {e})")),
        }
    } else {
        why_unlisted.push_str(", which this server does not serve to this caller)");
    }
    if lists_op(&params) {
        return builtin(&params);
    }
    Ok(Found::Unlisted(why_unlisted))
}
