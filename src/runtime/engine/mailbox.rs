//! The runtime's queue, and how its thread sleeps on it.
//!
//! Messages go through a channel. While the runtime reads the conversation agent's stdout
//! itself it sleeps in `poll` on that pipe and an eventfd (the doorbell) rather than on the
//! channel, so a sender also rings the doorbell, but only when the runtime is asleep or
//! about to be: a message sent while it works costs no system call.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

use super::super::agent::AgentStdout;
use super::Msg;

/// Where every message to the runtime is sent.
#[derive(Clone)]
pub(crate) struct Mailbox {
    tx: Sender<Msg>,
    bell: Arc<Doorbell>,
}

impl Mailbox {
    /// A mailbox and the runtime's end of it.
    pub(crate) fn new() -> (Mailbox, Inbox) {
        let (tx, rx) = std::sync::mpsc::channel();
        let bell = Arc::new(Doorbell::new());
        (
            Mailbox {
                tx,
                bell: bell.clone(),
            },
            Inbox { rx, bell },
        )
    }

    /// Queues `msg` for the runtime and wakes it. A runtime that has ended is not an error.
    pub(crate) fn send(&self, msg: Msg) {
        if self.tx.send(msg).is_ok() {
            self.bell.ring();
        }
    }
}

/// The runtime's end of its [`Mailbox`].
pub(crate) struct Inbox {
    rx: Receiver<Msg>,
    bell: Arc<Doorbell>,
}

/// Why [`Inbox::next`] returned no message.
pub(crate) enum Woken {
    /// A message.
    Msg(Msg),
    /// The wait ran out, or the agent's stdout was read: nothing queued.
    Nothing,
    /// Every sender is gone.
    Closed,
}

impl Inbox {
    /// Whether the runtime can sleep on an agent's stdout too (its doorbell exists).
    pub(crate) fn can_poll(&self) -> bool {
        self.bell.fd.is_some()
    }

    /// The next message, waiting up to `wait`. With `stdout` (the conversation agent's, read
    /// by the runtime) it also wakes when the agent wrote, and reads what it wrote: the
    /// events come back through the mailbox, so the next call returns them. `stdout` is
    /// set to `None` once it is finished.
    pub(crate) fn next(&self, wait: Duration, stdout: &mut Option<AgentStdout>) -> Woken {
        let polled = stdout
            .as_ref()
            .and_then(AgentStdout::fd)
            .zip(self.bell.fd.as_ref());
        let Some((out_fd, bell_fd)) = polled else {
            if stdout.is_some() {
                // Finished: nothing to wait on.
                *stdout = None;
            }
            return match self.rx.recv_timeout(wait) {
                Ok(m) => Woken::Msg(m),
                Err(RecvTimeoutError::Timeout) => Woken::Nothing,
                Err(RecvTimeoutError::Disconnected) => Woken::Closed,
            };
        };
        // Asleep from here: a message sent after this rings; one sent before is seen by
        // the look at the queue below.
        self.bell.arm();
        match self.rx.try_recv() {
            Ok(m) => {
                self.bell.disarm();
                return Woken::Msg(m);
            }
            Err(TryRecvError::Disconnected) => {
                self.bell.disarm();
                return Woken::Closed;
            }
            Err(TryRecvError::Empty) => {}
        }
        let mut fds = [
            PollFd::from_borrowed_fd(bell_fd.as_fd(), PollFlags::IN),
            PollFd::from_borrowed_fd(out_fd, PollFlags::IN),
        ];
        // A wait too long for a Timespec is as good as an hour: the loop looks again then.
        let timeout = Timespec::try_from(wait.min(Duration::from_secs(3600))).ok();
        // An interruption is a spurious wake-up: the loop looks and waits again.
        let _ = poll(&mut fds, timeout.as_ref());
        let (rung, wrote) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        self.bell.disarm();
        if rung {
            self.bell.clear();
        }
        if wrote {
            let out = stdout.as_mut().expect("polled above");
            if !out.read_ready() {
                *stdout = None;
            }
        }
        match self.rx.try_recv() {
            Ok(m) => Woken::Msg(m),
            Err(TryRecvError::Empty) => Woken::Nothing,
            Err(TryRecvError::Disconnected) => Woken::Closed,
        }
    }

    /// The next queued message, if any; never waits.
    pub(crate) fn try_next(&self) -> Option<Msg> {
        self.rx.try_recv().ok()
    }
}

/// An eventfd a sender writes to when the runtime sleeps in `poll`.
struct Doorbell {
    /// `None` when no eventfd could be made: the runtime then sleeps on the channel alone
    /// and leaves agent stdout to reader threads.
    fd: Option<OwnedFd>,
    /// The runtime is in (or about to enter) `poll`: the next sender must write.
    asleep: AtomicBool,
}

impl Doorbell {
    fn new() -> Doorbell {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(
                |e| tracing::debug!(error = %e, "no eventfd: agent stdout is read by a thread"),
            )
            .ok();
        Doorbell {
            fd,
            asleep: AtomicBool::new(false),
        }
    }

    /// After a message is queued. The fences pair with `arm`'s: either the runtime's look
    /// at the queue sees the message, or this sees it asleep and writes.
    fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.asleep.swap(false, Ordering::SeqCst) {
            if let Some(fd) = &self.fd {
                // A full counter (2^64 - 2 rings unread) already wakes the poll.
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
        }
    }

    fn arm(&self) {
        self.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    fn disarm(&self) {
        self.asleep.store(false, Ordering::SeqCst);
    }

    /// Resets the counter, so the next `poll` sleeps until the next ring.
    fn clear(&self) {
        if let Some(fd) = &self.fd {
            let mut count = [0u8; 8];
            let _ = rustix::io::read(fd, &mut count);
        }
    }
}
