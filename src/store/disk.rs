//! The files of a data directory: names, the lock, replay (snapshot + segments), new
//! segments and the compaction steps. Everything here runs at open (before any thread
//! starts), on the compactor thread (which only touches closed segments and the snapshot),
//! or on the writer thread (a new segment at rotation).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::frame::{self, Damage, FrameReader, Next};
use super::journal::{self, Format};
use super::{Error, Op, Record, Truncation};

pub(crate) const LOCK: &str = "LOCK";
pub(crate) const SNAPSHOT: &str = "snapshot";
pub(crate) const SNAPSHOT_TMP: &str = "snapshot.tmp";
const JOURNAL_PREFIX: &str = "journal.";
const SNAPSHOT_FORMAT: &str = "agentd-store-snapshot";
const SNAPSHOT_VERSION: u32 = 1;
/// Records are grouped into snapshot frames of about this many payload bytes: large enough
/// to amortise the frame overhead, small enough to keep the reader's buffers modest.
const SNAPSHOT_CHUNK: usize = 1 << 20;

pub(crate) fn journal_name(gen: u64) -> String {
    format!("{JOURNAL_PREFIX}{gen:020}")
}

fn parse_journal_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(JOURNAL_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Journal segment files in `dir` now (0 if it cannot be read).
pub(crate) fn count_segments(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .and_then(parse_journal_name)
                    .is_some()
            })
            .count()
    })
}

pub(crate) fn io_err(what: impl Into<String>, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    let path = path.to_path_buf();
    move |source| Error::Io {
        what: format!("{what} {}", path.display()),
        source,
    }
}

/// Data files hold credentials (push configs, sessions): owner-only.
pub(crate) fn create_opts() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600);
    o
}

/// Makes a directory entry change (create, rename, unlink) durable: fsync of a file covers
/// its data, not the name that points at it.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// The identity of a directory: what its path named when the store opened it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirId {
    dev: u64,
    ino: u64,
}

impl DirId {
    fn of(st: &rustix::fs::Stat) -> DirId {
        DirId {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// The held lock on a data directory; dropping it (or the process dying) releases it.
pub(crate) struct Lock {
    /// flock(LOCK_EX) on the directory itself: the lock that counts. A file in the
    /// directory can be deleted and recreated by anyone, and a second daemon would then lock
    /// the new file; the directory cannot be swapped out from under an open descriptor.
    _dir: OwnedFd,
    /// `LOCK`, flocked as well: agentd before the directory lock took only this one, so an
    /// older daemon and this one still exclude each other. Holds "pid N" for the message.
    _file: File,
    pub(crate) id: DirId,
}

/// Creates the directory if needed and takes the lock for the life of the returned
/// [`Lock`]. flock (not a pid file) because the kernel drops it when the holder dies, so a
/// crash never leaves a stale lock. rustix rather than `File::try_lock` because the latter
/// needs Rust 1.89 and the workspace promises 1.85.
///
/// The lock is on the directory, not its name: rename the directory of a running store and
/// a second store opened at the old path gets a new, empty directory (not refused: it
/// shares nothing), while the first notices at its next rotation or compaction that its
/// path names another directory and fails rather than touch it ([`check_dir`]).
pub(crate) fn lock(dir: &Path) -> Result<Lock, Error> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err("create data directory", dir))?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(dir, flags, Mode::empty())
        .map_err(|e| io_err("open data directory", dir)(e.into()))?;
    let path = dir.join(LOCK);
    let locked = |holder: Option<String>| Error::Locked {
        dir: dir.to_path_buf(),
        holder: holder
            .or_else(|| fs::read_to_string(&path).ok())
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Err(locked(None)),
        Err(e) => return Err(io_err("flock", dir)(e.into())),
    }
    let id = DirId::of(&rustix::fs::fstat(&fd).map_err(|e| io_err("stat", dir)(e.into()))?);
    let mut file = create_opts()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err("open lock file", &path))?;
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(locked(Some(format!(
                "{} (an earlier agentd)",
                holder.trim()
            ))));
        }
        Err(e) => return Err(io_err("flock", &path)(e.into())),
    }
    // Who holds it, for the other daemon's error message; informative only.
    let _ = file
        .set_len(0)
        .and_then(|()| writeln!(file, "pid {}", std::process::id()));
    Ok(Lock {
        _dir: fd,
        _file: file,
        id,
    })
}

