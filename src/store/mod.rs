//! The durable file store: an append-only journal with group commit, periodic snapshots,
//! and recovery that survives a crash at any instant. Nothing acknowledged is lost: a
//! caller learns that its [`Ticket`] is durable only after the `fdatasync` covering it
//! returned success.
//!
//! The store is opaque: it keeps [`Record`]s, each a put or a removal of one
//! `(kind, key)`. It does not know what a task or a session is; it only knows that the last
//! write per `(kind, key)` is the state, and that a removal makes the key disappear.
//!
//! # Files in the data directory
//!
//! ```text
//! LOCK                          holds "pid N" of the store that has the directory open,
//!                               for the error message (see "The lock" below)
//! snapshot                      the state as of some generation G (absent: G = 0)
//! snapshot.tmp                  a snapshot being written; never read, deleted at open
//! journal.00000000000000000007  a journal segment, generation in 20 decimal digits
//! ```
//!
//! Every file is a sequence of frames, `[u32 LE length][u32 LE crc32][payload]`, where the
//! crc (IEEE, the zlib one) covers the payload and the payload is never empty.
//!
//! - A record frame is one [`Store::append`] call: a JSON array of records,
//!   `[{"kind":"task","key":"t1","op":{"put":{..}}}, {"kind":"push","key":"c9","op":"remove"}]`.
//!   One frame per call makes a call atomic: after a crash it is replayed whole or not at
//!   all, so a caller can put a task and its push config together without a half state.
//! - A journal segment (format 2) is a segment header frame
//!   `{"format":"agentd-journal","version":2,"gen":G}`, written and synced when the segment
//!   is created, then batches. A batch is what the writer wrote with one `write` and synced
//!   with one `fdatasync`: a batch header frame `{"batch":N,"bytes":B}` (N = 1, 2, 3, ...
//!   within the segment; B = the bytes of record frames that follow), then those record
//!   frames. The header is the only thing recovery needs to tell a torn write from damage
//!   to acknowledged data (below); it costs one small frame per fsync.
//! - A segment of format 1 (agentd before batch headers) is record frames only. It still
//!   opens, and is read by the strict rule below; a store never appends to one: open starts
//!   a new segment after it. (An agentd of format 1 cannot read format 2: it would take the
//!   segment header for a torn tail. Do not downgrade over a data directory.)
//! - A snapshot is a header frame
//!   `{"format":"agentd-store-snapshot","version":1,"gen":G,"records":N}` followed by frames
//!   of the same record arrays (puts only, in the order they were last written). It holds
//!   everything in the segments below G, which are then garbage.
//!
//! JSON rather than a binary encoding: the bodies are JSON already (A2A wire types), the
//! core already links serde_json, a journal can be inspected with a ten-line script, and
//! the cost is invisible next to an fsync. The crc, not the parser, detects damage; the
//! parser only catches a bug that wrote a good crc over a bad payload.
//!
//! # Writing: group commit
//!
//! [`Store::append`] encodes on the caller's thread, queues the frame and returns a ticket
//! (1, 2, 3, ... per open; 0 is always durable). One writer thread takes everything queued,
//! writes it behind its batch header with one `write`, calls `fdatasync` once, and then
//! publishes the highest ticket in that batch as durable: [`Store::durable`],
//! [`Store::wait_durable`], [`Store::poll_durable`] (a `Waker`, for drivers holding answers
//! in an event loop) and [`Store::on_durable`] (a callback after each fsync). It writes the
//! next batch only after that fsync succeeded; recovery rests on this.
//!
//! A failed write or fsync (a full disk, an I/O error) makes the store *failed*: it keeps
//! the durable mark where it was, refuses further appends ([`Error::Failed`]), fails every
//! waiter, and writes nothing more to that segment. It does not retry: after a failed fsync
//! Linux may drop the dirty pages and report success on the next one, so a retry would be a
//! lie. Reads of what the caller holds go on. The caller, which holds the whole state in
//! memory, heals it with [`Store::heal`]: a fresh snapshot of that state (the commit point
//! is its rename), every old segment deleted, a new segment started. Until a heal succeeds,
//! a crash recovers the directory as the failure left it: a partial batch at the end of the
//! newest segment is a torn tail, and nothing in it was acknowledged. A store that cannot
//! write when it opens (a disk still full at a restart) opens failed in the same way, its
//! state recovered and readable.
//!
//! # Compaction
//!
//! When the segments since the snapshot exceed `max(compact_after_bytes, snapshot size)`
//! (the second term bounds write amplification when the state itself is large), the writer
//! rotates: it creates `journal.<G'>` with its header, syncs it and the directory (so the
//! header and the name survive before anything in the segment is acknowledged) and appends
//! there from then on. The compactor thread then replays the snapshot and the closed
//! segments below G', writes `snapshot.tmp` with `gen: G'`, fsyncs it, renames it to
//! `snapshot`, fsyncs the directory (the commit point), and deletes the segments below G'.
//! A crash anywhere leaves either the old snapshot with all its segments, or the new
//! snapshot with (possibly) stale segments that replay ignores and removes; appends continue
//! during compaction.
//!
//! # Recovery
//!
//! [`Store::open`] takes the lock, deletes `snapshot.tmp`, reads the header of `snapshot`,
//! removes segments below its generation, and replays the rest in order into a map of what
//! they wrote and removed. The segments must run on from the snapshot's generation without
//! a gap, or open refuses (`Error::Layout`). Then the snapshot streams past, frame by frame:
//! a record of a key the segments touched is stale and skipped; the rest, then the
//! segments' own live records, go to the caller, in the order of their last writes.
//! [`Store::open_with`] hands them over one at a time as they are parsed (on several
//! threads): a restart never holds the whole state twice, as a tree and as the caller's.
//!
//! Damage is a frame that does not read well: short header, zero length, absurd length,
//! length past end of file, bad crc, bad payload, or (format 2) a frame out of place (a
//! record frame where a batch header is due, a batch number out of sequence, a frame running
//! past its batch, a file ending inside a batch). Replay stops at the first damage. Damage
//! in a snapshot or a closed segment (one with a newer segment after it) is never a torn
//! write, since each was synced whole before anything after it was written: open refuses.
//!
//! Only the newest segment can be torn by a crash. Its last batch may have been written and
//! not yet synced, and then the kernel may have written any of its pages and not others, in
//! any order: a crash can leave a hole with good frames after it, none of them acknowledged.
//! Every batch before the last one was synced before the next was written, so damage in it
//! is damage to acknowledged data. The rule: **cut only when everything from the damage to
//! the end of the file can belong to the last batch; otherwise refuse.** Precisely, for
//! damage found at offset D of the newest segment:
//!
//! - in a record frame of batch N, whose header (read well) puts its end at E: cut at the
//!   start of batch N if E >= the file's length; refuse if the file goes on past E (bytes
//!   past E can only be a later batch, written after N was synced);
//! - where a batch header is due (after batch N-1 ended, or in that header itself): cut
//!   there unless a good batch header numbered above N-1 starts anywhere after D (found by
//!   scanning for `{"batch":`), which would be a later batch; refuse if one does;
//! - in the first frame of a segment, or anywhere in a segment of format 1: cut there unless
//!   any good frame (record frame or batch header) starts anywhere after D; refuse if one
//!   does. A format-2 segment header is synced before any batch is written, so damage to it
//!   with data after it is damage to synced data; a format-1 segment has no batches to show
//!   that good frames after damage were never acknowledged.
//!
//! A cut truncates the file (a whole batch, so the frames before the damage in that batch go
//! too: they were never acknowledged either) and is reported in [`Recovered::truncated`]
//! for the daemon to log. A refusal is [`Error::Corrupt`] naming the file, the offset of the
//! damaged frame and why it cannot be a torn write; the file is left as it is, for an
//! operator to decide (restore it from a backup, say). Damage in the last batch itself
//! cannot be told from a torn write: if that batch had been acknowledged (a flipped byte
//! after a clean stop), it is cut all the same. Before appending after what an earlier
//! process wrote, open syncs the newest segment, so a batch of this process never reaches
//! the disk before the unsynced last batch of the process before.
//!
//! # The lock
//!
//! One store per directory: open takes `flock(LOCK_EX | LOCK_NB)` on the data directory
//! itself, through a descriptor held until the store closes (the kernel drops it if the
//! process dies, so a crash leaves no stale lock). A lock on a file in the directory would
//! not do: deleting the file lets a second store create and lock a new one, and its
//! compaction would then delete the first store's journal under it. `LOCK` is still
//! written ("pid N") for the message a refused store prints, and still flocked, so that an
//! agentd from before the directory lock (which locks only `LOCK`) and this one exclude
//! each other; deleting it changes nothing for this version. The lock follows the
//! directory, not its name: if a live data directory is renamed, a store opened at the old
//! path gets a new, empty directory (it shares nothing, so it is not refused), and the
//! first store, which reaches its files by path, fails at its next rotation or compaction
//! (`Error::Layout`: its path names another directory) rather than create or delete files
//! in a directory it does not hold. What it acknowledged is in the renamed directory.

