//! The blocking outbound A2A client behind the `a2a.send` / `a2a.delegate` workflow steps
//! (surface §7.13). It dials the configured endpoint (`https://`, loopback `http://` or
//! `unix:///path`),
//! speaks through the core's sans-io client ([`agentd_core::client`]) and returns the peer's
//! final task or message.
//!
//! Everything here blocks the calling thread, bounded by the caller's deadline; every read
//! wakes at least every [`TICK`] to look at the cancel flag, so a canceled step lets go of
//! its socket promptly and tells the peer (best effort `CancelTask`).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use agentd_core::a2a::types::{Message, Part, StreamResponse, Task, TaskState};
use agentd_core::client::a2a::{
    self as wire, A2aError, CardError, SelectedInterface, SendOptions, SendResult,
};
use agentd_core::client::{
    OutRequest, ResponseEvent, ResponseHead, ResponseLimits, ResponseParser, SseDecoder,
};
use agentd_core::ext::COMMAND_URI;
use agentd_io_common::OsEntropy;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Map, Value};

/// How often a blocked read wakes to look at the cancel flag and the deadline.
pub const TICK: Duration = Duration::from_millis(50);
/// The bound of one server-sent event (one JSON-RPC response).
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;
/// How long the best-effort `CancelTask` after a cancel or timeout may take.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// The JSON-RPC code of UnsupportedOperation: a stream refused this way is retried unary.
const UNSUPPORTED_OPERATION: i64 = -32004;

/// One configured peer (`a2a.peers[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    pub name: String,
    /// `https://host[:port][/path]`, `http://127.0.0.1:PORT[/path]` (loopback only), or
    /// `unix:///absolute/path`.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer <token>` on JSON-RPC calls (not on the public card).
    pub bearer: Option<String>,
    /// More header fields for every request.
    pub headers: Vec<(String, String)>,
}

/// What is sent: a plain message, or a command of the command extension.
#[derive(Clone, Debug, PartialEq)]
pub enum OutboundBody {
    Message {
        parts: Vec<Part>,
    },
    /// One data part `{"agentd": {"op": op, ...args}}`, marked with the command URI.
    Command {
        op: String,
        args: Map<String, Value>,
    },
}

/// How to send: §7.13's rule, or one path forced (diagnostics and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SendMode {
    /// Stream if the card says the peer streams (or no card is served), else poll.
    #[default]
    Auto,
    Stream,
    /// `SendMessage` with `returnImmediately`, then `GetTask` until the task settles.
    Poll,
}

/// One outbound send.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboundSend {
    pub body: OutboundBody,
    /// Continue this conversation of ours on the peer.
    pub context_id: Option<String>,
    /// A pinned `messageId` (the step's `idempotency: true`): the same id on every retry,
    /// so the peer can tell a repeat. A fresh random id when `None`.
    pub message_id: Option<String>,
    pub mode: SendMode,
    /// The trace context every request of the call carries (`traceparent`, `tracestate`).
    pub trace: Option<agentd_core::trace::TraceContext>,
}

impl OutboundSend {
    pub fn message(parts: Vec<Part>) -> Self {
        OutboundSend {
            body: OutboundBody::Message { parts },
            context_id: None,
            message_id: None,
            mode: SendMode::Auto,
            trace: None,
        }
    }

    pub fn command(op: impl Into<String>, args: Map<String, Value>) -> Self {
        OutboundSend {
            body: OutboundBody::Command {
                op: op.into(),
                args,
            },
            context_id: None,
            message_id: None,
            mode: SendMode::Auto,
            trace: None,
        }
    }
}

/// What the peer finally answered.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerOutcome {
    /// The task settled: completed, or waiting on input or auth (the caller decides).
    Task(Task),
    /// The peer answered with a message and no task.
    Message(Message),
}