/// Fails if `dir` no longer names the directory the store locked (it was renamed or
/// deleted, and perhaps another store made a new one there). The store reaches its files
/// by path, so past this point it would create or delete files in a directory it does not
/// hold. Checked before each rotation and compaction; a rename racing the check itself
/// still slips through, which moving a live data directory deserves.
pub(crate) fn check_dir(dir: &Path, id: DirId) -> Result<(), Error> {
    match rustix::fs::stat(dir) {
        Ok(st) if DirId::of(&st) == id => Ok(()),
        Ok(_) => Err(Error::Layout(format!(
            "{} is no longer the directory this store locked: it was moved or replaced while open",
            dir.display()
        ))),
        Err(e) => Err(io_err("stat data directory", dir)(e.into())),
    }
}

/// The live state while replaying segments: the last write per (kind, key), with the order
/// of that write so recovery hands records back in the order they were last written, and
/// every key a segment removed (a snapshot's record of that key is stale too).
pub(crate) struct State<B = serde_json::Value> {
    map: HashMap<(String, String), (u64, B)>,
    removed: HashSet<(String, String)>,
    next: u64,
}

impl<B> Default for State<B> {
    fn default() -> Self {
        State {
            map: HashMap::new(),
            removed: HashSet::new(),
            next: 0,
        }
    }
}

impl<B> State<B> {
    pub(crate) fn apply(&mut self, rec: Record<B>) {
        let key = (rec.kind, rec.key);
        match rec.op {
            Op::Put(body) => {
                self.map.insert(key, (self.next, body));
                self.next += 1;
            }
            Op::Remove => {
                self.map.remove(&key);
                self.removed.insert(key);
            }
        }
    }

    /// The keys any replayed write touched, by kind: a snapshot's record of one of them is
    /// superseded.
    fn touched(&self) -> Touched {
        let mut t: Touched = HashMap::new();
        for (kind, key) in self.map.keys().chain(&self.removed) {
            t.entry(kind.clone()).or_default().insert(key.clone());
        }
        t
    }

    pub(crate) fn into_records(self) -> Vec<Record<B>> {
        let mut v: Vec<_> = self.map.into_iter().collect();
        v.sort_unstable_by_key(|(_, (order, _))| *order);
        v.into_iter()
            .map(|((kind, key), (_, body))| Record {
                kind,
                key,
                op: Op::Put(body),
            })
            .collect()
    }
}

/// Keys by kind, looked up with borrowed strings.
type Touched = HashMap<String, HashSet<String>>;

#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    format: String,
    version: u32,
    /// The snapshot holds everything in segments below this generation.
    gen: u64,
    records: u64,
}

/// What replay found on disk, besides the records it handed over.
pub(crate) struct Replay {
    /// Segments below this are covered by the snapshot (0: no snapshot).
    pub snapshot_gen: u64,
    pub snapshot_bytes: u64,
    /// Replayed segments, oldest first.
    pub segments: Vec<Kept>,
    pub frames: u64,
    pub truncated: Option<Truncation>,
}

/// A replayed segment, as it stands after any cut.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kept {
    pub gen: u64,
    pub len: u64,
    pub format: Format,
    /// Its last batch number (format 2).
    pub batches: u64,
}

/// How replay treats the files.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Opening the store: tidy up leftovers and cut a torn tail off the last segment.
    Open,
    /// Building a snapshot for segments below `upto`: read-only, and every byte must be
    /// good, because those segments were closed after their last fsync.
    Compact { upto: u64 },
}

/// What replay hands its sink, in order: first how many records at most will follow (to
/// size maps once), then each live record, in the order of its last write.
pub enum Recovering<T> {
    Expect(u64),
    Put { kind: String, key: String, body: T },
}

