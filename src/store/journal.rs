//! Journal segments: their two formats, and the rule that tells a write torn by a crash
//! (cut it off) from damage to data that was already synced and acknowledged (refuse).
//! The module docs of `store` describe both; this is the code.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

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
pub(crate) fn read<B: DeserializeOwned>(
    path: &Path,
    gen: u64,
    tail: bool,
    state: &mut State<B>,
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
    read_batched(&seg, frames, read, state)
}

/// Format 1: frames replay one by one; the first damage ends the segment.
fn read_unbatched<B: DeserializeOwned>(
    seg: &Seg<'_>,
    mut frames: FrameReader<BufReader<&File>>,
    mut read: SegmentRead,
    state: &mut State<B>,
) -> Result<SegmentRead, Error> {
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
/// frames read well, because a torn last batch is dropped whole.
fn read_batched<B: DeserializeOwned>(
    seg: &Seg<'_>,
    mut frames: FrameReader<BufReader<&File>>,
    mut read: SegmentRead,
    state: &mut State<B>,
) -> Result<SegmentRead, Error> {
    let mut records: Vec<Record<B>> = Vec::new();
    loop {
        let start = frames.offset();
        let head = match seg.next(&mut frames)? {
            Next::End => return Ok(read),
            Next::Bad { damage, .. } => return seg.at_boundary(read, start, damage),
            Next::Frame { payload, .. } => payload,
        };
        let due = read.batches + 1;
        let batch = match serde_json::from_slice::<BatchHeader>(&head) {
            Ok(h) if h.batch == due => h,
            Ok(h) => {
                let why = format!("batch {} where batch {due} was due", h.batch);
                return seg.at_boundary(read, start, Damage::BadPayload(why));
            }
            Err(_) => {
                let why = "a record frame where a batch header was due".into();
                return seg.at_boundary(read, start, Damage::BadPayload(why));
            }
        };
        let end = frames.offset().saturating_add(batch.bytes);
        let mut n = 0;
        records.clear();
        let damage = loop {
            let at = frames.offset();
            if at == end {
                break None;
            }
            match seg.next(&mut frames)? {
                Next::End => break Some((at, Damage::ShortBatch { missing: end - at })),
                Next::Bad { offset, damage } => break Some((offset, damage)),
                Next::Frame { offset, .. } if frames.offset() > end => {
                    let why = "a frame runs past the end of its batch".into();
                    break Some((offset, Damage::BadPayload(why)));
                }
                Next::Frame { offset, payload } => match decode_records(&payload) {
                    Ok(r) => {
                        records.extend(r);
                        n += 1;
                    }
                    Err(damage) => break Some((offset, damage)),
                },
            }
        };
        if let Some((at, damage)) = damage {
            return seg.in_batch(read, batch.batch, start, end, at, damage);
        }
        records.drain(..).for_each(|r| state.apply(r));
        read.frames += n;
        read.batches = batch.batch;
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

    /// Damage at `at` inside batch `batch`, which spans `[start, end)` with its header.
    /// Cut the whole batch if it can be the last one written, i.e. it reaches the end of
    /// the file; if the file goes on past it, a later batch was written, so this one had
    /// been synced.
    fn in_batch(
        &self,
        read: SegmentRead,
        batch: u64,
        start: u64,
        end: u64,
        at: u64,
        damage: Damage,
    ) -> Result<SegmentRead, Error> {
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