/// Why a send did not produce an outcome.
#[derive(Debug)]
pub enum PeerError {
    /// The peer's configuration cannot be used.
    Config(String),
    /// The peer could not be reached.
    Connect { endpoint: String, error: io::Error },
    /// The connection failed mid-exchange.
    Io(io::Error),
    /// An HTTP status other than 200, with the start of its body.
    Http {
        status: u16,
        reason: String,
        body: String,
    },
    /// The peer answered something that is not HTTP/JSON-RPC/A2A as it should be.
    Protocol(String),
    /// A JSON-RPC error from the peer.
    Rpc {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    /// The peer's card refuses us (0.3 only, unknown required extension, malformed).
    Card(CardError),
    /// The peer's task ended failed, rejected or canceled (by the peer).
    TaskFailed(Box<Task>),
    /// The deadline passed; the peer was asked to cancel `task_id` if one existed.
    Timeout { task_id: Option<String> },
    /// The caller canceled; the peer was asked to cancel `task_id` if one existed.
    Canceled { task_id: Option<String> },
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerError::Config(why) => write!(f, "peer configuration: {why}"),
            PeerError::Connect { endpoint, error } => {
                write!(f, "cannot connect to {endpoint}: {error}")
            }
            PeerError::Io(e) => write!(f, "connection to the peer failed: {e}"),
            PeerError::Http {
                status,
                reason,
                body,
            } => {
                write!(f, "the peer answered HTTP {status} {reason}")?;
                if !body.is_empty() {
                    write!(f, ": {body}")?;
                }
                Ok(())
            }
            PeerError::Protocol(why) => write!(f, "the peer's answer is not valid: {why}"),
            PeerError::Rpc { code, message, .. } => {
                write!(f, "the peer refused with JSON-RPC error {code}: {message}")
            }
            PeerError::Card(e) => e.fmt(f),
            PeerError::TaskFailed(t) => {
                write!(
                    f,
                    "the peer's task {} ended {}",
                    t.id,
                    t.status.state.as_str()
                )?;
                if let Some(m) = &t.status.message {
                    let text = wire::message_text(m);
                    if !text.is_empty() {
                        write!(f, ": {text}")?;
                    }
                }
                Ok(())
            }
            PeerError::Timeout { task_id } => {
                f.write_str("the peer did not finish before the deadline")?;
                if let Some(id) = task_id {
                    write!(f, " (task {id} was asked to cancel)")?;
                }
                Ok(())
            }
            PeerError::Canceled { task_id } => {
                f.write_str("the send was canceled")?;
                if let Some(id) = task_id {
                    write!(f, " (task {id} was asked to cancel)")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for PeerError {}

impl From<A2aError> for PeerError {
    fn from(e: A2aError) -> Self {
        match e {
            A2aError::Rpc(r) => PeerError::Rpc {
                code: r.code,
                message: r.message,
                data: r.data,
            },
            A2aError::Malformed(why) => PeerError::Protocol(why),
            A2aError::Invalid(why) => PeerError::Config(why),
            // A2aError is non-exhaustive: a reason added later reads as a protocol failure.
            other => PeerError::Protocol(other.to_string()),
        }
    }
}

/// Where the dial goes: always the configured address, never one named on the card.
#[derive(Clone, Debug)]
enum Dial {
    Tcp(SocketAddr),
    /// Resolved at each dial; verified against `name`.
    Https {
        host: String,
        port: u16,
        name: ServerName<'static>,
    },
    Unix(PathBuf),
}

/// A cached card: the interface chosen on it (None: the peer serves no card).
#[derive(Clone, Debug)]
struct CardEntry {
    selected: Option<SelectedInterface>,
    expires: Instant,
}

/// The client of one peer. Shareable across threads (`&self` everywhere).
#[derive(Debug)]
pub struct PeerClient {
    config: PeerConfig,
    dial: Dial,
    /// The `Host` header's value.
    host: String,
    /// The JSON-RPC endpoint's path.
    path: String,
    cache: Mutex<Option<CardEntry>>,
    next_id: AtomicU64,
    first_poll: Duration,
    max_poll: Duration,
    limits: ResponseLimits,
    tls: TlsSettings,
    /// Refuses addresses the dial must not reach (a webhook's SSRF check), checked on the
    /// addresses a name resolves to, so the connection goes only to one that passed.
    address_filter: Option<AddressFilter>,
}

/// Says why an address may not be dialed.
#[derive(Clone)]
pub struct AddressFilter(pub Arc<dyn Fn(IpAddr) -> Result<(), String> + Send + Sync>);

impl fmt::Debug for AddressFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AddressFilter")
    }
}

/// What an https dial trusts and presents.
#[derive(Debug, Default)]
struct TlsSettings {
    /// None: the system's roots.
    roots: Option<rustls::RootCertStore>,
    client_cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    config: OnceLock<Arc<rustls::ClientConfig>>,
}

/// Where the system's CA bundle usually is (Debian/Alpine, Fedora/RHEL, BSD/macOS, SUSE).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// The CA bundle named by `SSL_CERT_FILE`, else the first system bundle found.
fn system_roots() -> Result<rustls::RootCertStore, PeerError> {
    let env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    let paths: Vec<PathBuf> = match env {
        Some(p) => vec![p],
        None => SYSTEM_BUNDLES.iter().map(PathBuf::from).collect(),
    };
    for path in &paths {
        let Ok(pem) = std::fs::read(path) else {
            continue;
        };
        let roots = roots_from_pem(&pem)
            .map_err(|e| PeerError::Config(format!("{}: {e}", path.display())))?;
        return Ok(roots);
    }
    Err(PeerError::Config(
        "no CA bundle to verify https peers with (set SSL_CERT_FILE)".into(),
    ))
}

fn roots_from_pem(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        // A bundle may hold a certificate rustls cannot use; skip it, as browsers do.
        let _ = roots.add(cert.map_err(|e| e.to_string())?);
    }
    if roots.is_empty() {
        return Err("no usable CA certificate".into());
    }
    Ok(roots)
}

/// Client-owned headers a configuration may not set.
const OWNED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "content-type",
    "accept",
    "a2a-version",
    "a2a-extensions",
    "traceparent",
    "tracestate",
];

