//! The runtime's queue, and how the runtime sleeps on it.
//!
//! Messages go through a channel. A sender also rings the doorbell, but only when the
//! runtime is asleep or about to be: a message sent while it works costs no system call.
//! The runtime sleeps one of two ways:
//! - on its own thread ([`Inbox::next`]): in `poll` on the conversation agent's stdout and
//!   the doorbell's eventfd, or, reading no stdout, on the channel;
//! - as a task on the smol driver's executor ([`Inbox::next_as_task`]): the doorbell wakes
//!   the task's waker (no system call, no reactor), the executor's reactor watches the
//!   agent's stdout, and a timer the wait's end.

use std::future::{poll_fn, Future};
use std::os::fd::{AsFd, OwnedFd};
use std::pin::pin;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;

use async_io::{Async, Timer};

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
            Inbox {
                rx,
                bell,
                watched: None,
            },
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
    /// The conversation agent's stdout as the executor's reactor watches it (a second
    /// descriptor of the pipe), for a runtime run as a task ([`Inbox::watch`]).
    watched: Option<Async<OwnedFd>>,
}

/// A wait longer than this is a wait for a message or the agent alone: no timer is set.
const NO_TIMER: Duration = Duration::from_secs(3600);

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
    /// events come back through the mailbox, so a later call returns them. The pipe is
    /// looked at on every call, even with messages queued, so a backlog never holds an
    /// answer in it until the turn's deadline. `stdout` is set to `None` once it is
    /// finished.
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
                // Queued work first, but what the agent wrote meanwhile joins the queue.
                Self::peek(stdout);
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
            Self::read(stdout);
        }
        match self.rx.try_recv() {
            Ok(m) => Woken::Msg(m),
            Err(TryRecvError::Empty) => Woken::Nothing,
            Err(TryRecvError::Disconnected) => Woken::Closed,
        }
    }

    /// Has the executor's reactor watch `stdout` for [`Inbox::next_as_task`], in place of
    /// the one it watched. A stdout the reactor cannot take is given back to a reader thread
    /// (dropped), which sends its events through the mailbox as before.
    pub(crate) fn watch(&mut self, stdout: &mut Option<AgentStdout>) {
        self.watched = None;
        let Some(fd) = stdout.as_ref().and_then(AgentStdout::fd) else {
            return;
        };
        match fd.try_clone_to_owned().and_then(Async::new) {
            Ok(a) => self.watched = Some(a),
            Err(e) => {
                tracing::warn!(error = %e, "the agent's stdout cannot be watched by the executor; a thread reads it");
                *stdout = None;
            }
        }
    }

    /// [`Inbox::next`] for a runtime run as a task: it sleeps as a task until a message is
    /// sent (the doorbell wakes it), the watched stdout is readable ([`Inbox::watch`]) or
    /// `wait` ends. A wait of [`NO_TIMER`] or more sets no timer.
    pub(crate) async fn next_as_task(
        &mut self,
        wait: Duration,
        stdout: &mut Option<AgentStdout>,
    ) -> Woken {
        let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        // Asleep from here, as in `next`: a message sent after this wakes the task; one sent
        // before is seen by the look at the queue below.
        self.bell.arm_task(&waker);
        match self.rx.try_recv() {
            Ok(m) => {
                self.bell.disarm();
                Self::peek(stdout);
                self.unwatch_finished(stdout);
                // Work was waiting, so the task did not sleep: it lets the executor's other
                // tasks (the connections) run before its next round, or a queue that keeps
                // filling would hold an executor thread (the only one, on one CPU).
                yield_once().await;
                return Woken::Msg(m);
            }
            Err(TryRecvError::Disconnected) => {
                self.bell.disarm();
                return Woken::Closed;
            }
            Err(TryRecvError::Empty) => {}
        }
        let bell = &*self.bell;
        let rung = async {
            poll_fn(|cx| bell.poll_rung(cx.waker())).await;
            Wait::Rung
        };
        let watched = self.watched.as_ref();
        let wrote = async {
            match watched {
                Some(a) => match a.readable().await {
                    Ok(()) => Wait::Wrote,
                    Err(e) => Wait::Unwatchable(e),
                },
                None => std::future::pending().await,
            }
        };
        let ended = async {
            if wait < NO_TIMER {
                Timer::after(wait).await;
            } else {
                std::future::pending::<()>().await;
            }
            Wait::Ended
        };
        let woken = first(rung, first(wrote, ended)).await;
        self.bell.disarm();
        match woken {
            Wait::Wrote => Self::read(stdout),
            Wait::Unwatchable(e) => {
                // The reactor no longer reports the pipe: a reader thread takes it over
                // (a watch that fails at once would otherwise end every wait at once).
                tracing::warn!(error = %e, "the agent's stdout cannot be watched by the executor; a thread reads it");
                *stdout = None;
            }
            // Woken by the bell or the timer, the pipe is not read here: the next wait
            // looks at it first.
            Wait::Rung | Wait::Ended => {}
        }
        self.unwatch_finished(stdout);
        match self.rx.try_recv() {
            Ok(m) => Woken::Msg(m),
            Err(TryRecvError::Empty) => Woken::Nothing,
            Err(TryRecvError::Disconnected) => Woken::Closed,
        }
    }

    /// Stops watching a stdout that is finished: a pipe at its end is always readable, and
    /// a watched one would wake the task at once, every time.
    fn unwatch_finished(&mut self, stdout: &Option<AgentStdout>) {
        if stdout.is_none() {
            self.watched = None;
        }
    }

    /// Reads what the agent wrote if its stdout is readable now; never waits.
    fn peek(stdout: &mut Option<AgentStdout>) {
        let Some(fd) = stdout.as_ref().and_then(AgentStdout::fd) else {
            return;
        };
        let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
        let zero = Timespec::try_from(Duration::ZERO).ok();
        let _ = poll(&mut fds, zero.as_ref());
        if !fds[0].revents().is_empty() {
            Self::read(stdout);
        }
    }

    /// Reads what the agent wrote; forgets a finished stdout.
    fn read(stdout: &mut Option<AgentStdout>) {
        if stdout.as_mut().is_some_and(|out| !out.read_ready()) {
            *stdout = None;
        }
    }

    /// The next queued message, if any; never waits.
    pub(crate) fn try_next(&self) -> Option<Msg> {
        self.rx.try_recv().ok()
    }
}

