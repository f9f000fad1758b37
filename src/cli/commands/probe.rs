//! `agentd probe URL`: checks a server against A2A 1.0 (the JSON-RPC binding): its card, the
//! core methods, the refusals and their codes, streaming when the card says so, and the
//! `A2A-Version` header. A table of checks; exit 0 only when none fails.

use agentd_core::ext::UNIX_BINDING_URI;
use agentd_io_common::OsEntropy;
use serde_json::{json, Map, Value};

use super::super::args::Parsed;
use super::super::client::{Client, StreamEnd};
use super::super::output::{self, line, str_at, Style};
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd probe URL [--json]

Checks any A2A 1.0 server at URL against the specification, and prints a table of checks
(pass, fail or skip, and why):
  card      the well-known card (/.well-known/agent-card.json): served as a JSON object,
            its required fields, its interfaces (a JSONRPC one at protocol version 1.0),
            its capabilities
  methods   SendMessage (blocking: a final or interrupted state), GetTask, ListTasks,
            CancelTask (a finished task: -32002)
  refusals  an unknown task (-32001, GetTask and CancelTask), an unknown method (-32601),
            bad params (-32602: a message without parts, a page size over 100)
  streaming SendStreamingMessage, when the card says the server streams
  version   A2A-Version: an unsupported version (-32009), a missing header (read as 0.3:
            -32009), a patch number (ignored)
It sends two messages (one streamed when the server streams) and cancels nothing that has
not ended. Exit status 0 when every check passes (or is skipped), 1 when one fails; --json
lists the checks as JSON.
";

/// The states a task may be in on the wire.
const STATES: &[&str] = &[
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_AUTH_REQUIRED",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_FAILED",
    "TASK_STATE_REJECTED",
];

const TERMINAL: &[&str] = &[
    "TASK_STATE_COMPLETED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_FAILED",
    "TASK_STATE_REJECTED",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pass,
    Fail,
    Skip,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
        }
    }
}

struct Check {
    id: &'static str,
    outcome: Outcome,
    why: String,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn add(&mut self, id: &'static str, r: Result<String, String>) {
        let (outcome, why) = match r {
            Ok(why) => (Outcome::Pass, why),
            Err(why) => (Outcome::Fail, why),
        };
        self.checks.push(Check { id, outcome, why });
    }

    fn skip(&mut self, id: &'static str, why: impl Into<String>) {
        self.checks.push(Check {
            id,
            outcome: Outcome::Skip,
            why: why.into(),
        });
    }
}