impl PeerClient {
    /// Checks the configuration; dials nothing yet.
    pub fn new(config: PeerConfig) -> Result<PeerClient, PeerError> {
        let (dial, host, path) = parse_endpoint(&config.endpoint)?;
        for (name, _) in &config.headers {
            if OWNED_HEADERS.iter().any(|h| name.eq_ignore_ascii_case(h))
                || (config.bearer.is_some() && name.eq_ignore_ascii_case("authorization"))
            {
                return Err(PeerError::Config(format!(
                    "peer {}: header {name:?} is set by the client itself",
                    config.name
                )));
            }
        }
        let client = PeerClient {
            config,
            dial,
            host,
            path,
            cache: Mutex::new(None),
            next_id: AtomicU64::new(1),
            first_poll: Duration::from_millis(100),
            max_poll: Duration::from_secs(1),
            limits: ResponseLimits::DEFAULT,
            tls: TlsSettings::default(),
            address_filter: None,
        };
        // Header names and values (no CR/LF) are checked now, not at the first send.
        client
            .rpc_request(Vec::new(), false, &[], &[])
            .encode()
            .map_err(|e| PeerError::Config(format!("peer {}: {e}", client.config.name)))?;
        Ok(client)
    }

    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// Dials only addresses `filter` admits (every resolved address is checked, and the
    /// connection goes to one that passed, so a name cannot be re-pointed between the check
    /// and the dial).
    pub fn with_address_filter(mut self, filter: AddressFilter) -> Self {
        self.address_filter = Some(filter);
        self
    }

    /// POSTs `body` to the endpoint's own URL (a webhook) and returns the response's status
    /// and body.
    pub fn post(
        &self,
        headers: &[(String, String)],
        body: Vec<u8>,
        deadline: Instant,
    ) -> Result<(u16, Vec<u8>), PeerError> {
        let mut req = OutRequest::new("POST", &self.host, &self.path).body(body);
        for (k, v) in self.config.headers.iter().chain(headers) {
            req = req.header(k, v);
        }
        req = req.header("connection", "close");
        let never = AtomicBool::new(false);
        let (head, body) = self.roundtrip(&req, deadline, &never)?;
        Ok((head.status, body))
    }

    /// Trusts the CAs in `ca_pem` (instead of the system's) for an https peer.
    pub fn with_tls_roots(mut self, ca_pem: &[u8]) -> Result<Self, PeerError> {
        let roots = roots_from_pem(ca_pem).map_err(|e| PeerError::Config(format!("CA: {e}")))?;
        self.tls.roots = Some(roots);
        self.tls.config = OnceLock::new();
        Ok(self)
    }

