//! Journal segments: their two formats, and the rule that tells a write torn by a crash
//! (cut it off) from damage to data that was already synced and acknowledged (refuse).
//! The module docs of `store` describe both; this is the code.

use std::collections::VecDeque;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::mpsc;
use std::thread;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::disk::{decode_records, io_err, State};
use super::frame::{self, Damage, FrameReader, Next};
use super::{Error, Record};

const FORMAT: &str = "agentd-journal";
/// Format 1 (no name in the files) is bare record frames; format 2 adds the segment header
/// and the batch headers.
const VERSION: u32 = 2;

/// What the payload of each kind of frame starts with: serde_json writes fields in
/// declaration order, and a record array always holds at least one record. Recovery finds
/// frames after damage by these.
const RECORDS_START: &[u8] = br#"[{"kind":""#;
const BATCH_START: &[u8] = br#"{"batch":"#;

/// The first frame of a format-2 segment, written and synced when the segment is created,
/// before any batch. Unknown fields are allowed so that a later version's header still
/// reads as one, and is refused for its version rather than taken for damage.
#[derive(Serialize, Deserialize)]
struct SegmentHeader {
    format: String,
    version: u32,
    gen: u64,
}

/// The frame before each batch: its number in the segment (1, 2, ...) and the bytes of
/// record frames that follow it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchHeader {
    batch: u64,
    bytes: u64,
}

/// The segment header of segment `gen`, as a whole frame.
pub(crate) fn segment_header(gen: u64) -> Vec<u8> {
    let header = SegmentHeader {
        format: FORMAT.into(),
        version: VERSION,
        gen,
    };
    encode(&header)
}

/// The header of batch `batch` of a segment, announcing `bytes` of record frames, as a
/// whole frame.
pub(crate) fn batch_header(batch: u64, bytes: u64) -> Vec<u8> {
    encode(&BatchHeader { batch, bytes })
}

fn encode(header: &impl Serialize) -> Vec<u8> {
    let payload = serde_json::to_vec(header).expect("a header serialises");
    let mut out = Vec::with_capacity(frame::HEADER + payload.len());
    frame::push_frame(&mut out, &payload);
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// No bytes (kept): format 2 once its header is written.
    Empty,
    /// Format 1: record frames without headers, from an agentd before format 2.
    Unbatched,
    /// Format 2.
    Batched,
}

/// One segment replayed into the state.
pub(crate) struct SegmentRead {
    /// The file's length as found.
    pub len: u64,
    /// What to keep: `len`, or less when the tail is a torn write to cut off.
    pub kept: u64,
    /// The damage that ended replay, when the tail is cut: offset and kind.
    pub damage: Option<(u64, Damage)>,
    /// The format of the kept bytes.
    pub format: Format,
    /// Record frames replayed.
    pub frames: u64,
    /// The number of the last kept batch (format 2): the writer numbers on from it.
    pub batches: u64,
}

/// Replays segment `gen` at `path` into `state`. `tail`: this is the newest segment at
/// open, the one file a crash can leave torn; damage that may be a torn write is then
/// reported for cutting (`kept < len`), any other damage refused with [`Error::Corrupt`].
/// Without `tail` (a closed segment, one being compacted) every damage is refused.
///
/// With `workers` above 0 a format-2 segment's record frames are decoded on that many
/// threads while this one reads on ([`read_batched_pooled`]); the outcome is the same.
/// A format-2 batch is read whole before it is decoded, so a read error (EIO) after a
/// frame that does not decode, in the same batch, is reported as the read error: either
/// way the store is not opened.
pub(crate) fn read<B: DeserializeOwned + Send>(
    path: &Path,
    gen: u64,
    tail: bool,
    state: &mut State<B>,
    workers: usize,
) -> Result<SegmentRead, Error> {
    let file = File::open(path).map_err(io_err("open", path))?;
    let len = file.metadata().map_err(io_err("stat", path))?.len();
    let seg = Seg {
        path,
        file: &file,
        len,
        tail,
    };
    let mut frames = FrameReader::new(BufReader::with_capacity(1 << 16, &file), len);
    let mut read = SegmentRead {
        len,
        kept: len,
        damage: None,
        format: Format::Empty,
        frames: 0,
        batches: 0,
    };
    let first = match seg.next(&mut frames)? {
        Next::End => return Ok(read),
        // Unknown format; either way nothing good may follow (see `strict`).
        Next::Bad { offset, damage } => return seg.strict(read, offset, damage),
        Next::Frame { payload, .. } => payload,
    };
    if first.first() != Some(&b'{') {
        read.format = Format::Unbatched;
        return match decode_records(&first) {
            Ok(records) => {
                records.into_iter().for_each(|r| state.apply(r));
                read.frames = 1;
                read_unbatched(&seg, frames, read, state)
            }
            Err(damage) => seg.strict(read, 0, damage),
        };
    }
    match serde_json::from_slice::<SegmentHeader>(&first) {
        Ok(h) if h.format == FORMAT && h.version == VERSION && h.gen == gen => {}
        Ok(h) if h.format == FORMAT && h.gen == gen => {
            return Err(Error::Layout(format!(
                "{} has journal format version {}; this agentd reads versions 1 and {VERSION}",
                path.display(),
                h.version
            )))
        }
        Ok(h) if h.format == FORMAT => {
            return Err(Error::Layout(format!(
                "{} holds segment {} (renamed or copied?)",
                path.display(),
                h.gen
            )))
        }
        _ => {
            let damage = Damage::BadPayload("not a journal segment header".into());
            return seg.strict(read, 0, damage);
        }
    }
    read.format = Format::Batched;
    if workers == 0 {
        read_batched(&seg, frames, read, state)
    } else {
        read_batched_pooled(&seg, frames, read, state, workers)
    }
}