mod disk;
mod frame;
mod journal;
#[cfg(test)]
mod tests;

use std::fmt;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use disk::Recovering;
pub use frame::{crc32, Damage, MAX_FRAME};
use serde_json::value::RawValue;

/// A position in the append order of one open store: 1, 2, 3, ... Ticket 0 is durable from
/// the start. Tickets restart at 1 after a reopen (an answer cannot be held across a
/// restart, so nothing compares them across one).
pub type Ticket = u64;

/// One write: a put or a removal of `(kind, key)`. The body is a JSON value; compaction,
/// which only copies bodies, reads them as raw JSON text (`Box<RawValue>`) instead, a
/// fraction of a parsed tree's memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record<B = serde_json::Value> {
    /// The family: `"task"`, `"push"`, `"session"`, ...
    pub kind: String,
    /// The key within the family.
    pub key: String,
    pub op: Op<B>,
}

/// A put carries the new body, a removal nothing. A separate enum rather than kinds like
/// `task.remove` so the compaction key `(kind, key)` is the same for both; `"put": null` is
/// still a put.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op<B = serde_json::Value> {
    Put(B),
    Remove,
}

impl<B> Record<B> {
    pub fn put(kind: impl Into<String>, key: impl Into<String>, body: B) -> Self {
        Record {
            kind: kind.into(),
            key: key.into(),
            op: Op::Put(body),
        }
    }