/// Replays the directory and hands every live record to `sink`, its body made by `parse`
/// from the record's JSON text.
///
/// The segments are read first, into a map (a journal holds at most about a snapshot's
/// worth since the last compaction); then the snapshot streams through, frame by frame,
/// never held whole: a record of a key that a segment wrote or removed is stale and
/// skipped, unparsed; then the segments' own records follow. That is the same order as
/// applying every write in turn, without the tree of the whole state.
///
/// With `workers` above 0, the segments' record frames are decoded on that many threads
/// while this thread reads them and applies them in order; then the snapshot's frames are
/// decoded and parsed on as many while a reader thread reads ahead and this thread feeds
/// the sink, in frame order: a restart's parsing (most of its time) spreads over the
/// machine's cores. With 0, all on this thread.
pub(crate) fn replay<T: Send>(
    dir: &Path,
    mode: Mode,
    workers: usize,
    parse: &(dyn Fn(&str, &str, &RawValue) -> T + Sync),
    sink: &mut dyn FnMut(Recovering<T>),
) -> Result<Replay, Error> {
    let mut tidied = false;
    if mode == Mode::Open {
        // A leftover temp snapshot is an interrupted compaction that never committed.
        let tmp = dir.join(SNAPSHOT_TMP);
        match fs::remove_file(&tmp) {
            Ok(()) => tidied = true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &tmp)(e)),
        }
    }

    let snapshot = Snapshot::open(dir)?;
    let snapshot_gen = snapshot.as_ref().map_or(0, |s| s.header.gen);
    let snapshot_bytes = snapshot.as_ref().map_or(0, |s| s.len);

    let mut gens = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        if let Some(gen) = entry.file_name().to_str().and_then(parse_journal_name) {
            gens.push(gen);
        }
    }
    gens.sort_unstable();

    // Segments below the snapshot's generation are already in it: a compaction committed
    // its snapshot and died (or failed) before deleting them.
    // They are removed, and a torn tail cut, only once the snapshot has read well to its
    // end: a snapshot found damaged leaves every file as it was, for an operator.
    let (stale, mut live): (Vec<u64>, Vec<u64>) = gens.into_iter().partition(|g| *g < snapshot_gen);
    if let Mode::Compact { upto } = mode {
        live.retain(|g| *g < upto);
    }
    // Segments are created one after another and only deleted below a committed snapshot,
    // so the rest must run on from the snapshot without a gap. A gap means lost data; refuse
    // rather than silently replay around it.
    for (i, gen) in live.iter().enumerate() {
        if *gen != snapshot_gen + i as u64 {
            return Err(Error::Layout(format!(
                "journal segment {} is missing (found {}, snapshot covers below {snapshot_gen})",
                snapshot_gen + i as u64,
                journal_name(*gen)
            )));
        }
    }

    let mut state = State::<Box<RawValue>>::default();
    let mut segments = Vec::new();
    let mut frames = 0;
    let mut truncated = None;
    let last = live.len().checked_sub(1);
    for (i, gen) in live.iter().copied().enumerate() {
        let path = dir.join(journal_name(gen));
        // Only the newest segment can be torn by a crash: it is the only file written after
        // its last fsync. `journal::read` decides what in it is a torn tail.
        let tail = mode == Mode::Open && Some(i) == last;
        let read = journal::read(&path, gen, tail, &mut state, workers)?;
        frames += read.frames;
        if let Some((damage_offset, damage)) = read.damage {
            truncated = Some(Truncation {
                file: path,
                at_offset: read.kept,
                dropped_bytes: read.len - read.kept,
                damage_offset,
                damage,
            });
        }
        segments.push(Kept {
            gen,
            len: read.kept,
            format: read.format,
            batches: read.batches,
        });
    }

    let touched = state.touched();
    let in_snapshot = snapshot.as_ref().map_or(0, |s| s.header.records);
    // A header that lies about its count must not size anything: no record takes under 32
    // bytes of the file.
    let expect = in_snapshot
        .min(snapshot_bytes / 32)
        .saturating_add(state.map.len() as u64);
    sink(Recovering::Expect(expect));
    let snapshot_path = dir.join(SNAPSHOT);
    let source = Source {
        snapshot: snapshot.map(|s| s.frames),
        snapshot_path: &snapshot_path,
        journal: state.into_records().into_iter(),
    };
    let stream = Stream {
        touched: &touched,
        snapshot_path: &snapshot_path,
        parse,
    };
    let found = if workers == 0 {
        stream.inline(source, sink)?
    } else {
        stream.pooled(source, workers, sink)?
    };
    if found != in_snapshot {
        let why = format!("snapshot holds {found} records, header says {in_snapshot}");
        let damage = Damage::BadPayload(why);
        return Err(snapshot_corrupt(&snapshot_path, snapshot_bytes, damage));
    }
    if mode == Mode::Open {
        for gen in stale {
            let p = dir.join(journal_name(gen));
            fs::remove_file(&p).map_err(io_err("remove stale segment", &p))?;
            tidied = true;
        }
        if let Some(cut) = &truncated {
            let f = OpenOptions::new()
                .write(true)
                .open(&cut.file)
                .map_err(io_err("open", &cut.file))?;
            f.set_len(cut.at_offset)
                .and_then(|()| f.sync_data())
                .map_err(io_err("truncate", &cut.file))?;
        }
    }
    if tidied {
        sync_dir(dir)?;
    }
    Ok(Replay {
        snapshot_gen,
        snapshot_bytes,
        segments,
        frames,
        truncated,
    })
}

