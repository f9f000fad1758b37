//! JSON log lines (`AGENTD_LOG_FORMAT=json`, or `log.format = "json"`): one object per
//! line on stderr, for a log collector.
//!
//! Every line starts with the same four keys, in this order: `timestamp` (RFC 3339, UTC,
//! microseconds), `level` (`error`, `warn`, `info`, `debug` or `trace`), `target` (the part
//! of agentd that spoke: `agentd::request` for the request log) and `message`; the event's
//! own fields follow under their own names (the request log's: `request_id`, `method`,
//! `route`, `status`, `duration_ms`, `principal`, `task_id`, `trace_id`, ...). Numbers and
//! booleans stay JSON numbers and booleans; everything else is a string.
//!
//! Written here rather than with `tracing-subscriber`'s `json` feature: a layer of a
//! hundred lines over the `serde_json` the daemon already links adds less to the binary
//! than that feature's `tracing-serde` and its formatter, and the field names and their
//! order are this file's, so they stay put whatever that crate's next version does.

use std::fmt::Write as _;
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;

/// The layer that writes JSON lines to stderr.
pub struct JsonLayer;

impl<S: Subscriber> tracing_subscriber::Layer<S> for JsonLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut line = String::with_capacity(160 + fields.rest.len());
        line.push_str("{\"timestamp\":\"");
        timestamp(&mut line, std::time::SystemTime::now());
        line.push_str("\",\"level\":\"");
        line.push_str(level(meta.level()));
        line.push_str("\",\"target\":");
        string(&mut line, meta.target());
        line.push_str(",\"message\":");
        string(&mut line, fields.message.as_deref().unwrap_or(meta.name()));
        line.push_str(&fields.rest);
        line.push_str("}\n");
        // One write of the whole line: lines from different threads never interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

fn level(l: &tracing::Level) -> &'static str {
    match *l {
        tracing::Level::ERROR => "error",
        tracing::Level::WARN => "warn",
        tracing::Level::INFO => "info",
        tracing::Level::DEBUG => "debug",
        tracing::Level::TRACE => "trace",
    }
}

/// `s` as a JSON string.
fn string(out: &mut String, s: &str) {
    // serde_json escapes exactly what JSON needs; writing to a String cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
}

/// The event's message, and its other fields as `,"name":value` text.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    rest: String,
}

impl Fields {
    fn key(&mut self, field: &Field) {
        self.rest.push(',');
        string(&mut self.rest, field.name());
        self.rest.push(':');
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
            return;
        }
        self.key(field);
        string(&mut self.rest, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.key(field);
        let _ = write!(self.rest, "{value}");
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.key(field);
        let _ = write!(self.rest, "{value}");
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.key(field);
        self.rest.push_str(if value { "true" } else { "false" });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.key(field);
        if value.is_finite() {
            let _ = write!(self.rest, "{value}");
        } else {
            self.rest.push_str("null");
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
            return;
        }
        self.key(field);
        string(&mut self.rest, &text);
    }
}

/// `at` as RFC 3339 in UTC with microseconds: `2026-12-04T18:04:16.123456Z`.
fn timestamp(out: &mut String, at: std::time::SystemTime) {
    let d = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let _ = write!(
        out,
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    );
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (the well-known
/// era-based conversion: 400-year eras of 146,097 days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |s: u64, us: u32| {
            let mut out = String::new();
            timestamp(
                &mut out,
                std::time::UNIX_EPOCH + std::time::Duration::new(s, us * 1000),
            );
            out
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(at(1_796_313_753, 998_000), "2026-12-03T16:02:33.998000Z");
        assert_eq!(at(4_107_542_399, 0), "2100-02-28T23:59:59.000000Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
    }
}
