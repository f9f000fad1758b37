//! The log lines both drivers write: the throttled warnings of connections refused at the
//! bound and of failed `accept` calls, and the request log (one line per answer, limiter
//! refusals throttled per source).

use std::io;

use agentd_core::reqlog::{Keep, Phase, RequestRecord};
use agentd_core::Connection;

use crate::os::out_of_descriptors;

/// The throttled warning of connections answered 503 at the bound (both drivers): one line
/// per [`crate::os::LogThrottle::INTERVAL`] at most, `refused` counting the connections it stands for.
pub fn log_refused(refused: u64, max_connections: usize) {
    tracing::warn!(
        refused,
        max_connections,
        "connection limit reached; answering 503 (refused: connections since the last such line)"
    );
}

/// The throttled warning of failed `accept` calls (both drivers): `failures` counts the
/// calls it stands for; `error` is the last one's (none once accepting works again).
pub fn log_accept_failed(failures: u64, error: Option<&io::Error>) {
    match error {
        Some(e) if out_of_descriptors(e) => tracing::warn!(
            error = %e,
            failures,
            "accept failed: out of file descriptors; answering 503 with a spare one, else \
             pausing up to 1 s (failures: since the last such line)"
        ),
        Some(e) => tracing::warn!(
            error = %e,
            failures,
            "accept failed; pausing up to 1 s (failures: since the last such line)"
        ),
        None => tracing::warn!(
            failures,
            "accept failed; accepting again (failures: since the last such line)"
        ),
    }
}

/// The target of the request log's lines.
pub const REQUEST_LOG_TARGET: &str = "agentd::request";

/// Where every request record goes besides the log (the daemon's span exporter), if set.
static RECORD_SINK: std::sync::OnceLock<fn(&RequestRecord)> = std::sync::OnceLock::new();

/// Hands every request record to `sink` too (once per process; a second call is ignored):
/// from now on connections keep every request's record, whatever the log level.
pub fn set_record_sink(sink: fn(&RequestRecord)) {
    let _ = RECORD_SINK.set(sink);
}

/// Which request records a new connection should keep, from the log level in force: every
/// request's at `debug`, only limiter refusals at `info`, none below; every request's when
/// a record sink is set ([`set_record_sink`]). Both drivers ask once per connection, so a
/// connection costs nothing for a log that would discard its lines.
pub fn request_log_keep() -> Keep {
    if RECORD_SINK.get().is_some()
        || tracing::enabled!(target: REQUEST_LOG_TARGET, tracing::Level::DEBUG)
    {
        Keep::All
    } else if tracing::enabled!(target: REQUEST_LOG_TARGET, tracing::Level::INFO) {
        Keep::Refusals
    } else {
        Keep::Off
    }
}

/// Logs the records `conn` queued (and says how many it had to drop). Call it after each
/// call into the connection, outside the instance's lock.
pub fn log_requests(conn: &mut Connection) {
    let sink = RECORD_SINK.get();
    while let Some(r) = conn.poll_request_record() {
        log_request(&r);
        if let Some(sink) = sink {
            sink(&r);
        }
    }
    let dropped = conn.take_dropped_records();
    if dropped.refusals > 0 {
        tracing::info!(
            target: REQUEST_LOG_TARGET,
            records = dropped.records,
            refusals = dropped.refusals,
            "request records dropped: more answers in one burst than a connection queues"
        );
    } else if dropped.records > 0 {
        tracing::debug!(
            target: REQUEST_LOG_TARGET,
            records = dropped.records,
            "request records dropped: more answers in one burst than a connection queues"
        );
    }
}

/// How often one source's refusals by one limiter are logged at `info`; the refusals in
/// between are counted and the next line says how many (`suppressed`). A flood of refused
/// requests is the very thing a limiter meets, and it must not flood the log too.
pub const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// (source, limiter) → when its last line was logged, and refusals since not logged.
type RefusalKey = (
    Option<agentd_core::limits::Source>,
    agentd_core::reqlog::Limiter,
);
static REFUSALS_LOGGED: std::sync::Mutex<
    Option<std::collections::HashMap<RefusalKey, (std::time::Instant, u64)>>,
> = std::sync::Mutex::new(None);

/// Sources whose refusal lines are remembered; past it the oldest are forgotten.
const REFUSAL_LOG_SOURCES: usize = 4096;

/// Whether this refusal gets its `info` line, and how many were held back before it.
fn refusal_line_due(key: RefusalKey) -> Option<u64> {
    let now = std::time::Instant::now();
    let mut guard = REFUSALS_LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(Default::default);
    if map.len() >= REFUSAL_LOG_SOURCES && !map.contains_key(&key) {
        map.retain(|_, (at, _)| now.duration_since(*at) < REFUSAL_LOG_EVERY);
        if map.len() >= REFUSAL_LOG_SOURCES {
            map.clear();
        }
    }
    match map.get_mut(&key) {
        Some((at, held)) if now.duration_since(*at) < REFUSAL_LOG_EVERY => {
            *held += 1;
            None
        }
        Some((at, held)) => {
            *at = now;
            Some(std::mem::take(held))
        }
        None => {
            map.insert(key, (now, 0));
            Some(0)
        }
    }
}

/// One request's log line: a limiter's refusal at `info` (at most one line per source and
/// limiter each [`REFUSAL_LOG_EVERY`], with the count held back), every other request, and
/// a refusal held back, at `debug`. Fields: `request_id`, `method` (the JSON-RPC method),
/// `route` (HTTP method and path), `status`, `duration_ms`, `principal`, `task_id`,
/// `trace_id` (`-` where there is none), the JSON-RPC `error` code and `reason` of a
/// refusal, and `phase` for a stream's start and end or an abandoned request; a refusal
/// adds `limiter`, `source` and `retry_after_s`.
pub fn log_request(r: &RequestRecord) {
    let method = r.method.get().unwrap_or("-");
    let route = r.route.get().unwrap_or("-");
    let principal = r.principal.get().unwrap_or("-");
    let task_id = r.task_id.get().unwrap_or("-");
    let request_id = r.request_id.get().unwrap_or("-");
    let trace_id = r.trace_id.get().unwrap_or("-");
    let phase = (r.phase != Phase::Answered).then(|| r.phase.as_str());
    if let Some(refusal) = &r.refusal {
        if let Some(suppressed) = refusal_line_due((refusal.source, refusal.limiter)) {
            tracing::info!(
                target: REQUEST_LOG_TARGET,
                limiter = refusal.limiter.as_str(),
                source = %OrDash(refusal.source),
                retry_after_s = refusal.retry_after_s,
                request_id,
                method,
                route,
                status = r.status,
                duration_ms = r.duration_ms,
                principal,
                task_id,
                trace_id,
                suppressed,
                "request refused by a limiter"
            );
            return;
        }
    }
    tracing::debug!(
        target: REQUEST_LOG_TARGET,
        request_id,
        method,
        route,
        status = r.status,
        duration_ms = r.duration_ms,
        principal,
        task_id,
        trace_id,
        error = r.error_code(),
        reason = r.error_reason(),
        phase,
        "request"
    );
}

/// A value, or `-` without one.
struct OrDash<T>(Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for OrDash<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}
