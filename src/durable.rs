//! The host side of write-ahead durability: the `[store]` section, recovery of the store
//! into the instance at start, and the pump that carries the core's records to the store
//! and the store's fsyncs back to the core.
//!
//! ```text
//! connection ──change──▶ Instance ──poll_records──▶ pump ──append──▶ Store (writer: write+fdatasync)
//!      ▲                    ▲                        │  ▲                     │
//!      └──wake (released)───┴──records_durable(upto)─┘  └──Durable(ticket)────┘ (on_durable)
//! ```
//!
//! One pump thread owns the order: it drains the instance's records under the instance lock,
//! appends them as one atomic frame (a task and its session change land together or not at
//! all), remembers `(ticket, upto)`, and when the store reports a ticket durable calls
//! [`Instance::records_durable`] with the highest `upto` it covers. Group commit comes from
//! the store: while one fsync runs, the next drains queue up behind it.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use agentd_core::errors::RecordError;
use agentd_core::instance::RecordBody;
use agentd_core::tasks::TaskRecord;
use agentd_core::{Instance, Now};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::store::{self, Notice, Op, Record, Recovering, Store, Ticket};

/// Why a task still in flight at a restart ended.
pub const RESTART_REASON: &str = "agentd restarted while this task was in flight";

/// The record that numbers the events feed across restarts.
const FEED_KIND: &str = "feed";
const FEED_KEY: &str = "base";

/// `[store]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// `file` (the default: a journal and snapshot in `dir`) or `memory` (nothing survives
    /// a restart; for embedders and tests, loopback and unix listeners only).
    pub kind: Option<String>,
    /// The data directory (default `$XDG_STATE_HOME/agentd`, else
    /// `~/.local/state/agentd`). Created if missing.
    pub dir: Option<PathBuf>,
}

/// What `[store]` resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreKind {
    File(PathBuf),
    Memory,
}

impl StoreSection {
    pub fn resolve(&self) -> Result<StoreKind, String> {
        match self.kind.as_deref().unwrap_or("file") {
            "memory" => Ok(StoreKind::Memory),
            "file" => match &self.dir {
                Some(d) => Ok(StoreKind::File(d.clone())),
                None => default_dir().map(StoreKind::File),
            },
            other => Err(format!("store.kind: {other:?} is not file or memory")),
        }
    }
}

/// The per-user state directory (XDG base directory spec), for a daemon run with no
/// configuration.
pub fn default_dir() -> Result<PathBuf, String> {
    let from = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(state) = from("XDG_STATE_HOME").filter(|p| p.is_absolute()) {
        return Ok(state.join("agentd"));
    }
    match from("HOME") {
        Some(home) => Ok(home.join(".local/state/agentd")),
        None => Err(
            "store.dir is not set and neither XDG_STATE_HOME nor HOME is: \
                     name a data directory under [store]"
                .into(),
        ),
    }
}

/// What a restore found.
#[derive(Debug, Default)]
pub struct Restored {
    pub tasks: usize,
    pub records: usize,
    /// Tasks in flight at the crash or stop, now failed with [`RESTART_REASON`].
    pub ended: usize,
    /// Records that could not be read back (logged, skipped).
    pub skipped: usize,
    pub feed_base: u64,
    /// A damaged journal tail the store cut off at open (log it).
    pub truncated: Option<store::Truncation>,
}

/// A record's body as the store's replay threads read it: a task straight into its record
/// (the bulk of a large store, and most of a restart's time, spread over the cores), the
/// feed's base as its number, anything else left as JSON text for the instance.
enum Body {
    Task(Result<Box<TaskRecord>, RecordError>),
    Feed(u64),
    Other(Box<RawValue>),
}

fn parse_body(kind: &str, _key: &str, text: &RawValue) -> Body {
    match kind {
        agentd_core::tasks::TASK_KIND => {
            Body::Task(TaskRecord::from_json(text.get()).map(Box::new))
        }
        FEED_KIND => Body::Feed(serde_json::from_str(text.get()).unwrap_or(0)),
        _ => Body::Other(text.to_owned()),
    }
}

