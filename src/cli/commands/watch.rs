//! `agentd watch URL`: agentd's events feed (`agentd.events/SubscribeToEvents`), live, one
//! line per event; after a drop it resumes from the last `seq` it printed, and says on stderr
//! when the feed answers that events were missed (`resync`).

use std::time::Duration;

use agentd_core::ext::registry::EVENTS_METHOD;
use agentd_core::ext::EVENTS_URI;
use serde_json::{Map, Value};

use super::super::args::Parsed;
use super::super::client::{Client, StreamEnd};
use super::super::output::{self, line, str_at, Style};
use super::super::Failure;

const USAGE: &str = "\
Usage: agentd watch URL [--from SEQ] [--json]

Follows agentd's events feed (the events extension, agentd.events/SubscribeToEvents): every
task, run, step, conversation, lifecycle and configuration event the caller may see, one
line each (seq, time, kind, what), from the events the feed still keeps past --from SEQ
(0, the default: all it keeps), then live, until interrupted. --json prints each frame's
result (hello, event, goodbye) as one line.

When the stream drops or ends (the server's stream deadline), it reconnects from the last
seq it printed, so no event is printed twice. When the feed answers that events were
missed (resync: the subscriber fell behind the feed's ring, or the daemon restarted) it
says so on stderr: read the state again (agentd list, agentd run URL status). A server
whose card does not declare the events extension is refused (exit 2).
";

/// Reconnects in a row without any frame between them before giving up.
const MAX_RECONNECTS: u32 = 5;

pub fn watch(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &["--from"], &[])?;
    if super::help(&p, USAGE) {
        return Ok(());
    }
    let [url] = <[String; 1]>::try_from(p.exact(&["URL"])?).unwrap_or_default();
    let common = p.common(&url)?;
    let from = p.number("--from")?;
    let mut client = Client::new(&common)?;
    let card = client.card()?;
    let Some(ext) = super::declared(&card, EVENTS_URI) else {
        return Err(Failure::Usage(format!(
            "{url} does not declare agentd's events extension ({EVENTS_URI}) on its card: \
             it has no events feed"
        )));
    };
    let method = ext
        .pointer("/params/method")
        .and_then(Value::as_str)
        .unwrap_or(EVENTS_METHOD)
        .to_owned();
    let mut w = Watcher {
        json: common.json,
        style: Style::detect(),
        last: from,
        asked_from: None,
        frames: 0,
        goodbye: None,
    };
    let mut attempts = 0u32;
    loop {
        let mut params = Map::new();
        let cursor = w.last.unwrap_or(0);
        params.insert("fromSeq".into(), Value::from(cursor));
        w.asked_from = w.last;
        w.goodbye = None;
        let before = w.frames;
        let end =
            client.stream_ext(&method, params, None, &[EVENTS_URI], |v, _| Ok(w.frame(&v)))?;
        let why = match (&w.goodbye, end) {
            (Some(reason), _) if reason == "revoked" => {
                return Err(Failure::Connect(
                    "the server ended the feed: the credential was revoked".into(),
                ))
            }
            (Some(reason), _) => format!("the server said goodbye ({reason})"),
            (None, StreamEnd::Finished) => return Ok(()),
            (None, StreamEnd::Closed) => "the server closed the stream".to_owned(),
            (None, StreamEnd::Dropped(why)) => why,
        };
        if w.frames > before {
            attempts = 0;
        }
        attempts += 1;
        if attempts > MAX_RECONNECTS {
            return Err(Failure::Connect(format!(
                "the feed dropped and {MAX_RECONNECTS} reconnects failed: {why}"
            )));
        }
        match w.last {
            Some(seq) => eprintln!("agentd watch: {why}; reconnecting from seq {seq}"),
            None => eprintln!("agentd watch: {why}; reconnecting"),
        }
        // A stream that ended by plan (a goodbye) resumes at once; a broken one after a pause.
        if w.goodbye.is_none() {
            std::thread::sleep(Duration::from_millis(200 * u64::from(attempts)));
        }
    }
}

struct Watcher {
    json: bool,
    style: Style,
    /// The newest seq printed: the cursor of a reconnect.
    last: Option<u64>,
    /// The cursor this stream asked for (none: the first, without --from).
    asked_from: Option<u64>,
    frames: u64,
    /// The reason of the stream's `goodbye`, once one came.
    goodbye: Option<String>,
}

impl Watcher {
    /// One frame's result; false once the stream has said goodbye.
    fn frame(&mut self, v: &Value) -> bool {
        self.frames += 1;
        if let Some(h) = v.get("hello") {
            if self.json {
                output::json_line(v);
            }
            if h.get("resync").and_then(Value::as_bool) == Some(true) {
                let from = self.asked_from.unwrap_or(0);
                eprintln!(
                    "agentd watch: resync: the feed no longer holds every event after seq {from} \
                     (the watcher fell behind its ring, or the daemon restarted), so some were \
                     missed; read the state again (agentd list, agentd run URL status)"
                );
                // The feed's numbers may have started over: take what it sends from here.
                self.last = None;
            }
            return true;
        }
        if let Some(g) = v.get("goodbye") {
            if self.json {
                output::json_line(v);
            }
            self.goodbye = Some(
                g.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason")
                    .to_owned(),
            );
            return false;
        }
        let Some(e) = v.get("event") else {
            if self.json {
                output::json_line(v);
            }
            return true;
        };
        let seq = e.get("seq").and_then(Value::as_u64).unwrap_or(0);
        // A replay after a reconnect never prints an event twice.
        if self.last.is_some_and(|l| seq <= l) {
            return true;
        }
        self.last = Some(seq);
        if self.json {
            output::json_line(v);
        } else {
            line(&self.human(e, seq));
        }
        true
    }

    fn human(&self, e: &Value, seq: u64) -> String {
        let kind = str_at(e, &["kind"]);
        let ts = e.get("ts").and_then(Value::as_u64).unwrap_or(0);
        let data = e.get("data").cloned().unwrap_or_default();
        format!(
            "{}  {}  {}  {}",
            self.style.dim(&format!("{seq:>6}")),
            self.style.dim(&clock(ts)),
            self.style.bold(&format!("{kind:<12}")),
            summary(self.style, kind, &data)
        )
    }
}

/// `HH:MM:SS.mmm` (UTC) of epoch milliseconds.
fn clock(ms: u64) -> String {
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}

/// What an event says, in a line: the task, run or step and its state; else its data.
fn summary(style: Style, kind: &str, data: &Value) -> String {
    let pick = |keys: &[&str]| -> Vec<String> {
        keys.iter()
            .filter_map(|k| match data.get(*k) {
                Some(Value::String(s)) if !s.is_empty() => Some(format!("{k} {s}")),
                _ => None,
            })
            .collect()
    };
    match kind {
        "task" => {
            let t = data.get("task").unwrap_or(data);
            let mut s = format!(
                "{} {}",
                str_at(t, &["id"]),
                style.state(str_at(t, &["status", "state"]))
            );
            let msg = output::parts_text(t.pointer("/status/message/parts"));
            if !msg.is_empty() {
                s.push_str(&format!("  {}", output::first_line(&msg, 80)));
            }
            s
        }
        "run" => {
            let mut s = format!(
                "{} {} {}",
                str_at(data, &["id"]),
                str_at(data, &["workflow"]),
                str_at(data, &["status"])
            );
            let err = str_at(data, &["error"]);
            if !err.is_empty() {
                s.push_str(&format!("  {}", output::first_line(err, 80)));
            }
            s
        }
        "conversation" => {
            let n = |k: &str| data.get(k).and_then(Value::as_u64).unwrap_or(0);
            format!(
                "{}  {} turn(s), {} message(s)",
                str_at(data, &["id"]),
                n("turns"),
                n("messages")
            )
        }
        "step" => {
            let mut state = str_at(data, &["status"]);
            if state.is_empty() {
                state = str_at(data, &["phase"]);
            }
            format!(
                "{} {} {state}",
                str_at(data, &["run"]),
                str_at(data, &["step"])
            )
        }
        _ => {
            let named = pick(&["id", "handle", "run", "state", "status", "reason"]);
            if named.is_empty() {
                output::first_line(&serde_json::to_string(data).unwrap_or_default(), 100)
            } else {
                named.join("  ")
            }
        }
    }
}