    pub fn remove(kind: impl Into<String>, key: impl Into<String>) -> Self {
        Record {
            kind: kind.into(),
            key: key.into(),
            op: Op::Remove,
        }
    }
}

/// Tuning. The defaults suit a daemon; tests shrink them.
#[derive(Clone, Debug)]
pub struct Options {
    /// Compact when the segments since the snapshot exceed this (or the snapshot's own size,
    /// whichever is larger).
    pub compact_after_bytes: u64,
    /// The largest encoded append (one call's records); larger ones are refused. At most
    /// [`MAX_FRAME`] (`open` panics otherwise: a configuration bug, not a runtime state).
    pub max_append_bytes: usize,
    /// Appends block while this much is queued and not yet written: back-pressure instead of
    /// a queue without end when the disk is slower than the callers.
    pub max_pending_bytes: usize,
    /// Threads that decode and parse records at open: `None` picks from the machine's
    /// cores (none on one core, else up to 4); `Some(0)` does it all on the opening thread.
    pub replay_threads: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            compact_after_bytes: 64 << 20,
            max_append_bytes: 16 << 20,
            max_pending_bytes: 64 << 20,
            replay_threads: None,
        }
    }
}

/// What [`Store::open_with`] found, besides the records it handed over.
#[derive(Debug)]
pub struct Opened {
    /// Journal frames replayed (one per append call) on top of the snapshot.
    pub frames: u64,
    /// A damaged tail cut off the newest segment, if any. Log it.
    pub truncated: Option<Truncation>,
}

/// Open's threads that decode the journal and parse the snapshot, at most (more cores than
/// this only wait on the one thread that restores what they parse).
const MAX_REPLAY_THREADS: usize = 4;

/// What open found: the live state and whether a damaged tail was cut off.
#[derive(Debug)]
pub struct Recovered<B = serde_json::Value> {
    /// The live state: the last put per `(kind, key)` whose key was not removed afterwards,
    /// in the order of those last writes.
    pub records: Vec<Record<B>>,
    /// Journal frames replayed (one per append call) on top of the snapshot.
    pub frames: u64,
    /// A damaged tail cut off the newest segment, if any. Log it.
    pub truncated: Option<Truncation>,
}

/// A cut made at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncation {
    pub file: PathBuf,
    /// The file now ends here: at the start of the torn batch (in a segment of format 1,
    /// at the damaged frame).
    pub at_offset: u64,
    pub dropped_bytes: u64,
    /// Where the damage was found, at or after `at_offset`.
    pub damage_offset: u64,
    pub damage: Damage,
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: dropped {} bytes from offset {} (damage at offset {}: {})",
            self.file.display(),
            self.dropped_bytes,
            self.at_offset,
            self.damage_offset,
            self.damage
        )
    }
}

#[derive(Debug)]
pub enum Error {
    Io {
        what: String,
        source: io::Error,
    },
    /// Another store (this process or another) has the directory open.
    Locked {
        dir: PathBuf,
        holder: String,
    },
    /// Damage where no crash can cause it: in a snapshot, a closed segment, or data of the
    /// newest segment that provably had been synced. The file is left as it is.
    Corrupt {
        file: PathBuf,
        offset: u64,
        damage: Damage,
        /// Why this cannot be a torn write.
        why: String,
    },
    /// Files that cannot come from this store's own sequence of steps (a missing segment).
    Layout(String),
    /// One append encodes to more than `max_append_bytes`.
    TooLarge {
        bytes: usize,
        max: usize,
    },
    /// The store failed earlier (a write or fsync error) and takes no appends until
    /// [`Store::heal`] succeeds.
    Failed(Arc<str>),
    /// `wait_durable` timed out; the ticket may still become durable.
    Timeout,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { what, source } => write!(f, "{what}: {source}"),
            Error::Locked { dir, holder } => {
                write!(
                f,
                "data directory {} is in use by another agentd ({}); two daemons must not share it",
                dir.display(),
                if holder.is_empty() { "holder unknown" } else { holder }
            )
            }
            Error::Corrupt {
                file,
                offset,
                damage,
                why,
            } => {
                write!(
                    f,
                    "{} is corrupt at offset {offset}: {damage}; {why}. The file is left as \
                     it is, for an operator to decide",
                    file.display()
                )
            }
            Error::Layout(why) => write!(f, "data directory layout: {why}"),
            Error::TooLarge { bytes, max } => {
                write!(f, "append of {bytes} bytes exceeds the limit of {max}")
            }
            Error::Failed(why) => write!(f, "store cannot write until it heals: {why}"),
            Error::Timeout => f.write_str("timed out waiting for durability"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// What an [`Store::on_durable`] callback hears.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Every ticket up to this one is durable.
    Durable(Ticket),
    /// The store failed; nothing more will become durable.
    Failed(Arc<str>),
}

/// A snapshot of the store's counters.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub durable: Ticket,
    pub appended: Ticket,
    pub live_gen: u64,
    /// Bytes in segments not yet folded into the snapshot.
    pub journal_bytes: u64,
    pub snapshot_bytes: u64,
    pub batches: u64,
    pub compactions: u64,
    pub last_compaction_error: Option<String>,
    pub failed: Option<Arc<str>>,
    /// Times the store healed after failing.
    pub heals: u64,
}

