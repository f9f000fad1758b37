//! The outbound client (`agentd::runtime::peer`) against a real agentd server run in-process
//! on the io-std driver, on loopback TCP and on a unix socket, with a small scripted host
//! answering the instance's effects; and against a raw TCP server returning canned bytes for
//! the error paths. Every thread started here is stopped before its test returns.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use agentd::runtime::peer::{
    OutboundSend, PeerClient, PeerConfig, PeerError, PeerOutcome, SendMode,
};
use agentd_core::a2a::types::{Artifact, Part, PartContent, TaskState};
use agentd_core::client::a2a::CardError;
use agentd_core::{Completion, Effect, Instance, InstanceConfig};
use agentd_io_common::{BoundListener, Clock, Endpoint, OsEntropy};
use agentd_io_std::{DriverOptions, ServerHandle};
use serde_json::{json, Map, Value};

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// What the scripted host saw.
#[derive(Default)]
struct Seen {
    turns: Vec<String>,
    cancels: Vec<String>,
}

/// A real agentd (core + io-std driver) on loopback TCP and a unix socket, and its host.
struct Server {
    handle: Option<ServerHandle>,
    host: Option<thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    tcp: SocketAddr,
    unix: PathBuf,
    dir: PathBuf,
}

/// An https listener's certificate, key and optional client CA (mutual TLS).
struct TlsSetup {
    cert: String,
    key: String,
    client_ca: Option<String>,
}

impl Server {
    fn start() -> Server {
        Server::start_with(None)
    }

