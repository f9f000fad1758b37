//! Webhook delivery for push notifications: the host side of the core's
//! `Effect::Deliver`. Each delivery POSTs the task to its webhook, with the SSRF check
//! repeated on the addresses the URL's host resolves to, and retries with exponential
//! backoff until a bound; a delivery that gives up is logged as `a2a.push.failed`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentd_core::push::{check_address, PushPolicy};

use super::peer::{AddressFilter, PeerClient, PeerConfig, PeerError};

/// How deliveries are made (`[a2a.push]`).
#[derive(Clone, Debug)]
pub struct DeliveryOptions {
    pub policy: PushPolicy,
    /// Attempts before giving up.
    pub max_attempts: u32,
    /// The wait before the second attempt; it doubles each time, up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// One attempt's deadline.
    pub timeout: Duration,
    /// PEM CAs to trust for https webhooks (default: the system's).
    pub ca: Option<Vec<u8>>,
    /// Deliveries made at once (worker threads, started as needed).
    pub workers: usize,
    /// Deliveries waiting for a worker; past it a delivery is given up at once.
    pub queue: usize,
}

impl Default for DeliveryOptions {
    fn default() -> Self {
        DeliveryOptions {
            policy: PushPolicy::default(),
            max_attempts: 5,
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            ca: None,
            workers: 4,
            queue: 1024,
        }
    }
}

/// One webhook call.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub task_id: String,
    pub config_id: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The trace of the request that handed the task out: the delivery's `traceparent`
    /// names its client span (or, with no exporter, this context as is).
    pub trace: Option<agentd_core::trace::TraceContext>,
}

/// How a delivery ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The webhook answered 2xx on this attempt.
    Delivered { attempts: u32, status: u16 },
    /// Given up: why, after how many attempts.
    Failed { attempts: u32, error: String },
}

/// Delivers one notification, retrying as the options say. Blocks: run it on a worker.
/// Every attempt carries the delivery's `traceparent`; the delivery is one client span.
pub fn deliver(d: &Delivery, opts: &DeliveryOptions) -> Outcome {
    use agentd_core::trace::AttrValue;
    let span = crate::telemetry::WorkSpan::client(
        d.trace.as_ref(),
        "webhook".into(),
        vec![
            ("a2a.task_id", AttrValue::Str(d.task_id.clone())),
            ("agentd.push_config_id", AttrValue::Str(d.config_id.clone())),
        ],
    );
    let mut headers = d.headers.clone();
    headers.extend(crate::telemetry::headers(span.context()));
    let outcome = deliver_with(d, &headers, opts);
    span.end(match &outcome {
        Outcome::Delivered { .. } => None,
        Outcome::Failed { error, .. } => Some(error.clone()),
    });
    outcome
}

fn deliver_with(d: &Delivery, headers: &[(String, String)], opts: &DeliveryOptions) -> Outcome {
    let policy = opts.policy;
    let filter = AddressFilter(Arc::new(move |ip| {
        check_address(ip, policy).map_err(String::from)
    }));
    let client = PeerClient::new(PeerConfig {
        name: format!("webhook {}", d.config_id),
        endpoint: d.url.clone(),
        bearer: None,
        headers: Vec::new(),
    })
    .map(|c| c.with_address_filter(filter));
    let client = match (client, &opts.ca) {
        (Ok(c), Some(ca)) => c.with_tls_roots(ca),
        (c, _) => c,
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            return Outcome::Failed {
                attempts: 0,
                error: e.to_string(),
            }
        }
    };
    let mut backoff = opts.first_backoff;
    let mut last = String::new();
    for attempt in 1..=opts.max_attempts.max(1) {
        let deadline = Instant::now() + opts.timeout;
        match client.post(headers, d.body.clone(), deadline) {
            Ok((status, _)) if (200..300).contains(&status) => {
                return Outcome::Delivered {
                    attempts: attempt,
                    status,
                }
            }
            Ok((status, body)) => {
                last = format!(
                    "the webhook answered {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                );
                // A refusal that says the request itself is wrong will not change.
                if (400..500).contains(&status) && status != 408 && status != 429 {
                    return Outcome::Failed {
                        attempts: attempt,
                        error: last,
                    };
                }
            }
            Err(e) => {
                last = e.to_string();
                // An address the policy forbids stays forbidden.
                if let PeerError::Connect { error, .. } = &e {
                    if error.kind() == std::io::ErrorKind::PermissionDenied {
                        return Outcome::Failed {
                            attempts: attempt,
                            error: last,
                        };
                    }
                }
            }
        }
        if attempt < opts.max_attempts {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(opts.max_backoff);
        }
    }
    Outcome::Failed {
        attempts: opts.max_attempts,
        error: last,
    }
}