/// What ended a runtime task's wait.
enum Wait {
    Rung,
    Wrote,
    Unwatchable(std::io::Error),
    Ended,
}

/// Returns to the executor once, woken again at once: its other tasks run first.
async fn yield_once() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Whichever of `a` and `b` ends first (`a` is looked at first).
async fn first<T>(a: impl Future<Output = T>, b: impl Future<Output = T>) -> T {
    let (mut a, mut b) = (pin!(a), pin!(b));
    poll_fn(|cx| match a.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(v),
        Poll::Pending => b.as_mut().poll(cx),
    })
    .await
}

/// What a sender rings when the runtime sleeps: an eventfd for a runtime thread in `poll`,
/// the task's waker for a runtime task.
struct Doorbell {
    /// `None` when no eventfd could be made: a runtime thread then sleeps on the channel
    /// alone and leaves agent stdout to reader threads.
    fd: Option<OwnedFd>,
    /// The runtime is asleep (or about to be): the next sender must ring.
    asleep: AtomicBool,
    /// A runtime task's waker, set before it sleeps; `None` for a runtime thread.
    task: Mutex<Option<Waker>>,
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
            task: Mutex::new(None),
        }
    }

    /// After a message is queued. The fences pair with `arm`'s: either the runtime's look
    /// at the queue sees the message, or this sees it asleep and writes.
    fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.asleep.swap(false, Ordering::SeqCst) {
            // Taken out before it is woken: the lock is not held while the executor runs.
            let task = self.task_waker().take();
            if let Some(task) = task {
                task.wake();
            } else if let Some(fd) = &self.fd {
                // A full counter (2^64 - 2 rings unread) already wakes the poll.
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
        }
    }

    fn arm(&self) {
        self.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// `arm` for a runtime task: the ring wakes `waker`.
    fn arm_task(&self, waker: &Waker) {
        self.set_task(waker);
        self.arm();
    }

    /// Whether a sender rang since `arm_task`; if not, the ring wakes `waker`.
    fn poll_rung(&self, waker: &Waker) -> Poll<()> {
        if !self.asleep.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        self.set_task(waker);
        // A ring between the look above and the waker's place took the old waker.
        if self.asleep.load(Ordering::SeqCst) {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    fn set_task(&self, waker: &Waker) {
        let mut task = self.task_waker();
        if !task.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }

    fn task_waker(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        self.task.lock().unwrap_or_else(|p| p.into_inner())
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

#[cfg(test)]
mod tests {
    use super::super::super::agent::{AgentEventKind, AgentProcess, AgentSpec, TurnIn};
    use super::super::AgentSink;
    use super::*;
    use std::time::Instant;

    fn turn(task: &str) -> TurnIn {
        TurnIn {
            task: task.into(),
            context: "c".into(),
            principal: "operator".into(),
            parts: vec![agentd_core::a2a::types::Part::text("hi")],
            trace: None,
        }
    }

    /// An agent process `command` started by a first turn, and its stdout to read.
    fn started(command: &[&str]) -> (AgentProcess, AgentStdout) {
        let (tx, rx) = std::sync::mpsc::channel();
        let spec = AgentSpec::new("a", command.iter().map(|s| s.to_string()).collect());
        let agent = AgentProcess::new_polled(spec, tx).unwrap();
        agent.turn(turn("t1")).unwrap();
        let started = rx.recv_timeout(Duration::from_secs(20)).expect("it starts");
        assert!(matches!(started.kind, AgentEventKind::Started { .. }));
        let out = agent.take_stdout().expect("the started process's stdout");
        (agent, out)
    }

    const SENDERS: usize = 4;
    const EACH: usize = 3000;

    /// `SENDERS` threads each sending `EACH` messages, pausing now and then so the runtime
    /// catches up and goes to sleep often.
    fn senders(mail: &Mailbox) -> Vec<std::thread::JoinHandle<()>> {
        (0..SENDERS)
            .map(|_| {
                let mail = mail.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        mail.send(Msg::Wake);
                        if i % 16 == 0 {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                })
            })
            .collect()
    }

    /// Counts one wait begun at `t` of the senders' stream into `got`. A wake-up with nothing
    /// queued may happen (a ring that came late); a wait that runs to its end while a message
    /// is queued is a lost wake-up.
    fn count(woken: Woken, t: Instant, got: &mut usize) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "a wait ran {:?} with {got} of {} messages received",
            t.elapsed(),
            SENDERS * EACH
        );
        match woken {
            Woken::Msg(_) => *got += 1,
            Woken::Nothing => {}
            Woken::Closed => unreachable!("the test holds a sender"),
        }
    }

    #[test]
    fn no_message_is_left_waiting_while_the_runtime_sleeps_in_poll() {
        let (mail, inbox) = Mailbox::new();
        assert!(inbox.can_poll(), "this machine has eventfd");
        // A process that never writes: every wait is a sleep in poll on its stdout and the
        // doorbell, and only a ring ends it.
        let (_agent, out) = started(&["sleep", "30"]);
        let mut out = Some(out);
        let senders = senders(&mail);
        let mut got = 0;
        while got < SENDERS * EACH {
            let t = Instant::now();
            count(inbox.next(Duration::from_secs(10), &mut out), t, &mut got);
        }
        senders.into_iter().for_each(|s| s.join().unwrap());
        assert!(out.is_some(), "the quiet stdout is still waited on");
    }

    #[test]
    fn a_queue_that_never_empties_does_not_keep_the_agent_answer_unread() {
        let (mail, inbox) = Mailbox::new();
        let echo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents/echo_agent.py");
        let agent = AgentProcess::new_polled(
            AgentSpec::new("a", vec!["python3".into(), echo.into()]),
            AgentSink(mail.clone()),
        )
        .unwrap();
        agent.turn(turn("t1")).unwrap();
        let mut out = None;
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(Instant::now() < end, "the reply was never read");
            if let Some(o) = agent.take_stdout() {
                out = Some(o);
            }
            // Something always waits in the queue ahead of the agent's answer.
            mail.send(Msg::Wake);
            if let Woken::Msg(Msg::Agent(ev)) = inbox.next(Duration::from_secs(1), &mut out) {
                if matches!(ev.kind, AgentEventKind::Reply { .. }) {
                    break;
                }
            }
        }
    }

    /// As above, for a runtime run as a task: the doorbell wakes the task's waker, and the
    /// reactor watches the quiet stdout.
    #[test]
    fn no_message_is_left_waiting_while_the_runtime_task_sleeps() {
        let (mail, mut inbox) = Mailbox::new();
        let (_agent, out) = started(&["sleep", "30"]);
        let mut out = Some(out);
        inbox.watch(&mut out);
        assert!(inbox.watched.is_some(), "the reactor watches it");
        let senders = senders(&mail);
        let mut got = 0;
        async_io::block_on(async {
            while got < SENDERS * EACH {
                let t = Instant::now();
                let woken = inbox.next_as_task(Duration::from_secs(10), &mut out).await;
                count(woken, t, &mut got);
            }
        });
        senders.into_iter().for_each(|s| s.join().unwrap());
        assert!(
            out.is_some() && inbox.watched.is_some(),
            "the quiet stdout is still watched"
        );
        // A wait with nothing sent and nothing written ends at its timer.
        let t = Instant::now();
        let woken = async_io::block_on(inbox.next_as_task(Duration::from_millis(50), &mut out));
        assert!(matches!(woken, Woken::Nothing));
        assert!(
            t.elapsed() >= Duration::from_millis(50),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn the_runtime_task_reads_the_agent_answer_whether_or_not_messages_wait() {
        let (mail, mut inbox) = Mailbox::new();
        let echo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents/echo_agent.py");
        let agent = AgentProcess::new_polled(
            AgentSpec::new("a", vec!["python3".into(), echo.into()]),
            AgentSink(mail.clone()),
        )
        .unwrap();
        let mut out = None;
        for (task, busy) in [("t1", false), ("t2", true)] {
            agent.turn(turn(task)).unwrap();
            let end = Instant::now() + Duration::from_secs(20);
            loop {
                assert!(Instant::now() < end, "the reply to {task} was never read");
                if let Some(o) = agent.take_stdout() {
                    out = Some(o);
                    inbox.watch(&mut out);
                }
                if busy {
                    // Something always waits in the queue ahead of the agent's answer.
                    mail.send(Msg::Wake);
                }
                let woken =
                    async_io::block_on(inbox.next_as_task(Duration::from_secs(1), &mut out));
                if let Woken::Msg(Msg::Agent(ev)) = woken {
                    if matches!(ev.kind, AgentEventKind::Reply { .. }) {
                        assert_eq!(ev.task.as_deref(), Some(task));
                        break;
                    }
                }
            }
        }
    }

    /// An agent whose stdout ends while messages wait (read on the way to one of them) is
    /// watched no more: the next wait sleeps until its timer, not round and round on the
    /// pipe's end.
    #[test]
    fn a_finished_stdout_is_not_watched_whichever_way_it_was_read() {
        let (mail, mut inbox) = Mailbox::new();
        let (agent, out) = started(&["sh", "-c", "exit 0"]);
        let mut out = Some(out);
        inbox.watch(&mut out);
        // Its end is in the pipe before the runtime looks.
        std::thread::sleep(Duration::from_millis(300));
        mail.send(Msg::Wake);
        let woken = async_io::block_on(inbox.next_as_task(Duration::from_secs(5), &mut out));
        assert!(matches!(woken, Woken::Msg(Msg::Wake)));
        assert!(out.is_none(), "the end was read on the way to the message");
        let t = Instant::now();
        let woken = async_io::block_on(inbox.next_as_task(Duration::from_millis(300), &mut out));
        assert!(matches!(woken, Woken::Nothing));
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "woke after {:?}",
            t.elapsed()
        );
        drop(agent);
    }

    /// One message at a time, each sent only once the task has taken the one before: every
    /// wait must be ended by its own ring (with a stream of messages a lost ring is covered
    /// by the next one).
    #[test]
    fn each_message_alone_wakes_the_sleeping_runtime_task() {
        let (mail, mut inbox) = Mailbox::new();
        let (ack_tx, ack_rx) = std::sync::mpsc::channel::<()>();
        const N: usize = 400;
        let sender = std::thread::spawn(move || {
            for i in 0..N {
                // Now and then the task is surely asleep when the message comes.
                if i % 8 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                mail.send(Msg::Wake);
                if ack_rx.recv().is_err() {
                    return;
                }
            }
        });
        let mut out = None;
        async_io::block_on(async {
            for got in 0..N {
                let t = Instant::now();
                loop {
                    let woken = inbox.next_as_task(Duration::from_secs(10), &mut out).await;
                    assert!(
                        t.elapsed() < Duration::from_secs(5),
                        "message {got} waited {:?}",
                        t.elapsed()
                    );
                    if matches!(woken, Woken::Msg(_)) {
                        break;
                    }
                }
                ack_tx.send(()).unwrap();
            }
        });
        sender.join().unwrap();
    }
}