    /// Presents this certificate chain and key to an https peer (mutual TLS).
    pub fn with_client_cert(mut self, chain_pem: &[u8], key_pem: &[u8]) -> Result<Self, PeerError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| PeerError::Config(format!("client certificate: {e}")))?;
        if chain.is_empty() {
            return Err(PeerError::Config(
                "client certificate: none in the PEM".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| PeerError::Config(format!("client key: {e}")))?;
        self.tls.client_cert = Some((chain, key));
        self.tls.config = OnceLock::new();
        Ok(self)
    }

    /// Sets how often `GetTask` polls: from `first`, growing to `max`.
    pub fn with_poll_interval(mut self, first: Duration, max: Duration) -> Self {
        self.first_poll = first.max(Duration::from_millis(1));
        self.max_poll = max.max(self.first_poll);
        self
    }

    /// Sends `req` and follows it until the peer's task settles or it answers a message.
    /// A failed send drops the cached card, so the next one reads it again.
    pub fn send(
        &self,
        req: OutboundSend,
        deadline: Instant,
        cancel: &AtomicBool,
    ) -> Result<PeerOutcome, PeerError> {
        let r = self.send_inner(req, deadline, cancel);
        if r.is_err() {
            self.forget_card();
        }
        r
    }

    /// The interface chosen on the peer's card (cached), or None if it serves no card.
    pub fn card(
        &self,
        deadline: Instant,
        cancel: &AtomicBool,
    ) -> Result<Option<SelectedInterface>, PeerError> {
        if let Some(e) = self.lock_cache().as_ref() {
            if Instant::now() < e.expires {
                return Ok(e.selected.clone());
            }
        }
        let mut req = OutRequest::new("GET", &self.host, wire::CARD_PATH)
            .header("Accept", "application/json")
            .header("Connection", "close");
        for (n, v) in &self.config.headers {
            req = req.header(n, v);
        }
        let (head, body) = self.roundtrip(&req, deadline, cancel)?;
        let selected = match head.status {
            200 => {
                let card = wire::parse_card(&body).map_err(PeerError::Card)?;
                Some(
                    wire::select_interface(&card, &self.config.endpoint)
                        .map_err(PeerError::Card)?,
                )
            }
            // No card served: §7.13 says stream, with no tenant.
            404 => None,
            _ => return Err(http_error(&head, &body)),
        };
        // A card read under an mTLS identity may be that identity's view: never cached.
        let ttl = if self.tls.client_cert.is_some() && matches!(self.dial, Dial::Https { .. }) {
            0
        } else {
            wire::card_ttl_secs(&head, self.same_host())
        };
        if ttl > 0 {
            *self.lock_cache() = Some(CardEntry {
                selected: selected.clone(),
                expires: Instant::now() + Duration::from_secs(ttl),
            });
        }
        Ok(selected)
    }

    /// Drops the cached card.
    /// The peer's configured name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn forget_card(&self) {
        *self.lock_cache() = None;
    }

    /// `GetTask` once.
    pub fn get_task(
        &self,
        task_id: &str,
        tenant: Option<&str>,
        deadline: Instant,
        cancel: &AtomicBool,
    ) -> Result<Task, PeerError> {
        self.get_task_traced(task_id, tenant, deadline, cancel, &[])
    }

    fn get_task_traced(
        &self,
        task_id: &str,
        tenant: Option<&str>,
        deadline: Instant,
        cancel: &AtomicBool,
        trace: &[(String, String)],
    ) -> Result<Task, PeerError> {
        let id = self.next_id();
        let req = self.rpc_request(wire::get_task_body(id, task_id, tenant), false, &[], trace);
        let (head, body) = self.roundtrip(&req, deadline, cancel)?;
        if head.status != 200 {
            return Err(http_error(&head, &body));
        }
        Ok(wire::decode_task_response(&body, id)?)
    }

    /// `CancelTask` once.
    pub fn cancel_task(
        &self,
        task_id: &str,
        tenant: Option<&str>,
        deadline: Instant,
    ) -> Result<Task, PeerError> {
        self.cancel_task_traced(task_id, tenant, deadline, &[])
    }

    fn cancel_task_traced(
        &self,
        task_id: &str,
        tenant: Option<&str>,
        deadline: Instant,
        trace: &[(String, String)],
    ) -> Result<Task, PeerError> {
        let id = self.next_id();
        let req = self.rpc_request(
            wire::cancel_task_body(id, task_id, tenant),
            false,
            &[],
            trace,
        );
        let (head, body) = self.roundtrip(&req, deadline, &AtomicBool::new(false))?;
        if head.status != 200 {
            return Err(http_error(&head, &body));
        }
        Ok(wire::decode_task_response(&body, id)?)
    }

    fn send_inner(
        &self,
        req: OutboundSend,
        deadline: Instant,
        cancel: &AtomicBool,
    ) -> Result<PeerOutcome, PeerError> {
        check(deadline, cancel)?;
        let selected = self.card(deadline, cancel)?;
        let tenant = selected.as_ref().and_then(|s| s.tenant.clone());
        let message_id = req
            .message_id
            .clone()
            .unwrap_or_else(|| agentd_core::ids::uuid_v4(&mut OsEntropy));
        let context = req.context_id.as_deref();
        let (message, extensions): (Message, &[&str]) = match req.body {
            OutboundBody::Message { parts } => {
                (wire::user_message(&message_id, parts, context), &[])
            }
            OutboundBody::Command { op, args } => (
                wire::command_message(&message_id, &op, args, context)?,
                &[COMMAND_URI],
            ),
        };
        let stream = match req.mode {
            SendMode::Auto => selected.as_ref().is_none_or(|s| s.streaming),
            SendMode::Stream => true,
            SendMode::Poll => false,
        };
        let trace = crate::telemetry::headers(req.trace.as_ref());
        let call = Call {
            message: &message,
            extensions,
            tenant: tenant.as_deref(),
            deadline,
            cancel,
            trace: &trace,
        };
        if stream {
            if let Some(outcome) = self.send_streaming(&call)? {
                return Ok(outcome);
            }
            // The peer does not stream after all: once more, unary (same messageId).
        }
        self.send_polling(&call)
    }

    /// `Ok(None)`: the stream was refused with -32004 before anything was accepted, so
    /// the caller may retry unary.
    fn send_streaming(&self, call: &Call<'_>) -> Result<Option<PeerOutcome>, PeerError> {
        let id = self.next_id();
        let opts = SendOptions {
            tenant: call.tenant.map(str::to_owned),
            ..SendOptions::default()
        };
        let req = self.rpc_request(
            wire::send_message_body(id, true, call.message, &opts),
            true,
            call.extensions,
            call.trace,
        );
        let mut head: Option<ResponseHead> = None;
        let mut sse = SseDecoder::new(MAX_EVENT_BYTES);
        let mut plain = Vec::new();
        let mut follow = Follow::default();
        let r = self.exchange(&req, call.deadline, call.cancel, |ev| match ev {
            ResponseEvent::Head(h) => {
                let is_sse =
                    h.status == 200 && h.media_type().as_deref() == Some("text/event-stream");
                head = Some(h);
                follow.sse = is_sse;
                Ok(true)
            }
            ResponseEvent::Data(d) if follow.sse => {
                sse.push(&d)
                    .map_err(|e| PeerError::Protocol(e.to_string()))?;
                while let Some(e) = sse.next_event() {
                    follow.event(&wire::decode_stream_event(&e.data, id)?);
                    if follow.done() {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            ResponseEvent::Data(d) => {
                plain.extend_from_slice(&d);
                Ok(true)
            }
            ResponseEvent::End { .. } => Ok(true),
        });
        let refused = |e: &PeerError| matches!(e, PeerError::Rpc { code, .. } if *code == UNSUPPORTED_OPERATION);
        if let Err(e) = r {
            if refused(&e) && follow.task.is_none() && follow.message.is_none() {
                return Ok(None);
            }
            return Err(self.interrupted(e, follow.task.as_ref().map(|t| t.id.as_str()), call));
        }
        let head = head.ok_or_else(|| PeerError::Protocol("no response head".into()))?;
        if !follow.sse {
            let answer = if head.status != 200 {
                Err(http_error(&head, &plain))
            } else {
                // A JSON answer to a stream request: an error, or a whole result at once.
                wire::decode_send_response(&plain, id).map_err(PeerError::from)
            };
            return match answer {
                Err(e) if refused(&e) => Ok(None),
                Err(e) => Err(e),
                Ok(SendResult::Message(m)) => Ok(Some(PeerOutcome::Message(m))),
                Ok(SendResult::Task(t)) => self.poll(t, call).map(Some),
            };
        }
        match (follow.task, follow.message) {
            (Some(t), _) => self.poll(t, call).map(Some),
            (None, Some(m)) => Ok(Some(PeerOutcome::Message(m))),
            (None, None) => Err(PeerError::Protocol(
                "the stream ended before any task or message".into(),
            )),
        }
    }

    fn send_polling(&self, call: &Call<'_>) -> Result<PeerOutcome, PeerError> {
        let id = self.next_id();
        let opts = SendOptions {
            tenant: call.tenant.map(str::to_owned),
            return_immediately: true,
            ..SendOptions::default()
        };
        let req = self.rpc_request(
            wire::send_message_body(id, false, call.message, &opts),
            false,
            call.extensions,
            call.trace,
        );
        let (head, body) = self
            .roundtrip(&req, call.deadline, call.cancel)
            .map_err(|e| self.interrupted(e, None, call))?;
        if head.status != 200 {
            return Err(http_error(&head, &body));
        }
        match wire::decode_send_response(&body, id)? {
            SendResult::Message(m) => Ok(PeerOutcome::Message(m)),
            SendResult::Task(t) => self.poll(t, call),
        }
    }

    /// Follows `task` with `GetTask` until it settles; returns it settled.
    fn poll(&self, mut task: Task, call: &Call<'_>) -> Result<PeerOutcome, PeerError> {
        let mut interval = self.first_poll;
        loop {
            if task.status.state.ends_a_turn() {
                return settled(task);
            }
            let step = pause(interval, call.deadline, call.cancel).and_then(|_| {
                self.get_task_traced(
                    &task.id,
                    call.tenant,
                    call.deadline,
                    call.cancel,
                    call.trace,
                )
            });
            match step {
                Ok(t) => task = t,
                Err(e) => return Err(self.interrupted(e, Some(&task.id), call)),
            }
            interval = (interval * 3 / 2).min(self.max_poll);
        }
    }

    /// On a cancel or timeout, tells the peer to cancel its task (best effort) and names it.
    fn interrupted(&self, e: PeerError, task_id: Option<&str>, call: &Call<'_>) -> PeerError {
        let task_id = task_id.map(str::to_owned);
        match e {
            PeerError::Timeout { .. } | PeerError::Canceled { .. } => {
                if let Some(id) = &task_id {
                    let _ = self.cancel_task_traced(
                        id,
                        call.tenant,
                        Instant::now() + CANCEL_GRACE,
                        call.trace,
                    );
                }
                if matches!(e, PeerError::Timeout { .. }) {
                    PeerError::Timeout { task_id }
                } else {
                    PeerError::Canceled { task_id }
                }
            }
            other => other,
        }
    }

    /// A JSON-RPC POST to the endpoint (`A2A-Version: 1.0`, the bearer token, the
    /// configured headers), for callers that build their own documents (the client CLI).
    pub fn rpc_request(
        &self,
        body: Vec<u8>,
        streaming: bool,
        extensions: &[&str],
        trace: &[(String, String)],
    ) -> OutRequest {
        let mut r = wire::rpc_request(&self.host, &self.path, body, streaming, extensions)
            .header("Connection", "close");
        for (n, v) in trace {
            r = r.header(n, v);
        }
        if let Some(token) = &self.config.bearer {
            r = r.header("Authorization", &format!("Bearer {token}"));
        }
        for (n, v) in &self.config.headers {
            r = r.header(n, v);
        }
        r
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Option<CardEntry>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unix sockets and loopback addresses are this host.
    fn same_host(&self) -> bool {
        match &self.dial {
            Dial::Unix(_) => true,
            Dial::Tcp(a) => a.ip().is_loopback(),
            Dial::Https { host, .. } => {
                host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            }
        }
    }

    /// The TLS configuration, built at the first https dial (the system roots are read
    /// then, unless [`PeerClient::with_tls_roots`] gave others).
    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, PeerError> {
        if let Some(c) = self.tls.config.get() {
            return Ok(c.clone());
        }
        let roots = match &self.tls.roots {
            Some(r) => r.clone(),
            None => system_roots()?,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PeerError::Config(format!("TLS: {e}")))?
            .with_root_certificates(roots);
        let mut config = match &self.tls.client_cert {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| PeerError::Config(format!("client certificate: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let _ = self.tls.config.set(config.clone());
        Ok(config)
    }

    fn connect(&self, deadline: Instant) -> Result<Conn, PeerError> {
        let remaining = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(PeerError::Timeout { task_id: None })?;
        let connect_err = |error| PeerError::Connect {
            endpoint: self.config.endpoint.clone(),
            error,
        };
        let refused = |ip: IpAddr| -> Result<(), PeerError> {
            match &self.address_filter {
                Some(f) => (f.0)(ip).map_err(|why| PeerError::Connect {
                    endpoint: self.config.endpoint.clone(),
                    error: io::Error::new(io::ErrorKind::PermissionDenied, why),
                }),
                None => Ok(()),
            }
        };
        match &self.dial {
            Dial::Tcp(addr) => {
                refused(addr.ip())?;
                let s = TcpStream::connect_timeout(addr, remaining).map_err(connect_err)?;
                let _ = s.set_nodelay(true);
                Ok(Conn::Tcp(s))
            }
            Dial::Unix(path) => Ok(Conn::Unix(UnixStream::connect(path).map_err(connect_err)?)),
            Dial::Https { host, port, name } => {
                let config = self.tls_config()?;
                let addrs: Vec<SocketAddr> = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(connect_err)?
                    .collect();
                let mut last = io::Error::new(io::ErrorKind::NotFound, "the name has no address");
                let mut first_refusal = None;
                for addr in addrs {
                    if let Err(e) = refused(addr.ip()) {
                        first_refusal.get_or_insert(e);
                        continue;
                    }
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        return Err(PeerError::Timeout { task_id: None });
                    }
                    match TcpStream::connect_timeout(&addr, remaining) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            let tls = rustls::ClientConnection::new(config, name.clone())
                                .map_err(|e| PeerError::Config(format!("TLS: {e}")))?;
                            return Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(tls, s))));
                        }
                        Err(e) => last = e,
                    }
                }
                if let Some(refusal) = first_refusal {
                    if last.kind() == io::ErrorKind::NotFound {
                        return Err(refusal);
                    }
                }
                Err(connect_err(last))
            }
        }
    }

    /// One request on a fresh connection; `on` sees every response event and returns false
    /// to stop reading early. Returns once the response ended or `on` stopped.
    pub fn exchange(
        &self,
        req: &OutRequest,
        deadline: Instant,
        cancel: &AtomicBool,
        mut on: impl FnMut(ResponseEvent) -> Result<bool, PeerError>,
    ) -> Result<(), PeerError> {
        let bytes = req.encode().map_err(|e| PeerError::Config(e.to_string()))?;
        check(deadline, cancel)?;
        let mut conn = self.connect(deadline)?;
        conn.set_write_timeout(Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        ))
        .map_err(PeerError::Io)?;
        conn.write_all(&bytes)
            .and_then(|_| conn.flush())
            .map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    PeerError::Timeout { task_id: None }
                }
                _ => PeerError::Io(e),
            })?;
        let mut parser = ResponseParser::new(self.limits);
        let mut buf = vec![0u8; 16 * 1024];
        let mut eof = false;
        loop {
            while let Some(ev) = parser
                .next_event()
                .map_err(|e| PeerError::Protocol(e.to_string()))?
            {
                let end = matches!(ev, ResponseEvent::End { .. });
                if !on(ev)? || end {
                    return Ok(());
                }
            }
            if eof {
                return Err(PeerError::Protocol(
                    "the connection closed before the response ended".into(),
                ));
            }
            check(deadline, cancel)?;
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), TICK);
            conn.set_read_timeout(Some(wait)).map_err(PeerError::Io)?;
            match conn.read(&mut buf) {
                Ok(0) => {
                    parser.eof();
                    eof = true;
                }
                Ok(n) => parser
                    .push(&buf[..n])
                    .map_err(|e| PeerError::Protocol(e.to_string()))?,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(PeerError::Io(e)),
            }
        }
    }

    /// One request, its whole response.
    pub fn roundtrip(
        &self,
        req: &OutRequest,
        deadline: Instant,
        cancel: &AtomicBool,
    ) -> Result<(ResponseHead, Vec<u8>), PeerError> {
        let mut head = None;
        let mut body = Vec::new();
        self.exchange(req, deadline, cancel, |ev| {
            match ev {
                ResponseEvent::Head(h) => head = Some(h),
                ResponseEvent::Data(d) => body.extend_from_slice(&d),
                ResponseEvent::End { .. } => {}
            }
            Ok(true)
        })?;
        let head = head.ok_or_else(|| PeerError::Protocol("no response head".into()))?;
        Ok((head, body))
    }
}

