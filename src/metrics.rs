//! The daemon's parts of `GET /metrics` (the core renders its own: requests, latencies,
//! tasks, connections, streams): the runtime's objects by state and webhook deliveries
//! ([`RuntimeMetrics`], filled by the runtime), the store's latencies and sizes
//! ([`StoreMetrics`]), and the process's figures from `/proc` ([`ProcessMetrics`]). Each is
//! an [`agentd_core::metrics::MetricsSource`] registered with the instance; the core calls it
//! when `/metrics` is answered, outside the instance lock.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use agentd_core::metrics::{Kind, MetricsSource, MetricsWriter};

use crate::runtime::push::PushCounts;

/// Run states, as `run` events and `status` name them.
pub const RUN_STATES: [&str; 6] = [
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "cancelled",
];
/// Agent process states.
pub const AGENT_STATES: [&str; 5] = ["idle", "running", "crashed", "killed", "stopped"];

/// What the runtime last counted of its objects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeCounts {
    /// Runs kept (live and the finished ones kept for `run.get`), by [`RUN_STATES`].
    pub runs: [u64; RUN_STATES.len()],
    /// The conversation agent's process, by [`AGENT_STATES`] (all zero: none configured).
    pub agents: [u64; AGENT_STATES.len()],
    /// Subagents by their status (`starting`, `idle`, `working`, ...).
    pub subagents: Vec<(&'static str, u64)>,
    /// Conversations kept.
    pub conversations: u64,
}

/// The runtime's figures: the runtime replaces the counts after each round of work;
/// the push pool counts its deliveries.
#[derive(Debug, Default)]
pub struct RuntimeMetrics {
    pub counts: Mutex<RuntimeCounts>,
    pub push: Arc<PushCounts>,
}

impl RuntimeMetrics {
    /// Replaces the counts (only when they changed: the lock is taken either way, briefly).
    pub fn set(&self, counts: RuntimeCounts) {
        let mut g = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if *g != counts {
            *g = counts;
        }
    }
}

impl MetricsSource for RuntimeMetrics {
    fn write(&self, w: &mut MetricsWriter) {
        let c = self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        w.family(
            "agentd_runs",
            Kind::Gauge,
            "Workflow runs kept (live, and finished ones kept for run.get), by state.",
        );
        for (state, n) in RUN_STATES.iter().zip(c.runs) {
            w.sample("agentd_runs", &[("state", state)], n);
        }
        w.family(
            "agentd_agents",
            Kind::Gauge,
            "The conversation agent's process, by state (all 0 when none is configured).",
        );
        for (state, n) in AGENT_STATES.iter().zip(c.agents) {
            w.sample("agentd_agents", &[("state", state)], n);
        }
        w.family(
            "agentd_subagents",
            Kind::Gauge,
            "Live subagents, by status.",
        );
        for (state, n) in &c.subagents {
            w.sample("agentd_subagents", &[("state", state)], *n);
        }
        w.family(
            "agentd_conversations",
            Kind::Gauge,
            "Conversations kept (one per principal and contextId).",
        );
        w.sample("agentd_conversations", &[], c.conversations);
        w.family(
            "agentd_push_deliveries_total",
            Kind::Counter,
            "Webhook deliveries by outcome: delivered (a 2xx), failed (gave up after its \
             attempts), dropped (the delivery queue was full).",
        );
        for (outcome, n) in [
            ("delivered", &self.push.delivered),
            ("failed", &self.push.failed),
            ("dropped", &self.push.dropped),
        ] {
            w.sample(
                "agentd_push_deliveries_total",
                &[("outcome", outcome)],
                n.load(Relaxed),
            );
        }
    }
}

/// The file store's figures: its writer's latencies, its sizes and its health.
pub struct StoreMetrics(pub crate::store::Observer);

