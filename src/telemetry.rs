//! Traces: the spans the daemon records and their export over OTLP/HTTP (`[telemetry]`).
//!
//! - Server spans: the core gives every A2A request span ids when the instance traces
//!   requests ([`agentd_core::Instance::set_trace_requests`]); the drivers hand each request
//!   record to [`on_record`] (registered with [`agentd_io_common::log::set_record_sink`]),
//!   which makes the span with this process's clock ([`agentd_core::trace::server_span`]).
//! - Client spans: each outbound peer call (`a2a.send`, `a2a.delegate`) and webhook delivery
//!   ([`WorkSpan::client`]), whose id is the parent the callee sees in `traceparent`; and an
//!   internal span per exec step ([`WorkSpan::internal`]), the parent its program's
//!   `TRACEPARENT` names.
//!
//! The exporter is one background thread that POSTs batches (`application/json`, the OTLP
//! JSON mapping, [`agentd_core::trace::encode_traces`]) to `<otlp_endpoint>/v1/traces` with
//! the core's own HTTP client (through [`crate::runtime::peer::PeerClient`]): no tokio, hyper
//! or other HTTP client is linked. Recording a span never blocks: it goes to a queue of at
//! most [`QUEUE_SPANS`] spans, and a span that finds it full is dropped and counted
//! (`agentd_trace_spans_dropped_total{reason="queue-full"}`). A batch the collector does not
//! take (an error, a non-2xx, no answer within [`EXPORT_TIMEOUT`]) is dropped and counted
//! (`reason="export-failed"`), never retried: a collector that is down must not grow the
//! daemon. At shutdown, [`flush`] sends what is queued, best effort, within a bound.
//!
//! Without `[telemetry]` nothing is recorded or exported, and the context is still carried
//! on unchanged (a caller's `traceparent` reaches the agent, exec steps and outbound calls).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentd_core::metrics::{Kind, MetricsSource, MetricsWriter};
use agentd_core::reqlog::{Phase, RequestRecord};
use agentd_core::trace::{self, AttrValue, Span, SpanKind, TraceContext};
use agentd_io_common::OsEntropy;

use crate::runtime::peer::{PeerClient, PeerConfig};

/// Spans waiting for the exporter; past it a span is dropped and counted.
pub const QUEUE_SPANS: usize = 4096;
/// Spans in one export request.
pub const BATCH_SPANS: usize = 512;
/// How long spans wait to be batched before they are sent anyway.
pub const EXPORT_INTERVAL: Duration = Duration::from_secs(1);
/// One export request's deadline.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// `[telemetry]`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// The collector's base URL (`http://host:port`, optionally with a path prefix), without
    /// a trailing slash; spans go to `<it>/v1/traces`.
    pub otlp_endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
}

/// What the exporter counted since start.
#[derive(Debug, Default)]
pub struct TraceCounts {
    /// Spans the collector took (a 2xx answer to their batch).
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Spans dropped because their batch failed.
    pub dropped_export_failed: AtomicU64,
}