/// What one send carries through its steps.
struct Call<'a> {
    message: &'a Message,
    extensions: &'a [&'a str],
    tenant: Option<&'a str>,
    deadline: Instant,
    cancel: &'a AtomicBool,
    /// `traceparent` (and `tracestate`), on every request of the call.
    trace: &'a [(String, String)],
}

/// What a stream has told so far.
#[derive(Default)]
struct Follow {
    sse: bool,
    task: Option<Task>,
    message: Option<Message>,
}

impl Follow {
    fn event(&mut self, ev: &StreamResponse) {
        match (&mut self.task, ev) {
            (None, StreamResponse::Task(t)) => self.task = Some(t.clone()),
            (None, StreamResponse::Message(m)) => self.message = Some(m.clone()),
            // An update before any task: start from what it says.
            (None, StreamResponse::StatusUpdate(s)) => {
                self.task = Some(Task {
                    artifacts: Vec::new(),
                    context_id: s.context_id.clone(),
                    history: Vec::new(),
                    id: s.task_id.clone(),
                    metadata: None,
                    status: s.status.clone(),
                })
            }
            (None, StreamResponse::ArtifactUpdate(_)) => {}
            (Some(t), ev) => {
                wire::apply_update(t, ev);
            }
        }
    }

    /// The stream has said all it needs to: a settled task, or a message and no task.
    fn done(&self) -> bool {
        match &self.task {
            Some(t) => t.status.state.ends_a_turn(),
            None => self.message.is_some(),
        }
    }
}