    /// The TCP listener is https:// when `tls` is given.
    fn start_with(tls: Option<TlsSetup>) -> Server {
        let dir = std::env::temp_dir().join(format!(
            "agentd-peer-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let unix = dir.join("a.sock");
        let scheme = if tls.is_some() { "https" } else { "tcp" };
        let endpoints = [
            format!("{scheme}://127.0.0.1:0")
                .parse::<Endpoint>()
                .unwrap(),
            Endpoint::Unix(unix.clone()),
        ];
        let listeners: Vec<BoundListener> = endpoints
            .iter()
            .map(|e| BoundListener::bind(e).unwrap())
            .collect();
        let infos = listeners
            .iter()
            .zip(&endpoints)
            .map(|(l, e)| l.info_tls(e.is_tls()).unwrap())
            .collect();
        let tcp = match &listeners[0] {
            BoundListener::Tcp(l) => l.local_addr().unwrap(),
            _ => unreachable!(),
        };
        let clock = Clock::new();
        let mut config = InstanceConfig::new(infos);
        if let Some(t) = &tls {
            let listener = agentd_core::tls::listener(
                t.cert.as_bytes(),
                t.key.as_bytes(),
                t.client_ca.as_ref().map(|c| c.as_bytes()),
            )
            .unwrap();
            config.tls.insert(0, listener);
        }
        let instance = Arc::new(Mutex::new(Instance::new(
            config,
            Box::new(OsEntropy),
            clock.now(),
        )));
        let handle =
            agentd_io_std::serve(instance.clone(), listeners, DriverOptions::default(), clock)
                .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let host = {
            let (stop, seen) = (stop.clone(), seen.clone());
            thread::spawn(move || run_host(&instance, clock, &stop, &seen))
        };
        Server {
            handle: Some(handle),
            host: Some(host),
            stop,
            seen,
            tcp,
            unix,
            dir,
        }
    }

    fn tcp_peer(&self) -> PeerClient {
        peer(&format!("http://{}/", self.tcp))
    }

    fn unix_peer(&self) -> PeerClient {
        peer(&format!("unix://{}", self.unix.display()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.host.take() {
            let _ = h.join();
        }
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The scripted host. A turn's text says what to do:
/// `hello` → after 300 ms an artifact `echo: hello`, then completed;
/// `fail` → failed with "boom"; `ask` → input-required; anything else → never answered.
fn run_host(instance: &Mutex<Instance>, clock: Clock, stop: &AtomicBool, seen: &Mutex<Seen>) {
    let mut due: Vec<(Instant, Vec<Completion>)> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        {
            let mut inst = instance.lock().unwrap();
            while let Some(effect) = inst.poll_effect() {
                match effect {
                    Effect::Turn {
                        task_id, message, ..
                    } => {
                        let text = match message.parts.first().map(|p| &p.content) {
                            Some(PartContent::Text(t)) => t.clone(),
                            _ => String::new(),
                        };
                        seen.lock().unwrap().turns.push(text.clone());
                        let status = |state, msg: Option<&str>| Completion::Status {
                            task_id: task_id.clone(),
                            state,
                            message: msg.map(|m| vec![Part::text(m)]),
                        };
                        let now = Instant::now();
                        match text.as_str() {
                            "hello" => due.push((
                                now + Duration::from_millis(300),
                                vec![
                                    Completion::Artifact {
                                        task_id: task_id.clone(),
                                        artifact: Artifact {
                                            artifact_id: "a1".into(),
                                            description: String::new(),
                                            extensions: vec![],
                                            metadata: None,
                                            name: "echo".into(),
                                            parts: vec![Part::text("echo: hello")],
                                        },
                                        append: false,
                                        last_chunk: true,
                                    },
                                    status(TaskState::Completed, None),
                                ],
                            )),
                            "fail" => {
                                due.push((now, vec![status(TaskState::Failed, Some("boom"))]))
                            }
                            "ask" => due.push((
                                now,
                                vec![status(TaskState::InputRequired, Some("which one?"))],
                            )),
                            _ => {}
                        }
                    }
                    Effect::Cancel { task_id } => seen.lock().unwrap().cancels.push(task_id),
                    Effect::Command { op, .. } => panic!("unexpected command effect {op:?}"),
                    Effect::Deliver { url, .. } => panic!("unexpected webhook delivery to {url}"),
                    other => panic!("unexpected effect {other:?}"),
                }
            }
            let now = Instant::now();
            let (ready, later): (Vec<_>, Vec<_>) = due.drain(..).partition(|(t, _)| *t <= now);
            due = later;
            for (_, completions) in ready {
                for c in completions {
                    let _ = inst.handle_completion(c, clock.now());
                }
            }
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn peer(endpoint: &str) -> PeerClient {
    PeerClient::new(PeerConfig {
        name: "test".into(),
        endpoint: endpoint.into(),
        bearer: None,
        headers: vec![("X-Test".into(), "1".into())],
    })
    .unwrap()
    .with_poll_interval(Duration::from_millis(50), Duration::from_millis(100))
}

fn in_secs(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

fn text(s: &str) -> OutboundSend {
    OutboundSend::message(vec![Part::text(s)])
}

fn completed_echo(outcome: PeerOutcome) {
    let PeerOutcome::Task(t) = outcome else {
        panic!("expected a task, got {outcome:?}")
    };
    assert_eq!(t.status.state, TaskState::Completed);
    assert_eq!(t.artifacts.len(), 1, "{t:?}");
    assert_eq!(t.artifacts[0].parts, vec![Part::text("echo: hello")]);
}

#[test]
fn streaming_send_over_tcp_and_unix() {
    let s = Server::start();
    let never = AtomicBool::new(false);
    for client in [s.tcp_peer(), s.unix_peer()] {
        let card = client
            .card(in_secs(5), &never)
            .unwrap()
            .expect("agentd serves a card");
        assert!(card.streaming);
        let out = client.send(text("hello"), in_secs(10), &never).unwrap();
        completed_echo(out);
    }
    assert_eq!(s.seen.lock().unwrap().turns, ["hello", "hello"]);
}

#[test]
fn polling_send_follows_the_task_with_get_task() {
    let s = Server::start();
    let never = AtomicBool::new(false);
    for client in [s.tcp_peer(), s.unix_peer()] {
        let mut req = text("hello");
        req.mode = SendMode::Poll;
        completed_echo(client.send(req, in_secs(10), &never).unwrap());
    }
}

#[test]
fn settled_states_map_to_outcomes_and_errors() {
    let s = Server::start();
    let c = s.tcp_peer();
    let never = AtomicBool::new(false);
    for mode in [SendMode::Stream, SendMode::Poll] {
        let mut req = text("fail");
        req.mode = mode;
        match c.send(req, in_secs(10), &never) {
            Err(e @ PeerError::TaskFailed(_)) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("TASK_STATE_FAILED") && msg.contains("boom"),
                    "{msg}"
                );
            }
            other => panic!("{other:?}"),
        }
        let mut req = text("ask");
        req.mode = mode;
        let Ok(PeerOutcome::Task(t)) = c.send(req, in_secs(10), &never) else {
            panic!()
        };
        assert_eq!(t.status.state, TaskState::InputRequired);
    }
}

#[test]
fn command_status_is_answered_by_the_peer_core_as_a_message() {
    let s = Server::start();
    let never = AtomicBool::new(false);
    for client in [s.tcp_peer(), s.unix_peer()] {
        for mode in [SendMode::Auto, SendMode::Poll] {
            let mut req = OutboundSend::command("status", Map::new());
            req.mode = mode;
            let out = client.send(req, in_secs(10), &never).unwrap();
            let PeerOutcome::Message(m) = out else {
                panic!("{out:?}")
            };
            // The reply is the status document: the peer ran the command, not a turn.
            let PartContent::Data(doc) = &m.parts[0].content else {
                panic!("{m:?}")
            };
            assert!(doc.to_string().contains("uptime_ms"), "{doc}");
        }
    }
    assert!(s.seen.lock().unwrap().turns.is_empty());
}

#[test]
fn json_rpc_errors_are_typed() {
    let s = Server::start();
    let c = s.tcp_peer();
    let never = AtomicBool::new(false);
    match c.send(
        OutboundSend::command("no.such.op", Map::new()),
        in_secs(5),
        &never,
    ) {
        Err(PeerError::Rpc {
            code,
            message,
            data,
        }) => {
            assert_eq!(code, -32602);
            assert!(!message.is_empty());
            assert!(data.unwrap().to_string().contains("UNKNOWN_OP"));
        }
        other => panic!("{other:?}"),
    }
    match c.get_task("nope", None, in_secs(5), &never) {
        Err(PeerError::Rpc { code: -32001, .. }) => {}
        other => panic!("{other:?}"),
    }
    // Args that collide with the envelope are refused before anything is sent.
    let mut args = Map::new();
    args.insert("op".into(), json!("x"));
    assert!(matches!(
        c.send(OutboundSend::command("status", args), in_secs(5), &never),
        Err(PeerError::Config(_))
    ));
}

#[test]
fn cancel_and_deadline_cancel_the_peer_task() {
    let s = Server::start();
    for mode in [SendMode::Stream, SendMode::Poll] {
        for via_cancel in [true, false] {
            let c = s.tcp_peer();
            let cancel = Arc::new(AtomicBool::new(false));
            let flag = cancel.clone();
            let setter = thread::spawn(move || {
                thread::sleep(Duration::from_millis(400));
                flag.store(true, Ordering::SeqCst);
            });
            let mut req = text("wait forever");
            req.mode = mode;
            let started = Instant::now();
            let deadline = if via_cancel {
                in_secs(10)
            } else {
                Instant::now() + Duration::from_millis(400)
            };
            let never = AtomicBool::new(false);
            let r = c.send(req, deadline, if via_cancel { &cancel } else { &never });
            setter.join().unwrap();
            assert!(started.elapsed() < Duration::from_secs(3), "prompt");
            let task_id = match (via_cancel, r) {
                (true, Err(PeerError::Canceled { task_id: Some(id) })) => id,
                (false, Err(PeerError::Timeout { task_id: Some(id) })) => id,
                (_, other) => panic!("{mode:?} cancel={via_cancel}: {other:?}"),
            };
            let t = c.get_task(&task_id, None, in_secs(5), &never).unwrap();
            assert_eq!(t.status.state, TaskState::Canceled);
            // The host hears of it on its next round.
            let until = in_secs(2);
            while !s.seen.lock().unwrap().cancels.contains(&task_id) {
                assert!(Instant::now() < until, "the host never saw the cancel");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
    // Canceled before anything was sent: nothing is dialed.
    let c = peer("http://127.0.0.1:9/");
    assert!(matches!(
        c.send(text("x"), in_secs(5), &AtomicBool::new(true)),
        Err(PeerError::Canceled { task_id: None })
    ));
    assert!(matches!(
        c.send(text("x"), Instant::now(), &AtomicBool::new(false)),
        Err(PeerError::Timeout { task_id: None })
    ));
}

#[test]
fn connect_refused_is_typed() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let c = peer(&format!("http://127.0.0.1:{port}/"));
    match c.send(text("x"), in_secs(5), &AtomicBool::new(false)) {
        Err(e @ PeerError::Connect { .. }) => assert!(e.to_string().contains("cannot connect")),
        other => panic!("{other:?}"),
    }
    let c = peer("unix:///nonexistent/agentd-peer-test.sock");
    assert!(matches!(
        c.send(text("x"), in_secs(5), &AtomicBool::new(false)),
        Err(PeerError::Connect { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// A raw server with canned answers

/// Answers one connection per canned response, in order, and returns the requests it read.
struct Canned {
    addr: SocketAddr,
    thread: Option<thread::JoinHandle<Vec<String>>>,
}

impl Canned {
    fn start(responses: Vec<Vec<u8>>) -> Canned {
        Canned::start_with(|_| responses)
    }

    /// The responses may name the server's own address (a card's interface URL).
    fn start_with(script: impl FnOnce(SocketAddr) -> Vec<Vec<u8>>) -> Canned {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let responses = script(addr);
        let thread = thread::spawn(move || {
            let mut seen = Vec::new();
            let give_up = Instant::now() + Duration::from_secs(10);
            for resp in responses {
                let mut s = loop {
                    match l.accept() {
                        Ok((s, _)) => break s,
                        Err(_) if Instant::now() < give_up => {
                            thread::sleep(Duration::from_millis(5))
                        }
                        Err(_) => return seen,
                    }
                };
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                seen.push(read_request(&mut s));
                let _ = s.write_all(&resp);
            }
            seen
        });
        Canned {
            addr,
            thread: Some(thread),
        }
    }

    fn peer(&self) -> PeerClient {
        peer(&format!("http://{}/", self.addr))
    }

    fn requests(mut self) -> Vec<String> {
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Canned {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_request(s: &mut std::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if buf.len() >= end + 4 + len {
                return String::from_utf8_lossy(&buf).into_owned();
            }
        }
        match s.read(&mut b) {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&buf).into_owned(),
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
}

const NO_CARD: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

fn json_response(v: &Value) -> Vec<u8> {
    let body = v.to_string();
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn chunk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", bytes.len()).as_bytes());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

#[test]
fn no_card_means_stream_and_a_chunked_sse_stream_is_read() {
    // Request ids: 1 is the stream (the card GET takes none).
    let task = |state: &str| json!({"id":"t1","contextId":"c","status":{"state":state}});
    let mut stream =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    let ev = |v: Value| {
        format!(
            "data: {}\r\n\r\n",
            json!({"jsonrpc":"2.0","id":1,"result":v})
        )
    };
    let e1 = ev(json!({"task": task("TASK_STATE_WORKING")}));
    // One event split over two chunks, a comment, and a multi-line data field.
    chunk(&mut stream, &e1.as_bytes()[..10]);
    chunk(&mut stream, &e1.as_bytes()[10..]);
    chunk(&mut stream, b": keep-alive\n\n");
    let art = json!({"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t1","artifact":{"artifactId":"a","parts":[{"text":"x"}]}}}});
    let pretty = serde_json::to_string_pretty(&art).unwrap();
    let multi: String = pretty.lines().map(|l| format!("data: {l}\n")).collect();
    chunk(&mut stream, format!("{multi}\n").as_bytes());
    chunk(
        &mut stream,
        ev(json!({"statusUpdate":{"taskId":"t1","status":{"state":"TASK_STATE_COMPLETED"}}}))
            .as_bytes(),
    );
    stream.extend_from_slice(b"0\r\n\r\n");

    let srv = Canned::start(vec![NO_CARD.to_vec(), stream]);
    let out = srv
        .peer()
        .send(text("hi"), in_secs(5), &AtomicBool::new(false))
        .unwrap();
    let PeerOutcome::Task(t) = out else { panic!() };
    assert_eq!(t.status.state, TaskState::Completed);
    assert_eq!(t.artifacts[0].parts, vec![Part::text("x")]);
    let reqs = srv.requests();
    assert!(reqs[0].starts_with("GET /.well-known/agent-card.json HTTP/1.1\r\n"));
    assert!(!reqs[0].to_lowercase().contains("authorization"));
    assert!(reqs[1].contains("\"method\":\"SendStreamingMessage\""));
    assert!(reqs[1].contains("A2A-Version: 1.0\r\n"));
    assert!(reqs[1].contains("X-Test: 1\r\n"));
    // A plain message activates no extension.
    assert!(!reqs[1].to_lowercase().contains("a2a-extensions"));
}

#[test]
fn a_stream_refused_with_32004_is_retried_once_unary_with_the_same_message_id() {
    let refused = json_response(
        &json!({"jsonrpc":"2.0","id":1,"error":{"code":-32004,"message":"This operation is not supported"}}),
    );
    let answer = json_response(
        &json!({"jsonrpc":"2.0","id":2,"result":{"message":{"messageId":"r","role":"ROLE_AGENT","parts":[{"text":"ok"}]}}}),
    );
    let srv = Canned::start(vec![NO_CARD.to_vec(), refused, answer]);
    let mut req = OutboundSend::command("status", Map::new());
    req.message_id = Some("pinned-1".into());
    let out = srv
        .peer()
        .send(req, in_secs(5), &AtomicBool::new(false))
        .unwrap();
    assert!(matches!(out, PeerOutcome::Message(m) if m.message_id == "r"));
    let reqs = srv.requests();
    assert!(
        reqs[1].contains("SendStreamingMessage") && reqs[2].contains("\"method\":\"SendMessage\"")
    );
    for r in &reqs[1..] {
        assert!(r.contains("\"messageId\":\"pinned-1\""), "{r}");
        assert!(r.contains("A2A-Extensions: https://agentd.dev/a2a/ext/command\r\n"));
        assert!(r.contains("\"extensions\":[\"https://agentd.dev/a2a/ext/command\"]"));
    }
    assert!(reqs[2].contains("\"returnImmediately\":true"));
}

#[test]
fn card_tenant_and_streaming_false_choose_the_polling_path() {
    let working = json_response(
        &json!({"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","status":{"state":"TASK_STATE_WORKING"}}}}),
    );
    let done = json_response(
        &json!({"jsonrpc":"2.0","id":2,"result":{"id":"t","status":{"state":"TASK_STATE_COMPLETED"}}}),
    );
    let srv = Canned::start_with(|addr| {
        let card = json_response(
            &json!({"name":"p","capabilities":{"streaming":false},"supportedInterfaces":[
            {"url":"http://10.1.1.1/","protocolBinding":"JSONRPC","protocolVersion":"1.0"},
            {"url":format!("http://{addr}/"),"protocolBinding":"JSONRPC","protocolVersion":"1.0","tenant":"acme"}]}),
        );
        vec![card, working, done]
    });
    let out = srv
        .peer()
        .send(text("hi"), in_secs(5), &AtomicBool::new(false))
        .unwrap();
    assert!(matches!(out, PeerOutcome::Task(t) if t.status.state == TaskState::Completed));
    let reqs = srv.requests();
    assert!(
        reqs[1].contains("\"method\":\"SendMessage\"") && reqs[1].contains("\"tenant\":\"acme\"")
    );
    assert!(reqs[2].contains("\"method\":\"GetTask\"") && reqs[2].contains("\"tenant\":\"acme\""));
}

#[test]
fn http_and_framing_errors_are_typed() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops".to_vec(),
            "HTTP 500 Internal Server Error: oops",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"name\":".to_vec(),
            "closed in the middle of the response body",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}".to_vec(),
            "closed in the middle of a chunked body",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n".to_vec(),
            "malformed chunk size",
        ),
        (
            b"SSH-2.0-OpenSSH\r\n\r\n".to_vec(),
            "malformed response head",
        ),
        (b"".to_vec(), "closed before the response head"),
        (
            json_response(&json!({"name":"old","url":"http://x/","protocolVersion":"0.3.0"})),
            "A2A 0.3",
        ),
        (
            json_response(
                &json!({"capabilities":{"extensions":[{"uri":"https://x/must","required":true}]},
                "supportedInterfaces":[{"url":"http://x/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}]}),
            ),
            "requires extension https://x/must",
        ),
    ];
    for (card_answer, want) in cases {
        let srv = Canned::start(vec![card_answer]);
        let err = srv
            .peer()
            .send(text("x"), in_secs(5), &AtomicBool::new(false))
            .unwrap_err();
        assert!(err.to_string().contains(want), "want {want:?}, got {err}");
        drop(srv);
    }
    // The refusal is typed too, not only worded.
    let srv = Canned::start(vec![json_response(&json!({"supportedInterfaces":[]}))]);
    assert!(matches!(
        srv.peer()
            .send(text("x"), in_secs(5), &AtomicBool::new(false)),
        Err(PeerError::Card(CardError::NoInterface { .. }))
    ));
}

#[test]
fn a_failed_send_drops_the_cached_card() {
    let card = |streaming: bool| {
        json_response(&json!({"capabilities":{"streaming":streaming},
            "supportedInterfaces":[{"url":"http://x/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}]}))
    };
    let refused = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec();
    let msg = |id: u64| {
        json_response(
            &json!({"jsonrpc":"2.0","id":id,"result":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[]}}}),
        )
    };
    // card, send ok (cached card reused: no second GET), send fails, card read again.
    let srv = Canned::start(vec![
        card(false),
        msg(1),
        msg(2),
        refused,
        card(false),
        msg(4),
    ]);
    let c = srv.peer();
    let never = AtomicBool::new(false);
    c.send(text("1"), in_secs(5), &never).unwrap();
    c.send(text("2"), in_secs(5), &never).unwrap();
    assert!(matches!(
        c.send(text("3"), in_secs(5), &never),
        Err(PeerError::Http { status: 503, .. })
    ));
    c.send(text("4"), in_secs(5), &never).unwrap();
    let reqs = srv.requests();
    let gets: Vec<usize> = (0..reqs.len())
        .filter(|i| reqs[*i].starts_with("GET "))
        .collect();
    assert_eq!(gets, [0, 4], "{reqs:#?}");
}

// ---------------------------------------------------------------------------------------
// https

struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf for 127.0.0.1 and localhost: (certificate PEM, key PEM).
fn leaf(ca: &Ca, cn: &str) -> (String, String) {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[test]
fn https_peer_streams_and_polls_with_verified_certificates() {
    let server_ca = ca("server CA");
    let (cert, key) = leaf(&server_ca, "agentd");
    let s = Server::start_with(Some(TlsSetup {
        cert,
        key,
        client_ca: None,
    }));
    let never = AtomicBool::new(false);
    let endpoint = format!("https://127.0.0.1:{}/", s.tcp.port());
    let c = peer(&endpoint)
        .with_tls_roots(server_ca.pem.as_bytes())
        .unwrap();
    assert!(c.card(in_secs(5), &never).unwrap().unwrap().streaming);
    completed_echo(c.send(text("hello"), in_secs(10), &never).unwrap());
    let mut req = text("hello");
    req.mode = SendMode::Poll;
    completed_echo(c.send(req, in_secs(10), &never).unwrap());

    // A certificate from a CA we do not trust is refused in the handshake.
    let other = ca("someone else");
    let c = peer(&endpoint)
        .with_tls_roots(other.pem.as_bytes())
        .unwrap();
    match c.send(text("hello"), in_secs(5), &never) {
        Err(e @ PeerError::Io(_)) => {
            assert!(e.to_string().to_lowercase().contains("certificate"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn https_peer_with_mutual_tls() {
    let server_ca = ca("server CA");
    let client_ca = ca("client CA");
    let (cert, key) = leaf(&server_ca, "agentd");
    let s = Server::start_with(Some(TlsSetup {
        cert,
        key,
        client_ca: Some(client_ca.pem.clone()),
    }));
    let never = AtomicBool::new(false);
    let endpoint = format!("https://localhost:{}/", s.tcp.port());
    let (ccert, ckey) = leaf(&client_ca, "workflow-runner");
    let with_cert = peer(&endpoint)
        .with_tls_roots(server_ca.pem.as_bytes())
        .unwrap()
        .with_client_cert(ccert.as_bytes(), ckey.as_bytes())
        .unwrap();
    assert!(with_cert.card(in_secs(5), &never).unwrap().is_some());
    let without = peer(&endpoint)
        .with_tls_roots(server_ca.pem.as_bytes())
        .unwrap();
    assert!(matches!(
        without.card(in_secs(5), &never),
        Err(PeerError::Io(_) | PeerError::Protocol(_))
    ));
}

#[test]
fn only_one_unary_retry_and_a_refusal_inside_the_stream_counts_too() {
    let refusal =
        |id: u64| json!({"jsonrpc":"2.0","id":id,"error":{"code":-32004,"message":"not served"}});
    let mut sse =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    chunk(&mut sse, format!("data: {}\n\n", refusal(1)).as_bytes());
    sse.extend_from_slice(b"0\r\n\r\n");
    let srv = Canned::start(vec![NO_CARD.to_vec(), sse, json_response(&refusal(2))]);
    match srv
        .peer()
        .send(text("x"), in_secs(5), &AtomicBool::new(false))
    {
        Err(PeerError::Rpc {
            code: -32004,
            message,
            ..
        }) => assert_eq!(message, "not served"),
        other => panic!("{other:?}"),
    }
    let reqs = srv.requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs[2].contains("\"method\":\"SendMessage\""));
}
