//! The client subcommands of the `agentd` binary (`agentd card|send|get|list|cancel|
//! subscribe|run|answer|watch|probe|login|logout URL ...`): an ordinary A2A 1.0 client of
//! any server, agentd or not. It speaks through the daemon's own peer client, so it reaches
//! what the daemon's peer calls reach: `http://` on loopback, `https://` (mutual TLS with
//! `--cert`/`--key`), unix sockets (`unix:///path`), a bearer token. Human output by
//! default, `--json` for scripts.
//!
//! It sends `A2A-Version: 1.0` on every call, reads the card before the first call (for the
//! interface's tenant and whether the server streams). The core-method subcommands activate
//! no extension; `run` activates agentd's command extension, `answer` its task annotations
//! and `watch` its events feed, each only when the card declares it. `login`/`logout` speak
//! the OAuth device grant (RFC 8628) and keep the token per origin (`credentials`). See
//! docs/client.md.

mod args;
mod client;
mod commands;
mod credentials;
mod output;
mod schema;

use std::fmt;
use std::process::ExitCode;

use agentd::runtime::peer::PeerError;
use serde_json::Value;

/// The subcommand names: `agentd NAME ...` with one of these first is the client.
pub const SUBCOMMANDS: &[&str] = &[
    "card",
    "send",
    "get",
    "list",
    "cancel",
    "subscribe",
    "run",
    "answer",
    "watch",
    "probe",
    "login",
    "logout",
    "help",
];

pub const HELP: &str = "\
Client subcommands (an A2A 1.0 client of any server; see docs/client.md):
  agentd card URL                 the agent card: name, interfaces, skills, extensions
  agentd send URL [TEXT]          send a message (streams; --no-stream waits for the answer)
         [--no-stream] [--task ID] [--context ID] [--data JSON] [--file PATH]
  agentd get URL TASK [--history N]
                                  one task, with its newest N history messages
  agentd list URL [--context ID] [--state STATE] [--page-size N] [--page-token TOKEN]
                                  the caller's tasks, newest first, a page at a time
  agentd cancel URL TASK          cancel a task
  agentd subscribe URL TASK       follow a task's stream to its end (reconnects after a drop)
  agentd run URL OP [--arg NAME=VALUE ...] [--args JSON]
                                  run an op of agentd's command extension, its arguments
                                  checked against the op's schema first
  agentd answer URL TASK [--answer JSON | --field NAME=VALUE ...]
                                  answer a task waiting for input (asks field by field
                                  on a terminal), checked against its askSchema
  agentd watch URL [--from SEQ]   agentd's events feed, live, one line per event (resumes
                                  from the last seq after a drop; says when it resynced)
  agentd probe URL                check any A2A 1.0 server against the specification: its
                                  card, the core methods and their refusals, streaming,
                                  A2A-Version (a table of checks; exit 1 if one fails)
  agentd login URL [--client-id NAME] [--scope user|operator]
                                  sign in by the device grant; the token is kept per origin
  agentd logout URL               revoke and forget the kept token

  URL is http://127.0.0.1:PORT[/path] (plain http on loopback only),
  https://HOST[:PORT][/path] or unix:///PATH.
  Every subcommand takes --json (the server's JSON: one document, or one line per
  stream event), --bearer TOKEN (else $AGENTD_TOKEN, else the token `agentd login`
  kept for the URL's origin), --timeout SECS, --ca FILE and
  --cert FILE --key FILE (mutual TLS).
  Exit status: 0 done, 1 the server refused (a JSON-RPC error), 2 usage, 3 connection
  (cannot connect, dropped, timed out), 4 the server's answer is not valid A2A.
";

/// Why a subcommand did not do its work; each kind has its exit status.
#[derive(Debug)]
pub enum Failure {
    /// Bad arguments (exit 2).
    Usage(String),
    /// The server refused outside JSON-RPC, e.g. an OAuth error (exit 1).
    Refused(String),
    /// The server answered a JSON-RPC error (exit 1).
    Rpc {
        code: i64,
        reason: Option<String>,
        message: String,
    },
    /// The server could not be reached, the connection broke, or the time ran out (exit 3).
    Connect(String),
    /// The server's answer is not what A2A says it is (exit 4).
    BadAnswer(String),
    /// `probe`: this many checks failed (exit 1).
    Probe(usize),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Rpc { .. } | Failure::Refused(_) | Failure::Probe(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Connect(_) => 3,
            Failure::BadAnswer(_) => 4,
        }
    }

    /// A JSON-RPC error object: its code, its `ErrorInfo` reason if any, its message.
    pub fn rpc(e: &Value) -> Failure {
        let reason = e
            .get("data")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|d| d.get("reason").and_then(Value::as_str))
            .map(str::to_owned);
        Failure::Rpc {
            code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
            reason,
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(why) | Failure::Refused(why) => f.write_str(why),
            Failure::Rpc {
                code,
                reason,
                message,
            } => {
                write!(f, "error {code}")?;
                if let Some(r) = reason {
                    write!(f, " {r}")?;
                }
                write!(f, ": {message}")
            }
            Failure::Connect(why) => f.write_str(why),
            Failure::BadAnswer(why) => write!(f, "bad answer: {why}"),
            Failure::Probe(n) => write!(f, "{n} check(s) failed"),
        }
    }
}

impl From<PeerError> for Failure {
    fn from(e: PeerError) -> Self {
        match e {
            PeerError::Rpc {
                code,
                message,
                data,
            } => Failure::rpc(&serde_json::json!({"code": code, "message": message, "data": data})),
            PeerError::Config(why) => Failure::Usage(why),
            PeerError::Connect { .. } | PeerError::Io(_) => Failure::Connect(e.to_string()),
            PeerError::Timeout { .. } => Failure::Connect("timed out (see --timeout)".into()),
            PeerError::Canceled { .. } => Failure::Connect(e.to_string()),
            PeerError::Http { .. }
            | PeerError::Protocol(_)
            | PeerError::Card(_)
            | PeerError::TaskFailed(_) => Failure::BadAnswer(e.to_string()),
        }
    }
}

/// Runs the client subcommand `name` with the words after it.
pub fn main(name: &str, words: &[String]) -> ExitCode {
    let r = match name {
        "help" => {
            output::say(HELP);
            Ok(())
        }
        "card" => commands::card(words),
        "send" => commands::send(words),
        "get" => commands::get(words),
        "list" => commands::list(words),
        "cancel" => commands::cancel(words),
        "subscribe" => commands::subscribe(words),
        "run" => commands::run(words),
        "answer" => commands::answer(words),
        "watch" => commands::watch(words),
        "probe" => commands::probe(words),
        "login" => commands::login(words),
        "logout" => commands::logout(words),
        other => Err(Failure::Usage(format!("no subcommand {other:?}"))),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            let hint = if matches!(f, Failure::Usage(_)) {
                format!("; see agentd {name} --help")
            } else {
                String::new()
            };
            eprintln!("agentd {name}: {f}{hint}");
            ExitCode::from(f.exit_code())
        }
    }
}