/// A settled task as an outcome: completed or interrupted is an answer, the other terminal
/// states are the peer's failure.
fn settled(task: Task) -> Result<PeerOutcome, PeerError> {
    match task.status.state {
        TaskState::Failed | TaskState::Rejected | TaskState::Canceled => {
            Err(PeerError::TaskFailed(Box::new(task)))
        }
        _ => Ok(PeerOutcome::Task(task)),
    }
}

fn check(deadline: Instant, cancel: &AtomicBool) -> Result<(), PeerError> {
    if cancel.load(Ordering::SeqCst) {
        return Err(PeerError::Canceled { task_id: None });
    }
    if Instant::now() >= deadline {
        return Err(PeerError::Timeout { task_id: None });
    }
    Ok(())
}

/// Sleeps `d`, waking every [`TICK`] to look at the flag and the deadline.
fn pause(d: Duration, deadline: Instant, cancel: &AtomicBool) -> Result<(), PeerError> {
    let until = Instant::now() + d;
    loop {
        check(deadline, cancel)?;
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        std::thread::sleep((until - now).min(TICK).min(deadline - now));
    }
}

/// A non-200 answer: a JSON-RPC error when the body is one (401/403 carry theirs), else the
/// status and the start of the body.
fn http_error(head: &ResponseHead, body: &[u8]) -> PeerError {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if let Some(e) = v.get("error").filter(|e| e.get("code").is_some()) {
            return PeerError::Rpc {
                code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                data: e.get("data").cloned(),
            };
        }
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
    PeerError::Http {
        status: head.status,
        reason: head.reason.clone(),
        body: text.trim().to_owned(),
    }
}