/// Webhook deliveries by outcome since start: delivered (a 2xx), failed (gave up after its
/// attempts, or refused at delivery), dropped (the queue was full, or no worker could start).
#[derive(Debug, Default)]
pub struct PushCounts {
    pub delivered: AtomicU64,
    pub failed: AtomicU64,
    pub dropped: AtomicU64,
}

/// The deliveries in flight: at most `workers` threads, fed from a queue of at most `queue`
/// deliveries. A webhook that never answers holds one worker for its attempts and backoffs
/// (about a minute with the defaults), so a thread per delivery would let a slow webhook
/// grow threads with the request rate; here it only makes the queue wait, and a delivery
/// that finds the queue full is given up at once (`a2a.push.failed`).
pub struct DeliveryPool {
    opts: Arc<DeliveryOptions>,
    /// Deliveries by outcome, for `/metrics`.
    pub counts: Arc<PushCounts>,
    tx: SyncSender<Delivery>,
    rx: Arc<Mutex<Receiver<Delivery>>>,
    /// Workers started so far; they start on demand and then stay.
    started: usize,
}

impl DeliveryPool {
    pub fn new(opts: Arc<DeliveryOptions>) -> DeliveryPool {
        let (tx, rx) = mpsc::sync_channel(opts.queue.max(1));
        DeliveryPool {
            opts,
            counts: Arc::default(),
            tx,
            rx: Arc::new(Mutex::new(rx)),
            started: 0,
        }
    }

    /// Queues a delivery, starting a worker while fewer than `workers` run.
    pub fn submit(&mut self, d: Delivery) {
        if self.started < self.opts.workers.max(1) {
            let (rx, opts, counts) = (self.rx.clone(), self.opts.clone(), self.counts.clone());
            match std::thread::Builder::new()
                .name("agentd-push".into())
                .spawn(move || work(&rx, &opts, &counts))
            {
                Ok(_) => self.started += 1,
                Err(e) if self.started == 0 => {
                    self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(task = %d.task_id, config = %d.config_id, url = %d.url, error = %e, "a2a.push.failed: no worker thread");
                    return;
                }
                // Workers already run: they will take it.
                Err(_) => {}
            }
        }
        match self.tx.try_send(d) {
            Ok(()) => {}
            Err(TrySendError::Full(d)) | Err(TrySendError::Disconnected(d)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    task = %d.task_id, config = %d.config_id, url = %d.url, attempts = 0u32,
                    error = %format!("{} deliveries are already waiting (a2a.push.queue)", self.opts.queue),
                    "a2a.push.failed"
                );
            }
        }
    }
}

/// A worker: takes deliveries one at a time until the pool is dropped.
fn work(rx: &Mutex<Receiver<Delivery>>, opts: &DeliveryOptions, counts: &PushCounts) {
    loop {
        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(d) = next else { return };
        match deliver(&d, opts) {
            Outcome::Delivered { attempts, status } => {
                counts.delivered.fetch_add(1, Ordering::Relaxed);
                tracing::info!(task = %d.task_id, config = %d.config_id, attempts, status, "a2a.push.delivered");
            }
            Outcome::Failed { attempts, error } => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(task = %d.task_id, config = %d.config_id, url = %d.url, attempts, %error, "a2a.push.failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_resolves_to_loopback_is_refused_at_delivery() {
        // The core refuses `localhost` by name at registration; a name that resolves there
        // anyway is caught here, on the resolved address.
        let d = Delivery {
            task_id: "t".into(),
            config_id: "c".into(),
            url: "https://localhost:9/hook".into(),
            headers: Vec::new(),
            body: b"{}".to_vec(),
            trace: None,
        };
        let opts = DeliveryOptions {
            first_backoff: Duration::from_millis(1),
            ..DeliveryOptions::default()
        };
        match deliver(&d, &opts) {
            Outcome::Failed { attempts, error } => {
                assert_eq!(attempts, 1, "a forbidden address is not retried");
                assert!(error.contains("allow_private"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }
}
