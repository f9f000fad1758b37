//! Giving memory back to the system after a burst.
//!
//! glibc's allocator keeps what a thread freed in that thread's arena for reuse, and gives
//! back only the top of each heap. After 10,000 connections close, the std driver (a thread
//! per connection) kept ~128 MiB that way, and a restore of 100k tasks kept the parse's
//! garbage. Two levers, both glibc's:
//!
//! - [`limit_arenas`] caps the arenas (`mallopt(M_ARENA_MAX)`) before any thread starts
//!   ([`default_arenas`]). `malloc_trim` gives back every free page of the main arena but
//!   never shrinks the top of another: glibc shrinks that only when a thread attached to
//!   the arena frees a large block into it. smol's few threads live as long as the daemon
//!   and keep doing so; the std driver's connection threads end with their connections,
//!   and after a wave of 10,000 the other arenas' tops held 20-45 MiB that no trim
//!   returned, until some later connection's thread happened to free into that very arena
//!   (measured: an explicit `malloc_trim(0)` changed nothing). So the std driver runs on
//!   the main arena alone (back at rest within a second of the threads ending, every
//!   wave), smol on two a CPU (one arena cost smol 15 % on a 100k-task restart and took
//!   GetTask's p99 beside 4 ListTasks callers from 2.2x alone to 2.3-3.5x);
//! - [`trim`] (`malloc_trim(0)`) returns every free page, called once the store is
//!   restored and by [`spawn_trimmer`] when the open connections have fallen far below
//!   their recent peak ([`TrimPolicy`]) or the resident set has grown and settled
//!   ([`GrowthPolicy`]).
//!
//! On other C libraries both are no-ops.

use std::sync::Arc;
use std::time::Duration;