pub fn probe(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &[], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url] = <[String; 1]>::try_from(p.exact(&["URL"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let mut client = Client::new(&common)?;
    let mut r = Report::default();
    let card = match client.card() {
        Ok(c) => {
            r.add(
                "card.served",
                Ok("a JSON object at /.well-known/agent-card.json".into()),
            );
            Some(c)
        }
        // Nothing answers at all: no table to print.
        Err(f @ Failure::Connect(_)) => return Err(f),
        Err(f) => {
            r.add("card.served", Err(f.to_string()));
            None
        }
    };
    let mut streams = false;
    match &card {
        Some(c) => {
            r.add("card.fields", card_fields(c));
            r.add("card.interfaces", card_interfaces(c, &url));
            r.add("card.capabilities", card_capabilities(c));
            streams = c.pointer("/capabilities/streaming") == Some(&Value::Bool(true));
        }
        None => {
            for id in ["card.fields", "card.interfaces", "card.capabilities"] {
                r.skip(id, "no card");
            }
        }
    }
    // The methods go on even without a card: the URL is the endpoint.
    if let Err(f @ Failure::BadAnswer(_)) = client.tenant_of_card() {
        r.add(
            "card.select",
            Err(format!("no interface this client can use: {f}")),
        );
    }
    methods(&mut client, &mut r);
    if streams {
        r.add("stream.send", stream_send(&mut client));
    } else {
        r.skip(
            "stream.send",
            "the card does not say capabilities.streaming",
        );
    }
    versions(&mut client, &mut r);

    let failed = r
        .checks
        .iter()
        .filter(|c| c.outcome == Outcome::Fail)
        .count();
    if common.json {
        let list: Vec<Value> = r
            .checks
            .iter()
            .map(|c| json!({"check": c.id, "result": c.outcome.word(), "reason": c.why}))
            .collect();
        output::json_pretty(&json!({"url": url, "passed": failed == 0, "checks": list}));
    } else {
        let s = Style::detect();
        let rows: Vec<Vec<String>> = r
            .checks
            .iter()
            .map(|c| {
                let word = match c.outcome {
                    Outcome::Pass => s.state("completed").replace("completed", "pass"),
                    Outcome::Fail => s.state("failed").replace("failed", "fail"),
                    Outcome::Skip => s.dim("skip"),
                };
                vec![c.id.to_owned(), word, c.why.clone()]
            })
            .collect();
        output::table(s, &["CHECK", "RESULT", "WHY"], &rows, None);
        let passed = r
            .checks
            .iter()
            .filter(|c| c.outcome == Outcome::Pass)
            .count();
        let skipped = r.checks.len() - passed - failed;
        line(&format!(
            "{passed} passed, {failed} failed, {skipped} skipped"
        ));
    }
    if failed > 0 {
        return Err(Failure::Probe(failed));
    }
    Ok(())
}

fn is_str(v: &Value, k: &str) -> bool {
    v.get(k).is_some_and(Value::is_string)
}

fn str_list(v: &Value, k: &str) -> bool {
    v.get(k)
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().all(Value::is_string))
}

/// The card's required members (A2A 1.0 AgentCard) and their types.
fn card_fields(c: &Value) -> Result<String, String> {
    let mut bad = Vec::new();
    for k in ["name", "description", "version"] {
        if !is_str(c, k) {
            bad.push(format!("{k} (a string)"));
        }
    }
    if !c.get("capabilities").is_some_and(Value::is_object) {
        bad.push("capabilities (an object)".into());
    }
    for k in ["defaultInputModes", "defaultOutputModes"] {
        if !str_list(c, k) {
            bad.push(format!("{k} (a list of media types)"));
        }
    }
    match c.get("skills").and_then(Value::as_array) {
        None => bad.push("skills (a list)".into()),
        Some(skills) => {
            for (i, k) in skills.iter().enumerate() {
                let missing: Vec<&str> = ["id", "name", "description"]
                    .into_iter()
                    .filter(|f| !is_str(k, f))
                    .chain((!str_list(k, "tags")).then_some("tags"))
                    .collect();
                if !missing.is_empty() {
                    bad.push(format!("skills[{i}] without {}", missing.join(", ")));
                }
            }
        }
    }
    if c.get("supportedInterfaces")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        bad.push("supportedInterfaces (a list of at least one)".into());
    }
    if bad.is_empty() {
        Ok(
            "name, description, version, capabilities, input/output modes, skills, interfaces"
                .into(),
        )
    } else {
        Err(format!("missing or mistyped: {}", bad.join("; ")))
    }
}

/// Each interface names its URL, binding and a Major.Minor protocol version; one is JSON-RPC
/// at 1.0 (for a `unix://` URL, agentd's unix-socket binding of JSON-RPC will do).
fn card_interfaces(c: &Value, url: &str) -> Result<String, String> {
    let list = c
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if list.is_empty() {
        return Err("no supportedInterfaces".into());
    }
    let mut bad = Vec::new();
    for (i, f) in list.iter().enumerate() {
        for k in ["url", "protocolBinding", "protocolVersion"] {
            if !is_str(f, k) {
                bad.push(format!("[{i}] has no {k}"));
            }
        }
        let v = str_at(f, &["protocolVersion"]);
        let major_minor = v.split_once('.').is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        });
        if !v.is_empty() && !major_minor {
            bad.push(format!("[{i}] protocolVersion {v:?} is not Major.Minor"));
        }
    }
    if !bad.is_empty() {
        return Err(bad.join("; "));
    }
    let unix = url.starts_with("unix:");
    let usable = |b: &str| b == "JSONRPC" || (unix && b == UNIX_BINDING_URI);
    let Some(hit) = list.iter().find(|f| {
        usable(str_at(f, &["protocolBinding"])) && str_at(f, &["protocolVersion"]) == "1.0"
    }) else {
        return Err(if unix {
            format!("no JSONRPC (or {UNIX_BINDING_URI}) interface at protocolVersion 1.0")
        } else {
            "no JSONRPC interface at protocolVersion 1.0".into()
        });
    };
    Ok(format!(
        "{} interface(s), {} 1.0 among them",
        list.len(),
        str_at(hit, &["protocolBinding"])
    ))
}