/// The writer's latencies, for `/metrics`.
#[derive(Debug, Default)]
pub struct Latency {
    /// Writing one batch (its header and frames, one `writev`) to the journal.
    pub append: agentd_core::metrics::Histogram,
    /// The `fdatasync` after it.
    pub fsync: agentd_core::metrics::Histogram,
}

/// A read-only view of an open store for another thread (`/metrics`): its counters, its
/// writer's latencies and its segment files. It keeps the store's shared state alive, not
/// the store open.
#[derive(Clone)]
pub struct Observer(Arc<Shared>);

impl Observer {
    pub fn stats(&self) -> Stats {
        self.0.stats()
    }

    pub fn latency(&self) -> &Latency {
        &self.0.latency
    }

    /// Journal segment files in the data directory now.
    pub fn segments(&self) -> usize {
        disk::count_segments(&self.0.dir)
    }
}

type Callback = Arc<dyn Fn(&Notice) + Send + Sync>;

struct Inner {
    /// Frames queued for the writer, in ticket order.
    pending: Vec<u8>,
    /// The last ticket handed out.
    appended: Ticket,
    durable: Ticket,
    failed: Option<Arc<str>>,
    /// The fresh segment a heal started, for the writer to take up.
    healed: Option<Segment>,
    heals: u64,
    shutdown: bool,
    wakers: Vec<(Ticket, Waker)>,
    callbacks: Vec<Callback>,
    batches: u64,
    live_gen: u64,
    live_bytes: u64,
    /// Bytes in closed segments not yet compacted away.
    closed_bytes: u64,
    snapshot_bytes: u64,
    compacting: bool,
    /// After a failed compaction, wait for this much new journal before trying again, so a
    /// persistent error (a full disk) does not rotate a segment per batch.
    retry_after_live_bytes: u64,
    compactions: u64,
    last_compaction_error: Option<String>,
    /// `compact()` requests handed out, taken by a rotation, and finished.
    force_requested: u64,
    force_taken: u64,
    force_done: u64,
}

struct Shared {
    dir: PathBuf,
    /// What `dir` named when the store locked it (see `disk::check_dir`).
    dir_id: disk::DirId,
    opts: Options,
    inner: Mutex<Inner>,
    /// The writer waits here for work.
    work: Condvar,
    /// Appenders wait here for queue space, waiters for durability, `compact()` for its
    /// compaction.
    progress: Condvar,
    /// How long the writer's writes and fsyncs take.
    latency: Latency,
    /// Tests make the next write+fsync fail, to exercise the fatal path.
    #[cfg(test)]
    fail_next_sync: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave Inner half-updated in a way that
        // breaks durability accounting worse than the panic itself; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The open store. Dropping it (or [`Store::close`]) writes out what is queued, waits for a
/// running compaction, and releases the lock.
pub struct Store {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    compactor: Option<JoinHandle<()>>,
    jobs: Option<mpsc::Sender<Job>>,
    _lock: disk::Lock,
}

struct Job {
    upto: u64,
    force: u64,
}

impl Store {
    /// Opens (or creates) the store in `dir`, recovering its state. Fails with
    /// [`Error::Locked`] if another store has it open.
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<(Store, Recovered), Error> {
        let mut records = Vec::new();
        let mut unreadable = None;
        let (store, opened) = Self::open_with(
            dir,
            opts,
            &|_, _, body| serde_json::from_str(body.get()),
            &mut |r| match r {
                Recovering::Expect(n) => records.reserve(usize::try_from(n).unwrap_or(0)),
                Recovering::Put { kind, key, body } => match body {
                    Ok(body) => records.push(Record::put(kind, key, body)),
                    Err(e) => unreadable = Some(format!("{kind} {key}: {e}")),
                },
            },
        )?;
        // Every body was read well as JSON text already; a tree of it fails only past
        // serde_json's nesting limit, which the text's own reading shares.
        if let Some(why) = unreadable {
            return Err(Error::Layout(format!("a record does not read back: {why}")));
        }
        let recovered = Recovered {
            records,
            frames: opened.frames,
            truncated: opened.truncated,
        };
        Ok((store, recovered))
    }

