//! Which connections have something to do: the one registry of the connections' wakers.
//!
//! A connection registers its waker once, when it is prepared, and is named by the key it
//! gets. Everything in the instance that a connection waits on (a task's events, a blocking
//! send's settling, a host's command answer, the events feed, a held answer's durability)
//! keeps only that key, and every cause of a wake-up goes through [`Ready::wake`]. So a
//! connection's waker is cloned once, not once per thing it waits on, and a connection
//! that closes is forgotten in one place.
//!
//! It is a registry, not a queue of ready connections: a queue needs a consumer, and the
//! core owns no loop. Each driver already waits on its own waker (an async task's, a
//! thread's), which is what a wake-up reaches.

use std::collections::HashMap;
use std::task::Waker;

/// Names one registered connection.
pub(crate) type ConnKey = u64;

/// The connections' wakers, by key.
#[derive(Default)]
pub(crate) struct Ready {
    wakers: HashMap<ConnKey, Waker>,
    next: ConnKey,
}

impl Ready {
    /// Registers a connection's waker; the key names it from now on.
    pub(crate) fn register(&mut self, waker: &Waker) -> ConnKey {
        self.next += 1;
        self.wakers.insert(self.next, waker.clone());
        self.next
    }

    /// The connection closed: nothing wakes it any more.
    pub(crate) fn forget(&mut self, key: ConnKey) {
        self.wakers.remove(&key);
        if self.wakers.is_empty() && self.wakers.capacity() > 64 {
            // A burst of connections leaves no large table behind.
            self.wakers = HashMap::new();
        }
    }

    /// The connection has something to do (a key already forgotten is ignored: what it
    /// waited on outlived it).
    pub(crate) fn wake(&self, key: ConnKey) {
        if let Some(w) = self.wakers.get(&key) {
            w.wake_by_ref();
        }
    }

    /// Connections registered.
    pub(crate) fn len(&self) -> usize {
        self.wakers.len()
    }
}

impl std::fmt::Debug for Ready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ready")
            .field("connections", &self.wakers.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_the_registered_connection_until_it_is_forgotten() {
        let (a, b) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let mut ready = Ready::default();
        let ka = ready.register(&Waker::from(a.clone()));
        let kb = ready.register(&Waker::from(b.clone()));
        assert_ne!(ka, kb);
        ready.wake(ka);
        ready.wake(ka);
        assert_eq!(
            (a.0.load(Ordering::SeqCst), b.0.load(Ordering::SeqCst)),
            (2, 0)
        );
        ready.forget(ka);
        ready.wake(ka);
        ready.wake(kb);
        assert_eq!(
            (a.0.load(Ordering::SeqCst), b.0.load(Ordering::SeqCst)),
            (2, 1)
        );
        assert_eq!(ready.len(), 1);
    }
}