pub(crate) fn decode_records<B: DeserializeOwned>(
    payload: &[u8],
) -> Result<Vec<Record<B>>, Damage> {
    serde_json::from_slice(payload).map_err(|e| Damage::BadPayload(e.to_string()))
}

/// Why damage in a snapshot is never a torn write.
const SNAPSHOT_SYNCED: &str = "a snapshot is renamed into place only after its fsync";

/// A record as a snapshot frame holds it, borrowed from the frame: nothing is copied
/// before the key is known to be live.
#[derive(Deserialize)]
struct RecordRef<'a> {
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    op: OpRef<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum OpRef<'a> {
    Put(#[serde(borrow)] &'a RawValue),
    Remove,
}

/// The open snapshot, its header read.
struct Snapshot {
    len: u64,
    header: SnapshotHeader,
    frames: FrameReader<BufReader<File>>,
}

impl Snapshot {
    /// Opens `snapshot` and reads its header (`None`: there is none). A snapshot is only ever
    /// renamed into place after its fsync, so any damage is refused.
    fn open(dir: &Path) -> Result<Option<Snapshot>, Error> {
        let path = dir.join(SNAPSHOT);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        let len = file.metadata().map_err(io_err("stat", &path))?.len();
        let mut frames = FrameReader::new(BufReader::with_capacity(1 << 16, file), len);
        let bad_header = || Damage::BadPayload("not an agentd store snapshot v1 header".into());
        let header = match frames.next().map_err(io_err("read", &path))? {
            Next::Bad { offset, damage } => return Err(snapshot_corrupt(&path, offset, damage)),
            Next::End => {
                let damage = Damage::BadPayload("empty snapshot".into());
                return Err(snapshot_corrupt(&path, 0, damage));
            }
            Next::Frame { payload, .. } => serde_json::from_slice(&payload)
                .ok()
                .filter(|h: &SnapshotHeader| {
                    h.format == SNAPSHOT_FORMAT && h.version == SNAPSHOT_VERSION
                })
                .ok_or_else(|| snapshot_corrupt(&path, 0, bad_header()))?,
        };
        Ok(Some(Snapshot {
            len,
            header,
            frames,
        }))
    }
}

fn snapshot_corrupt(path: &Path, offset: u64, damage: Damage) -> Error {
    Error::Corrupt {
        file: path.to_path_buf(),
        offset,
        damage,
        why: SNAPSHOT_SYNCED.into(),
    }
}

/// One piece of replay work: a snapshot frame, a run of the segments' live records, or
/// the error that ended reading (handed on in order, so the records before it still
/// count as read).
enum Work {
    Frame { offset: u64, payload: Vec<u8> },
    Puts(Vec<Record<Box<RawValue>>>),
    Failed(Error),
}

/// A piece of work done: the snapshot records it held (live or not), and the live ones
/// parsed.
struct Done<T> {
    in_snapshot: u64,
    puts: Vec<(String, String, T)>,
}

/// The segments' live records go to the workers in runs of this many.
const PUTS_RUN: usize = 256;