    /// [`Store::open`] for a caller that takes the state as it streams off the disk rather
    /// than as one list: `parse` makes each live record's body from its JSON text (on
    /// several threads at once, so it must be `Sync`), and `sink` gets
    /// [`Recovering::Expect`] first, then every live record in the order of its last write,
    /// on this thread, before the store starts. The snapshot is never held whole.
    pub fn open_with<T: Send>(
        dir: impl AsRef<Path>,
        opts: Options,
        parse: &(dyn Fn(&str, &str, &RawValue) -> T + Sync),
        sink: &mut dyn FnMut(Recovering<T>),
    ) -> Result<(Store, Opened), Error> {
        let dir = dir.as_ref().to_path_buf();
        assert!(
            opts.max_append_bytes <= MAX_FRAME as usize,
            "max_append_bytes above MAX_FRAME"
        );
        let lock = disk::lock(&dir)?;
        let workers = opts.replay_threads.unwrap_or_else(|| {
            // One core: the reader and workers would only take turns with this thread.
            match thread::available_parallelism().map_or(1, |n| n.get()) {
                1 => 0,
                n => n.min(MAX_REPLAY_THREADS),
            }
        });
        let replay = disk::replay(&dir, disk::Mode::Open, workers, parse, sink)?;

        let all_bytes: u64 = replay.segments.iter().map(|s| s.len).sum();
        let started = (|| {
            Ok(match replay.segments.last() {
                // Appends go on in the newest segment when it has the current format.
                Some(last) if last.len > 0 && last.format == journal::Format::Batched => {
                    let path = dir.join(disk::journal_name(last.gen));
                    let file = disk::create_opts()
                        .append(true)
                        .open(&path)
                        .map_err(disk::io_err("open", &path))?;
                    sync_earlier_writes(&file, &path)?;
                    Segment {
                        file,
                        gen: last.gen,
                        path,
                        batches: last.batches,
                        bytes: last.len,
                    }
                }
                // Format 1: batches never follow its unmarked frames in one file. It becomes
                // a closed segment, which is trusted to be synced whole, so sync it first.
                Some(last) if last.len > 0 => {
                    let path = dir.join(disk::journal_name(last.gen));
                    let file = File::open(&path).map_err(disk::io_err("open", &path))?;
                    sync_earlier_writes(&file, &path)?;
                    Segment::start(&dir, last.gen + 1)?
                }
                // Empty: a rotation that crashed before writing the header, or a cut to
                // nothing.
                Some(last) => Segment::start(&dir, last.gen)?,
                None => Segment::start(&dir, replay.snapshot_gen)?,
            })
        })();
        // A disk that is full (or failing) now still lets the state be read: the store opens
        // failed, read-only, and heals like a store that failed later ([`Store::heal`]).
        // Anything but an I/O error (a lock, a layout) still refuses to open.
        let (seg, failed) = match started {
            Ok(seg) => (Some(seg), None),
            Err(e @ Error::Io { .. }) => (None, Some(Arc::<str>::from(e.to_string()))),
            Err(e) => return Err(e),
        };
        let newest = replay
            .segments
            .last()
            .map_or(replay.snapshot_gen, |l| l.gen);
        let live_gen = seg.as_ref().map_or(newest + 1, |s| s.gen);
        let live_bytes = seg.as_ref().map_or(0, |s| s.bytes);
        let closed_bytes = match (replay.segments.last(), &seg) {
            (Some(last), Some(seg)) if last.gen == seg.gen => all_bytes - last.len,
            _ => all_bytes,
        };
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            dir_id: lock.id,
            opts,
            inner: Mutex::new(Inner {
                pending: Vec::new(),
                appended: 0,
                durable: 0,
                failed,
                healed: None,
                heals: 0,
                shutdown: false,
                wakers: Vec::new(),
                callbacks: Vec::new(),
                batches: 0,
                live_gen,
                live_bytes,
                closed_bytes,
                snapshot_bytes: replay.snapshot_bytes,
                compacting: false,
                retry_after_live_bytes: 0,
                compactions: 0,
                last_compaction_error: None,
                force_requested: 0,
                force_taken: 0,
                force_done: 0,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            latency: Latency::default(),
            #[cfg(test)]
            fail_next_sync: Default::default(),
        });

        let (tx, rx) = mpsc::channel::<Job>();
        let s = shared.clone();
        let compactor = thread::Builder::new()
            .name("agentd-store-compact".into())
            .spawn(move || compactor_loop(&s, rx))
            .map_err(|e| Error::Io {
                what: "spawn compactor thread".into(),
                source: e,
            })?;
        let s = shared.clone();
        let jobs = tx.clone();
        let writer = thread::Builder::new()
            .name("agentd-store-writer".into())
            .spawn(move || writer_loop(&s, seg, &jobs))
            .map_err(|e| Error::Io {
                what: "spawn writer thread".into(),
                source: e,
            })?;

        let opened = Opened {
            frames: replay.frames,
            truncated: replay.truncated,
        };
        let store = Store {
            shared,
            writer: Some(writer),
            compactor: Some(compactor),
            jobs: Some(tx),
            _lock: lock,
        };
        Ok((store, opened))
    }