impl MetricsSource for StoreMetrics {
    fn write(&self, w: &mut MetricsWriter) {
        let o = &self.0;
        let stats = o.stats();
        w.family(
            "agentd_store_append_seconds",
            Kind::Histogram,
            "Time to write one batch of records to the journal (before its fsync).",
        );
        w.histogram("agentd_store_append_seconds", &[], &o.latency().append);
        w.family(
            "agentd_store_fsync_seconds",
            Kind::Histogram,
            "Time to fdatasync one batch of records: what an acknowledged change waits for.",
        );
        w.histogram("agentd_store_fsync_seconds", &[], &o.latency().fsync);
        w.family(
            "agentd_store_journal_bytes",
            Kind::Gauge,
            "Bytes in journal segments not yet folded into the snapshot.",
        );
        w.sample("agentd_store_journal_bytes", &[], stats.journal_bytes);
        w.family(
            "agentd_store_snapshot_bytes",
            Kind::Gauge,
            "Bytes of the last snapshot.",
        );
        w.sample("agentd_store_snapshot_bytes", &[], stats.snapshot_bytes);
        w.family(
            "agentd_store_segments",
            Kind::Gauge,
            "Journal segment files in the data directory.",
        );
        w.sample("agentd_store_segments", &[], o.segments() as u64);
        w.family(
            "agentd_store_batches_total",
            Kind::Counter,
            "Batches written and synced since start.",
        );
        w.sample("agentd_store_batches_total", &[], stats.batches);
        w.family(
            "agentd_store_compactions_total",
            Kind::Counter,
            "Compactions (a new snapshot, old segments deleted) since start.",
        );
        w.sample("agentd_store_compactions_total", &[], stats.compactions);
        w.family(
            "agentd_store_heals_total",
            Kind::Counter,
            "Times the store healed after it could not write.",
        );
        w.sample("agentd_store_heals_total", &[], stats.heals);
        w.family(
            "agentd_store_failed",
            Kind::Gauge,
            "1 while the store's writer has failed and waits for a heal.",
        );
        w.sample(
            "agentd_store_failed",
            &[],
            u64::from(stats.failed.is_some()),
        );
    }
}

/// The process's figures, read from `/proc/self` at each scrape.
#[derive(Debug, Default)]
pub struct ProcessMetrics;

impl MetricsSource for ProcessMetrics {
    fn write(&self, w: &mut MetricsWriter) {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            line[name.len()..].split_whitespace().next()?.parse().ok()
        };
        if let Some(kib) = field("VmRSS:") {
            w.family(
                "agentd_process_resident_memory_bytes",
                Kind::Gauge,
                "Resident memory of the daemon process (VmRSS).",
            );
            w.sample("agentd_process_resident_memory_bytes", &[], kib * 1024);
        }
        if let Some(n) = field("Threads:") {
            w.family(
                "agentd_process_threads",
                Kind::Gauge,
                "Threads of the daemon process.",
            );
            w.sample("agentd_process_threads", &[], n);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory's own descriptor, open while it is read, is not counted.
            let n = dir.count().saturating_sub(1) as u64;
            w.family(
                "agentd_process_open_fds",
                Kind::Gauge,
                "Open file descriptors of the daemon process.",
            );
            w.sample("agentd_process_open_fds", &[], n);
        }
        if let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            w.family(
                "agentd_process_max_fds",
                Kind::Gauge,
                "The open-file limit (RLIMIT_NOFILE, soft).",
            );
            w.sample("agentd_process_max_fds", &[], limit);
        }
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command (which may hold spaces) are split from its closing paren:
        // utime and stime are the 14th and 15th fields, in clock ticks (USER_HZ, 100 on Linux).
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let (Some(u), Some(s)) = (f.get(11), f.get(12)) {
                if let (Ok(u), Ok(s)) = (u.parse::<u64>(), s.parse::<u64>()) {
                    w.family(
                        "agentd_process_cpu_seconds_total",
                        Kind::Counter,
                        "CPU time of the daemon process, user and system.",
                    );
                    w.sample_f64(
                        "agentd_process_cpu_seconds_total",
                        &[],
                        (u + s) as f64 / 100.0,
                    );
                }
            }
        }
    }
}