/// The work in replay order: the snapshot's frames (after its header), then the segments'
/// records.
struct Source<'a> {
    snapshot: Option<FrameReader<BufReader<File>>>,
    snapshot_path: &'a Path,
    journal: std::vec::IntoIter<Record<Box<RawValue>>>,
}

impl Source<'_> {
    /// The next piece; after a failure, none.
    fn next(&mut self) -> Option<Work> {
        if let Some(frames) = &mut self.snapshot {
            let failed = match frames.next() {
                Ok(Next::Frame { offset, payload }) => {
                    return Some(Work::Frame { offset, payload })
                }
                Ok(Next::End) => None,
                Ok(Next::Bad { offset, damage }) => {
                    Some(snapshot_corrupt(self.snapshot_path, offset, damage))
                }
                Err(e) => Some(io_err("read", self.snapshot_path)(e)),
            };
            self.snapshot = None;
            if let Some(e) = failed {
                self.journal = Vec::new().into_iter();
                return Some(Work::Failed(e));
            }
        }
        let run: Vec<_> = self.journal.by_ref().take(PUTS_RUN).collect();
        (!run.is_empty()).then_some(Work::Puts(run))
    }
}

struct Stream<'a, T> {
    touched: &'a Touched,
    snapshot_path: &'a Path,
    parse: &'a (dyn Fn(&str, &str, &RawValue) -> T + Sync),
}

impl<T: Send> Stream<'_, T> {
    fn work(&self, w: Work) -> Result<Done<T>, Error> {
        match w {
            Work::Failed(e) => Err(e),
            Work::Puts(run) => Ok(Done {
                in_snapshot: 0,
                puts: run
                    .into_iter()
                    .filter_map(|r| match r.op {
                        Op::Put(body) => {
                            let parsed = (self.parse)(&r.kind, &r.key, &body);
                            Some((r.kind, r.key, parsed))
                        }
                        Op::Remove => None,
                    })
                    .collect(),
            }),
            Work::Frame { offset, payload } => {
                let corrupt = |why: String| {
                    snapshot_corrupt(self.snapshot_path, offset, Damage::BadPayload(why))
                };
                let records: Vec<RecordRef<'_>> =
                    serde_json::from_slice(&payload).map_err(|e| corrupt(e.to_string()))?;
                let mut done = Done {
                    in_snapshot: records.len() as u64,
                    puts: Vec::with_capacity(records.len()),
                };
                for r in records {
                    let OpRef::Put(body) = r.op else {
                        return Err(corrupt("a removal in a snapshot".into()));
                    };
                    let stale = self
                        .touched
                        .get(&*r.kind)
                        .is_some_and(|k| k.contains(&*r.key));
                    if !stale {
                        let parsed = (self.parse)(&r.kind, &r.key, body);
                        done.puts
                            .push((r.kind.into_owned(), r.key.into_owned(), parsed));
                    }
                }
                Ok(done)
            }
        }
    }

    fn deliver(done: Done<T>, found: &mut u64, sink: &mut dyn FnMut(Recovering<T>)) {
        *found += done.in_snapshot;
        for (kind, key, body) in done.puts {
            sink(Recovering::Put { kind, key, body });
        }
    }

    fn inline(
        &self,
        mut source: Source<'_>,
        sink: &mut dyn FnMut(Recovering<T>),
    ) -> Result<u64, Error> {
        let mut found = 0;
        while let Some(w) = source.next() {
            Self::deliver(self.work(w)?, &mut found, sink);
        }
        Ok(found)
    }

    /// A reader thread deals the pieces out to the workers in turn; this thread takes the
    /// results back in the same turn, so the sink sees them in replay order. Channels of
    /// two pieces per worker bound what is read ahead.
    fn pooled(
        &self,
        mut source: Source<'_>,
        workers: usize,
        sink: &mut dyn FnMut(Recovering<T>),
    ) -> Result<u64, Error> {
        let spawn_err = |e| Error::Io {
            what: "spawn a replay thread".into(),
            source: e,
        };
        thread::scope(|scope| {
            let mut to_workers = Vec::with_capacity(workers);
            let mut from_workers = Vec::with_capacity(workers);
            for i in 0..workers {
                let (work_tx, work_rx) = mpsc::sync_channel::<Work>(2);
                let (done_tx, done_rx) = mpsc::sync_channel(2);
                thread::Builder::new()
                    .name(format!("agentd-replay-{i}"))
                    .spawn_scoped(scope, move || {
                        for w in work_rx {
                            if done_tx.send(self.work(w)).is_err() {
                                break;
                            }
                        }
                    })
                    .map_err(spawn_err)?;
                to_workers.push(work_tx);
                from_workers.push(done_rx);
            }
            thread::Builder::new()
                .name("agentd-replay-read".into())
                .spawn_scoped(scope, move || {
                    let mut turn = 0;
                    while let Some(w) = source.next() {
                        if to_workers[turn % workers].send(w).is_err() {
                            break;
                        }
                        turn += 1;
                    }
                })
                .map_err(spawn_err)?;
            let mut found = 0;
            // Piece k went to worker k mod n; the first worker with nothing more to give
            // back marks the end, as every later piece would have come after its own.
            for turn in 0.. {
                match from_workers[turn % workers].recv() {
                    Ok(done) => Self::deliver(done?, &mut found, sink),
                    Err(_) => break,
                }
            }
            Ok(found)
        })
    }
}

