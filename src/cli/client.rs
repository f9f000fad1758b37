//! One server, as the client subcommands talk to it: the daemon's own peer client
//! ([`agentd::runtime::peer::PeerClient`], on the core's sans-io HTTP client) moves the bytes
//! (http, https, mutual TLS, bearer, unix sockets); this builds the JSON-RPC documents and
//! reads the answers as plain JSON, so that nothing a server answers can panic the client.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use agentd::runtime::peer::{PeerClient, PeerConfig, PeerError, MAX_EVENT_BYTES};
use agentd_core::client::a2a::CARD_PATH;
use agentd_core::client::{OutRequest, ResponseEvent, SseDecoder};
use serde_json::{json, Map, Value};

use super::args::Common;
use super::Failure;

/// How long a unary call may take unless `--timeout` says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a stream may stay open unless `--timeout` says otherwise.
const STREAM_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

pub struct Client {
    peer: PeerClient,
    /// The `Host` header of the card request.
    host: String,
    timeout: Option<Duration>,
    next_id: u64,
    /// The interface's tenant, read from the card at the first call.
    tenant: Option<Option<String>>,
    bearer: Option<String>,
    never: AtomicBool,
}

/// How a stream stopped.
#[derive(Debug)]
pub enum StreamEnd {
    /// The handler said the stream has told all (a final state, or a message).
    Finished,
    /// The server closed the stream cleanly before that.
    Closed,
    /// The connection broke (or could not be made) after the stream had started: why.
    Dropped(String),
}