/// Format 1: frames replay one by one; the first damage ends the segment.
fn read_unbatched<B: DeserializeOwned>(
    seg: &Seg<'_>,
    mut frames: FrameReader<BufReader<&File>>,
    mut read: SegmentRead,
    state: &mut State<B>,
) -> Outcome {
    loop {
        match seg.next(&mut frames)? {
            Next::End => return Ok(read),
            Next::Bad { offset, damage } => return seg.strict(read, offset, damage),
            Next::Frame { offset, payload } => match decode_records(&payload) {
                Ok(records) => {
                    records.into_iter().for_each(|r| state.apply(r));
                    read.frames += 1;
                }
                Err(damage) => return seg.strict(read, offset, damage),
            },
        }
    }
}

/// Format 2: batch after batch. A batch's records reach the state only once all of its
/// frames read and decoded well, because a torn last batch is dropped whole.
fn read_batched<B: DeserializeOwned>(
    seg: &Seg<'_>,
    mut frames: FrameReader<BufReader<&File>>,
    mut read: SegmentRead,
    state: &mut State<B>,
) -> Outcome {
    loop {
        match next_batch(seg, &mut frames, read.batches + 1)? {
            BatchRead::End => return Ok(read),
            BatchRead::Boundary { start, damage } => return seg.at_boundary(read, start, damage),
            BatchRead::Torn(b, payloads, at, damage) => {
                return judge_torn::<B>(seg, read, b, payloads, at, damage)
            }
            BatchRead::Whole(b, payloads) => match gather(&b, decode_run(payloads)) {
                Ok(records) => read.apply(&b, records, state),
                Err((at, damage)) => return seg.in_batch(read, &b, at, damage),
            },
        }
    }
}

/// How a segment's replay ends.
type Outcome = Result<SegmentRead, Error>;

/// A batch of a format-2 segment as read: its frames checked, not yet decoded.
enum BatchRead {
    /// The segment ends cleanly here.
    End,
    /// Damage at `start`, where a batch header was due.
    Boundary { start: u64, damage: Damage },
    /// A whole batch and its record frames' payloads.
    Whole(ReadBatch, Vec<Vec<u8>>),
    /// A batch damaged at an offset before its end, and the payloads read before that.
    Torn(ReadBatch, Vec<Vec<u8>>, u64, Damage),
}

/// Where a batch lies (`[start, end)`, its header included) and its record frames' offsets.
struct ReadBatch {
    batch: u64,
    start: u64,
    end: u64,
    offsets: Vec<u64>,
}