/// Creates segment `gen` with its header (or writes the header into it if it exists
/// empty: a crash after creating it, or a cut that left nothing) and makes header and name
/// durable before any batch can be written. Recovery relies on the header being synced
/// first: damage to it with batches after it is damage to synced data.
pub(crate) fn start_segment(dir: &Path, gen: u64) -> Result<(File, PathBuf, u64), Error> {
    let path = dir.join(journal_name(gen));
    let mut file = create_opts()
        .append(true)
        .create(true)
        .open(&path)
        .map_err(io_err("create segment", &path))?;
    let len = file.metadata().map_err(io_err("stat", &path))?.len();
    if len != 0 {
        return Err(Error::Layout(format!(
            "{} exists with {len} bytes where a new segment was to start",
            path.display()
        )));
    }
    let header = journal::segment_header(gen);
    file.write_all(&header)
        .and_then(|()| file.sync_data())
        .map_err(io_err("write segment header", &path))?;
    sync_dir(dir)?;
    Ok((file, path, header.len() as u64))
}

/// Writes `records` as a snapshot of generation `gen` into `snapshot.tmp` and fsyncs it;
/// returns its size. The caller renames it into place. On an error the partial file is
/// deleted: on a full disk it would only hold on to the space a retry needs.
fn write_snapshot_tmp<B: Serialize>(
    dir: &Path,
    gen: u64,
    records: &[Record<B>],
) -> Result<u64, Error> {
    let tmp = dir.join(SNAPSHOT_TMP);
    let res = write_snapshot_file(&tmp, gen, records);
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

fn write_snapshot_file<B: Serialize>(
    tmp: &Path,
    gen: u64,
    records: &[Record<B>],
) -> Result<u64, Error> {
    let file = create_opts()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(io_err("create", tmp))?;
    let mut w = BufWriter::with_capacity(1 << 16, file);
    let mut frame = Vec::new();
    let header = SnapshotHeader {
        format: SNAPSHOT_FORMAT.into(),
        version: SNAPSHOT_VERSION,
        gen,
        records: records.len() as u64,
    };
    frame::push_frame(
        &mut frame,
        &serde_json::to_vec(&header).expect("header serialises"),
    );
    let mut size = frame.len() as u64;
    w.write_all(&frame).map_err(io_err("write", tmp))?;
    // Chunks of whole records, each a JSON array like a journal frame.
    let mut chunk = Vec::with_capacity(SNAPSHOT_CHUNK + 4096);
    let mut flush = |chunk: &mut Vec<u8>, w: &mut BufWriter<File>| -> Result<(), Error> {
        if chunk.is_empty() {
            return Ok(());
        }
        chunk.push(b']');
        frame.clear();
        frame::push_frame(&mut frame, chunk);
        size += frame.len() as u64;
        chunk.clear();
        w.write_all(&frame).map_err(io_err("write", tmp))
    };
    for rec in records {
        chunk.push(if chunk.is_empty() { b'[' } else { b',' });
        serde_json::to_writer(&mut chunk, rec).expect("a record serialises");
        if chunk.len() >= SNAPSHOT_CHUNK {
            flush(&mut chunk, &mut w)?;
        }
    }
    flush(&mut chunk, &mut w)?;
    let file = w
        .into_inner()
        .map_err(|e| io_err("write", tmp)(e.into_error()))?;
    file.sync_all().map_err(io_err("fsync", tmp))?;
    Ok(size)
}

/// Makes `records` the whole state, durably, as a snapshot of generation `gen`, and deletes
/// every segment below `gen`: what a store does to heal after a failed write, when what the
/// journal holds past its last good fsync cannot be trusted but the caller still has the
/// state in memory. Returns the snapshot's size. The rename is the commit point, exactly
/// as in [`compact`]; until it, the directory is as the failed store left it.
pub(crate) fn install_snapshot<B: Serialize>(
    dir: &Path,
    gen: u64,
    records: &[Record<B>],
) -> Result<u64, Error> {
    let size = write_snapshot_tmp(dir, gen, records)?;
    let snap = dir.join(SNAPSHOT);
    fs::rename(dir.join(SNAPSHOT_TMP), &snap).map_err(io_err("rename snapshot.tmp to", &snap))?;
    sync_dir(dir)?;
    let read = fs::read_dir(dir).map_err(io_err("read directory", dir))?;
    for entry in read.flatten() {
        let name = entry.file_name();
        if let Some(g) = name.to_str().and_then(parse_journal_name) {
            if g < gen {
                let p = dir.join(&name);
                fs::remove_file(&p).map_err(io_err("remove superseded segment", &p))?;
            }
        }
    }
    sync_dir(dir)?;
    Ok(size)
}

/// Where a compaction stops early: tests use it to leave the directory exactly as a crash
/// at that point would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `snapshot.tmp` written and synced, not renamed.
    TmpWritten,
    /// Renamed into place (and the directory synced), old segments still present.
    Renamed,
}

