//! Metrics in the Prometheus text exposition format (version 0.0.4), for `GET /metrics`.
//!
//! The core keeps plain counters and fixed-bucket histograms in atomics ([`Metrics`], one
//! per instance, shared with every connection): counting a request is a few relaxed adds, no
//! lock and no allocation. Latencies come from the [`Now`](crate::Now) values the driver
//! passes: from the call that read a request's head to the one that framed its answer (the
//! head of a stream), so they have the driver's clock's millisecond resolution.
//!
//! The host adds its own figures (the store, the runtime, the process) through
//! [`MetricsSource`]s it registers with [`crate::Instance::add_metrics_source`]: each writes
//! its families with a [`MetricsWriter`] when `/metrics` is answered, outside the instance
//! lock (see [`crate::Connection::produce`]).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::a2a::types::TaskState;
use crate::a2a::CoreMethod;
use crate::errors::ErrorKind;
use crate::reqlog::Limiter;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The upper bounds of every histogram's buckets, in microseconds (rendered in seconds):
/// from 100 µs (an fsync on a fast disk) to 30 s (a request held by a slow store).
pub const BUCKETS_US: [u64; 17] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000,
];

/// A histogram of durations with the fixed buckets [`BUCKETS_US`]; observing is three
/// relaxed adds.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    count: AtomicU64,
    sum_us: AtomicU64,
    /// Buckets below this bound are not rendered: the durations are not measured finely
    /// enough to tell them apart ([`Histogram::with_resolution_us`]).
    resolution_us: u64,
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty histogram of durations measured to `us` microseconds: only buckets from
    /// `us` up are rendered (the cumulative counts still hold every observation). The
    /// core's request durations are whole milliseconds of the driver's clock, so a
    /// sub-millisecond bucket would claim a precision they do not have.
    pub fn with_resolution_us(us: u64) -> Self {
        Histogram {
            resolution_us: us,
            ..Self::default()
        }
    }

    /// Counts one duration of `us` microseconds.
    pub fn observe_us(&self, us: u64) {
        let i = BUCKETS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// Counts one duration.
    pub fn observe(&self, d: std::time::Duration) {
        self.observe_us(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

/// What a `# TYPE` line says of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (its name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, a sum and a count.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Writes metric families in the text format: a family's `# HELP` and `# TYPE` lines, then
/// its samples. Names are the caller's (`agentd_` prefix, `_total`, `_seconds`, `_bytes`);
/// label values are escaped here.
#[derive(Debug, Default)]
pub struct MetricsWriter {
    out: String,
}

impl MetricsWriter {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a family. `name` is the family's name (a counter's with its `_total`).
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of a counter or gauge.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// One sample whose value is not a whole number.
    pub fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", float(value));
    }

    /// A histogram's samples: its cumulative buckets, `_sum` (seconds) and `_count`.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let mut cumulative = 0;
        let mut le = String::new();
        for (i, b) in h.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            le.clear();
            match BUCKETS_US.get(i) {
                Some(us) if *us < h.resolution_us => continue,
                Some(us) => le.push_str(&float(*us as f64 / 1e6)),
                None => le.push_str("+Inf"),
            }
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", float(h.sum_us.load(Relaxed) as f64 / 1e6));
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        // The count is the buckets' total, so the two never disagree in one scrape.
        let _ = writeln!(self.out, " {cumulative}");
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        let all = labels.iter().copied().chain(le.map(|v| ("le", v)));
        for (k, v) in all {
            if !first {
                self.out.push(',');
            }
            first = false;
            self.out.push_str(k);
            self.out.push_str("=\"");
            for c in v.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }

    /// The exposition written so far.
    pub fn as_str(&self) -> &str {
        &self.out
    }

    /// The exposition, as bytes to send.
    pub fn into_bytes(self) -> Vec<u8> {
        self.out.into_bytes()
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A float as the text format takes it (Go's `ParseFloat`: `1e-06` and `0.25` both read).
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A host's part of `/metrics`: the store, the runtime, the process. Called when `/metrics`
/// is answered, outside the instance lock, so it may read its own state (and `/proc`); it
/// must not take the instance lock.
pub trait MetricsSource: Send + Sync {
    /// Writes this source's families.
    fn write(&self, w: &mut MetricsWriter);
}

/// The host's sources, as a connection holds them between deciding `/metrics` and
/// rendering it.
#[derive(Clone, Default)]
pub(crate) struct Sources(pub(crate) Vec<std::sync::Arc<dyn MetricsSource>>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sources({})", self.0.len())
    }
}

/// What a request is counted under: an A2A method, the events feed, or the HTTP route of
/// what is not JSON-RPC. Bounded, so the counters are a fixed table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MethodLabel {
    Core(CoreMethod),
    /// `agentd.events/SubscribeToEvents`.
    Events,
    /// A JSON-RPC request whose method is not known (unparsable, unknown, or refused before
    /// its body was read: no credential).
    UnknownRpc,
    Card,
    OAuth,
    Metrics,
    Healthz,
    Readyz,
    /// Anything else: preflights, refused paths and methods, framing errors.
    Other,
}

const METHODS: usize = CoreMethod::ALL.len() + 8;

impl MethodLabel {
    fn index(self) -> usize {
        let core = CoreMethod::ALL.len();
        match self {
            MethodLabel::Core(m) => m as usize,
            MethodLabel::Events => core,
            MethodLabel::UnknownRpc => core + 1,
            MethodLabel::Card => core + 2,
            MethodLabel::OAuth => core + 3,
            MethodLabel::Metrics => core + 4,
            MethodLabel::Healthz => core + 5,
            MethodLabel::Readyz => core + 6,
            MethodLabel::Other => core + 7,
        }
    }

    fn name_of(index: usize) -> &'static str {
        let core = CoreMethod::ALL.len();
        match index.checked_sub(core) {
            None => CoreMethod::ALL[index].name(),
            Some(0) => crate::ext::registry::EVENTS_METHOD,
            Some(1) => "unknown",
            Some(2) => "card",
            Some(3) => "oauth",
            Some(4) => "metrics",
            Some(5) => "healthz",
            Some(6) => "readyz",
            _ => "other",
        }
    }
}

/// HTTP statuses a request is counted under when no JSON-RPC error names its outcome; any
/// other is counted as `other`.
const HTTP_CODES: [u16; 16] = [
    400, 401, 403, 404, 405, 408, 411, 413, 414, 415, 429, 431, 500, 501, 503, 505,
];
const OUTCOMES: usize = 1 + ErrorKind::ALL.len() + HTTP_CODES.len() + 1;

/// The outcome of an answer: `ok`, an error kind, or an HTTP status.
fn outcome_index(status: u16, error: Option<ErrorKind>) -> usize {
    match error {
        Some(kind) => 1 + kind as usize,
        None if status < 400 => 0,
        None => {
            let base = 1 + ErrorKind::ALL.len();
            base + HTTP_CODES
                .iter()
                .position(|c| *c == status)
                .unwrap_or(HTTP_CODES.len())
        }
    }
}

/// The `code` and `reason` labels of an outcome.
fn outcome_labels(index: usize) -> (String, &'static str) {
    if index == 0 {
        return ("ok".into(), "");
    }
    let i = index - 1;
    if let Some(kind) = ErrorKind::ALL.get(i) {
        let row = kind.row();
        return (row.code.to_string(), row.reason.unwrap_or(""));
    }
    match HTTP_CODES.get(i - ErrorKind::ALL.len()) {
        Some(code) => (code.to_string(), ""),
        None => ("other".into(), ""),
    }
}

/// Limiter refusals, by [`Limiter`].
const LIMITERS: [Limiter; 4] = [
    Limiter::SourceFailures,
    Limiter::PrincipalRate,
    Limiter::DeviceGrantRate,
    Limiter::OAuthSource,
];

fn limiter_index(l: Limiter) -> usize {
    LIMITERS.iter().position(|x| *x == l).unwrap_or(0)
}

/// Task states `agentd_tasks` is broken down by.
const TASK_STATES: [TaskState; 8] = [
    TaskState::Submitted,
    TaskState::Working,
    TaskState::InputRequired,
    TaskState::AuthRequired,
    TaskState::Completed,
    TaskState::Failed,
    TaskState::Canceled,
    TaskState::Rejected,
];

/// The core's counters, one set per instance, shared (an `Arc`) with every connection.
#[derive(Debug)]
pub struct Metrics {
    requests: Box<[[AtomicU64; OUTCOMES]; METHODS]>,
    latency: Box<[Histogram; METHODS]>,
    refusals: [AtomicU64; LIMITERS.len()],
    connections_open: AtomicU64,
    connections_total: AtomicU64,
    streams_open: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicU64::new(0))
            })),
            latency: Box::new(std::array::from_fn(|_| {
                Histogram::with_resolution_us(1_000)
            })),
            refusals: Default::default(),
            connections_open: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            streams_open: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// A request was answered (the head of its answer framed) after `ms` milliseconds.
    pub(crate) fn answered(
        &self,
        method: MethodLabel,
        status: u16,
        error: Option<ErrorKind>,
        ms: u64,
    ) {
        let m = method.index();
        self.requests[m][outcome_index(status, error)].fetch_add(1, Relaxed);
        self.latency[m].observe_us(ms.saturating_mul(1000));
    }

    /// A limiter refused a request.
    pub(crate) fn refused(&self, limiter: Limiter) {
        self.refusals[limiter_index(limiter)].fetch_add(1, Relaxed);
    }

    pub(crate) fn connection_opened(&self) {
        self.connections_open.fetch_add(1, Relaxed);
        self.connections_total.fetch_add(1, Relaxed);
    }

    pub(crate) fn connection_closed(&self) {
        self.connections_open.fetch_sub(1, Relaxed);
    }

    pub(crate) fn stream_opened(&self) {
        self.streams_open.fetch_add(1, Relaxed);
    }

    pub(crate) fn stream_closed(&self) {
        self.streams_open.fetch_sub(1, Relaxed);
    }

    /// Requests counted under `method` (any outcome), for tests.
    pub fn requests_of(&self, method: &str) -> u64 {
        (0..METHODS)
            .filter(|&m| MethodLabel::name_of(m) == method)
            .flat_map(|m| self.requests[m].iter())
            .map(|c| c.load(Relaxed))
            .sum()
    }

    /// Writes the core's families: requests, latencies, refusals, connections, streams.
    pub(crate) fn write(&self, w: &mut MetricsWriter) {
        w.family(
            "agentd_requests_total",
            Kind::Counter,
            "Requests answered, by method (A2A method or HTTP route) and outcome code (ok, \
             the JSON-RPC error code with its reason, or the HTTP status).",
        );
        for m in 0..METHODS {
            let method = MethodLabel::name_of(m);
            for (o, c) in self.requests[m].iter().enumerate() {
                let n = c.load(Relaxed);
                if n == 0 {
                    continue;
                }
                let (code, reason) = outcome_labels(o);
                if reason.is_empty() {
                    w.sample(
                        "agentd_requests_total",
                        &[("method", method), ("code", &code)],
                        n,
                    );
                } else {
                    w.sample(
                        "agentd_requests_total",
                        &[("method", method), ("code", &code), ("reason", reason)],
                        n,
                    );
                }
            }
        }
        w.family(
            "agentd_request_duration_seconds",
            Kind::Histogram,
            "Time from a request's head read to its answer's head framed, by method \
             (millisecond resolution).",
        );
        for m in 0..METHODS {
            let h = &self.latency[m];
            if h.count() > 0 {
                w.histogram(
                    "agentd_request_duration_seconds",
                    &[("method", MethodLabel::name_of(m))],
                    h,
                );
            }
        }
        w.family(
            "agentd_limiter_refusals_total",
            Kind::Counter,
            "Requests a limiter refused, by limiter.",
        );
        for (l, c) in LIMITERS.iter().zip(&self.refusals) {
            w.sample(
                "agentd_limiter_refusals_total",
                &[("limiter", l.as_str())],
                c.load(Relaxed),
            );
        }
        w.family(
            "agentd_connections_open",
            Kind::Gauge,
            "Client connections open now.",
        );
        w.sample(
            "agentd_connections_open",
            &[],
            self.connections_open.load(Relaxed),
        );
        w.family(
            "agentd_connections_total",
            Kind::Counter,
            "Client connections accepted since start.",
        );
        w.sample(
            "agentd_connections_total",
            &[],
            self.connections_total.load(Relaxed),
        );
        w.family(
            "agentd_streams_open",
            Kind::Gauge,
            "Server-Sent Events answers open now (task streams and the events feed).",
        );
        w.sample("agentd_streams_open", &[], self.streams_open.load(Relaxed));
    }
}