/// Creates the data directory (owner-only: it holds session token digests), opens the
/// store in it and restores what it holds into a fresh instance (with write-ahead on) as
/// it streams off the disk; then ends what was in flight, and numbers the feed past
/// anything a subscriber saw before. Returns the store, what was restored, and the
/// records the host must append before serving (the feed's new base).
pub fn open(
    dir: &Path,
    inst: &mut Instance,
    now: Now,
) -> Result<(Store, Restored, Vec<Record<RecordBody>>), String> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("store.dir {}: {e}", dir.display()))?;
    inst.set_write_ahead(true);
    let mut r = Restored::default();
    let mut old_base = None;
    let (store, opened) =
        Store::open_with(dir, store::Options::default(), &parse_body, &mut |rec| {
            let (kind, key, body) = match rec {
                // Sized once rather than rehashed at every doubling as they fill.
                Recovering::Expect(n) => {
                    return inst.reserve_tasks(usize::try_from(n).unwrap_or(0));
                }
                Recovering::Put { kind, key, body } => (kind, key, body),
            };
            r.records += 1;
            let done = match body {
                Body::Feed(base) => {
                    old_base = Some(base);
                    return;
                }
                Body::Task(task) => task.and_then(|t| inst.restore_task(&key, *t)).map(|()| 1),
                Body::Other(text) => inst
                    .restore_record_json(&kind, &key, text.get(), now)
                    .map(|()| 0),
            };
            match done {
                Ok(tasks) => r.tasks += tasks,
                Err(e) => {
                    r.skipped += 1;
                    tracing::warn!(%kind, %key, "store record not restored: {e}");
                }
            }
        })
        .map_err(|e| format!("store: {e}"))?;
    r.truncated = opened.truncated;
    r.ended = inst.end_in_flight(RESTART_REASON, now);
    // Feed cursors from before a restart must read as stale. A previous run numbered its
    // events from its own base upwards; start past both its base plus 2^32 events and the
    // clock in microseconds (a run would need a million events a second to catch up).
    r.feed_base = if r.records == 0 {
        0
    } else {
        (now.epoch_ms.saturating_mul(1000)).max(old_base.unwrap_or(0).saturating_add(1 << 32))
    };
    inst.set_feed_base(r.feed_base);
    let base = serde_json::value::to_raw_value(&r.feed_base).expect("a number serialises");
    let base = Record::put(FEED_KIND, FEED_KEY, base);
    Ok((store, r, vec![base]))
}

enum Msg {
    /// Records may be waiting in the instance.
    Records,
    Durable(Ticket),
    Failed(String),
    Stop,
}

/// The instance's records waker: one message per round of changes, not one per change
/// (it is woken under the instance lock, on every connection's path).
struct ChannelWake {
    tx: Mutex<Sender<Msg>>,
    pending: AtomicBool,
}

impl Wake for ChannelWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            if let Ok(tx) = self.tx.lock() {
                let _ = tx.send(Msg::Records);
            }
        }
    }
}

