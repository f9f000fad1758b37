//! `agentd subscribe URL TASK`: SubscribeToTask, and the stream printer the streaming send
//! shares. A dropped stream is resumed with `Last-Event-ID`.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value};

use super::super::args::Parsed;
use super::super::client::{Client, StreamEnd};
use super::super::output::{self, line, str_at, Style};
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd subscribe URL TASK [--json]

Follows a task's stream (SubscribeToTask): its state, status updates and artifacts as
they arrive, to a final state (completed, failed, canceled, rejected) or one that waits
(input-required, auth-required). When the connection drops it reconnects with the last
event id it saw (Last-Event-ID) and says so on stderr. --json prints each event's result
as one line.
";

/// Reconnects in a row without any event between them before giving up.
const MAX_RECONNECTS: u32 = 5;

pub fn subscribe(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &[], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url, task] = <[String; 2]>::try_from(p.exact(&["URL", "TASK"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let mut client = Client::new(&common)?;
    let mut follow = Follower::new(common.json);
    follow.task_id = Some(task);
    follow_task(&mut client, &mut follow, "agentd subscribe")
}

/// Subscribes to `follow.task_id` from `follow.last_id` (none: from a fresh snapshot) until
/// a final state, reconnecting after a drop.
pub(super) fn follow_task(
    client: &mut Client,
    follow: &mut Follower,
    who: &str,
) -> Result<(), Failure> {
    let mut attempts = 0u32;
    loop {
        let task = follow.task_id.clone().unwrap_or_default();
        let mut params = Map::new();
        params.insert("id".into(), Value::String(task));
        let last = follow.last_id.clone();
        let seen_before = follow.events;
        let end = client.stream("SubscribeToTask", params, last.as_deref(), |v, id| {
            Ok(follow.event(&v, id))
        })?;
        let why = match end {
            StreamEnd::Finished => return Ok(()),
            StreamEnd::Closed if follow.done => return Ok(()),
            StreamEnd::Closed => "the server closed the stream before a final state".to_owned(),
            StreamEnd::Dropped(why) => why,
        };
        if follow.events > seen_before {
            attempts = 0;
        }
        attempts += 1;
        if attempts > MAX_RECONNECTS {
            return Err(Failure::Connect(format!(
                "the stream dropped and {MAX_RECONNECTS} reconnects failed: {why}"
            )));
        }
        match &follow.last_id {
            Some(id) => {
                eprintln!("{who}: stream dropped ({why}); reconnecting with Last-Event-ID {id}")
            }
            None => eprintln!("{who}: stream dropped ({why}); reconnecting"),
        }
        std::thread::sleep(Duration::from_millis(200 * u64::from(attempts)));
    }
}

/// Prints a task stream's events as they arrive, and keeps what a reconnect needs.
pub(super) struct Follower {
    json: bool,
    style: Style,
    pub task_id: Option<String>,
    /// The SSE id of the newest frame: a reconnect's `Last-Event-ID`.
    pub last_id: Option<String>,
    /// A final state (or a message answering without a task) was seen.
    pub done: bool,
    pub events: u64,
    header: bool,
    state: String,
    artifacts: HashSet<String>,
}

impl Follower {
    pub fn new(json: bool) -> Follower {
        Follower {
            json,
            style: Style::detect(),
            task_id: None,
            last_id: None,
            done: false,
            events: 0,
            header: false,
            state: String::new(),
            artifacts: HashSet::new(),
        }
    }

    /// One stream result; false once the stream has told all.
    pub fn event(&mut self, v: &Value, id: Option<&str>) -> bool {
        self.events += 1;
        if let Some(id) = id {
            self.last_id = Some(id.to_owned());
        }
        if self.json {
            output::json_line(v);
        }
        if let Some(t) = v.get("task") {
            self.task_id = Some(str_at(t, &["id"]).to_owned());
            self.head(t);
            let msg = output::parts_text(t.pointer("/status/message/parts"));
            self.status(str_at(t, &["status", "state"]), &msg);
            for a in t
                .get("artifacts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let aid = str_at(a, &["artifactId"]).to_owned();
                if self.artifacts.insert(aid) && !self.json {
                    output::artifact(self.style, a, false);
                }
            }
        } else if let Some(s) = v.get("statusUpdate") {
            if self.task_id.is_none() {
                self.task_id = Some(str_at(s, &["taskId"]).to_owned());
            }
            self.head(s);
            let msg = output::parts_text(s.pointer("/status/message/parts"));
            self.status(str_at(s, &["status", "state"]), &msg);
        } else if let Some(a) = v.get("artifactUpdate") {
            if let Some(art) = a.get("artifact") {
                let aid = str_at(art, &["artifactId"]).to_owned();
                let append = a.get("append").and_then(Value::as_bool) == Some(true);
                let fresh = self.artifacts.insert(aid);
                if !self.json {
                    output::artifact(self.style, art, append && !fresh);
                }
            }
        } else if let Some(m) = v.get("message") {
            if !self.json {
                output::message(self.style, m);
            }
            self.done = true;
        }
        !self.done
    }

    fn head(&mut self, t: &Value) {
        if self.header || self.json {
            return;
        }
        self.header = true;
        let id = str_at(t, &["id"]);
        let id = if id.is_empty() {
            str_at(t, &["taskId"])
        } else {
            id
        };
        let mut l = format!("{}{}", self.style.dim("task     "), self.style.bold(id));
        let ctx = str_at(t, &["contextId"]);
        if !ctx.is_empty() {
            l.push_str(&format!("  {}", self.style.dim(&format!("context {ctx}"))));
        }
        line(&l);
    }

    fn status(&mut self, state: &str, msg: &str) {
        if output::ends_a_turn(state) {
            self.done = true;
        }
        if self.json || (state == self.state && msg.is_empty()) {
            return;
        }
        self.state = state.to_owned();
        let mut l = format!("{}{}", self.style.dim("state    "), self.style.state(state));
        if !msg.is_empty() {
            l.push_str(&format!("  {}", msg.replace('\n', "\n         ")));
        }
        line(&l);
    }
}