/// What `/metrics` reads of the instance, taken under its lock (a few numbers) and rendered
/// outside it.
#[derive(Clone, Debug, Default)]
pub(crate) struct InstanceFigures {
    pub(crate) tasks: [usize; TASK_STATES.len()],
    pub(crate) feed_subscribers: usize,
    pub(crate) waiters: usize,
    pub(crate) pending_calls: usize,
    pub(crate) draining: bool,
    pub(crate) paused: bool,
    pub(crate) store_degraded: bool,
    pub(crate) uptime_ms: u64,
}

impl InstanceFigures {
    pub(crate) fn of(inst: &crate::Instance, now: crate::Now) -> Self {
        let mut tasks = [0; TASK_STATES.len()];
        for (n, s) in tasks.iter_mut().zip(TASK_STATES) {
            *n = inst.tasks.in_state(s);
        }
        InstanceFigures {
            tasks,
            feed_subscribers: inst.feed_subscribers(),
            waiters: inst.waiters(),
            pending_calls: inst.pending_calls(),
            draining: inst.is_draining(),
            paused: inst.is_paused(),
            store_degraded: inst.store_unavailable().is_some(),
            uptime_ms: now.mono_ms.saturating_sub(inst.started().mono_ms),
        }
    }

    pub(crate) fn write(&self, w: &mut MetricsWriter) {
        w.family("agentd_tasks", Kind::Gauge, "Tasks kept, by state.");
        for (n, s) in self.tasks.iter().zip(TASK_STATES) {
            let state = s
                .as_str()
                .trim_start_matches("TASK_STATE_")
                .to_ascii_lowercase();
            w.sample("agentd_tasks", &[("state", &state)], *n as u64);
        }
        w.family(
            "agentd_feed_subscribers",
            Kind::Gauge,
            "Connections reading the events feed now.",
        );
        w.sample("agentd_feed_subscribers", &[], self.feed_subscribers as u64);
        w.family(
            "agentd_waiters",
            Kind::Gauge,
            "Connections waiting on the instance: blocking sends, streams, command calls, \
             answers held until durable.",
        );
        w.sample("agentd_waiters", &[], self.waiters as u64);
        w.family(
            "agentd_host_calls_pending",
            Kind::Gauge,
            "Commands handed to the host and not answered yet.",
        );
        w.sample("agentd_host_calls_pending", &[], self.pending_calls as u64);
        w.family(
            "agentd_draining",
            Kind::Gauge,
            "1 while the instance drains (new work is refused).",
        );
        w.sample("agentd_draining", &[], u64::from(self.draining));
        w.family(
            "agentd_paused",
            Kind::Gauge,
            "1 while the instance is paused.",
        );
        w.sample("agentd_paused", &[], u64::from(self.paused));
        w.family(
            "agentd_store_degraded",
            Kind::Gauge,
            "1 while the store cannot write (changes are refused, reads go on).",
        );
        w.sample("agentd_store_degraded", &[], u64::from(self.store_degraded));
        w.family(
            "agentd_uptime_seconds",
            Kind::Gauge,
            "Seconds since the instance started.",
        );
        w.sample_f64("agentd_uptime_seconds", &[], self.uptime_ms as f64 / 1000.0);
    }
}