impl Client {
    pub fn new(c: &Common) -> Result<Client, Failure> {
        let config = PeerConfig {
            name: "agentd-cli".into(),
            endpoint: c.url.clone(),
            bearer: c.bearer.clone(),
            headers: Vec::new(),
        };
        let mut peer = PeerClient::new(config).map_err(|e| match e {
            PeerError::Config(why) => Failure::Usage(why),
            other => Failure::from(other),
        })?;
        if let Some(ca) = &c.ca {
            let pem = std::fs::read(ca)
                .map_err(|e| Failure::Usage(format!("--ca {}: {e}", ca.display())))?;
            peer = peer.with_tls_roots(&pem).map_err(usage)?;
        }
        if let Some((cert, key)) = &c.client_cert {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|e| Failure::Usage(format!("{}: {e}", p.display())))
            };
            peer = peer
                .with_client_cert(&read(cert)?, &read(key)?)
                .map_err(usage)?;
        }
        let host = if c.url.starts_with("unix:") {
            "localhost".to_owned()
        } else {
            let rest = c.url.split_once("://").map_or("", |(_, r)| r);
            rest.split('/').next().unwrap_or_default().to_owned()
        };
        Ok(Client {
            peer,
            host,
            timeout: c.timeout,
            next_id: 1,
            tenant: None,
            bearer: c.bearer.clone(),
            never: AtomicBool::new(false),
        })
    }

    fn deadline(&self, stream: bool) -> Instant {
        let d = self.timeout.unwrap_or(if stream {
            STREAM_TIMEOUT
        } else {
            DEFAULT_TIMEOUT
        });
        Instant::now() + d
    }

    /// The card as served (`GET /.well-known/agent-card.json` at the URL's origin).
    pub fn card(&mut self) -> Result<Value, Failure> {
        let req = OutRequest::new("GET", &self.host, CARD_PATH)
            .header("Accept", "application/json")
            .header("A2A-Version", "1.0")
            .header("Connection", "close");
        let (head, body) = self
            .peer
            .roundtrip(&req, self.deadline(false), &self.never)?;
        if head.status != 200 {
            return Err(Failure::BadAnswer(format!(
                "the agent card answered HTTP {} {}",
                head.status, head.reason
            )));
        }
        let card: Value = serde_json::from_slice(&body)
            .map_err(|e| Failure::BadAnswer(format!("the agent card is not JSON: {e}")))?;
        if !card.is_object() {
            return Err(Failure::BadAnswer(
                "the agent card is not a JSON object".into(),
            ));
        }
        Ok(card)
    }

    /// A plain HTTP request to a path at the URL's origin (the OAuth endpoints): its status
    /// and its body as JSON (`Null` when it is not JSON). `form` is sent as
    /// `application/x-www-form-urlencoded`.
    pub fn http_json(&mut self, path: &str, form: Option<&str>) -> Result<(u16, Value), Failure> {
        let mut req = OutRequest::new(
            if form.is_some() { "POST" } else { "GET" },
            &self.host,
            path,
        )
        .header("Accept", "application/json")
        .header("Connection", "close");
        if let Some(f) = form {
            req = req
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(f.as_bytes().to_vec());
        }
        let (head, body) = self
            .peer
            .roundtrip(&req, self.deadline(false), &self.never)?;
        Ok((
            head.status,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        ))
    }

    /// The tenant of the interface the card offers for this URL (read once).
    fn tenant(&mut self) -> Result<Option<String>, Failure> {
        if let Some(t) = &self.tenant {
            return Ok(t.clone());
        }
        let selected = self.peer.card(self.deadline(false), &self.never)?;
        let t = selected.and_then(|s| s.tenant);
        self.tenant = Some(t.clone());
        Ok(t)
    }

    /// Whether the card says the server streams (false when it serves no card).
    pub fn streams(&mut self) -> Result<bool, Failure> {
        Ok(self
            .peer
            .card(self.deadline(false), &self.never)?
            .is_some_and(|s| s.streaming))
    }

    fn body(
        &mut self,
        method: &str,
        mut params: Map<String, Value>,
    ) -> Result<(u64, Vec<u8>), Failure> {
        if let Some(t) = self.tenant()? {
            params.insert("tenant".into(), Value::String(t));
        }
        let id = self.next_id;
        self.next_id += 1;
        let doc = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        Ok((id, serde_json::to_vec(&doc).unwrap_or_default()))
    }

    /// One JSON-RPC call; its `result`.
    pub fn call(&mut self, method: &str, params: Map<String, Value>) -> Result<Value, Failure> {
        self.call_ext(method, params, &[])
    }

    /// One JSON-RPC call with `extensions` activated (`A2A-Extensions`); its `result`.
    pub fn call_ext(
        &mut self,
        method: &str,
        params: Map<String, Value>,
        extensions: &[&str],
    ) -> Result<Value, Failure> {
        let (id, body) = self.body(method, params)?;
        let req = self.peer.rpc_request(body, false, extensions, &[]);
        let (head, body) = self
            .peer
            .roundtrip(&req, self.deadline(false), &self.never)?;
        let doc = serde_json::from_slice::<Value>(&body).ok();
        match doc {
            Some(doc) => result_of(doc, Some(id), head.status),
            None => Err(Failure::BadAnswer(format!(
                "HTTP {} {}: the answer is not JSON{}",
                head.status,
                head.reason,
                snippet(&body)
            ))),
        }
    }

    /// One streaming JSON-RPC call (`SendStreamingMessage`, `SubscribeToTask`): each
    /// result goes to `on` with the SSE id of its frame, until `on` answers false. A JSON
    /// answer instead of a stream is a refusal, or a whole result (given to `on` once).
    pub fn stream(
        &mut self,
        method: &str,
        params: Map<String, Value>,
        last_event_id: Option<&str>,
        on: impl FnMut(Value, Option<&str>) -> Result<bool, Failure>,
    ) -> Result<StreamEnd, Failure> {
        self.stream_ext(method, params, last_event_id, &[], on)
    }

    /// [`Client::stream`] with `extensions` activated (`A2A-Extensions`).
    pub fn stream_ext(
        &mut self,
        method: &str,
        params: Map<String, Value>,
        last_event_id: Option<&str>,
        extensions: &[&str],
        mut on: impl FnMut(Value, Option<&str>) -> Result<bool, Failure>,
    ) -> Result<StreamEnd, Failure> {
        let (id, body) = match self.body(method, params) {
            Ok(b) => b,
            // The card could not be read: as dropped as the stream itself, for a reconnect.
            Err(Failure::Connect(why)) if last_event_id.is_some() => {
                return Ok(StreamEnd::Dropped(why))
            }
            Err(e) => return Err(e),
        };
        let mut req = self.peer.rpc_request(body, true, extensions, &[]);
        if let Some(last) = last_event_id {
            req = req.header("Last-Event-ID", last);
        }
        let mut status = 0;
        let mut sse: Option<SseDecoder> = None;
        let mut plain = Vec::new();
        let mut failed: Option<Failure> = None;
        let mut finished = false;
        let mut frames = 0usize;
        let r = self
            .peer
            .exchange(&req, self.deadline(true), &self.never, |ev| {
                match ev {
                    ResponseEvent::Head(h) => {
                        status = h.status;
                        if h.status == 200 && h.media_type().as_deref() == Some("text/event-stream")
                        {
                            sse = Some(SseDecoder::new(MAX_EVENT_BYTES));
                        }
                    }
                    ResponseEvent::Data(d) => match &mut sse {
                        Some(dec) => {
                            if let Err(e) = dec.push(&d) {
                                failed = Some(Failure::BadAnswer(e.to_string()));
                                return Err(PeerError::Protocol(String::new()));
                            }
                            while let Some(e) = dec.next_event() {
                                frames += 1;
                                let step = serde_json::from_str::<Value>(&e.data)
                                    .map_err(|err| {
                                        Failure::BadAnswer(format!(
                                            "a stream frame is not JSON: {err}"
                                        ))
                                    })
                                    .and_then(|doc| result_of(doc, Some(id), 200))
                                    .and_then(|result| on(result, e.id()));
                                match step {
                                    Ok(true) => {}
                                    Ok(false) => {
                                        finished = true;
                                        return Ok(false);
                                    }
                                    Err(f) => {
                                        failed = Some(f);
                                        return Err(PeerError::Protocol(String::new()));
                                    }
                                }
                            }
                        }
                        None => plain.extend_from_slice(&d),
                    },
                    ResponseEvent::End { .. } => {}
                }
                Ok(true)
            });
        if let Some(f) = failed {
            return Err(f);
        }
        if finished {
            return Ok(StreamEnd::Finished);
        }
        match r {
            Ok(()) if sse.is_some() => Ok(StreamEnd::Closed),
            Ok(()) => {
                let doc = serde_json::from_slice::<Value>(&plain).map_err(|_| {
                    Failure::BadAnswer(format!(
                        "HTTP {status}: the answer is neither a stream nor JSON{}",
                        snippet(&plain)
                    ))
                })?;
                let result = result_of(doc, Some(id), status)?;
                on(result, None)?;
                Ok(StreamEnd::Finished)
            }
            // A broken stream, or one that could not be opened again: reconnectable.
            Err(e @ (PeerError::Io(_) | PeerError::Protocol(_))) if sse.is_some() || frames > 0 => {
                Ok(StreamEnd::Dropped(e.to_string()))
            }
            Err(e @ PeerError::Connect { .. }) if last_event_id.is_some() => {
                Ok(StreamEnd::Dropped(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Client {
    /// The interface's tenant as read from the card (none when it has none, or no card).
    pub fn tenant_of_card(&mut self) -> Result<Option<String>, Failure> {
        self.tenant()
    }

    /// A POST of `body` to the JSON-RPC endpoint with only the `headers` given (and the
    /// bearer token): the HTTP status and the body as read. For `probe`,
    /// which sends what a well-behaved client would not (another `A2A-Version`, none).
    pub fn raw_post(
        &mut self,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<(u16, Vec<u8>), Failure> {
        let mut h: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        if let Some(token) = &self.bearer {
            h.push(("Authorization".into(), format!("Bearer {token}")));
        }
        Ok(self.peer.post(&h, body, self.deadline(false))?)
    }
}

fn usage(e: PeerError) -> Failure {
    match e {
        PeerError::Config(why) => Failure::Usage(why),
        other => other.into(),
    }
}

/// The start of a body that is not what it should be, for the error message.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// A JSON-RPC response document's `result`, or its error as a [`Failure::Rpc`].
pub fn result_of(doc: Value, id: Option<u64>, status: u16) -> Result<Value, Failure> {
    let Value::Object(mut doc) = doc else {
        return Err(Failure::BadAnswer("the answer is not a JSON object".into()));
    };
    if let Some(e) = doc.get("error") {
        return Err(Failure::rpc(e));
    }
    if status != 200 {
        return Err(Failure::BadAnswer(format!(
            "HTTP {status} without a JSON-RPC error"
        )));
    }
    if let (Some(want), Some(got)) = (id, doc.get("id")) {
        if got.as_u64() != Some(want) && got.as_str() != Some(want.to_string().as_str()) {
            return Err(Failure::BadAnswer(format!(
                "the answer's id is {got}, not {want}"
            )));
        }
    }
    doc.remove("result")
        .ok_or_else(|| Failure::BadAnswer("the answer has neither result nor error".into()))
}