/// `http://host:port[/path]` (host a loopback IP or `localhost`), `https://host[:port][/path]`
/// or `unix:///path`: the dial, the Host header and the JSON-RPC path.
fn parse_endpoint(endpoint: &str) -> Result<(Dial, String, String), PeerError> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(PeerError::Config(format!(
                "{endpoint}: a unix peer is unix:///absolute/path"
            )));
        }
        return Ok((
            Dial::Unix(PathBuf::from(path)),
            "localhost".into(),
            "/".into(),
        ));
    }
    let (rest, tls) = if let Some(r) = endpoint.strip_prefix("https://") {
        (r, true)
    } else if let Some(r) = endpoint.strip_prefix("http://") {
        (r, false)
    } else {
        return Err(PeerError::Config(format!(
            "{endpoint}: a peer endpoint is https://host/, http://127.0.0.1:PORT/ or unix:///path"
        )));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    // A query is part of the resource (webhooks carry them); a fragment never leaves the
    // client, and user info would put a credential in a URL.
    if path.contains('#') || authority.contains('@') {
        return Err(PeerError::Config(format!(
            "{endpoint}: an endpoint has no user info or fragment"
        )));
    }
    let default_port = if tls { 443 } else { 80 };
    let port_of = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| PeerError::Config(format!("{endpoint}: bad port {p:?}")))
    };
    // A bracketed IPv6 literal holds colons of its own: the port, if any, follows the `]`.
    let (host, port) = if authority.starts_with('[') {
        match authority.split_once(']') {
            Some((h, "")) => (&authority[..=h.len()], default_port),
            Some((h, rest)) => match rest.strip_prefix(':') {
                Some(p) => (&authority[..=h.len()], port_of(p)?),
                None => {
                    return Err(PeerError::Config(format!(
                        "{endpoint}: nothing may follow an IPv6 literal but :port"
                    )))
                }
            },
            None => {
                return Err(PeerError::Config(format!(
                    "{endpoint}: an IPv6 literal is closed with ]"
                )))
            }
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, port_of(p)?),
            None => (authority, default_port),
        }
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match bare {
        "localhost" => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        h => h.parse::<IpAddr>().ok(),
    };
    let dial = if tls {
        let name = match bare.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(bare.to_owned()).map_err(|_| {
                PeerError::Config(format!("{endpoint}: {bare:?} is not a host name"))
            })?,
        };
        Dial::Https {
            host: bare.to_owned(),
            port,
            name,
        }
    } else {
        let ip = ip.ok_or_else(|| {
            PeerError::Config(format!(
                "{endpoint}: plain http:// peers must be a loopback address (127.0.0.1, [::1] or localhost)"
            ))
        })?;
        if !ip.is_loopback() && ip != IpAddr::V6(Ipv6Addr::LOCALHOST) {
            return Err(PeerError::Config(format!(
                "{endpoint}: plain http:// is only for loopback peers; a remote peer needs https://"
            )));
        }
        Dial::Tcp(SocketAddr::new(ip, port))
    };
    Ok((dial, authority.to_owned(), path.to_owned()))
}