/// The running pump. [`Pump::finish`] writes out the last changes and closes the store.
pub struct Pump {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl Pump {
    /// Drains what changed since the last drain, makes it durable, and closes the store.
    pub fn finish(mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The first heal is tried this long after the store failed; each failed attempt doubles
/// the wait, up to [`HEAL_MAX_BACKOFF`]. A heal writes the whole state, so it is not tried
/// in a tight loop on a disk that stays full.
const HEAL_FIRST_BACKOFF: Duration = Duration::from_millis(500);
const HEAL_MAX_BACKOFF: Duration = Duration::from_secs(15);
/// A heal that keeps failing is logged at most this often.
const HEAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// Starts the pump. `host_records` are the host's own records (the feed's base, from
/// [`open`]): appended first, and written again by every heal.
///
/// A store that fails (a full disk, an I/O error) never stops the daemon: the pump marks
/// the instance's store unavailable (changes are refused with STORE_UNAVAILABLE, answers
/// waiting for the failed writes are given up, reads go on), logs it once, and tries to heal
/// the store from the instance's state with a growing pause between attempts; once a heal
/// succeeds, the instance takes changes again.
pub fn spawn(
    inst: Arc<Mutex<Instance>>,
    store: Store,
    host_records: Vec<Record<RecordBody>>,
) -> std::io::Result<Pump> {
    spawn_gathering(inst, store, host_records, GATHER)
}

/// [`spawn`], letting changes nobody waits for gather for up to `gather`.
fn spawn_gathering(
    inst: Arc<Mutex<Instance>>,
    store: Store,
    host_records: Vec<Record<RecordBody>>,
    gather: Duration,
) -> std::io::Result<Pump> {
    let (tx, rx) = mpsc::channel();
    let cb = Mutex::new(tx.clone());
    // Runs on the store's writer thread: only a send, never the instance lock.
    store.on_durable(move |n| {
        let msg = match n {
            Notice::Durable(t) => Msg::Durable(*t),
            Notice::Failed(why) => Msg::Failed(why.to_string()),
        };
        if let Ok(tx) = cb.lock() {
            let _ = tx.send(msg);
        }
    });
    inst.lock()
        .unwrap_or_else(|p| p.into_inner())
        .add_metrics_source(Arc::new(crate::metrics::StoreMetrics(store.observer())));
    let mut degraded = store.stats().failed.map(|why| why.to_string());
    if degraded.is_none() && !host_records.is_empty() {
        if let Err(e) = store.append(&host_records) {
            degraded = Some(e.to_string());
        }
    }
    let wake = Arc::new(ChannelWake {
        tx: Mutex::new(tx.clone()),
        pending: AtomicBool::new(false),
    });
    let thread = thread::Builder::new()
        .name("agentd-records".into())
        .spawn(move || {
            let mut pump = Pumping {
                inst: &inst,
                store,
                host_records,
                inflight: VecDeque::new(),
                degraded: None,
                gather,
            };
            if let Some(why) = degraded {
                pump.fail(why);
            }
            pump.run(&rx, &wake);
        })?;
    Ok(Pump {
        tx,
        thread: Some(thread),
    })
}

/// Appends `records`, in order, in as many appends as the store's size bound needs, and
/// returns the last ticket (durable means all of them are). A drain holds every change since
/// the last one, so a burst of large requests can add up to more than one append may hold;
/// that is never a reason to stop. Splitting costs nothing in the common case (one append
/// that fits) and no fsync ever (the store's group commit writes whatever is queued at
/// once). A drain is not atomic on disk, and needs not be: each record is the whole state
/// of its key, and nothing in the drain is acknowledged before the last append is durable.
/// One record alone can always be appended: the task bounds (`limits.task_artifact_bytes`,
/// the history bound, the agent line bound) keep a task record far below the store's limit.
fn append_split<B: serde::Serialize>(
    store: &Store,
    records: &[Record<B>],
) -> Result<Ticket, crate::store::Error> {
    match store.append(records) {
        Err(crate::store::Error::TooLarge { .. }) if records.len() > 1 => {
            let (first, rest) = records.split_at(records.len() / 2);
            append_split(store, first)?;
            append_split(store, rest)
        }
        other => other,
    }
}

/// How long changes no answer waits for may gather before they are written: far below
/// anything a person or a peer could notice, well above an agent's quick answer.
const GATHER: Duration = Duration::from_millis(5);

/// The next message within `wait`; `None` when none came.
fn recv(rx: &Receiver<Msg>, wait: Duration) -> Option<Msg> {
    match rx.recv_timeout(wait) {
        Ok(m) => Some(m),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => Some(Msg::Stop),
    }
}

fn lock(inst: &Mutex<Instance>) -> std::sync::MutexGuard<'_, Instance> {
    inst.lock().unwrap_or_else(|e| e.into_inner())
}

/// A failed store waiting to heal.
struct Degraded {
    why: String,
    next_attempt: Instant,
    backoff: Duration,
    attempts: u64,
    last_logged: Instant,
}

/// The pump thread's state.
struct Pumping<'a> {
    inst: &'a Mutex<Instance>,
    store: Store,
    host_records: Vec<Record<RecordBody>>,
    /// Appended and not yet durable: (ticket, the record sequence it makes durable).
    inflight: VecDeque<(Ticket, u64)>,
    degraded: Option<Degraded>,
    /// How long changes nobody waits for may gather ([`GATHER`]).
    gather: Duration,
}

impl Pumping<'_> {
    fn run(mut self, rx: &Receiver<Msg>, wake: &Arc<ChannelWake>) {
        let waker = &Waker::from(wake.clone());
        lock(self.inst).register_records_waker(waker);
        // A message that ended a gathering pause (never `Records`), handled as the next one.
        let mut next: Option<Msg> = None;
        loop {
            // A periodic look as well as the waker: a change made through a path that does
            // not announce itself is still written within this interval.
            let wait = match &self.degraded {
                Some(d) => d.next_attempt.saturating_duration_since(Instant::now()),
                None => Duration::from_millis(200),
            };
            let msg = match next.take() {
                Some(m) => Some(m),
                None => recv(rx, wait),
            };
            if matches!(msg, Some(Msg::Records)) && self.degraded.is_none() {
                next = self.gather(rx, wake);
            }
            if matches!(msg, Some(Msg::Stop)) {
                // A store still failed gets one last try: what the instance holds (changes
                // made while it failed included) survives the stop if the disk has room now.
                if self.degraded.is_some() {
                    self.heal();
                }
                self.drain(wake, waker);
                if let Err(e) = self.store.close() {
                    tracing::error!("store: {e}");
                }
                return;
            }
            if self.degraded.is_some() {
                // Changes wait in the instance (one dirty mark per key, so bounded by what
                // it holds) until the heal writes them all.
                if self
                    .degraded
                    .as_ref()
                    .is_some_and(|d| Instant::now() >= d.next_attempt)
                {
                    self.heal();
                }
                if self.degraded.is_none() {
                    // Healed. Wakes while it was failed left the flag set, so no message
                    // came for later changes: the drain clears it and writes them.
                    self.drain(wake, waker);
                }
                continue;
            }
            self.drain(wake, waker);
            match msg {
                Some(Msg::Durable(t)) => {
                    let mut upto = None;
                    while self
                        .inflight
                        .front()
                        .is_some_and(|(ticket, _)| *ticket <= t)
                    {
                        upto = self.inflight.pop_front().map(|(_, u)| u);
                    }
                    if let Some(u) = upto {
                        lock(self.inst).records_durable(u);
                    }
                }
                Some(Msg::Failed(why)) => self.fail(why),
                Some(Msg::Records | Msg::Stop) | None => {}
            }
        }
    }

