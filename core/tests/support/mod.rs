//! A test client for the core: feeds request bytes into a connection, reads the response
//! bytes back, plays the host for effects, and moves a fake clock. No sockets, no sleeps.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use agentd_core::a2a::card::AgentSkill;
use agentd_core::auth::{Peer, Principal};
use agentd_core::host::OpSet;
use agentd_core::ids::CounterEntropy;
use agentd_core::{
    Connection, Effect, HostCapabilities, Instance, InstanceConfig, ListenerInfo, ListenerKind, Now,
};
use serde_json::Value;

pub const T0: u64 = 1_767_225_600_000;

/// Counts wake-ups.
#[derive(Default)]
pub struct WakeCount(pub AtomicUsize);

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the harness's host serves unless a test says otherwise: every host-served op of the
/// table, and the conversation skill (the test host answers turns).
pub fn every_op_and_conversation() -> HostCapabilities {
    HostCapabilities {
        ops: OpSet::host_ops(),
        skills: vec![AgentSkill {
            description: "Converse with this agent.".into(),
            examples: Vec::new(),
            input_modes: Vec::new(),
            output_modes: Vec::new(),
            id: "conversation".into(),
            name: "Conversation".into(),
            tags: vec!["conversation".into()],
        }],
    }
}

pub struct Harness {
    pub inst: Instance,
    pub config: InstanceConfig,
    pub now: Now,
    pub effects: Vec<Effect>,
}

impl Harness {
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    pub fn with(tweak: impl FnOnce(&mut InstanceConfig)) -> Self {
        let mut config = InstanceConfig::new(vec![
            ListenerInfo {
                kind: ListenerKind::Tcp,
                url: "http://127.0.0.1:8420/".into(),
                loopback: true,
            },
            ListenerInfo {
                kind: ListenerKind::Unix("/run/a.sock".into()),
                url: "unix:///run/a.sock".into(),
                loopback: false,
            },
        ]);
        config.host = every_op_and_conversation();
        tweak(&mut config);
        let now = Now::new(1_000, T0);
        Harness {
            inst: Instance::new(config.clone(), Box::new(CounterEntropy(42)), now),
            config,
            now,
            effects: Vec::new(),
        }
    }

    pub fn conn(&self) -> Client {
        self.conn_on(0)
    }

    /// A connection whose peer the transport proved: a unix peer on listener 1, a TCP peer
    /// (resolved per request from its credentials) on listener 0.
    pub fn conn_on(&self, listener: usize) -> Client {
        let peer = if listener == 1 {
            Peer::Unix { uid: 0 }
        } else {
            Peer::Tcp
        };
        self.conn_peer(listener, peer)
    }

    /// A connection whose caller an embedder already authenticated.
    pub fn conn_as(&self, listener: usize, principal: Principal) -> Client {
        self.conn_peer(listener, Peer::Fixed(principal))
    }

    pub fn conn_peer(&self, listener: usize, peer: Peer) -> Client {
        let wakes = Arc::new(WakeCount::default());
        let waker = Waker::from(wakes.clone());
        Client {
            conn: Connection::new(listener, peer, self.config.conn, waker, self.now),
            wakes,
        }
    }

    /// Moves the fake clock.
    pub fn advance(&mut self, ms: u64) {
        self.now = Now::new(self.now.mono_ms + ms, self.now.epoch_ms + ms);
    }

    /// Collects the effects the instance queued.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        let mut out = Vec::new();
        while let Some(e) = self.inst.poll_effect() {
            out.push(e);
        }
        out
    }

    /// The task id of the one Turn effect queued.
    pub fn turn(&mut self) -> String {
        let effects = self.take_effects();
        match effects.as_slice() {
            [Effect::Turn { task_id, .. }] => task_id.clone(),
            other => panic!("expected one turn effect, got {other:?}"),
        }
    }
}

pub struct Client {
    pub conn: Connection,
    pub wakes: Arc<WakeCount>,
}

impl Client {
    /// Feeds bytes and returns everything the connection wrote.
    pub fn feed(&mut self, h: &mut Harness, bytes: &[u8]) -> Vec<u8> {
        self.conn.handle_input(&mut h.inst, bytes, h.now);
        self.drain(h)
    }

    /// Polls (as after a wake-up) and returns what was written.
    pub fn poll(&mut self, h: &mut Harness) -> Vec<u8> {
        self.conn.poll(&mut h.inst, h.now);
        self.drain(h)
    }

    pub fn timeout(&mut self, h: &mut Harness) -> Vec<u8> {
        self.conn.handle_timeout(&mut h.inst, h.now);
        self.drain(h)
    }

    /// Reads everything the connection has to write, as a driver does: writing makes room,
    /// and a large answer fills it again until it is complete.
    pub fn drain(&mut self, h: &Harness) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let pending = self.conn.pending_output();
            if pending.is_empty() {
                return out;
            }
            out.extend_from_slice(pending);
            let n = pending.len();
            self.conn.consume_output(n, h.now);
        }
    }

    pub fn wakes(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }
}