/// A connected socket: TCP, TLS over TCP, or unix.
enum Conn {
    Tcp(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
    Unix(UnixStream),
}

impl Conn {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(d),
            Conn::Tls(s) => s.sock.set_read_timeout(d),
            Conn::Unix(s) => s.set_read_timeout(d),
        }
    }

    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_write_timeout(d),
            Conn::Tls(s) => s.sock.set_write_timeout(d),
            Conn::Unix(s) => s.set_write_timeout(d),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Tls(s) => match s.read(buf) {
                // A peer that closes without close_notify: the parser still knows whether
                // the response was complete (length or chunk framing), so call it EOF.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                r => r,
            },
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
            Conn::Unix(s) => s.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let ok = |e: &str| parse_endpoint(e).map(|(_, h, p)| (h, p)).unwrap();
        assert_eq!(
            ok("http://127.0.0.1:8420"),
            ("127.0.0.1:8420".into(), "/".into())
        );
        assert_eq!(
            ok("http://127.0.0.1:8420/a2a"),
            ("127.0.0.1:8420".into(), "/a2a".into())
        );
        assert_eq!(ok("http://[::1]:9/"), ("[::1]:9".into(), "/".into()));
        // A bracketed IPv6 literal without a port takes the scheme's (it was read as the
        // port "1]" before).
        assert_eq!(ok("http://[::1]/a2a"), ("[::1]".into(), "/a2a".into()));
        assert!(matches!(
            parse_endpoint("https://[2001:db8::1]/").map(|(d, _, _)| d),
            Ok(Dial::Https { port: 443, .. })
        ));
        assert_eq!(ok("http://localhost/"), ("localhost".into(), "/".into()));
        assert_eq!(ok("unix:///run/a.sock"), ("localhost".into(), "/".into()));
        // A webhook keeps its query.
        assert_eq!(
            ok("http://127.0.0.1/hook?k=1"),
            ("127.0.0.1".into(), "/hook?k=1".into())
        );
        for bad in [
            "http://10.0.0.1:80/",
            "http://example.com/",
            "http://127.0.0.1:99999/",
            "unix://relative",
            "ftp://x",
            "http://127.0.0.1/#frag",
            "http://user@127.0.0.1/",
            "http://[::1/",
            "http://[::1]x/",
            "http://[::1]:bad/",
        ] {
            assert!(
                matches!(parse_endpoint(bad), Err(PeerError::Config(_))),
                "{bad}"
            );
        }
        assert_eq!(
            ok("https://peer.example/a2a"),
            ("peer.example".into(), "/a2a".into())
        );
        assert_eq!(
            ok("https://10.0.0.1:8443"),
            ("10.0.0.1:8443".into(), "/".into())
        );
        assert!(matches!(
            parse_endpoint("https://bad name/"),
            Err(PeerError::Config(_))
        ));
    }

    #[test]
    fn config_headers_are_checked_up_front() {
        let cfg = |headers: Vec<(&str, &str)>, bearer: Option<&str>| PeerConfig {
            name: "p".into(),
            endpoint: "http://127.0.0.1:1/".into(),
            bearer: bearer.map(Into::into),
            headers: headers
                .into_iter()
                .map(|(a, b)| (a.into(), b.into()))
                .collect(),
        };
        assert!(PeerClient::new(cfg(vec![("X-Trace", "1")], Some("tok"))).is_ok());
        for bad in [
            cfg(vec![("X", "a\r\nB: c")], None),
            cfg(vec![("A2A-Extensions", "x")], None),
            cfg(vec![("Authorization", "x")], Some("t")),
            cfg(vec![], Some("t\n")),
        ] {
            assert!(matches!(PeerClient::new(bad), Err(PeerError::Config(_))));
        }
    }
}