/// The capabilities' flags are booleans; each extension names its URI.
fn card_capabilities(c: &Value) -> Result<String, String> {
    let caps = c.get("capabilities").cloned().unwrap_or_default();
    let mut bad = Vec::new();
    for k in ["streaming", "pushNotifications", "extendedAgentCard"] {
        if caps.get(k).is_some_and(|v| !v.is_boolean()) {
            bad.push(format!("{k} is not a boolean"));
        }
    }
    let exts = caps.get("extensions");
    if exts.is_some_and(|e| !e.is_array()) {
        bad.push("extensions is not a list".into());
    }
    for (i, e) in exts
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if !is_str(e, "uri") {
            bad.push(format!("extensions[{i}] has no uri"));
        }
        if e.get("required").is_some_and(|v| !v.is_boolean()) {
            bad.push(format!("extensions[{i}].required is not a boolean"));
        }
    }
    if bad.is_empty() {
        let on: Vec<&str> = ["streaming", "pushNotifications", "extendedAgentCard"]
            .into_iter()
            .filter(|k| caps.get(*k) == Some(&Value::Bool(true)))
            .collect();
        Ok(if on.is_empty() {
            "well-formed; none on".into()
        } else {
            format!("well-formed; on: {}", on.join(", "))
        })
    } else {
        Err(bad.join("; "))
    }
}

fn message(text: &str) -> Value {
    json!({
        "role": "ROLE_USER",
        "messageId": agentd_core::ids::uuid_v4(&mut OsEntropy),
        "parts": [{"text": text}],
    })
}