/// The public card's GET.
pub const CARD_GET: &[u8] = b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n";

/// A JSON-RPC POST with the A2A-Version header and these `A2A-Extensions` lines.
pub fn rpc_ext(body: &str, extension_lines: &[&str]) -> Vec<u8> {
    let lines: String = extension_lines
        .iter()
        .map(|l| format!("A2A-Extensions: {l}\r\n"))
        .collect();
    format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n{lines}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn call_ext(method: &str, id: u64, params: Value, extension_lines: &[&str]) -> Vec<u8> {
    rpc_ext(
        &serde_json::json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string(),
        extension_lines,
    )
}

/// A JSON-RPC POST with the A2A-Version header.
pub fn rpc(body: &str) -> Vec<u8> {
    format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn call(method: &str, id: u64, params: Value) -> Vec<u8> {
    rpc(&serde_json::json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string())
}

/// A messageId not used before in this test process: a send is idempotent per (caller,
/// messageId), so each new message needs its own.
pub fn fresh_id() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("m-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn text_message(text: &str, message_id: &str) -> Value {
    serde_json::json!({"role":"ROLE_USER","messageId":message_id,"parts":[{"text":text}]})
}

/// The host reports that a task moved to `state`, with an agent message of `text`.
pub fn complete(
    h: &mut Harness,
    task_id: &str,
    state: agentd_core::a2a::types::TaskState,
    text: Option<&str>,
) {
    h.inst
        .handle_completion(
            agentd_core::Completion::Status {
                task_id: task_id.into(),
                state,
                message: text.map(|t| vec![agentd_core::a2a::types::Part::text(t)]),
            },
            h.now,
        )
        .expect("status accepted");
}

/// One parsed response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The JSON of each `data:` line of an SSE body.
    pub fn events(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).expect("SSE data is JSON"))
            .collect()
    }
}

/// Parses every complete response in `bytes`, in order. Interim 100 responses are included.
pub fn parse_all(mut bytes: &[u8]) -> Vec<Resp> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (resp, used) = parse_one(bytes)
            .unwrap_or_else(|| panic!("incomplete response: {}", String::from_utf8_lossy(bytes)));
        out.push(resp);
        bytes = &bytes[used..];
    }
    out
}

pub fn parse_one(bytes: &[u8]) -> Option<(Resp, usize)> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(": ").expect("header line");
            (n.to_owned(), v.to_owned())
        })
        .collect();
    let mut resp = Resp {
        status,
        headers,
        body: Vec::new(),
    };
    if status == 100 || status == 304 || status == 204 {
        return Some((resp, end));
    }
    if resp.header("transfer-encoding") == Some("chunked") {
        let mut pos = end;
        loop {
            let line_end = bytes[pos..].windows(2).position(|w| w == b"\r\n")? + pos;
            let size =
                usize::from_str_radix(std::str::from_utf8(&bytes[pos..line_end]).ok()?, 16).ok()?;
            pos = line_end + 2;
            if size == 0 {
                if bytes.len() < pos + 2 {
                    return None;
                }
                return Some((resp, pos + 2));
            }
            resp.body.extend_from_slice(bytes.get(pos..pos + size)?);
            pos += size + 2;
        }
    }
    if let Some(len) = resp.header("content-length") {
        let len: usize = len.parse().ok()?;
        resp.body = bytes.get(end..end + len)?.to_vec();
        return Some((resp, end + len));
    }
    // Close-delimited (an HTTP/1.0 stream): the rest.
    resp.body = bytes[end..].to_vec();
    Some((resp, bytes.len()))
}

/// The first response's head, and whatever of its body has arrived (an open stream's
/// frames so far).
pub fn first_head(bytes: &[u8]) -> Resp {
    if let Some((resp, _)) = parse_one(bytes) {
        return resp;
    }
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let head = std::str::from_utf8(&bytes[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(": ").unwrap();
            (n.to_owned(), v.to_owned())
        })
        .collect();
    Resp {
        status,
        headers,
        body: bytes[end..].to_vec(),
    }
}

/// The single response in `bytes`.
pub fn one(bytes: &[u8]) -> Resp {
    let mut all = parse_all(bytes);
    assert_eq!(
        all.len(),
        1,
        "expected one response in {}",
        String::from_utf8_lossy(bytes)
    );
    all.pop().unwrap()
}

/// Asserts a JSON-RPC error with this code (and reason, when given) at HTTP `status`.
pub fn assert_rpc_error(resp: &Resp, code: i64, reason: Option<&str>) -> Value {
    assert_eq!(resp.status, 200, "JSON-RPC errors answer HTTP 200");
    let j = resp.json();
    assert_eq!(j["jsonrpc"], "2.0");
    assert_eq!(j["error"]["code"], code, "code in {j}");
    assert!(j.get("result").is_none());
    if let Some(reason) = reason {
        assert_eq!(
            j["error"]["data"][0]["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
            "{j}"
        );
        assert_eq!(j["error"]["data"][0]["reason"], reason, "{j}");
    }
    j
}