    /// Changes wait: unless an answer waits for them, lets more gather for up to
    /// `self.gather` before the drain, so a turn's start, its steps and its end (an agent's
    /// answer, a command's result, soon after) go to disk as one record and one write, not
    /// one each. Ends early when a change is wanted promptly ([`Instance::records_awaited`]:
    /// an answer waits for it or a webhook reports it, and either wakes the pump) and on any
    /// other message (a durable or failure notice, a stop), which it returns for the loop to
    /// handle next.
    fn gather(&self, rx: &Receiver<Msg>, wake: &ChannelWake) -> Option<Msg> {
        let until = Instant::now() + self.gather;
        loop {
            // Cleared before the look: a change or a waiter after it sends a message.
            wake.pending.store(false, Ordering::Release);
            if lock(self.inst).records_awaited() {
                return None;
            }
            match recv(rx, until.saturating_duration_since(Instant::now())) {
                Some(Msg::Records) => continue,
                other => return other,
            }
        }
    }

    /// Appends what changed since the last drain (nothing while the store is failed).
    fn drain(&mut self, wake: &ChannelWake, waker: &Waker) {
        if self.degraded.is_some() {
            return;
        }
        // Cleared before the drain: a change after it wakes the pump again.
        wake.pending.store(false, Ordering::Release);
        let batch = {
            let mut i = lock(self.inst);
            let b = i.poll_records();
            i.register_records_waker(waker);
            b
        };
        let Some(batch) = batch else { return };
        match append_split(&self.store, &to_store(batch.records)) {
            Ok(ticket) => self.inflight.push_back((ticket, batch.upto)),
            Err(e) => self.fail(e.to_string()),
        }
    }