fn params(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The task of a send's result (`{"task": …}`), or none for a message reply.
fn task_in(result: &Value) -> Result<Option<Value>, String> {
    if let Some(t) = result.get("task") {
        return Ok(Some(t.clone()));
    }
    if result.get("message").is_some() {
        return Ok(None);
    }
    Err(format!(
        "the result is neither {{\"task\"}} nor {{\"message\"}}: {}",
        output::first_line(&result.to_string(), 120)
    ))
}

/// A task's id and a valid state.
fn task_ok(t: &Value) -> Result<(String, String), String> {
    let id = str_at(t, &["id"]);
    if id.is_empty() {
        return Err("the task has no id".into());
    }
    let state = str_at(t, &["status", "state"]);
    if !STATES.contains(&state) {
        return Err(format!("the task's state {state:?} is not a TaskState"));
    }
    Ok((id.to_owned(), state.to_owned()))
}

/// Expects a JSON-RPC refusal with `code`.
fn refused(r: Result<Value, Failure>, code: i64, name: &str) -> Result<String, String> {
    match r {
        Err(Failure::Rpc {
            code: c, reason, ..
        }) if c == code => Ok(format!(
            "{code} {}",
            reason.unwrap_or_else(|| name.to_owned())
        )),
        Err(Failure::Rpc {
            code: c, message, ..
        }) => Err(format!(
            "answered {c} ({}), not {code} {name}",
            output::first_line(&message, 80)
        )),
        Err(f) => Err(format!("not a JSON-RPC error {code}: {f}")),
        Ok(v) => Err(format!(
            "answered a result, not {code} {name}: {}",
            output::first_line(&v.to_string(), 80)
        )),
    }
}

/// The core methods on a task the probe sends, and the refusals.
fn methods(client: &mut Client, r: &mut Report) {
    let sent = client.call(
        "SendMessage",
        params(json!({"message": message("agentd probe: hello")})),
    );
    let task: Option<(String, String)> = match sent {
        Err(f) => {
            r.add("send.blocking", Err(f.to_string()));
            None
        }
        Ok(v) => match task_in(&v).and_then(|t| t.map(|t| task_ok(&t)).transpose()) {
            Err(why) => {
                r.add("send.blocking", Err(why));
                None
            }
            Ok(None) => {
                r.add(
                    "send.blocking",
                    Ok("answered with a message (no task)".into()),
                );
                None
            }
            Ok(Some((id, state))) => {
                let settled = TERMINAL.contains(&state.as_str())
                    || state == "TASK_STATE_INPUT_REQUIRED"
                    || state == "TASK_STATE_AUTH_REQUIRED";
                r.add(
                    "send.blocking",
                    if settled {
                        Ok(format!("a task, {}", output::state_word(&state)))
                    } else {
                        Err(format!(
                            "a blocking send answered while the task was {}; it returns once \
                             the task is final or interrupted",
                            output::state_word(&state)
                        ))
                    },
                );
                Some((id, state))
            }
        },
    };

    match &task {
        None => r.skip("get.task", "no task to read (the send gave none)"),
        Some((id, state)) => {
            let got = client
                .call("GetTask", params(json!({"id": id})))
                .map_err(|f| f.to_string())
                .and_then(|v| {
                    // A2A 1.0 answers the Task itself; `{"task": …}` is tolerated.
                    let t = v.get("task").cloned().unwrap_or(v);
                    task_ok(&t)
                });
            r.add(
                "get.task",
                got.and_then(|(gid, gstate)| {
                    if &gid != id {
                        Err(format!("asked for {id}, answered {gid}"))
                    } else if &gstate != state {
                        Err(format!(
                            "the task was {} after the send, GetTask says {}",
                            output::state_word(state),
                            output::state_word(&gstate)
                        ))
                    } else {
                        Ok("the same task, in the same state".into())
                    }
                }),
            );
        }
    }

    let listed = client
        .call("ListTasks", Map::new())
        .map_err(|f| f.to_string());
    r.add(
        "list.tasks",
        listed.clone().and_then(|v| {
            let tasks = v
                .get("tasks")
                .and_then(Value::as_array)
                .ok_or("no tasks list")?;
            let mut missing = Vec::new();
            if !is_str(&v, "nextPageToken") {
                missing.push("nextPageToken");
            }
            for k in ["pageSize", "totalSize"] {
                if !v.get(k).is_some_and(Value::is_number) {
                    missing.push(k);
                }
            }
            if !missing.is_empty() {
                return Err(format!("the answer has no {}", missing.join(", ")));
            }
            if let Some((id, _)) = &task {
                if !tasks.iter().any(|t| str_at(t, &["id"]) == id) {
                    return Err(format!("the task just sent ({id}) is not listed"));
                }
            }
            Ok(format!("{} task(s), with paging members", tasks.len()))
        }),
    );
    r.add(
        "list.artifacts-absent",
        listed.and_then(|v| {
            let with: Vec<&str> = v
                .get("tasks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|t| t.get("artifacts").is_some())
                .map(|t| str_at(t, &["id"]))
                .collect();
            if with.is_empty() {
                Ok("no artifacts key without includeArtifacts".into())
            } else {
                Err(format!(
                    "{} task(s) carry artifacts though includeArtifacts was not set",
                    with.len()
                ))
            }
        }),
    );

    match &task {
        Some((id, state)) if TERMINAL.contains(&state.as_str()) => r.add(
            "cancel.ended",
            refused(
                client.call("CancelTask", params(json!({"id": id}))),
                -32002,
                "TaskNotCancelable",
            ),
        ),
        Some((_, state)) => r.skip(
            "cancel.ended",
            format!("the task is {}, not ended", output::state_word(state)),
        ),
        None => r.skip("cancel.ended", "no task"),
    }

    let unknown = format!("agentd-probe-{}", agentd_core::ids::uuid_v4(&mut OsEntropy));
    r.add(
        "error.get-unknown-task",
        refused(
            client.call("GetTask", params(json!({"id": unknown}))),
            -32001,
            "TaskNotFound",
        ),
    );
    r.add(
        "error.cancel-unknown-task",
        refused(
            client.call("CancelTask", params(json!({"id": unknown}))),
            -32001,
            "TaskNotFound",
        ),
    );
    r.add(
        "error.unknown-method",
        refused(
            client.call("agentd.probe/NoSuchMethod", Map::new()),
            -32601,
            "MethodNotFound",
        ),
    );
    let mut empty = message("x");
    empty["parts"] = json!([]);
    r.add(
        "error.params-no-parts",
        refused(
            client.call("SendMessage", params(json!({"message": empty}))),
            -32602,
            "InvalidParams",
        ),
    );
    r.add(
        "error.params-page-size",
        refused(
            client.call("ListTasks", params(json!({"pageSize": 1000}))),
            -32602,
            "InvalidParams",
        ),
    );
}

/// A streamed send: every frame a JSON-RPC result of one of the four stream kinds, the
/// last a final or interrupted state (or a message).
fn stream_send(client: &mut Client) -> Result<String, String> {
    let mut frames = 0usize;
    let mut last_state = String::new();
    let mut bad: Option<String> = None;
    let mut ended = false;
    let end = client
        .stream(
            "SendStreamingMessage",
            params(json!({"message": message("agentd probe: streamed")})),
            None,
            |v, _| {
                frames += 1;
                let state = if let Some(t) = v.get("task") {
                    str_at(t, &["status", "state"]).to_owned()
                } else if let Some(s) = v.get("statusUpdate") {
                    str_at(s, &["status", "state"]).to_owned()
                } else if v.get("artifactUpdate").is_some() {
                    String::new()
                } else if v.get("message").is_some() {
                    ended = true;
                    return Ok(false);
                } else {
                    bad = Some(format!(
                        "frame {frames} is none of task, statusUpdate, artifactUpdate, message: {}",
                        output::first_line(&v.to_string(), 100)
                    ));
                    return Ok(false);
                };
                if !state.is_empty() {
                    if !STATES.contains(&state.as_str()) {
                        bad = Some(format!("frame {frames}: {state:?} is not a TaskState"));
                        return Ok(false);
                    }
                    last_state = state;
                    if output::ends_a_turn(&last_state) {
                        ended = true;
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
        .map_err(|f| f.to_string())?;
    if let Some(b) = bad {
        return Err(b);
    }
    match end {
        StreamEnd::Dropped(why) => Err(format!("the stream broke after {frames} frame(s): {why}")),
        _ if ended => Ok(format!(
            "{frames} frame(s), ending {}",
            if last_state.is_empty() {
                "with a message".to_owned()
            } else {
                output::state_word(&last_state)
            }
        )),
        _ => Err(format!(
            "the stream closed after {frames} frame(s) before a final or interrupted state"
        )),
    }
}

/// `A2A-Version`: what a server does with another version, none, and a patch number.
fn versions(client: &mut Client, r: &mut Report) {
    let tenant = client.tenant_of_card().ok().flatten();
    let doc = |id: u64| {
        let mut p = json!({"id": format!("agentd-probe-{id}")});
        if let Some(t) = &tenant {
            p["tenant"] = Value::from(t.as_str());
        }
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": "GetTask", "params": p}))
            .unwrap_or_default()
    };
    let ask = |client: &mut Client, version: Option<&str>, id: u64| {
        let mut h = vec![
            ("Content-Type", "application/json"),
            ("Accept", "application/json"),
        ];
        if let Some(v) = version {
            h.push(("A2A-Version", v));
        }
        let (status, body) = client.raw_post(&h, doc(id))?;
        let v = serde_json::from_slice::<Value>(&body)
            .map_err(|_| Failure::BadAnswer(format!("HTTP {status}: the answer is not JSON")))?;
        super::super::client::result_of(v, Some(id), status)
    };
    r.add(
        "version.unsupported",
        refused(
            ask(client, Some("99.0"), 901),
            -32009,
            "VersionNotSupported",
        ),
    );
    r.add(
        "version.missing",
        refused(ask(client, None, 902), -32009, "VersionNotSupported")
            .map(|ok| format!("{ok} (a request without A2A-Version is 0.3)")),
    );
    // A patch number is ignored: the request is served, so the unknown task is -32001.
    r.add(
        "version.patch-ignored",
        refused(ask(client, Some("1.0.7"), 903), -32001, "TaskNotFound")
            .map(|_| "1.0.7 is served as 1.0".into()),
    );
}
