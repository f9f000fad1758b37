//! The live log ring `debug.events` reads: the daemon's own log lines, kept in memory while
//! `a2a.introspection.enabled` is on. A `tracing` layer beside the stderr formatter feeds it;
//! while introspection is off it records nothing, so the ring costs nothing.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use serde_json::{json, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;

/// Lines kept; older ones are dropped and counted.
pub const CAPACITY: usize = 4096;
/// `debug.events` `limit`: default and bound.
pub const DEFAULT_LIMIT: usize = 200;
pub const MAX_LIMIT: usize = 500;
/// A field value longer than this is cut.
const MAX_FIELD_BYTES: usize = 1024;

static RECORDING: AtomicBool = AtomicBool::new(false);

struct Ring {
    lines: VecDeque<Value>,
    next_seq: u64,
    dropped: u64,
}

fn ring() -> &'static Mutex<Ring> {
    static RING: OnceLock<Mutex<Ring>> = OnceLock::new();
    RING.get_or_init(|| {
        Mutex::new(Ring {
            lines: VecDeque::new(),
            next_seq: 1,
            dropped: 0,
        })
    })
}

/// Turns recording on (introspection enabled) or off.
pub fn set_recording(on: bool) {
    RECORDING.store(on, Ordering::Relaxed);
}

/// The layer to install beside the formatter.
pub struct LogRingLayer;

impl<S: Subscriber> tracing_subscriber::Layer<S> for LogRingLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if !RECORDING.load(Ordering::Relaxed) {
            return;
        }
        let mut fields = FieldsVisitor::default();
        event.record(&mut fields);
        let meta = event.metadata();
        // The event's name is its message; the target says which part of agentd spoke.
        let name = fields
            .message
            .take()
            .unwrap_or_else(|| meta.name().to_owned());
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut r = ring().lock().unwrap_or_else(|p| p.into_inner());
        let seq = r.next_seq;
        r.next_seq += 1;
        if r.lines.len() == CAPACITY {
            r.lines.pop_front();
            r.dropped += 1;
        }
        r.lines.push_back(json!({
            "seq": seq,
            "ts": ts,
            "level": meta.level().as_str().to_ascii_lowercase(),
            "target": meta.target(),
            "name": name,
            "fields": Value::Object(fields.fields),
        }));
    }
}

#[derive(Default)]
struct FieldsVisitor {
    message: Option<String>,
    fields: serde_json::Map<String, Value>,
}

impl Visit for FieldsVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, cut(value.to_owned()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.insert(field.name().into(), json!(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.insert(field.name().into(), json!(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.insert(field.name().into(), json!(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        self.put(field, cut(s));
    }
}

impl FieldsVisitor {
    fn put(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = Some(value);
        } else {
            self.fields
                .insert(field.name().into(), Value::String(value));
        }
    }
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_FIELD_BYTES {
        let mut end = MAX_FIELD_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The `debug.events` result for its arguments.
pub fn read(after: u64, limit: usize, level: Option<&str>, prefix: Option<&str>) -> Value {
    let r = ring().lock().unwrap_or_else(|p| p.into_inner());
    let events: Vec<&Value> = r
        .lines
        .iter()
        .filter(|l| l["seq"].as_u64().unwrap_or(0) > after)
        .filter(|l| level.is_none_or(|lv| l["level"] == lv))
        .filter(|l| prefix.is_none_or(|p| l["name"].as_str().unwrap_or("").starts_with(p)))
        .take(limit.min(MAX_LIMIT))
        .collect();
    json!({
        "events": events,
        "newest_seq": r.next_seq - 1,
        "oldest_seq": r.lines.front().and_then(|l| l["seq"].as_u64()).unwrap_or(r.next_seq),
        "dropped": r.dropped,
    })
}