    /// The store failed: nothing more can be acknowledged until it heals.
    fn fail(&mut self, why: String) {
        if self.degraded.is_some() {
            return;
        }
        tracing::error!(
            "store: cannot write ({why}); changes are refused with STORE_UNAVAILABLE and \
             reads answered until it heals; healing by itself"
        );
        self.inflight.clear();
        lock(self.inst).set_store_unavailable(Some(why.clone()));
        let now = Instant::now();
        self.degraded = Some(Degraded {
            why,
            next_attempt: now + HEAL_FIRST_BACKOFF,
            backoff: HEAL_FIRST_BACKOFF,
            attempts: 0,
            last_logged: now,
        });
    }

    /// Writes the instance's whole state into a fresh snapshot; on success the instance
    /// takes changes again.
    fn heal(&mut self) {
        let Some(d) = self.degraded.as_mut() else {
            return;
        };
        d.attempts += 1;
        let all = lock(self.inst).all_records();
        let mut records = to_store(all.records);
        // Removals need no record: the snapshot is the whole state.
        records.retain(|r| matches!(r.op, Op::Put(_)));
        records.extend(self.host_records.iter().cloned());
        match self.store.heal(&records) {
            Ok(()) => {
                tracing::info!(
                    records = records.len(),
                    attempts = d.attempts,
                    "store: healed; wrote the whole state into a fresh snapshot (it failed: {})",
                    d.why
                );
                self.degraded = None;
                let mut i = lock(self.inst);
                i.records_durable(all.upto);
                i.set_store_unavailable(None);
            }
            Err(e) => {
                let now = Instant::now();
                if now.duration_since(d.last_logged) >= HEAL_LOG_EVERY {
                    d.last_logged = now;
                    tracing::warn!(
                        attempts = d.attempts,
                        "store: still cannot write ({e}); changes stay refused"
                    );
                }
                d.backoff = (d.backoff * 2).min(HEAL_MAX_BACKOFF);
                d.next_attempt = now + d.backoff;
            }
        }
    }
}

