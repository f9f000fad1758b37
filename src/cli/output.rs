//! Human output: tasks, messages and tables, with colour when stdout is a terminal and
//! `NO_COLOR` is unset. `--json` bypasses all of it.

use std::io::{IsTerminal, Write};

use serde_json::Value;

/// Writes to stdout; a closed stdout (`| head`) is not an error worth a panic.
pub fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// One line on stdout.
pub fn line(text: &str) {
    say(&format!("{text}\n"));
}

/// A JSON value as one line (`--json`).
pub fn json_line(v: &Value) {
    line(&serde_json::to_string(v).unwrap_or_default());
}

/// A JSON value, indented (`--json` for one document).
pub fn json_pretty(v: &Value) {
    line(&serde_json::to_string_pretty(v).unwrap_or_default());
}

#[derive(Clone, Copy, Debug)]
pub struct Style {
    color: bool,
}

impl Style {
    pub fn detect() -> Style {
        Style {
            color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    /// For what goes to stderr (prompts, notes).
    pub fn detect_stderr() -> Style {
        Style {
            color: std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }

    pub fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }

    /// A task state as people read it (`completed`, `input-required`), coloured by kind.
    pub fn state(&self, state: &str) -> String {
        let short = state_word(state);
        let code = match short.as_str() {
            "completed" => "32",
            "failed" | "rejected" => "31",
            "canceled" => "33",
            "input-required" | "auth-required" => "35",
            _ => "36",
        };
        self.paint(code, &short)
    }
}

/// `TASK_STATE_INPUT_REQUIRED` as `input-required`.
pub fn state_word(state: &str) -> String {
    state
        .strip_prefix("TASK_STATE_")
        .unwrap_or(state)
        .to_ascii_lowercase()
        .replace('_', "-")
}

/// A state as the wire spells it, from `completed`, `input-required` or the wire form.
pub fn state_wire(word: &str) -> String {
    let up = word.trim().to_ascii_uppercase().replace('-', "_");
    if up.starts_with("TASK_STATE_") {
        up
    } else {
        format!("TASK_STATE_{up}")
    }
}

/// Whether a stream ends at this state: terminal or interrupted.
pub fn ends_a_turn(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_CANCELED"
            | "TASK_STATE_REJECTED"
            | "TASK_STATE_INPUT_REQUIRED"
            | "TASK_STATE_AUTH_REQUIRED"
    )
}

pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(next) => cur = next,
            None => return "",
        }
    }
    cur.as_str().unwrap_or_default()
}

/// The parts of a message or artifact as text: text parts as they are, data parts as
/// compact JSON, files and urls by name.
pub fn parts_text(parts: Option<&Value>) -> String {
    let mut out: Vec<String> = Vec::new();
    for p in parts.and_then(Value::as_array).into_iter().flatten() {
        if let Some(t) = p.get("text").and_then(Value::as_str) {
            out.push(t.to_owned());
        } else if let Some(d) = p.get("data") {
            out.push(serde_json::to_string(d).unwrap_or_default());
        } else if p.get("raw").is_some() || p.get("url").is_some() || p.get("file").is_some() {
            let name = str_at(p, &["filename"]);
            let url = str_at(p, &["url"]);
            out.push(format!(
                "[file {}]",
                if name.is_empty() { url } else { name }
            ));
        }
    }
    out.join("\n")
}

/// A message's role as a word (`user`, `agent`).
pub fn role_word(m: &Value) -> String {
    let role = str_at(m, &["role"]);
    role.strip_prefix("ROLE_")
        .unwrap_or(role)
        .to_ascii_lowercase()
}

/// A task: its id, context and state, the status message, the artifacts, and the history
/// when asked for.
pub fn task(style: Style, t: &Value, with_history: bool) {
    let label = |name: &str| style.dim(&format!("{name:<9}"));
    line(&format!(
        "{}{}",
        label("task"),
        style.bold(str_at(t, &["id"]))
    ));
    let ctx = str_at(t, &["contextId"]);
    if !ctx.is_empty() {
        line(&format!("{}{ctx}", label("context")));
    }
    line(&format!(
        "{}{}",
        label("state"),
        style.state(str_at(t, &["status", "state"]))
    ));
    let msg = parts_text(t.pointer("/status/message/parts"));
    if !msg.is_empty() {
        line(&format!("{}{}", label("message"), indent(&msg)));
    }
    for a in t
        .get("artifacts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        artifact(style, a, false);
    }
    if with_history {
        let history = t.get("history").and_then(Value::as_array);
        if let Some(h) = history.filter(|h| !h.is_empty()) {
            line(&style.dim("history"));
            for m in h {
                line(&format!(
                    "  {}: {}",
                    role_word(m),
                    indent(&parts_text(m.get("parts")))
                ));
            }
        }
    }
}

/// One artifact (or a piece of it, appended to what came before).
pub fn artifact(style: Style, a: &Value, more: bool) {
    let mut name = str_at(a, &["name"]).to_owned();
    if name.is_empty() {
        name = str_at(a, &["artifactId"]).to_owned();
    }
    let label = if more { "artifact+" } else { "artifact" };
    line(&format!(
        "{}{}: {}",
        style.dim(&format!("{label:<9}")),
        name,
        indent(&parts_text(a.get("parts")))
    ));
}

/// A message that answers without a task.
pub fn message(style: Style, m: &Value) {
    line(&format!(
        "{}{}",
        style.dim(&format!("{:<9}", role_word(m))),
        indent(&parts_text(m.get("parts")))
    ));
}

/// Continuation lines under a label.
fn indent(text: &str) -> String {
    text.replace('\n', "\n         ")
}

/// Columns padded to their widest cell (the last one is not padded).
pub fn table(style: Style, header: &[&str], rows: &[Vec<String>], colored: Option<usize>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let render = |cells: &[String], head: bool| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let last = i + 1 == cells.len();
            let pad = if last {
                0
            } else {
                widths[i].saturating_sub(c.chars().count()) + 2
            };
            let shown = if head {
                style.bold(c)
            } else if Some(i) == colored {
                style.state(&state_wire(c))
            } else {
                c.clone()
            };
            s.push_str(&shown);
            s.push_str(&" ".repeat(pad));
        }
        s
    };
    let head: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    line(&render(&head, true));
    for r in rows {
        line(&render(r, false));
    }
}

/// The first line of a text, cut to `max` characters.
pub fn first_line(text: &str, max: usize) -> String {
    let l = text.lines().next().unwrap_or_default();
    if l.chars().count() > max {
        let cut: String = l.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        l.to_owned()
    }
}

/// Runs `work` while a progress line on stderr (a terminal only, and not with `--json`)
/// says how long the answer has been awaited; the line is cleared before `work` returns.
pub fn with_progress<T>(what: &str, json: bool, work: impl FnOnce() -> T) -> T {
    if json || !std::io::stderr().is_terminal() {
        return work();
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            const FRAMES: [char; 4] = ['|', '/', '-', '\\'];
            let mut n = 0usize;
            // Nothing for the first moment: a quick answer draws no line at all.
            let mut drawn = false;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let waited = start.elapsed();
                if waited >= std::time::Duration::from_millis(300) {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(
                        err,
                        "\r{} {what} {}s",
                        FRAMES[n % FRAMES.len()],
                        waited.as_secs()
                    );
                    let _ = err.flush();
                    drawn = true;
                    n += 1;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            if drawn {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
            }
        });
        let r = work();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    })
}
