//! CI builds and runs the embedder (`cargo test --workspace`, so `scripts/test.sh` and
//! `.ci/run`): it is started as a process on a loopback port, asked for its card, sent a
//! message and a streaming message over real HTTP, checked for its echoes, and stopped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The running embedder; killed and reaped when dropped, whatever the test did.
struct Embedder {
    child: Child,
    addr: String,
}

impl Embedder {
    fn start() -> Embedder {
        let mut child = Command::new(env!("CARGO_BIN_EXE_embed"))
            .arg("127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the embedder");
        let stdout = child.stdout.take().expect("its stdout");
        let mut embedder = Embedder {
            child,
            addr: String::new(),
        };
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("its first line");
        let addr = line.trim().strip_prefix("listening http://");
        embedder.addr = addr
            .and_then(|a| a.strip_suffix('/'))
            .expect(&line)
            .to_owned();
        embedder
    }

    /// One request on its own connection (`Connection: close`): the status line, the
    /// headers and the body, chunked transfer undone.
    fn request(&self, method: &str, path: &str, body: &str) -> (String, String) {
        let mut s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nA2A-Version: 1.0\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer)
            .expect("the whole answer, then the close");
        let answer = String::from_utf8(answer).expect("UTF-8");
        let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        (
            head.to_owned(),
            if chunked {
                unchunk(body)
            } else {
                body.to_owned()
            },
        )
    }
}

impl Drop for Embedder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unchunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

fn send(method: &str, id: u32, text: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"message":{{"role":"ROLE_USER","messageId":"m-{id}","parts":[{{"text":"{text}"}}]}}}}}}"#
    )
}

#[test]
fn the_embedder_serves_its_card_and_echoes_turns() {
    let e = Embedder::start();

    let (head, card) = e.request("GET", "/.well-known/agent-card.json", "");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(
        card.contains(&format!("\"url\":\"http://{}/\"", e.addr)),
        "{card}"
    );
    assert!(card.contains("\"protocolBinding\":\"JSONRPC\""), "{card}");

    let (head, body) = e.request("POST", "/", &send("SendMessage", 1, "hello embed"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(
        body.contains("\"state\":\"TASK_STATE_COMPLETED\""),
        "{body}"
    );
    assert!(body.contains("\"text\":\"echo: hello embed\""), "{body}");

    let stream = send("SendStreamingMessage", 2, "hello stream");
    let (head, events) = e.request("POST", "/", &stream);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    let data: Vec<&str> = events.lines().filter(|l| l.starts_with("data: ")).collect();
    assert!(data.len() >= 2, "a task, then its completion: {events}");
    let last = data.last().unwrap();
    assert!(
        last.contains("\"state\":\"TASK_STATE_COMPLETED\""),
        "{events}"
    );
    assert!(
        events.contains("\"text\":\"echo: hello stream\""),
        "{events}"
    );
}

/// README.md, docs/architecture.md and the core's crate docs promise a whole embedder in
/// under 100 lines: this is the one.
#[test]
fn the_embedder_is_under_100_lines() {
    let source = include_str!("../src/main.rs");
    let lines = source.lines().count();
    assert!(lines < 100, "examples/embed/src/main.rs has {lines} lines");
}