    /// Queues `records` as one atomic frame and returns its ticket. Encoding happens here,
    /// on the caller's thread; the write and fsync happen on the writer thread. Blocks only
    /// while the queue is full (`max_pending_bytes`). An empty `records` writes nothing and
    /// returns the last ticket handed out.
    pub fn append<B: Serialize>(&self, records: &[Record<B>]) -> Result<Ticket, Error> {
        let mut frame = Vec::new();
        if !records.is_empty() {
            let payload = serde_json::to_vec(records).expect("a record serialises");
            let max = self.shared.opts.max_append_bytes;
            if payload.len() > max {
                return Err(Error::TooLarge {
                    bytes: payload.len(),
                    max,
                });
            }
            frame.reserve_exact(frame::HEADER + payload.len());
            frame::push_frame(&mut frame, &payload);
        }
        let mut g = self.shared.lock();
        loop {
            if let Some(why) = &g.failed {
                return Err(Error::Failed(why.clone()));
            }
            if frame.is_empty() {
                return Ok(g.appended);
            }
            // An empty queue always takes the frame, however large, so nothing waits forever.
            if g.pending.is_empty()
                || g.pending.len() + frame.len() <= self.shared.opts.max_pending_bytes
            {
                break;
            }
            g = self
                .shared
                .progress
                .wait(g)
                .unwrap_or_else(|e| e.into_inner());
        }
        g.pending.extend_from_slice(&frame);
        g.appended += 1;
        let ticket = g.appended;
        drop(g);
        self.shared.work.notify_one();
        Ok(ticket)
    }

    /// The highest durable ticket: every ticket up to it is on disk.
    pub fn durable(&self) -> Ticket {
        self.shared.lock().durable
    }