struct Exporter {
    service_name: String,
    client: PeerClient,
    queue: Mutex<Queue>,
    wake: Condvar,
    counts: Arc<TraceCounts>,
    /// The thread, taken by [`flush`].
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct Queue {
    spans: VecDeque<Span>,
    closing: bool,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

/// Checks a configured collector endpoint: `http://` a loopback address (a collector or
/// agent on this host), or `https://` any host (the system's CAs), optionally with a path
/// prefix. Returns it without a trailing slash.
pub fn check_endpoint(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
    let (authority, _) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() || rest.contains(['?', '#']) {
        return Err(format!("{url:?} is not http(s)://host:port[/path]"));
    }
    let base = url.trim_end_matches('/').to_owned();
    PeerClient::new(peer_config(&base)).map_err(|e| format!("{url:?}: {e}"))?;
    Ok(base)
}

fn peer_config(base: &str) -> PeerConfig {
    PeerConfig {
        name: "otlp collector".into(),
        endpoint: format!("{base}/v1/traces"),
        bearer: None,
        headers: Vec::new(),
    }
}

/// Starts the exporter (once per process); from now on spans are recorded and sent. Returns
/// the counters, for `/metrics`.
pub fn start(settings: &TelemetrySettings) -> Result<Arc<TraceCounts>, String> {
    let client = PeerClient::new(peer_config(&settings.otlp_endpoint))
        .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
    let counts = Arc::new(TraceCounts::default());
    let exporter = Exporter {
        service_name: settings.service_name.clone(),
        client,
        queue: Mutex::new(Queue::default()),
        wake: Condvar::new(),
        counts: counts.clone(),
        thread: Mutex::new(None),
    };
    if EXPORTER.set(exporter).is_err() {
        return Err("the exporter is already started".into());
    }
    let handle = std::thread::Builder::new()
        .name("agentd-otlp".into())
        .spawn(export_loop)
        .map_err(|e| format!("exporter thread: {e}"))?;
    if let Some(e) = EXPORTER.get() {
        *e.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }
    tracing::info!(endpoint = %settings.otlp_endpoint, service = %settings.service_name, "exporting spans over OTLP/HTTP");
    Ok(counts)
}

/// Whether spans are recorded (an exporter runs).
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Queues a finished span for export; never blocks. A span of an unsampled trace is not
/// recorded; with no exporter, nothing is.
pub fn record(span: Span, sampled: bool) {
    let Some(e) = EXPORTER.get() else {
        return;
    };
    if !sampled {
        return;
    }
    let mut q = e.queue.lock().unwrap_or_else(|p| p.into_inner());
    if q.closing || q.spans.len() >= QUEUE_SPANS {
        e.counts.dropped_queue_full.fetch_add(1, Relaxed);
        return;
    }
    q.spans.push_back(span);
    if q.spans.len() >= BATCH_SPANS {
        e.wake.notify_one();
    }
}

/// The driver's request records: the server span of each A2A request that has one, ended
/// now (by this process's clock) and started the record's duration before.
pub fn on_record(r: &RequestRecord) {
    if r.phase == Phase::StreamStarted {
        // A stream's span ends with the stream.
        return;
    }
    let Some(ids) = r.span else {
        return;
    };
    if let Some(span) = trace::server_span(r, now_unix_nano()) {
        record(span, ids.flags & trace::SAMPLED != 0);
    }
}

/// Sends what is queued and stops the exporter: at most `within`, best effort.
pub fn flush(within: Duration) {
    let Some(e) = EXPORTER.get() else {
        return;
    };
    e.queue.lock().unwrap_or_else(|p| p.into_inner()).closing = true;
    e.wake.notify_one();
    let Some(handle) = e.thread.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return;
    };
    let deadline = Instant::now() + within;
    while !handle.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if handle.is_finished() {
        let _ = handle.join();
    } else {
        tracing::warn!("the span exporter did not finish within {within:?}; spans left unsent");
    }
}

fn export_loop() {
    let Some(e) = EXPORTER.get() else {
        return;
    };
    // One warning per failing stretch, not per batch.
    let mut failing = false;
    loop {
        let (batch, closing) = {
            let mut q = e.queue.lock().unwrap_or_else(|p| p.into_inner());
            if !q.closing && q.spans.len() < BATCH_SPANS {
                q = e
                    .wake
                    .wait_timeout(q, EXPORT_INTERVAL)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            let n = q.spans.len().min(BATCH_SPANS);
            (q.spans.drain(..n).collect::<Vec<_>>(), q.closing)
        };
        if !batch.is_empty() {
            let body = trace::encode_traces(&e.service_name, &batch);
            let headers = [("content-type".to_owned(), "application/json".to_owned())];
            let n = batch.len() as u64;
            match e
                .client
                .post(&headers, body, Instant::now() + EXPORT_TIMEOUT)
            {
                Ok((status, _)) if (200..300).contains(&status) => {
                    e.counts.exported.fetch_add(n, Relaxed);
                    if failing {
                        tracing::info!("span export works again");
                        failing = false;
                    }
                }
                other => {
                    e.counts.dropped_export_failed.fetch_add(n, Relaxed);
                    if !failing {
                        let why = match other {
                            Ok((status, body)) => format!(
                                "the collector answered {status}: {}",
                                String::from_utf8_lossy(&body[..body.len().min(200)])
                            ),
                            Err(err) => err.to_string(),
                        };
                        tracing::warn!(spans = n, "span export failed, batch dropped: {why}");
                        failing = true;
                    }
                }
            }
        }
        let empty = e
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .spans
            .is_empty();
        if closing && empty {
            return;
        }
    }
}

/// Nanoseconds since the Unix epoch, now.
pub fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The span of some work the daemon does for a trace (an outbound call, an exec step):
/// made before the work, its context ([`WorkSpan::context`]) goes out as `traceparent`,
/// and [`WorkSpan::end`] records it.
///
/// With an exporter, the work gets a span of its own (a child of `parent`, or the root of a
/// new trace when there is none). Without one, nothing is recorded and the parent's context
/// goes out as it came in, so the callee's spans still join the caller's trace.
pub struct WorkSpan {
    context: Option<TraceContext>,
    span: Option<Span>,
}

impl WorkSpan {
    /// An outbound call's span named `name` (`a2a.delegate worker`, `webhook`) under
    /// `parent`.
    pub fn client(
        parent: Option<&TraceContext>,
        name: String,
        attributes: Vec<(&'static str, AttrValue)>,
    ) -> WorkSpan {
        WorkSpan::start(parent, name, SpanKind::Client, attributes)
    }

    /// A span of work in this process (an exec step) named `name` under `parent`.
    pub fn internal(
        parent: Option<&TraceContext>,
        name: String,
        attributes: Vec<(&'static str, AttrValue)>,
    ) -> WorkSpan {
        WorkSpan::start(parent, name, SpanKind::Internal, attributes)
    }

    fn start(
        parent: Option<&TraceContext>,
        name: String,
        kind: SpanKind,
        attributes: Vec<(&'static str, AttrValue)>,
    ) -> WorkSpan {
        if !enabled() {
            return WorkSpan {
                context: parent.cloned(),
                span: None,
            };
        }
        let span_id = trace::new_span_id(&mut OsEntropy);
        let context = match parent {
            Some(p) => p.child(span_id),
            None => TraceContext::root(trace::new_trace_id(&mut OsEntropy), span_id),
        };
        let now = now_unix_nano();
        let span = Span {
            trace_id: context.trace_id,
            span_id,
            parent_span_id: parent.map(|p| p.span_id),
            name,
            kind,
            start_unix_nano: now,
            end_unix_nano: now,
            attributes,
            error: None,
        };
        WorkSpan {
            context: Some(context),
            span: Some(span),
        }
    }

    /// The context to send: `traceparent` (and `tracestate`).
    pub fn context(&self) -> Option<&TraceContext> {
        self.context.as_ref()
    }

    /// Ends the span, an error if `error` says why, and queues it.
    pub fn end(self, error: Option<String>) {
        let (Some(mut span), Some(ctx)) = (self.span, self.context) else {
            return;
        };
        span.end_unix_nano = now_unix_nano().max(span.start_unix_nano);
        span.error = error;
        record(span, ctx.sampled());
    }
}

/// The headers that carry `trace`: `traceparent`, and `tracestate` when there is one.
pub fn headers(trace: Option<&TraceContext>) -> Vec<(String, String)> {
    let Some(t) = trace else {
        return Vec::new();
    };
    let mut h = vec![("traceparent".to_owned(), t.traceparent())];
    if let Some(s) = t.tracestate() {
        h.push(("tracestate".to_owned(), s.to_owned()));
    }
    h
}

/// The exporter's part of `/metrics`.
pub struct TraceMetrics(pub Arc<TraceCounts>);

impl MetricsSource for TraceMetrics {
    fn write(&self, w: &mut MetricsWriter) {
        w.family(
            "agentd_trace_spans_exported_total",
            Kind::Counter,
            "Spans the OTLP collector took.",
        );
        w.sample(
            "agentd_trace_spans_exported_total",
            &[],
            self.0.exported.load(Relaxed),
        );
        w.family(
            "agentd_trace_spans_dropped_total",
            Kind::Counter,
            "Spans dropped: queue-full (the export queue was full), export-failed (their \
             batch failed and is not retried).",
        );
        for (reason, n) in [
            ("queue-full", &self.0.dropped_queue_full),
            ("export-failed", &self.0.dropped_export_failed),
        ] {
            w.sample(
                "agentd_trace_spans_dropped_total",
                &[("reason", reason)],
                n.load(Relaxed),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls() {
        assert_eq!(
            check_endpoint("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318"
        );
        assert_eq!(
            check_endpoint("https://collector.example:4318/otlp").unwrap(),
            "https://collector.example:4318/otlp"
        );
        for bad in [
            // Plain http only to this host, as for peers.
            "http://collector.example:4318",
            "127.0.0.1:4318",
            "http://",
            "http://u@h:1",
            "http://h:1/?x",
            "unix:///tmp/s",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers_carry_the_context() {
        assert!(headers(None).is_empty());
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::parse(tp.as_bytes(), Some(b"k=v")).unwrap();
        assert_eq!(
            headers(Some(&c)),
            [
                ("traceparent".to_owned(), tp.to_owned()),
                ("tracestate".to_owned(), "k=v".to_owned())
            ]
        );
        // No exporter in unit tests: the parent's context goes out unchanged.
        let s = WorkSpan::client(Some(&c), "x".into(), Vec::new());
        assert_eq!(s.context(), Some(&c));
        s.end(None);
    }
}