fn to_store(records: Vec<agentd_core::instance::Record>) -> Vec<Record<RecordBody>> {
    records
        .into_iter()
        .map(|r| match r.body {
            Some(body) => Record::put(r.kind, r.key, body),
            None => Record::remove(r.kind, r.key),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_core::auth::Peer;
    use agentd_core::ids::CounterEntropy;
    use agentd_core::{Connection, InstanceConfig, ListenerInfo, ListenerKind};

    fn send(inst: &Mutex<Instance>, now: Now, text: &str) -> String {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"role": "ROLE_USER", "messageId": text, "parts": [{"text": text}]},
                       "configuration": {"returnImmediately": true}}})
        .to_string();
        let req = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut i = lock(inst);
        let limits = i.config().conn;
        let mut c = Connection::new(0, Peer::Tcp, limits, Waker::noop().clone(), now);
        c.handle_input(&mut i, req.as_bytes(), now);
        match i.poll_effect() {
            Some(agentd_core::Effect::Turn { task_id, .. }) => task_id,
            other => panic!("expected the task's turn, got {other:?}"),
        }
    }

    /// The host finishes `task`'s work: it completes.
    fn complete(inst: &Mutex<Instance>, now: Now, task: &str) {
        let done = agentd_core::Completion::Status {
            task_id: task.to_owned(),
            state: agentd_core::a2a::types::TaskState::Completed,
            message: None,
        };
        lock(inst).handle_completion(done, now).unwrap();
    }

    /// An instance with write-ahead on, at `now`.
    fn write_ahead_instance(now: Now) -> Arc<Mutex<Instance>> {
        let listener = ListenerInfo {
            kind: ListenerKind::Tcp,
            url: "http://127.0.0.1:8420/".into(),
            loopback: true,
        };
        let mut inst = Instance::new(
            InstanceConfig::new(vec![listener]),
            Box::new(CounterEntropy(1)),
            now,
        );
        inst.set_write_ahead(true);
        Arc::new(Mutex::new(inst))
    }

    /// What a closed store holds. A child another test of this process is starting may
    /// hold a copy of the store's lock descriptor between its fork and its exec (the fd is
    /// CLOEXEC): on a loaded machine that can take milliseconds, so the reopen retries.
    fn reopen(dir: &Path) -> store::Recovered {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match Store::open(dir, store::Options::default()) {
                Err(e)
                    if e.to_string().contains("in use") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                other => break other.unwrap().1,
            }
        }
    }

    /// Waits (up to 10 s) until every change the instance made is durable.
    fn until_durable(inst: &Mutex<Instance>, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let i = lock(inst);
            if i.durable_seq() == i.record_seq() {
                return;
            }
            drop(i);
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: never durable"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A change nobody waits for gathers (here for a minute, so the test does not depend
    /// on the machine's speed); an answer that waits for a change ends the gathering at
    /// once, and what gathered goes to disk in the same write.
    #[test]
    fn changes_nobody_waits_for_gather_until_an_answer_waits() {
        let dir = std::env::temp_dir().join(format!("agentd-gather-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let now = Now::new(0, 1_767_225_600_000);
        let inst = write_ahead_instance(now);
        let (store, _) = Store::open(&dir, store::Options::default()).unwrap();
        let pump =
            spawn_gathering(inst.clone(), store, Vec::new(), Duration::from_secs(60)).unwrap();
        // An answer (returnImmediately) waits for its new task: written at once.
        let first = send(&inst, now, "first");
        until_durable(&inst, "the task an answer waits for");
        // The host settles it: nobody waits for that change, so it gathers.
        complete(&inst, now, &first);
        std::thread::sleep(Duration::from_millis(200));
        {
            let i = lock(&inst);
            assert!(
                i.durable_seq() < i.record_seq(),
                "a change nobody waits for gathered rather than being written at once"
            );
        }
        // A second task's answer waits: both changes are written now, long before a minute.
        let second = send(&inst, now, "second");
        until_durable(&inst, "the gathered change and the awaited one");
        pump.finish();
        let recovered = reopen(&dir);
        let body = |key: &str| match &recovered.records.iter().find(|r| r.key == key).unwrap().op {
            Op::Put(b) => b.to_string(),
            _ => panic!("a put"),
        };
        assert!(body(&first).contains("TASK_STATE_COMPLETED"));
        assert!(body(&second).contains("TASK_STATE_SUBMITTED"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A write that fails makes the instance refuse changes instead of stopping anything; a
    /// stop while the store is still failed tries one last heal, so what the instance held
    /// (the task whose write failed included) is there at the next open.
    #[test]
    fn a_failed_write_degrades_and_a_stop_heals_what_it_can() {
        let dir = std::env::temp_dir().join(format!("agentd-pump-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let now = Now::new(0, 1_767_225_600_000);
        let inst = write_ahead_instance(now);
        let (store, _) = Store::open(&dir, store::Options::default()).unwrap();
        store.fail_next_sync();
        // A task waits to be written when the pump starts: its write is the one that fails.
        let task = send(&inst, now, "first");
        let pump = spawn(inst.clone(), store, Vec::new()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while lock(&inst).store_unavailable().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the store never failed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let why = lock(&inst).store_unavailable().unwrap().to_owned();
        assert!(why.contains("Input/output error"), "{why}");
        // The host's work goes on while the store cannot write: the task completes.
        complete(&inst, now, &task);
        pump.finish();
        let recovered = reopen(&dir);
        let record = recovered
            .records
            .iter()
            .find(|r| r.key == task)
            .expect("the task survived the stop");
        let Op::Put(body) = &record.op else {
            panic!("a put")
        };
        assert!(
            body.to_string().contains("TASK_STATE_COMPLETED"),
            "the change made while the store could not write was healed in: {body}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
