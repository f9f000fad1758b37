//! A timer for a loop that waits again and again, each time with a deadline that mostly
//! moves later: a connection's read, idle or answer deadline.
//!
//! Setting an `async_io::Timer` wakes the reactor (an eventfd write, then a pass of the
//! reactor that finds only that), so a new timer for every wait cost every request those
//! system calls, and an agent turn twice. A [`Deadline`] keeps its timer set at the earliest
//! deadline it was asked for and sets it again only when a wait asks for an earlier one, or
//! after it fired: a wait for a later deadline sleeps through the early firing.

use std::time::Instant;

use async_io::Timer;
use futures_lite::future;

/// A reusable timer: [`Deadline::sleep_until`] in a loop sets the reactor's timer once per
/// firing, not once per wait.
#[derive(Debug)]
pub struct Deadline {
    timer: Timer,
    /// When the timer is set to fire; `None` when it is not set (new, or fired).
    set: Option<Instant>,
    /// How many times the timer was set, for the tests.
    #[cfg(test)]
    sets: u64,
}

impl Deadline {
    /// A deadline with no timer set.
    pub fn new() -> Self {
        Deadline {
            timer: Timer::never(),
            set: None,
            #[cfg(test)]
            sets: 0,
        }
    }

    /// Sleeps until `at`; with `None`, forever. Cancel-safe: dropped before it ends, the
    /// timer stays set and the next call uses it (a firing in between is a spurious wake-up
    /// of the task, which the next call absorbs).
    pub async fn sleep_until(&mut self, at: Option<Instant>) {
        let Some(at) = at else {
            return future::pending().await;
        };
        loop {
            if self.set.is_none_or(|set| set > at) {
                self.timer.set_at(at);
                self.set = Some(at);
                #[cfg(test)]
                {
                    self.sets += 1;
                }
            }
            (&mut self.timer).await;
            // It fired at `set`, which is `at` or before it.
            self.set = None;
            if Instant::now() >= at {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn sleeps_until_the_deadline_and_not_before() {
        let mut d = Deadline::new();
        let start = Instant::now();
        future::block_on(d.sleep_until(Some(start + 30 * MS)));
        assert!(start.elapsed() >= 30 * MS);
        assert_eq!(d.sets, 1);
    }

    #[test]
    fn without_a_deadline_it_never_ends() {
        let mut d = Deadline::new();
        let ended = future::block_on(future::or(
            async {
                d.sleep_until(None).await;
                true
            },
            async {
                Timer::after(20 * MS).await;
                false
            },
        ));
        assert!(!ended);
        assert_eq!(d.sets, 0);
    }

    /// The case it is for: waits cut short by work, each asking for a later deadline, set
    /// the timer once; a wait that runs out does not end at the first, earlier deadline.
    #[test]
    fn later_deadlines_keep_the_timer_and_sleep_through_its_early_firing() {
        let mut d = Deadline::new();
        let start = Instant::now();
        for i in 0..50u32 {
            let woken = future::block_on(future::or(
                async {
                    d.sleep_until(Some(start + 40 * MS + i * MS)).await;
                    false
                },
                async { true }, // the request came first
            ));
            assert!(woken);
        }
        assert_eq!(d.sets, 1, "a later deadline must not set the timer again");
        future::block_on(d.sleep_until(Some(start + 90 * MS)));
        assert!(
            start.elapsed() >= 90 * MS,
            "it ended at the timer's earlier deadline"
        );
        assert_eq!(d.sets, 2, "set once more, after the early firing");
    }

    #[test]
    fn an_earlier_deadline_sets_the_timer_again() {
        let mut d = Deadline::new();
        let start = Instant::now();
        let _ = future::block_on(future::or(
            async {
                d.sleep_until(Some(start + Duration::from_secs(3600))).await;
                false
            },
            async { true },
        ));
        future::block_on(d.sleep_until(Some(start + 20 * MS)));
        assert!(start.elapsed() >= 20 * MS);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "it waited for the old deadline"
        );
        assert_eq!(d.sets, 2);
    }
}