/// Reads the next batch, expected to be number `due`.
fn next_batch(
    seg: &Seg<'_>,
    frames: &mut FrameReader<BufReader<&File>>,
    due: u64,
) -> Result<BatchRead, Error> {
    let start = frames.offset();
    let head = match seg.next(frames)? {
        Next::End => return Ok(BatchRead::End),
        Next::Bad { damage, .. } => return Ok(BatchRead::Boundary { start, damage }),
        Next::Frame { payload, .. } => payload,
    };
    let bytes = match serde_json::from_slice::<BatchHeader>(&head) {
        Ok(h) if h.batch == due => h.bytes,
        Ok(h) => {
            let why = format!("batch {} where batch {due} was due", h.batch);
            let damage = Damage::BadPayload(why);
            return Ok(BatchRead::Boundary { start, damage });
        }
        Err(_) => {
            let why = "a record frame where a batch header was due".into();
            let damage = Damage::BadPayload(why);
            return Ok(BatchRead::Boundary { start, damage });
        }
    };
    let mut b = ReadBatch {
        batch: due,
        start,
        end: frames.offset().saturating_add(bytes),
        offsets: Vec::new(),
    };
    let mut payloads = Vec::new();
    loop {
        let at = frames.offset();
        if at == b.end {
            return Ok(BatchRead::Whole(b, payloads));
        }
        let (at, damage) = match seg.next(frames)? {
            Next::End => (
                at,
                Damage::ShortBatch {
                    missing: b.end - at,
                },
            ),
            Next::Bad { offset, damage } => (offset, damage),
            Next::Frame { offset, .. } if frames.offset() > b.end => {
                let why = "a frame runs past the end of its batch".into();
                (offset, Damage::BadPayload(why))
            }
            Next::Frame { offset, payload } => {
                b.offsets.push(offset);
                payloads.push(payload);
                continue;
            }
        };
        return Ok(BatchRead::Torn(b, payloads, at, damage));
    }
}

/// What a run of record frames decodes to, in order; it stops at the first frame that
/// does not decode.
type Decoded<B> = Vec<Result<Vec<Record<B>>, Damage>>;

fn decode_run<B: DeserializeOwned>(payloads: Vec<Vec<u8>>) -> Decoded<B> {
    let mut out = Vec::with_capacity(payloads.len());
    for p in payloads {
        let r = decode_records(&p);
        let bad = r.is_err();
        out.push(r);
        if bad {
            break;
        }
    }
    out
}

/// Batch `b`'s records from its frames' decoding (taken from `decoded`, one per frame), or
/// the offset and damage of its first frame that did not decode.
fn gather<B>(
    b: &ReadBatch,
    decoded: impl IntoIterator<Item = Result<Vec<Record<B>>, Damage>>,
) -> Result<Vec<Record<B>>, (u64, Damage)> {
    let mut decoded = decoded.into_iter();
    let mut records = Vec::new();
    for offset in &b.offsets {
        match decoded.next() {
            Some(Ok(r)) => records.extend(r),
            Some(Err(damage)) => return Err((*offset, damage)),
            // `decode_run` stops short only after an `Err`, which comes first. Never damage:
            // a bug here must not cut acknowledged data as a torn tail.
            None => panic!("frame {offset}: decoded frames ran out before their batch did"),
        }
    }
    Ok(records)
}

/// Damage inside batch `b` at `at`: a frame read before it that does not decode comes
/// first, in file order, as it does when each frame is decoded as it is read.
fn judge_torn<B: DeserializeOwned>(
    seg: &Seg<'_>,
    read: SegmentRead,
    b: ReadBatch,
    payloads: Vec<Vec<u8>>,
    at: u64,
    damage: Damage,
) -> Outcome {
    let earlier = gather::<B>(&b, decode_run(payloads)).err();
    let (at, damage) = earlier.unwrap_or((at, damage));
    seg.in_batch(read, &b, at, damage)
}

impl SegmentRead {
    /// Applies whole batch `b`'s records: the segment is good up to its end.
    fn apply<B>(&mut self, b: &ReadBatch, records: Vec<Record<B>>, state: &mut State<B>) {
        records.into_iter().for_each(|r| state.apply(r));
        self.frames += b.offsets.len() as u64;
        self.batches = b.batch;
    }
}

/// Whole batches are handed to a decoding thread in runs of at least this many payload bytes
/// (the last batch may take a run past it): batches written by group commit can be a few
/// hundred bytes each.
const RUN_BYTES: usize = 64 << 10;

