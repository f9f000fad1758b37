//! The count of open connections a driver keeps, with the most that were open at once since
//! someone last looked: a host that samples it now and then (to give memory back after a
//! burst, `agentd::memory`) still sees a burst that opened and closed between two looks.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Open connections of one server, and their peak since the last [`ConnGauge::take_peak`].
#[derive(Debug, Default)]
pub struct ConnGauge {
    open: AtomicUsize,
    peak: AtomicUsize,
}

impl ConnGauge {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a slot unless `max` are open: true when it did (the caller then calls
    /// [`ConnGauge::closed`] when the connection ends).
    pub fn try_open(&self, max: usize) -> bool {
        let before = self.open.fetch_add(1, Ordering::SeqCst);
        if before >= max {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        self.peak.fetch_max(before + 1, Ordering::Relaxed);
        true
    }

    /// A connection [`ConnGauge::try_open`] admitted has ended.
    pub fn closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// The most connections open at once since the last call (at least those open now), and
    /// starts the next period from those open now.
    pub fn take_peak(&self) -> usize {
        let now = self.open();
        self.peak.swap(now, Ordering::Relaxed).max(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_sees_a_burst_that_came_and_went_between_two_looks() {
        let g = ConnGauge::new();
        assert_eq!(g.take_peak(), 0);
        for _ in 0..5 {
            assert!(g.try_open(5));
        }
        assert!(!g.try_open(5), "the sixth is over the bound");
        assert_eq!(g.open(), 5);
        for _ in 0..4 {
            g.closed();
        }
        assert_eq!(g.open(), 1);
        assert_eq!(g.take_peak(), 5, "the burst is seen after it closed");
        assert_eq!(g.take_peak(), 1, "the next period starts from those open");
        g.closed();
        assert_eq!(g.take_peak(), 1);
        assert_eq!(g.take_peak(), 0);
    }
}
