//! SSE reconnection of task streams on the real binary, over real sockets: a stream dropped
//! midway is resumed with `Last-Event-ID` and gets exactly the events it missed, then the
//! live ones; a resume after the task finished replays the rest and closes. The agent
//! (`tests/agents/paced.py`) waits on gate files, so the test picks where to drop.

mod common;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{task_state, Daemon, Setup, DRIVERS, READ_TIMEOUT};
use serde_json::{json, Value};

/// One SSE frame: its `id:` and its `data:` JSON.
type Frame = (Option<String>, Value);

/// A task stream read frame by frame off one connection.
struct Stream {
    sock: TcpStream,
    buf: Vec<u8>,
    /// De-chunked SSE text not yet split into events.
    sse: Vec<u8>,
    status: u16,
    content_type: String,
    content_length: usize,
    ended: bool,
}

impl Stream {
    /// Posts a request and reads the response head.
    fn open(d: &Daemon, method: &str, params: Value, last_event_id: Option<&str>) -> Stream {
        let sock = TcpStream::connect(d.tcp).expect("connect");
        sock.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let body = json!({"jsonrpc":"2.0","id":1,"method":method,"params":params}).to_string();
        let resume = last_event_id
            .map(|i| format!("Last-Event-ID: {i}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n{resume}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut s = Stream {
            sock,
            buf: Vec::new(),
            sse: Vec::new(),
            status: 0,
            content_type: String::new(),
            content_length: 0,
            ended: false,
        };
        s.sock.write_all(req.as_bytes()).unwrap();
        let head = s.line();
        s.status = head[9..12].parse().unwrap();
        loop {
            let l = s.line();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').unwrap();
            if n.eq_ignore_ascii_case("content-type") {
                s.content_type = v.trim().to_owned();
            } else if n.eq_ignore_ascii_case("content-length") {
                s.content_length = v.trim().parse().unwrap();
            }
        }
        s
    }

    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16 * 1024];
        match self.sock.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                n
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => 0,
            Err(e) => panic!(
                "nothing arrived within {READ_TIMEOUT:?} ({e}); buffered {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l: Vec<u8> = self.buf.drain(..i + 2).take(i).collect();
                return String::from_utf8(l).unwrap();
            }
            assert!(self.fill() > 0, "the connection closed mid-line");
        }
    }

    /// The next frame; `None` when the chunked stream ended.
    fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(i) = self.sse.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.sse.drain(..i + 2).take(i).collect();
                let block = String::from_utf8(block).unwrap();
                let mut id = None;
                let mut data = None;
                for l in block.lines() {
                    if let Some(v) = l.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    } else if let Some(v) = l.strip_prefix("data: ") {
                        data = Some(serde_json::from_str(v).expect("data is JSON"));
                    }
                }
                match data {
                    Some(d) => return Some((id, d)),
                    None => continue, // a keep-alive comment
                }
            }
            if self.ended {
                return None;
            }
            let size = usize::from_str_radix(&self.line(), 16).expect("a chunk size");
            if size == 0 {
                assert_eq!(self.line(), "", "the last chunk has no trailers");
                self.ended = true;
                continue;
            }
            while self.buf.len() < size + 2 {
                assert!(self.fill() > 0, "the connection closed mid-chunk");
            }
            self.sse.extend(self.buf.drain(..size));
            assert_eq!(self.buf.drain(..2).collect::<Vec<u8>>(), b"\r\n");
        }
    }

    /// Every remaining frame, up to the stream's end.
    fn rest(&mut self) -> Vec<Frame> {
        std::iter::from_fn(|| self.next()).collect()
    }

    /// A plain (not streamed) answer's JSON body.
    fn json(mut self) -> Value {
        while self.buf.len() < self.content_length {
            assert!(self.fill() > 0, "the connection closed mid-body");
        }
        serde_json::from_slice(&self.buf[..self.content_length]).expect("a JSON body")
    }

    /// The client drops the connection.
    fn drop_connection(self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

fn kind(f: &Frame) -> String {
    let r = f.1["result"].as_object().expect("a result frame");
    assert_eq!(r.len(), 1, "{}", f.1);
    r.keys().next().unwrap().clone()
}

/// What a frame says, for comparing two streams: (id, kind, artifact id or state).
fn digest(f: &Frame) -> (String, String, String) {
    let r = &f.1["result"];
    let what = r["artifactUpdate"]["artifact"]["artifactId"]
        .as_str()
        .or(r["statusUpdate"]["status"]["state"].as_str())
        .or(r["task"]["status"]["state"].as_str())
        .unwrap_or("?")
        .to_owned();
    (f.0.clone().expect("a task frame has an id"), kind(f), what)
}

/// The number at the end of an event id.
fn seq(id: &str) -> u64 {
    id.rsplit(':').next().unwrap().parse().unwrap()
}

fn get_task(d: &Daemon, id: &str) -> Value {
    d.connect_tcp().rpc_ok("GetTask", json!({"id": id}))
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn touch(p: &Path) {
    std::fs::write(p, b"").unwrap();
}

fn drop_and_resume(driver: &str) {
    let agent = format!("{}/tests/agents/paced.py", env!("CARGO_MANIFEST_DIR"));
    let d = Daemon::start_setup(
        driver,
        &Setup {
            sections: format!("[agent]\ncommand = [\"python3\", \"{agent}\"]\n"),
            ..Setup::default()
        },
    );
    let gate = d.dir().join("gate");
    let gate_text = gate.to_str().unwrap().to_owned();

    // Stream the turn up to the first artifact, then drop the connection.
    let mut s = Stream::open(
        &d,
        "SendStreamingMessage",
        json!({"message": {"role":"ROLE_USER","messageId":"m-1","parts":[{"text": gate_text}]}}),
        None,
    );
    assert_eq!(
        (s.status, s.content_type.as_str()),
        (200, "text/event-stream")
    );
    let mut seen = vec![s.next().expect("the task frame")];
    assert_eq!(kind(&seen[0]), "task");
    let task_id = seen[0].1["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let f = s.next().expect("a frame before the stream ends");
        let done = f.1["result"]["artifactUpdate"]["artifact"]["artifactId"] == "part-1";
        seen.push(f);
        if done {
            break;
        }
    }
    // Ids name this task and count up by one from the snapshot's.
    let ids: Vec<String> = seen.iter().map(|f| f.0.clone().unwrap()).collect();
    for (i, id) in ids.iter().enumerate() {
        assert!(id.starts_with(&format!("{task_id}:")), "{id}");
        assert_eq!(seq(id), seq(&ids[0]) + i as u64, "{ids:?}");
    }
    let last_seen = ids.last().unwrap().clone();
    s.drop_connection();

    // The task goes on without the client: part-2 and the step-2 status are missed.
    touch(&gate.with_extension("1"));
    wait_for("part-2 and step 2", || {
        let t = get_task(&d, &task_id);
        t["artifacts"].as_array().is_some_and(|a| a.len() == 2)
            && t["status"]["message"]["parts"][0]["text"] == "step 2"
    });

    // Reconnect: exactly the missed events, no snapshot, no duplicate; then live.
    let mut r = Stream::open(
        &d,
        "SubscribeToTask",
        json!({"id": task_id}),
        Some(&last_seen),
    );
    assert_eq!(
        (r.status, r.content_type.as_str()),
        (200, "text/event-stream")
    );
    let missed = [r.next().unwrap(), r.next().unwrap()];
    let got: Vec<_> = missed.iter().map(digest).collect();
    let n = seq(&last_seen);
    let eid = |k: u64| {
        format!(
            "{}{}",
            &last_seen[..last_seen.len() - n.to_string().len()],
            k
        )
    };
    assert_eq!(
        got,
        [
            (eid(n + 1), "artifactUpdate".to_owned(), "part-2".to_owned()),
            (
                eid(n + 2),
                "statusUpdate".to_owned(),
                "TASK_STATE_WORKING".to_owned()
            ),
        ]
    );
    touch(&gate.with_extension("2"));
    let live = r.rest();
    let got: Vec<_> = live.iter().map(digest).collect();
    assert_eq!(
        got,
        [
            (eid(n + 3), "artifactUpdate".to_owned(), "part-3".to_owned()),
            (
                eid(n + 4),
                "statusUpdate".to_owned(),
                "TASK_STATE_COMPLETED".to_owned()
            ),
        ],
        "the live rest, then the stream ends"
    );
    assert_eq!(task_state(&get_task(&d, &task_id)), "TASK_STATE_COMPLETED");

    // After completion: from the dropped point again, the same four events, then it closes.
    let mut again = Stream::open(
        &d,
        "SubscribeToTask",
        json!({"id": task_id}),
        Some(&last_seen),
    );
    assert_eq!(again.status, 200);
    let replayed: Vec<_> = again.rest().iter().map(digest).collect();
    let expected: Vec<_> = missed.iter().chain(live.iter()).map(digest).collect();
    assert_eq!(replayed, expected);

    // Without the header a finished task is still refused; a foreign id is invalid params.
    let plain = d
        .connect_tcp()
        .rpc_err("SubscribeToTask", json!({"id": task_id}), -32004);
    assert!(plain["message"]
        .as_str()
        .unwrap()
        .contains("TASK_STATE_COMPLETED"));
    let bad = Stream::open(
        &d,
        "SubscribeToTask",
        json!({"id": task_id}),
        Some("someone-else:1:1"),
    );
    assert_eq!(
        (bad.status, bad.content_type.as_str()),
        (200, "application/json")
    );
    let err = bad.json();
    assert_eq!(err["error"]["code"], -32602, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Last-Event-ID"));
}

#[test]
fn a_dropped_task_stream_resumes_from_last_event_id() {
    for driver in DRIVERS {
        drop_and_resume(driver);
    }
}
