//! How long the drivers hold the shared instance lock: a measurement for `bench/`, off
//! unless asked for. Both drivers share one `Mutex<Instance>` between every connection, so
//! the time spent inside it bounds what the daemon can serve in parallel (a TLS handshake
//! runs inside the connection, hence under it).
//!
//! [`enable`] (the daemon calls it when `AGENTD_LOCK_STATS` is set) starts the count; until
//! then [`lock`] reads no clock and costs one relaxed load more than `Mutex::lock`. Counted:
//! every acquisition the drivers make, the time spent waiting for it and holding it, and the
//! longest hold. The host's own threads (the runtime, the store pump) are not counted.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);
static ACQUISITIONS: AtomicU64 = AtomicU64::new(0);
static WAIT_NS: AtomicU64 = AtomicU64::new(0);
static HELD_NS: AtomicU64 = AtomicU64::new(0);
static MAX_HELD_NS: AtomicU64 = AtomicU64::new(0);

/// Starts counting. There is no way back: a count that stops proves nothing.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether [`enable`] was called.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The totals since [`enable`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Acquisitions by the drivers.
    pub acquisitions: u64,
    /// Nanoseconds spent waiting to acquire, summed.
    pub wait_ns: u64,
    /// Nanoseconds spent holding, summed.
    pub held_ns: u64,
    /// The longest single hold, in nanoseconds.
    pub max_held_ns: u64,
}

impl LockStats {
    /// One machine-readable line, for scripts: `lock-stats acquisitions=N wait_ns=N ...`.
    pub fn line(&self) -> String {
        format!(
            "lock-stats acquisitions={} wait_ns={} held_ns={} max_held_ns={}",
            self.acquisitions, self.wait_ns, self.held_ns, self.max_held_ns
        )
    }
}

/// The totals so far (all zero unless enabled).
pub fn snapshot() -> LockStats {
    LockStats {
        acquisitions: ACQUISITIONS.load(Ordering::Relaxed),
        wait_ns: WAIT_NS.load(Ordering::Relaxed),
        held_ns: HELD_NS.load(Ordering::Relaxed),
        max_held_ns: MAX_HELD_NS.load(Ordering::Relaxed),
    }
}

/// Locks `mutex` (a poisoned lock is taken over: a panic while holding it cannot leave the
/// instance half-changed in a way a later request would misread more than a crash would),
/// and counts the hold when enabled.
pub fn lock<T>(mutex: &Mutex<T>) -> TimedGuard<'_, T> {
    if !enabled() {
        return TimedGuard {
            guard: mutex.lock().unwrap_or_else(|p| p.into_inner()),
            since: None,
        };
    }
    let asked = Instant::now();
    let guard = mutex.lock().unwrap_or_else(|p| p.into_inner());
    let since = Instant::now();
    WAIT_NS.fetch_add(nanos(since - asked), Ordering::Relaxed);
    TimedGuard {
        guard,
        since: Some(since),
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A held lock; counts the hold when dropped.
pub struct TimedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    since: Option<Instant>,
}

impl<T> Deref for TimedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for TimedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for TimedGuard<'_, T> {
    fn drop(&mut self) {
        // Runs before the inner guard unlocks: the hold is what it measures.
        if let Some(since) = self.since {
            let held = nanos(since.elapsed());
            ACQUISITIONS.fetch_add(1, Ordering::Relaxed);
            HELD_NS.fetch_add(held, Ordering::Relaxed);
            MAX_HELD_NS.fetch_max(held, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_holds_once_enabled() {
        let m = Mutex::new(1);
        *lock(&m) += 1;
        assert_eq!(
            snapshot(),
            LockStats::default(),
            "nothing is counted before enable"
        );
        enable();
        {
            let mut g = lock(&m);
            *g += 1;
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let s = snapshot();
        assert_eq!(*lock(&m), 3);
        assert!(s.acquisitions >= 1);
        assert!(
            s.held_ns >= 2_000_000 && s.max_held_ns >= 2_000_000,
            "{s:?}"
        );
        assert!(s.line().starts_with("lock-stats acquisitions="));
    }
}