/// Why `/readyz` says not ready, if it does: draining, or a store that cannot write.
pub(crate) fn not_ready(inst: &crate::Instance) -> Option<&'static str> {
    if inst.is_draining() {
        Some("draining")
    } else if inst.store_unavailable().is_some() {
        Some("store unavailable")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_into_its_bucket_and_renders_cumulative() {
        let h = Histogram::new();
        h.observe_us(0);
        h.observe_us(100);
        h.observe_us(101);
        h.observe_us(60_000_000);
        let mut w = MetricsWriter::new();
        w.family("x_seconds", Kind::Histogram, "x");
        w.histogram("x_seconds", &[("a", "b\"\n\\")], &h);
        let text = w.as_str();
        assert!(
            text.contains("x_seconds_bucket{a=\"b\\\"\\n\\\\\",le=\"0.0001\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("le=\"0.00025\"} 3\n"), "{text}");
        assert!(text.contains("le=\"30\"} 3\n"), "{text}");
        assert!(text.contains("le=\"+Inf\"} 4\n"), "{text}");
        assert!(
            text.contains("x_seconds_sum{a=\"b\\\"\\n\\\\\"} 60.000201\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_count{a=\"b\\\"\\n\\\\\"} 4\n"),
            "{text}"
        );
    }

    #[test]
    fn a_coarse_histogram_renders_no_bucket_finer_than_its_resolution() {
        let h = Histogram::with_resolution_us(1_000);
        h.observe_us(0);
        h.observe_us(2_000);
        let mut w = MetricsWriter::new();
        w.histogram("r_seconds", &[], &h);
        let text = w.as_str();
        assert!(!text.contains("le=\"0.0001\""), "{text}");
        assert!(!text.contains("le=\"0.0005\""), "{text}");
        assert!(
            text.contains("r_seconds_bucket{le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("r_seconds_bucket{le=\"0.0025\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("r_seconds_count 2\n"), "{text}");
    }

    #[test]
    fn outcomes_round_trip_to_their_labels() {
        assert_eq!(outcome_labels(outcome_index(200, None)), ("ok".into(), ""));
        assert_eq!(outcome_labels(outcome_index(304, None)), ("ok".into(), ""));
        assert_eq!(
            outcome_labels(outcome_index(200, Some(ErrorKind::TaskNotFound))),
            ("-32001".into(), "TASK_NOT_FOUND")
        );
        assert_eq!(outcome_labels(outcome_index(404, None)), ("404".into(), ""));
        assert_eq!(
            outcome_labels(outcome_index(418, None)),
            ("other".into(), "")
        );
        for m in 0..METHODS {
            assert!(!MethodLabel::name_of(m).is_empty());
        }
        assert_eq!(MethodLabel::Other.index(), METHODS - 1);
        for m in CoreMethod::ALL {
            assert_eq!(MethodLabel::name_of(MethodLabel::Core(m).index()), m.name());
        }
    }
}