use agentd_io_common::ConnGauge;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::ffi::c_int;

    /// `M_ARENA_MAX` of glibc's `<malloc.h>`.
    const M_ARENA_MAX: c_int = -8;

    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
        fn malloc_trim(pad: usize) -> c_int;
    }

    pub(super) fn limit_arenas(n: c_int) -> bool {
        // SAFETY: mallopt only sets a tunable of the allocator; glibc takes its own lock,
        // and M_ARENA_MAX with a positive value is documented for any time (it is read
        // when a thread first needs an arena).
        unsafe { mallopt(M_ARENA_MAX, n) == 1 }
    }

    pub(super) fn trim() -> bool {
        // SAFETY: malloc_trim walks the arenas under their locks and returns free pages to
        // the kernel; it touches no memory that is in use.
        unsafe { malloc_trim(0) == 1 }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod glibc {
    pub(super) fn limit_arenas(_: std::ffi::c_int) -> bool {
        false
    }
    pub(super) fn trim() -> bool {
        false
    }
}

/// Caps glibc's malloc arenas at `n` (at least 1). Call before any thread starts. True when
/// the allocator took it. An operator's own choice wins: with `MALLOC_ARENA_MAX` or a
/// `glibc.malloc.arena_max` tunable in the environment, nothing is changed (and false is
/// returned).
pub fn limit_arenas(n: usize) -> bool {
    let operator = std::env::var_os("MALLOC_ARENA_MAX").is_some();
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if operator_chose_arenas(operator, &tunables) {
        return false;
    }
    glibc::limit_arenas(n.clamp(1, 1024) as std::ffi::c_int)
}

/// Whether the environment already caps the arenas: `MALLOC_ARENA_MAX` set, or
/// `glibc.malloc.arena_max` among the colon-separated `GLIBC_TUNABLES`.
fn operator_chose_arenas(malloc_arena_max_set: bool, glibc_tunables: &str) -> bool {
    malloc_arena_max_set
        || glibc_tunables
            .split(':')
            .any(|t| t.split('=').next() == Some("glibc.malloc.arena_max"))
}

/// The arena cap the daemon uses. With a thread per connection (the std driver): one,
/// glibc's main arena, the only one whose free top `malloc_trim` gives back (see the module
/// docs). Its threads share its lock, but each keeps a cache of small freed blocks of its
/// own (glibc's tcache) that most allocations are served from: measured on 2 CPUs, the
/// daemon's CPU per request (`bench/send_cpu.py`, 32 connections) was 0.86-1.27x that with
/// four arenas (two runs), per turn (`bench/turn_cpu.py`, 4 connections) 0.97-1.03x.
/// Otherwise two a CPU (glibc's own default is eight), at least 2: few enough that a
/// burst's garbage is not kept 16 times over.
pub fn default_arenas(thread_per_connection: bool) -> usize {
    match thread_per_connection {
        true => 1,
        false => std::thread::available_parallelism().map_or(1, |n| n.get()) * 2,
    }
}

/// Returns the allocator's free pages to the system. True when some were.
pub fn trim() -> bool {
    glibc::trim()
}

/// When to trim after a burst: the open connections, sampled each period, have fallen to
/// at most a `1/FACTOR` of the peak seen since the last trim, by at least `MIN_DROP`
/// connections (a few hundred connections' worth of memory is not worth a walk of every
/// arena). The peak comes from [`ConnGauge::take_peak`], so a burst that opened and closed
/// between two samples counts. Once it has trimmed, the peak starts again from what is
/// open: one trim per burst (and its follow-ups), and a steady load never trims.
///
/// Each such trim is followed by [`TrimPolicy::FOLLOW_UPS`] more, a period apart, by one
/// more after each that gave back at least [`TrimPolicy::WORTH`] bytes, and by
/// [`TrimPolicy::AFTER_EXITS`] more after each period in which the process's threads grew
/// fewer (within [`TrimPolicy::MAX_FOLLOW_UPS`] periods of the fall): what the burst's
/// threads free as they exit (glibc's per-thread caches, flushed at thread exit, after the
/// connection count fell) comes after the first, 10,000 exits take many seconds on a loaded
/// machine, and the last exits' memory may be freed a moment after the count falls.
#[derive(Debug, Default, Clone)]
pub struct TrimPolicy {
    recent_peak: usize,
    follow_ups: usize,
    /// Samples left in which a follow-up may still trim.
    window: usize,
    threads: usize,
}

impl TrimPolicy {
    /// How far below the peak the open connections must fall.
    pub const FACTOR: usize = 4;
    /// Trims after the one a fall from the peak calls for, one a period.
    pub const FOLLOW_UPS: usize = 10;
    /// The periods after a fall from the peak in which follow-ups may trim: the most trims
    /// one fall calls for after its first.
    pub const MAX_FOLLOW_UPS: usize = 60;
    /// Trims after a period in which threads ended.
    pub const AFTER_EXITS: usize = 3;
    /// A trim that gave back at least this many bytes calls for another.
    pub const WORTH: u64 = 1 << 20;
    /// The least drop from the peak worth a trim.
    pub const MIN_DROP: usize = 256;

    pub fn new() -> Self {
        Self::default()
    }

    /// One sample: `open` connections now, `peak` the most at once since the last sample
    /// (at least `open`), `threads` the process's threads now. True when the caller should
    /// trim now.
    pub fn observe(&mut self, open: usize, peak: usize, threads: usize) -> bool {
        self.window = self.window.saturating_sub(1);
        let threads_ended = threads < self.threads;
        self.threads = threads;
        if threads_ended && self.window > 0 {
            // Threads of the burst exited since the last sample: what they freed is there.
            self.follow_ups = self.follow_ups.max(Self::AFTER_EXITS);
        }
        self.recent_peak = self.recent_peak.max(peak).max(open);
        let fell = self.recent_peak - open >= Self::MIN_DROP
            && open.saturating_mul(Self::FACTOR) <= self.recent_peak;
        if fell {
            self.recent_peak = open;
            self.follow_ups = Self::FOLLOW_UPS;
            self.window = Self::MAX_FOLLOW_UPS + 1;
            return true;
        }
        if self.follow_ups > 0 && self.window > 0 {
            self.follow_ups -= 1;
            return true;
        }
        false
    }

    /// What the trim [`TrimPolicy::observe`] called for gave back (resident bytes before
    /// less after): one that was worth it calls for another a period later.
    pub fn trimmed(&mut self, released: u64) {
        if released >= Self::WORTH {
            self.follow_ups += 1;
        }
    }
}

/// When to trim after the resident set grew and settled: a burst of requests that fills the
/// store leaves its garbage (parsed requests, answers, records written ahead, a finished
/// task's messages before they were packed) between the tasks it keeps, and glibc keeps
/// those free chunks inside the heap. 100k tasks sent by 8 connections left 2.7 KiB resident
/// per task where 1.9 KiB was in use. So: trim when the resident set has grown since the
/// last trim by at least a quarter, and at least [`GrowthPolicy::GROWTH`], and grew by less
/// than 1/64 in each of the last two periods (the burst is over). A store that keeps growing
/// trims once per quarter of growth (a trim walks the whole heap, so its cost grows with
/// it), once each burst has settled. A steady load never trims: growth must also pass what
/// the resident set was before the last trim, so a load that faults back in what a trim
/// gave (memory it reuses all the time) is not trimmed again and again.
#[derive(Debug, Default, Clone)]
pub struct GrowthPolicy {
    /// The resident set after the last trim (or the least seen since).
    baseline: u64,
    /// The resident set just before the last trim.
    high_water: u64,
    /// The resident set at the last sample.
    last: u64,
    /// Consecutive periods that grew by less than 1/64.
    calm: u32,
}

impl GrowthPolicy {
    /// The least growth worth a trim.
    pub const GROWTH: u64 = 8 << 20;

    pub fn new() -> Self {
        Self::default()
    }

    /// One sample: `resident` bytes now. True when the caller should trim now.
    pub fn observe(&mut self, resident: u64) -> bool {
        let last = std::mem::replace(&mut self.last, resident);
        self.calm = match resident <= last.saturating_add(last / 64) {
            true => self.calm.saturating_add(1),
            false => 0,
        };
        if self.baseline == 0 || resident < self.baseline {
            self.baseline = resident;
            return false;
        }
        let worth = Self::GROWTH.max(self.baseline / 4);
        let past = self
            .baseline
            .saturating_add(worth)
            .max(self.high_water.saturating_add(Self::GROWTH));
        self.calm >= 2 && resident >= past
    }

    /// A trim happened (whoever called for it), taking the resident set from `before` to
    /// `after`: growth counts from `after`, and must also pass `before`.
    pub fn trimmed(&mut self, before: u64, after: u64) {
        self.baseline = after;
        self.high_water = before;
        self.last = after;
        self.calm = 0;
    }
}

/// The process's resident set in bytes (`VmRSS` of `/proc/self/status`), 0 when unreadable.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let kib = s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
            kib.split_whitespace().next()?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// The process's threads (`Threads` of `/proc/self/status`), 0 when unreadable.
pub fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let n = s.lines().find_map(|l| l.strip_prefix("Threads:"))?;
            n.trim().parse().ok()
        })
        .unwrap_or(0)
}

