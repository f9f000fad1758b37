//! The floor under bench/turn_cpu.py's ratio: a server that does nothing but the system
//! calls a turn needs (std only; turn_cpu.py `--floor` compiles it with `rustc -O`).
//!
//! One thread, blocking I/O, one keep-alive connection at a time, no parsing beyond the
//! request's length, no state. Without an agent every request is answered at once with a
//! fixed REJECTED task. With one (`--agent CMD...`, the same echo agent) each request writes
//! one `turn` line to the agent's stdin and reads its lines until the `reply` before it
//! answers. `SendStreamingMessage` is answered as the daemon answers it: the headers and a
//! first event at once, an event per batch of the agent's lines as they come, the last with
//! the chunked terminator. Whatever a daemon adds to a turn, it cannot do with less kernel
//! work than this: the difference between this server's two modes is what talking to a
//! second process costs on the machine, before any daemon's own work.
//!
//! Prints `listening http://127.0.0.1:PORT/` when ready; runs until killed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub const TASK: &str = r#"{"id":"00000000-0000-4000-8000-000000000000","contextId":"00000000-0000-4000-8000-000000000001","status":{"state":"TASK_STATE_REJECTED","timestamp":"2026-01-01T00:00:00.000Z"},"history":[{"role":"ROLE_USER","messageId":"m","parts":[{"text":"hello"}]}]}"#;

/// The agent process; `R` is how its stdout is read.
pub struct Agent<R> {
    _child: Child,
    /// Written blocking, as the daemon does: a turn line always fits the pipe.
    stdin: ChildStdin,
    pub stdout: R,
    turns: u64,
}

impl<R> Agent<R> {
    /// Starts the agent `cmd` names, its stdin and stdout piped, `wrap` its stdout.
    pub fn spawn(cmd: &[String], wrap: impl FnOnce(ChildStdout) -> R) -> Self {
        let mut child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the agent");
        Agent {
            stdin: child.stdin.take().unwrap(),
            stdout: wrap(child.stdout.take().unwrap()),
            _child: child,
            turns: 0,
        }
    }

    /// Writes the next turn's line.
    pub fn start_turn(&mut self) {
        self.turns += 1;
        self.stdin
            .write_all(turn_line(self.turns).as_bytes())
            .expect("write to the agent");
    }
}

impl Agent<BufReader<ChildStdout>> {
    /// Sends one turn; `on_lines` gets each batch of whole lines as it is read, and the
    /// call returns after the batch that holds the `reply`.
    fn turn(&mut self, mut on_lines: impl FnMut(&[u8], bool)) {
        self.start_turn();
        loop {
            let buf = self.stdout.fill_buf().expect("read the agent");
            assert!(!buf.is_empty(), "the agent closed its stdout");
            let whole = match buf.iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => {
                    // Less than a line: read on (rare: the agent writes whole lines).
                    let mut line = Vec::new();
                    self.stdout
                        .read_until(b'\n', &mut line)
                        .expect("read the agent");
                    let done = contains(&line, b"\"reply\"");
                    on_lines(&line, done);
                    if done {
                        return;
                    }
                    continue;
                }
            };
            let done = contains(&buf[..whole], b"\"reply\"");
            on_lines(&buf[..whole], done);
            self.stdout.consume(whole);
            if done {
                return;
            }
        }
    }
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The `turn` line of turn `n`, as the daemon writes it.
fn turn_line(n: u64) -> String {
    format!(
        "{{\"type\":\"turn\",\"task\":\"t-{n}\",\"context\":\"c\",\"text\":\"hello\",\"parts\":[{{\"text\":\"hello\"}}]}}\n"
    )
}

/// Where the first whole request in `buf` ends, and whether it streams; None while it is
/// not all there (or its head is not UTF-8).
pub fn parse_request(buf: &[u8]) -> Option<(usize, bool)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let total = end + 4 + len;
    (buf.len() >= total).then(|| (total, contains(&buf[end..total], b"SendStreamingMessage")))
}

/// One request's head and body from `buf` (refilled from `s`); false at EOF.
fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<bool> {
    loop {
        if let Some((total, streaming)) = parse_request(buf) {
            buf.drain(..total);
            return Some(streaming);
        }
        let mut chunk = [0u8; 16384];
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

pub fn chunk(out: &mut Vec<u8>, event: &str) {
    let frame = format!("data: {{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{event}}}\n\n");
    out.extend_from_slice(format!("{:x}\r\n{frame}\r\n", frame.len()).as_bytes());
}

/// A streaming answer's head and its first event (the task, SUBMITTED).
pub fn stream_head() -> Vec<u8> {
    let mut out =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    chunk(
        &mut out,
        &format!("{{\"task\":{}}}", TASK.replace("REJECTED", "SUBMITTED")),
    );
    out
}

/// The rest of a stream: with no agent, the REJECTED task and the end (`lines` empty,
/// `done`); with one, an event per agent line, and after the `reply` the COMPLETED task and
/// the end.
pub fn stream_events(lines: &[u8], done: bool, agent: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for line in lines.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let line = String::from_utf8_lossy(line);
        chunk(&mut out, &format!("{{\"statusUpdate\":{line}}}"));
    }
    if done {
        let last = final_task(agent);
        chunk(&mut out, &format!("{{\"statusUpdate\":{last}}}"));
        out.extend_from_slice(b"0\r\n\r\n");
    }
    out
}

/// A blocking answer: the task, REJECTED without an agent, COMPLETED with one.
pub fn send_answer(agent: bool) -> Vec<u8> {
    let task = final_task(agent);
    let body = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"task\":{task}}}}}");
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn final_task(agent: bool) -> String {
    if agent {
        TASK.replace("TASK_STATE_REJECTED", "TASK_STATE_COMPLETED")
    } else {
        TASK.to_owned()
    }
}

fn serve(mut s: TcpStream, agent: &mut Option<Agent<BufReader<ChildStdout>>>) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    while let Some(streaming) = read_request(&mut s, &mut buf) {
        let ok = if streaming {
            let mut ok = s.write_all(&stream_head()).is_ok();
            match agent {
                None => ok &= s.write_all(&stream_events(b"", true, false)).is_ok(),
                Some(a) => a.turn(|lines, done| {
                    ok &= s.write_all(&stream_events(lines, done, true)).is_ok();
                }),
            }
            ok
        } else {
            if let Some(a) = agent {
                a.turn(|_, _| {});
            }
            s.write_all(&send_answer(agent.is_some())).is_ok()
        };
        if !ok {
            return;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut agent = match args.first().map(String::as_str) {
        Some("--agent") if args.len() > 1 => Some(Agent::spawn(&args[1..], |out| {
            BufReader::with_capacity(1 << 16, out)
        })),
        None => None,
        _ => {
            eprintln!("usage: turn_floor [--agent CMD [ARGS...]]");
            std::process::exit(2);
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    println!("listening http://{}/", listener.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    for s in listener.incoming().flatten() {
        serve(s, &mut agent);
    }
}