/// Format 2, as [`read_batched`] reads it, with the record frames decoded on `workers`
/// threads (the decoding is most of a segment's replay). This thread reads every frame and
/// checks the batch structure, in file order; runs of whole batches go to the workers in
/// turn and come back in the same turn, so batches reach the state in order, each only
/// once it and every batch before it decoded well. Damage is decided as `read_batched`
/// decides it: before any damage this thread finds is judged, every batch read before it
/// is applied or found bad, and so is every batch before a read error. At most two runs per
/// worker are in flight.
fn read_batched_pooled<B: DeserializeOwned + Send>(
    seg: &Seg<'_>,
    mut frames: FrameReader<BufReader<&File>>,
    read: SegmentRead,
    state: &mut State<B>,
    workers: usize,
) -> Outcome {
    thread::scope(|scope| {
        let mut to_workers = Vec::with_capacity(workers);
        let mut from_workers = Vec::with_capacity(workers);
        for i in 0..workers {
            let (run_tx, run_rx) = mpsc::channel::<Vec<Vec<u8>>>();
            let (done_tx, done_rx) = mpsc::channel::<Decoded<B>>();
            thread::Builder::new()
                .name(format!("agentd-journal-{i}"))
                .spawn_scoped(scope, move || {
                    for run in run_rx {
                        if done_tx.send(decode_run(run)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| Error::Io {
                    what: "spawn a replay thread".into(),
                    source: e,
                })?;
            to_workers.push(run_tx);
            from_workers.push(done_rx);
        }
        let mut pool = Pool {
            read,
            to_workers,
            from_workers,
            in_flight: VecDeque::new(),
            taken: 0,
            run: Vec::new(),
            payloads: Vec::new(),
            run_bytes: 0,
        };
        // A batch a worker found bad ends the segment, judged on what was applied before it.
        let judge = |read, (b, at, damage): BadBatch| seg.in_batch(read, &b, at, damage);
        // The number of the last batch read whole (applied, in flight or being gathered).
        let mut read_up_to = pool.read.batches;
        loop {
            let next = match next_batch(seg, &mut frames, read_up_to + 1) {
                Ok(next) => next,
                // As decoding on reading would: damage in a batch before it comes first.
                Err(e) => {
                    return match pool.drain(state) {
                        Ok(()) => Err(e),
                        Err(bad) => judge(pool.read, bad),
                    }
                }
            };
            if !matches!(next, BatchRead::Whole(..)) {
                if let Err(bad) = pool.drain(state) {
                    return judge(pool.read, bad);
                }
            }
            match next {
                BatchRead::End => return Ok(pool.read),
                BatchRead::Boundary { start, damage } => {
                    return seg.at_boundary(pool.read, start, damage)
                }
                BatchRead::Torn(b, payloads, at, damage) => {
                    return judge_torn::<B>(seg, pool.read, b, payloads, at, damage)
                }
                BatchRead::Whole(b, payloads) => {
                    read_up_to = b.batch;
                    pool.add(b, payloads);
                }
            }
            if pool.run_bytes >= RUN_BYTES {
                pool.send();
            }
            while pool.in_flight.len() >= 2 * workers {
                if let Err(bad) = pool.take(state) {
                    return judge(pool.read, bad);
                }
            }
        }
    })
}

/// A batch that did not decode, with the offset and damage of its first bad frame.
type BadBatch = (ReadBatch, u64, Damage);

/// [`read_batched_pooled`]'s runs in flight and the state of the segment as applied.
struct Pool<B> {
    /// The segment as far as it is applied to the state.
    read: SegmentRead,
    to_workers: Vec<mpsc::Sender<Vec<Vec<u8>>>>,
    from_workers: Vec<mpsc::Receiver<Decoded<B>>>,
    /// The batches of each run sent and not yet taken back, oldest first.
    in_flight: VecDeque<Vec<ReadBatch>>,
    /// Runs taken back: run k goes to worker k mod n, and comes back from it.
    taken: usize,
    /// The run being gathered.
    run: Vec<ReadBatch>,
    payloads: Vec<Vec<u8>>,
    run_bytes: usize,
}

impl<B> Pool<B> {
    fn add(&mut self, batch: ReadBatch, payloads: Vec<Vec<u8>>) {
        self.run_bytes += payloads.iter().map(Vec::len).sum::<usize>();
        self.payloads.extend(payloads);
        self.run.push(batch);
    }

    /// Hands the gathered run to the next worker.
    fn send(&mut self) {
        if self.run.is_empty() {
            return;
        }
        let next = (self.taken + self.in_flight.len()) % self.to_workers.len();
        // A worker stops only when its channel closes, or by panicking (see `take`).
        let _ = self.to_workers[next].send(std::mem::take(&mut self.payloads));
        self.in_flight.push_back(std::mem::take(&mut self.run));
        self.run_bytes = 0;
    }

    /// Takes the oldest run back and applies its batches in order, up to one that did not
    /// decode.
    fn take(&mut self, state: &mut State<B>) -> Result<(), BadBatch> {
        let n = self.from_workers.len();
        // A worker ends early only by panicking, which aborts a release build; a test's
        // scope panics again when it joins.
        let decoded = self.from_workers[self.taken % n]
            .recv()
            .expect("a replay thread panicked");
        self.taken += 1;
        let mut decoded = decoded.into_iter();
        let batches = self
            .in_flight
            .pop_front()
            .expect("every run sent is in flight");
        for b in batches {
            match gather(&b, decoded.by_ref()) {
                Ok(records) => self.read.apply(&b, records, state),
                Err((at, damage)) => return Err((b, at, damage)),
            }
        }
        Ok(())
    }

    /// Sends what is gathered and applies every run in flight, as [`Pool::take`].
    fn drain(&mut self, state: &mut State<B>) -> Result<(), BadBatch> {
        self.send();
        while !self.in_flight.is_empty() {
            self.take(state)?;
        }
        Ok(())
    }
}

/// The segment being read, and the decisions about damage in it.
struct Seg<'a> {
    path: &'a Path,
    file: &'a File,
    len: u64,
    tail: bool,
}

impl Seg<'_> {
    fn next(&self, frames: &mut FrameReader<BufReader<&File>>) -> Result<Next, Error> {
        frames.next().map_err(io_err("read", self.path))
    }

    fn refuse(&self, offset: u64, damage: Damage, why: String) -> Error {
        Error::Corrupt {
            file: self.path.to_path_buf(),
            offset,
            damage,
            why,
        }
    }

    /// Not the newest segment: written whole and synced before the next one was created.
    fn closed(&self, offset: u64, damage: Damage) -> Error {
        let why = "a closed segment was synced whole before the next one was created".into();
        self.refuse(offset, damage, why)
    }

    /// Keeps `[0, at)`: the rest is a torn write.
    fn cut(&self, mut read: SegmentRead, at: u64, damage_at: u64, damage: Damage) -> SegmentRead {
        read.kept = at;
        read.damage = Some((damage_at, damage));
        if at == 0 {
            read.format = Format::Empty;
        }
        read
    }

    /// Damage in a format-1 segment, or in the first frame of any segment: cut only if no
    /// good frame follows it. A format-1 segment carries no batch boundaries, so whether
    /// good frames after damage were synced cannot be told; refusing is the side that
    /// loses nothing. A format-2 segment's header is synced before any batch is written, so
    /// damage to it with anything good after it is damage to synced data.
    fn strict(&self, read: SegmentRead, at: u64, damage: Damage) -> Result<SegmentRead, Error> {
        if !self.tail {
            return Err(self.closed(at, damage));
        }
        let good = frame::find_frame(
            self.file,
            self.len,
            at + 1,
            &[RECORDS_START, BATCH_START],
            |_| true,
        )
        .map_err(io_err("read", self.path))?;
        match good {
            None => Ok(self.cut(read, at, at, damage)),
            Some(q) => Err(self.refuse(
                at,
                damage,
                format!(
                    "a good frame follows at offset {q}, so this is not a torn tail, and the \
                     file records no batches that could show it was never acknowledged"
                ),
            )),
        }
    }

    /// Damage where a batch header was due (after batch `read.batches`): the batch starting
    /// here may be a torn last one (its header page never reached the disk). Cut unless a
    /// later batch's header follows: a batch is written only after the one before it was
    /// synced.
    fn at_boundary(
        &self,
        read: SegmentRead,
        start: u64,
        damage: Damage,
    ) -> Result<SegmentRead, Error> {
        if !self.tail {
            return Err(self.closed(start, damage));
        }
        let mut later = 0;
        let found = frame::find_frame(self.file, self.len, start + 1, &[BATCH_START], |p| {
            match serde_json::from_slice::<BatchHeader>(p) {
                Ok(h) if h.batch > read.batches => {
                    later = h.batch;
                    true
                }
                _ => false,
            }
        })
        .map_err(io_err("read", self.path))?;
        match found {
            None => Ok(self.cut(read, start, start, damage)),
            Some(q) => Err(self.refuse(
                start,
                damage,
                format!(
                    "batch {later} follows at offset {q}, and a batch is written only after \
                     the one before it was synced: this is damage to acknowledged data, not \
                     a torn write"
                ),
            )),
        }
    }

    /// Damage at `at` inside batch `b`, which spans `[start, end)` with its header. Cut the
    /// whole batch if it can be the last one written, i.e. it reaches the end of the file;
    /// if the file goes on past it, a later batch was written, so this one had been synced.
    fn in_batch(&self, read: SegmentRead, b: &ReadBatch, at: u64, damage: Damage) -> Outcome {
        let ReadBatch {
            batch, start, end, ..
        } = *b;
        if !self.tail {
            return Err(self.closed(at, damage));
        }
        if end >= self.len {
            return Ok(self.cut(read, start, at, damage));
        }
        Err(self.refuse(
            at,
            damage,
            format!(
                "it lies in batch {batch} (offsets {start} to {end}) and the file goes on to \
                 {}; a batch is written only after the one before it was synced, so this is \
                 damage to acknowledged data, not a torn write",
                self.len
            ),
        ))
    }
}