/// How often [`spawn_trimmer`] samples the connections.
pub const TRIM_PERIOD: Duration = Duration::from_secs(1);

/// Starts a small thread that samples `gauge` every [`TRIM_PERIOD`] and trims when the
/// [`TrimPolicy`] says so.
pub fn spawn_trimmer(gauge: Arc<ConnGauge>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("agentd-trim".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut policy = TrimPolicy::new();
            let mut growth = GrowthPolicy::new();
            loop {
                std::thread::sleep(TRIM_PERIOD);
                let peak = gauge.take_peak();
                let before = resident_bytes();
                let fell = policy.observe(gauge.open(), peak, thread_count());
                let grew = growth.observe(before);
                if fell || grew {
                    let trimmed = trim();
                    let after = resident_bytes();
                    let released = before.saturating_sub(after);
                    if fell {
                        policy.trimmed(released);
                    }
                    growth.trimmed(before, after);
                    tracing::debug!(
                        peak,
                        trimmed,
                        released,
                        why = if fell {
                            "connections fell after a burst"
                        } else {
                            "grew and settled"
                        },
                        "memory trimmed"
                    );
                }
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_arena_cap_is_kept() {
        assert!(!operator_chose_arenas(false, ""));
        assert!(operator_chose_arenas(true, ""));
        assert!(operator_chose_arenas(false, "glibc.malloc.arena_max=8"));
        assert!(operator_chose_arenas(
            false,
            "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=2"
        ));
        assert!(!operator_chose_arenas(false, "glibc.malloc.arena_test=2"));
        assert!(!operator_chose_arenas(false, "glibc.malloc.tcache_count=0"));
    }

    #[test]
    fn a_burst_shorter_than_the_period_is_trimmed_after() {
        let g = ConnGauge::new();
        let mut p = TrimPolicy::new();
        assert!(!p.observe(g.open(), g.take_peak(), 1), "nothing happened");
        // 1,000 connections open and close between two samples.
        for _ in 0..1000 {
            assert!(g.try_open(usize::MAX));
        }
        for _ in 0..1000 {
            g.closed();
        }
        assert!(
            p.observe(g.open(), g.take_peak(), 1),
            "the burst is seen and trimmed"
        );
        for _ in 0..TrimPolicy::FOLLOW_UPS {
            assert!(
                p.observe(g.open(), g.take_peak(), 1),
                "and again a period later"
            );
        }
        assert!(!p.observe(g.open(), g.take_peak(), 1), "then no more");
    }

    #[test]
    fn trims_go_on_while_they_give_memory_back_within_a_budget() {
        let mut p = TrimPolicy::new();
        assert!(!p.observe(1000, 1000, 1));
        assert!(p.observe(0, 0, 1), "the fall");
        p.trimmed(100 << 20);
        for _ in 0..TrimPolicy::FOLLOW_UPS {
            assert!(p.observe(0, 0, 1));
            p.trimmed(0);
        }
        assert!(
            p.observe(0, 0, 1),
            "the fall's trim gave back enough for one more"
        );
        p.trimmed(TrimPolicy::WORTH - 1);
        assert!(!p.observe(0, 0, 1), "that one gave back too little");
        // However much each gives back, at most MAX_FOLLOW_UPS follow a fall.
        let mut p = TrimPolicy::new();
        assert!(!p.observe(1000, 1000, 1));
        assert!(p.observe(0, 0, 1));
        let mut n = 0;
        while p.observe(0, 0, 1) {
            p.trimmed(u64::MAX);
            n += 1;
            assert!(n <= TrimPolicy::MAX_FOLLOW_UPS);
        }
        assert_eq!(n, TrimPolicy::MAX_FOLLOW_UPS);
        assert_ne!(resident_bytes(), 0);
    }

    /// 10,000 connection threads take seconds to exit after their connections closed: each
    /// period in which threads ended is followed by a trim, however long they take (within
    /// the window), and once they are all gone, nothing more.
    #[test]
    fn trims_go_on_while_the_bursts_threads_are_ending() {
        let mut p = TrimPolicy::new();
        assert!(!p.observe(10_000, 10_000, 10_010));
        assert!(p.observe(0, 0, 10_010), "the fall");
        for _ in 0..TrimPolicy::FOLLOW_UPS {
            assert!(p.observe(0, 0, 10_010));
            p.trimmed(0);
        }
        assert!(
            !p.observe(0, 0, 10_010),
            "nothing ended, nothing to give back"
        );
        for threads in [9_000, 5_000, 10] {
            assert!(p.observe(0, 0, threads), "{threads} threads left: trimmed");
            p.trimmed(0);
        }
        for _ in 1..TrimPolicy::AFTER_EXITS {
            assert!(p.observe(0, 0, 10), "what the last exits freed: trimmed");
            p.trimmed(0);
        }
        assert!(!p.observe(0, 0, 10), "all ended: no more");
        // A thread ending in a steady load, long after a fall, trims nothing.
        for _ in 0..TrimPolicy::MAX_FOLLOW_UPS {
            p.observe(0, 0, 10);
        }
        assert!(!p.observe(0, 0, 9));
    }

    #[test]
    fn trims_once_the_connections_fell_far_below_their_peak() {
        let mut p = TrimPolicy::new();
        assert!(!p.observe(2000, 2000, 1), "at the peak");
        assert!(!p.observe(1000, 1000, 1), "half the peak is not far enough");
        assert!(!p.observe(600, 600, 1), "above a quarter");
        assert!(p.observe(500, 500, 1), "a quarter of the peak");
        assert!(p.observe(500, 500, 1), "a follow-up a period later");
        // The peak starts again from those still open: their closing is another burst's
        // end, and after it (and its follow-ups) nothing more.
        assert!(p.observe(0, 0, 1));
        for _ in 0..TrimPolicy::FOLLOW_UPS {
            assert!(p.observe(0, 0, 1));
        }
        assert!(!p.observe(0, 0, 1));
    }

    #[test]
    fn trims_once_the_resident_set_grew_and_settled() {
        const MIB: u64 = 1 << 20;
        let mut p = GrowthPolicy::new();
        assert!(!p.observe(10 * MIB), "the first sample is the baseline");
        assert!(!p.observe(10 * MIB), "steady");
        // A burst: no trim while it grows, nor after one calm period.
        for rss in [30, 60, 90] {
            assert!(!p.observe(rss * MIB), "still growing at {rss} MiB");
        }
        assert!(!p.observe(91 * MIB), "calm for one period");
        assert!(p.observe(91 * MIB), "calm for two, 81 MiB above: trim");
        p.trimmed(91 * MIB, 60 * MIB);
        // A steady load that faults back in what the trim gave is not trimmed again.
        for _ in 0..50 {
            assert!(!p.observe(91 * MIB));
        }
        // Growth past what it was before the trim is.
        assert!(!p.observe(100 * MIB), "growing");
        assert!(!p.observe(100 * MIB), "calm for one period");
        assert!(p.observe(100 * MIB), "past the high water, calm: trim");
        p.trimmed(100 * MIB, 100 * MIB);
        // Memory given back lowers the baseline; growth then counts from it, and from the
        // high water.
        assert!(!p.observe(50 * MIB));
        for _ in 0..3 {
            assert!(!p.observe(100 * MIB), "not past the high water");
        }
        assert!(!p.observe(108 * MIB));
        assert!(!p.observe(108 * MIB));
        assert!(p.observe(108 * MIB), "8 MiB past it");
        // Small: 8 MiB is the least worth a trim.
        let mut p = GrowthPolicy::new();
        assert!(!p.observe(4 * MIB));
        assert!(!p.observe(11 * MIB));
        assert!(!p.observe(11 * MIB));
        assert!(!p.observe(11 * MIB), "7 MiB above");
        assert!(!p.observe(12 * MIB + MIB / 2));
        assert!(!p.observe(12 * MIB + MIB / 2));
        assert!(p.observe(12 * MIB + MIB / 2), "8.5 MiB above, calm");
    }

    #[test]
    fn a_steady_load_or_a_small_drop_never_trims() {
        let mut p = TrimPolicy::new();
        for _ in 0..100 {
            assert!(!p.observe(5000, 5200, 1));
        }
        // From 200 to 0: a quarter, but fewer than MIN_DROP connections.
        let mut p = TrimPolicy::new();
        assert!(!p.observe(200, 200, 1));
        assert!(!p.observe(0, 0, 1));
    }
}