pub(crate) struct Compacted {
    pub snapshot_bytes: u64,
    pub removed_bytes: u64,
}

/// Folds the snapshot and every segment below `upto` into a new snapshot, then deletes
/// those segments. Crash-safe at each step: until the rename the old snapshot and all
/// segments are untouched (a stray tmp is deleted at open); after it the new snapshot says
/// "segments below `upto` are in me" and replay ignores (and removes) them.
pub(crate) fn compact(dir: &Path, upto: u64, stop: Option<Step>) -> Result<Compacted, Error> {
    // Bodies are only copied, so they stay raw JSON text: a parsed tree of every record
    // would cost several times the store's size at each compaction.
    let mut records = Vec::new();
    let replay = replay(
        dir,
        Mode::Compact { upto },
        0,
        &|_, _, body| body.to_owned(),
        &mut |r| match r {
            Recovering::Expect(n) => records.reserve(usize::try_from(n).unwrap_or(0)),
            Recovering::Put { kind, key, body } => records.push(Record {
                kind,
                key,
                op: Op::Put(body),
            }),
        },
    )?;
    let covered = replay.segments;

    let size = write_snapshot_tmp(dir, upto, &records)?;
    if stop == Some(Step::TmpWritten) {
        return Ok(Compacted {
            snapshot_bytes: size,
            removed_bytes: 0,
        });
    }

    let snap = dir.join(SNAPSHOT);
    fs::rename(dir.join(SNAPSHOT_TMP), &snap).map_err(io_err("rename snapshot.tmp to", &snap))?;
    // The commit point: once this returns, the new snapshot survives a crash.
    sync_dir(dir)?;
    if stop == Some(Step::Renamed) {
        return Ok(Compacted {
            snapshot_bytes: size,
            removed_bytes: 0,
        });
    }

    let mut removed = 0;
    for seg in covered {
        let p = dir.join(journal_name(seg.gen));
        fs::remove_file(&p).map_err(io_err("remove compacted segment", &p))?;
        removed += seg.len;
    }
    // Not needed for correctness (replay removes segments below the snapshot), only so the
    // space is surely reclaimed; an error here is still reported.
    sync_dir(dir)?;
    Ok(Compacted {
        snapshot_bytes: size,
        removed_bytes: removed,
    })
}