    /// Blocks until `ticket` is durable, the store fails, or `timeout` passes.
    pub fn wait_durable(&self, ticket: Ticket, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            if g.durable >= ticket {
                return Ok(());
            }
            if let Some(why) = &g.failed {
                return Err(Error::Failed(why.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout);
            }
            g = self
                .shared
                .progress
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Non-blocking: ready once `ticket` is durable (or the store failed); otherwise keeps
    /// `cx`'s waker and wakes it after the fsync that covers the ticket.
    pub fn poll_durable(&self, ticket: Ticket, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let mut g = self.shared.lock();
        if g.durable >= ticket {
            return Poll::Ready(Ok(()));
        }
        if let Some(why) = &g.failed {
            return Poll::Ready(Err(Error::Failed(why.clone())));
        }
        match g
            .wakers
            .iter_mut()
            .find(|(t, w)| *t == ticket && w.will_wake(cx.waker()))
        {
            Some(_) => {}
            None => g.wakers.push((ticket, cx.waker().clone())),
        }
        Poll::Pending
    }

    /// Calls `f` on the writer thread after every fsync (with the new durable ticket) and
    /// once on failure. Keep it short (it delays the next batch) and never panic (it runs on
    /// the writer thread, and a panic there stops durability for good). It is not called for what
    /// was durable before it was registered; read [`Store::durable`] after registering.
    pub fn on_durable(&self, f: impl Fn(&Notice) + Send + Sync + 'static) {
        self.shared.lock().callbacks.push(Arc::new(f));
    }

    /// Rotates the journal and folds everything before the rotation into a new snapshot now,
    /// blocking until that compaction finishes. Normally compaction runs by itself.
    pub fn compact(&self) -> Result<(), Error> {
        let mut g = self.shared.lock();
        g.force_requested += 1;
        let mine = g.force_requested;
        self.shared.work.notify_one();
        loop {
            if let Some(why) = &g.failed {
                return Err(Error::Failed(why.clone()));
            }
            if g.force_done >= mine {
                return match &g.last_compaction_error {
                    Some(e) => Err(Error::Io {
                        what: "compaction".into(),
                        source: io::Error::other(e.clone()),
                    }),
                    None => Ok(()),
                };
            }
            g = self
                .shared
                .progress
                .wait(g)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Makes the next write+fsync fail (EIO), as a full or failing disk would.
    #[cfg(test)]
    pub(crate) fn fail_next_sync(&self) {
        self.shared
            .fail_next_sync
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Heals a failed store from the state its caller holds in memory: writes `records`
    /// (every live `(kind, key)`, puts only) as a fresh snapshot, deletes every journal
    /// segment, starts a new one, and takes appends again. Every ticket handed out before
    /// counts as durable from then on: whatever it carried is superseded by `records`.
    ///
    /// Why a rewrite and not a retry: after a failed write or fsync, what the journal holds
    /// past the last good fsync cannot be trusted (Linux may have dropped the dirty pages and
    /// report the next fsync a success), and a partial batch sits at the end of the segment.
    /// The snapshot's rename is the commit point, as in compaction; a crash before it
    /// recovers the directory as the failure left it (the partial batch is a torn tail).
    ///
    /// Fails (the store stays failed, and the caller tries again later) while the disk is
    /// still full; a partial snapshot is deleted so that it holds no space. A store that has
    /// not failed is left alone.
    pub fn heal<B: Serialize>(&self, records: &[Record<B>]) -> Result<(), Error> {
        let gen = {
            let mut g = self.shared.lock();
            if g.failed.is_none() {
                return Ok(());
            }
            // A compaction running when the write failed finishes (or fails) first: it
            // writes snapshot.tmp too.
            while g.compacting {
                g = self
                    .shared
                    .progress
                    .wait(g)
                    .unwrap_or_else(|e| e.into_inner());
            }
            g.compacting = true;
            // Above every segment on disk, so the snapshot supersedes them all; each attempt
            // takes a new one (a failed attempt may have left a partial segment file).
            g.live_gen += 1;
            g.live_gen
        };
        let dir = &self.shared.dir;
        let res = disk::check_dir(dir, self.shared.dir_id)
            .and_then(|()| disk::install_snapshot(dir, gen, records))
            .and_then(|size| Segment::start(dir, gen).map(|seg| (size, seg)));
        let mut g = self.shared.lock();
        g.compacting = false;
        let out = match res {
            Ok((size, seg)) => {
                g.failed = None;
                g.durable = g.appended;
                g.closed_bytes = 0;
                g.live_bytes = seg.bytes;
                g.snapshot_bytes = size;
                g.retry_after_live_bytes = 0;
                g.heals += 1;
                g.healed = Some(seg);
                Ok(())
            }
            Err(e) => Err(e),
        };
        drop(g);
        self.shared.work.notify_all();
        self.shared.progress.notify_all();
        out
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// A view of this store's counters and latencies for another thread.
    pub fn observer(&self) -> Observer {
        Observer(self.shared.clone())
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

impl Shared {
    fn stats(&self) -> Stats {
        let g = self.lock();
        Stats {
            durable: g.durable,
            appended: g.appended,
            live_gen: g.live_gen,
            journal_bytes: g.closed_bytes + g.live_bytes,
            snapshot_bytes: g.snapshot_bytes,
            batches: g.batches,
            compactions: g.compactions,
            last_compaction_error: g.last_compaction_error.clone(),
            failed: g.failed.clone(),
            heals: g.heals,
        }
    }
}

impl Store {
    /// Writes out what is queued, stops the threads and releases the lock. Reports the
    /// failure if the store had failed.
    pub fn close(mut self) -> Result<(), Error> {
        self.shutdown();
        match self.shared.lock().failed.clone() {
            Some(why) => Err(Error::Failed(why)),
            None => Ok(()),
        }
    }

    fn shutdown(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        // The writer held the other sender; this ends the compactor after its current job.
        self.jobs.take();
        if let Some(c) = self.compactor.take() {
            let _ = c.join();
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The segment the writer appends to.
struct Segment {
    file: File,
    gen: u64,
    path: PathBuf,
    /// Batches written to it so far: the next one is numbered one higher.
    batches: u64,
    /// Its length when the writer took it over.
    bytes: u64,
}

impl Segment {
    /// A new segment, its header and name durable.
    fn start(dir: &Path, gen: u64) -> Result<Segment, Error> {
        let (file, path, bytes) = disk::start_segment(dir, gen)?;
        Ok(Segment {
            file,
            gen,
            path,
            batches: 0,
            bytes,
        })
    }
}

/// Syncs what an earlier process wrote to the newest segment. It died, but its last batch
/// may still sit in the page cache, unsynced; recovery read it from there. Were a batch
/// appended after it before it reached the disk, a crash of the machine could leave a hole
/// in it followed by that later batch, which recovery takes as proof of damage to synced
/// data and refuses.
fn sync_earlier_writes(file: &File, path: &Path) -> Result<(), Error> {
    file.sync_data().map_err(disk::io_err("fdatasync", path))
}

/// `write_all` over several buffers in one `writev`: a batch header and its frames reach the
/// kernel as one write, as one batch did before it had a header.
fn write_all_vectored(file: &mut File, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        match file.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits while the store is failed, until a heal hands over its fresh segment (`None`: the
/// store shut down first).
fn wait_for_heal(shared: &Shared) -> Option<Segment> {
    let mut g = shared.lock();
    loop {
        if let Some(seg) = g.healed.take() {
            return Some(seg);
        }
        if g.shutdown {
            return None;
        }
        g = shared.work.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}

fn writer_loop(shared: &Shared, seg: Option<Segment>, jobs: &mpsc::Sender<Job>) {
    let mut batch = Vec::new();
    let Some(mut seg) = seg.or_else(|| wait_for_heal(shared)) else {
        return;
    };
    loop {
        let mut g = shared.lock();
        let last = loop {
            let force = g.force_requested > g.force_taken && !g.compacting;
            if !g.pending.is_empty() || force || g.shutdown {
                break g.appended;
            }
            g = shared.work.wait(g).unwrap_or_else(|e| e.into_inner());
        };
        if g.pending.is_empty() && g.shutdown {
            return;
        }
        // Double-buffer: appenders fill the other vector while this batch is written.
        std::mem::swap(&mut g.pending, &mut batch);
        drop(g);
        shared.progress.notify_all();

        if !batch.is_empty() {
            // The header that makes this a batch for recovery. The next batch is written only
            // after this one's fsync succeeded (this loop), which is what lets recovery tell
            // damage under a synced batch from a torn last one.
            let head = journal::batch_header(seg.batches + 1, batch.len() as u64);
            let writing = Instant::now();
            let res = write_all_vectored(
                &mut seg.file,
                &mut [IoSlice::new(&head), IoSlice::new(&batch)],
            )
            .and_then(|()| injected_fault(shared))
            .and_then(|()| {
                let syncing = Instant::now();
                shared.latency.append.observe(syncing - writing);
                let synced = seg.file.sync_data();
                shared.latency.fsync.observe(syncing.elapsed());
                synced
            });
            if let Err(e) = res {
                fail(
                    shared,
                    format!("write+fdatasync {}: {e}", seg.path.display()),
                );
                batch.clear();
                match wait_for_heal(shared) {
                    Some(fresh) => {
                        seg = fresh;
                        continue;
                    }
                    None => return,
                }
            }
            seg.batches += 1;
            let wakers;
            let callbacks;
            {
                let mut g = shared.lock();
                g.durable = last;
                g.live_bytes += (head.len() + batch.len()) as u64;
                g.batches += 1;
                let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut g.wakers)
                    .into_iter()
                    .partition(|(t, _)| *t <= last);
                g.wakers = waiting;
                wakers = ready;
                callbacks = g.callbacks.clone();
            }
            batch.clear();
            shared.progress.notify_all();
            wakers.into_iter().for_each(|(_, w)| w.wake());
            let notice = Notice::Durable(last);
            callbacks.iter().for_each(|f| f(&notice));
        }

        if let Some(job) = rotate_due(shared) {
            if let Err(e) = rotate(shared, &mut seg, job.upto) {
                // No compaction follows this rotation.
                shared.lock().compacting = false;
                fail(shared, e.to_string());
                match wait_for_heal(shared) {
                    Some(fresh) => {
                        seg = fresh;
                        continue;
                    }
                    None => return,
                }
            }
            // The compactor outlives the writer (shutdown joins the writer first).
            let _ = jobs.send(job);
        }
    }
}

/// Decides, under the lock, whether to rotate now; if so marks a compaction as running.
fn rotate_due(shared: &Shared) -> Option<Job> {
    let mut g = shared.lock();
    if g.compacting || g.shutdown {
        return None;
    }
    let forced = g.force_requested > g.force_taken;
    let threshold = shared.opts.compact_after_bytes.max(g.snapshot_bytes);
    let due = g.closed_bytes + g.live_bytes > threshold && g.live_bytes >= g.retry_after_live_bytes;
    if !(forced || due) {
        return None;
    }
    g.compacting = true;
    g.force_taken = g.force_requested;
    Some(Job {
        upto: g.live_gen + 1,
        force: g.force_taken,
    })
}

/// Starts segment `gen` and makes its header and name durable before anything in it can be
/// acknowledged.
fn rotate(shared: &Shared, seg: &mut Segment, gen: u64) -> Result<(), Error> {
    disk::check_dir(&shared.dir, shared.dir_id)?;
    *seg = Segment::start(&shared.dir, gen)?;
    let mut g = shared.lock();
    g.closed_bytes += g.live_bytes;
    g.live_bytes = seg.bytes;
    g.live_gen = seg.gen;
    Ok(())
}

#[cfg(not(test))]
fn injected_fault(_: &Shared) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
fn injected_fault(shared: &Shared) -> io::Result<()> {
    match shared
        .fail_next_sync
        .swap(false, std::sync::atomic::Ordering::SeqCst)
    {
        true => Err(io::Error::from_raw_os_error(5)), // EIO
        false => Ok(()),
    }
}

fn fail(shared: &Shared, why: String) {
    let why: Arc<str> = why.into();
    let (wakers, callbacks) = {
        let mut g = shared.lock();
        g.failed = Some(why.clone());
        g.pending = Vec::new();
        (std::mem::take(&mut g.wakers), g.callbacks.clone())
    };
    shared.progress.notify_all();
    wakers.into_iter().for_each(|(_, w)| w.wake());
    let notice = Notice::Failed(why);
    callbacks.iter().for_each(|f| f(&notice));
}

fn compactor_loop(shared: &Shared, jobs: mpsc::Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        let res = disk::check_dir(&shared.dir, shared.dir_id)
            .and_then(|()| disk::compact(&shared.dir, job.upto, None));
        let mut g = shared.lock();
        g.compacting = false;
        g.force_done = g.force_done.max(job.force);
        match res {
            Ok(done) => {
                g.compactions += 1;
                g.snapshot_bytes = done.snapshot_bytes;
                g.closed_bytes = g.closed_bytes.saturating_sub(done.removed_bytes);
                g.retry_after_live_bytes = 0;
                g.last_compaction_error = None;
            }
            Err(e) => {
                // Not fatal: the journal still holds everything. Try again after more writes.
                g.last_compaction_error = Some(e.to_string());
                g.retry_after_live_bytes = shared.opts.compact_after_bytes;
            }
        }
        drop(g);
        shared.progress.notify_all();
        shared.work.notify_one();
    }
}
