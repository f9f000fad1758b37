//! Store tests on real files in temp directories: recovery from every torn tail, bit flips
//! and other damage (cut off when it can be a torn last batch, refused when it lies in
//! synced data), segments of format 1, compaction interrupted at each step, the fatal-fsync
//! path. Concurrency, the lock and the SIGKILL crash test live in `tests/store.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use serde_json::json;

use super::disk::{self, Step};
use super::frame::{FrameReader, Next};
use super::journal;
use super::*;

const T: Duration = Duration::from_secs(10);

pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "agentd-store-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn opts() -> Options {
    Options {
        compact_after_bytes: u64::MAX,
        ..Options::default()
    }
}

fn open(dir: &Path) -> (Store, Recovered) {
    Store::open(dir, opts()).unwrap()
}

fn put(key: &str, v: serde_json::Value) -> Record {
    Record::put("task", key, v)
}

/// Appends each batch as its own frame and waits for it to be durable before the next, so
/// each is also a write batch of its own (acknowledged before the next is written); closes.
fn write_batches(dir: &Path, batches: &[Vec<Record>]) {
    let (store, _) = open(dir);
    for b in batches {
        let t = store.append(b).unwrap();
        store.wait_durable(t, T).unwrap();
    }
    store.close().unwrap();
}

/// The state a reference model expects after the first `n` batches.
fn model(batches: &[Vec<Record>], n: usize) -> Vec<Record> {
    let mut s = disk::State::default();
    batches[..n]
        .iter()
        .flatten()
        .cloned()
        .for_each(|r| s.apply(r));
    s.into_records()
}

fn batches() -> Vec<Vec<Record>> {
    vec![
        vec![put("a", json!({"n": 1})), put("b", json!("two"))],
        vec![Record::put("push", "a", json!([1, 2, 3]))],
        vec![put("a", json!({"n": 2, "s": "ü ✓ \" \\"}))],
        vec![Record::remove("task", "b"), put("c", json!(null))],
        vec![
            put("d", json!({"big": "x".repeat(300)})),
            Record::remove("push", "nope"),
        ],
    ]
}

fn only_segment(dir: &Path) -> PathBuf {
    let segs: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("journal.")
        })
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.into_iter().next().unwrap()
}

/// Start offsets and payloads of every frame in a file.
fn frames_of(bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut r = FrameReader::new(bytes, bytes.len() as u64);
    let mut out = Vec::new();
    loop {
        match r.next().unwrap() {
            Next::Frame { offset, payload } => out.push((offset, payload)),
            Next::End => return out,
            Next::Bad { offset, damage } => panic!("damage at {offset}: {damage}"),
        }
    }
}

/// Start offsets of every frame in a file (headers included).
fn frame_starts(path: &Path) -> Vec<u64> {
    frames_of(&fs::read(path).unwrap())
        .into_iter()
        .map(|(o, _)| o)
        .collect()
}

/// Where one batch of a format-2 segment lies: `[start, end)`, its header included, and
/// where its record frames start.
#[derive(Debug)]
struct BatchAt {
    start: u64,
    end: u64,
    frames: Vec<u64>,
}

/// The batches of a format-2 segment.
fn batches_of(bytes: &[u8]) -> Vec<BatchAt> {
    let frames = frames_of(bytes);
    assert!(frames[0].1.starts_with(br#"{"format":"agentd-journal""#));
    let mut out: Vec<BatchAt> = Vec::new();
    for (offset, payload) in &frames[1..] {
        if payload.starts_with(br#"{"batch":"#) {
            out.push(BatchAt {
                start: *offset,
                end: *offset,
                frames: Vec::new(),
            });
        } else {
            out.last_mut().unwrap().frames.push(*offset);
        }
    }
    for i in 0..out.len() {
        out[i].end = out.get(i + 1).map_or(bytes.len() as u64, |b| b.start);
    }
    out
}

/// A format-2 segment laid out as the writer lays it out: `batches[i]` holds the appends
/// (one frame each) of batch i + 1. Lets a test build batches of several frames, which the
/// writer makes only when appends race an fsync.
fn build_segment(gen: u64, batches: &[Vec<Vec<Record>>]) -> Vec<u8> {
    let payloads: Vec<Vec<Vec<u8>>> = batches
        .iter()
        .map(|appends| {
            appends
                .iter()
                .map(|records| serde_json::to_vec(records).unwrap())
                .collect()
        })
        .collect();
    build_segment_raw(gen, &payloads)
}

/// [`build_segment`] from the record frames' payloads, which may be anything.
fn build_segment_raw(gen: u64, batches: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let mut out = journal::segment_header(gen);
    for (i, payloads) in batches.iter().enumerate() {
        let mut body = Vec::new();
        for p in payloads {
            frame::push_frame(&mut body, p);
        }
        out.extend(journal::batch_header(i as u64 + 1, body.len() as u64));
        out.extend(body);
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn round_trip_and_last_write_wins() {
    let d = TempDir::new("roundtrip");
    let b = batches();
    write_batches(d.path(), &b);
    let (store, rec) = open(d.path());
    assert_eq!(rec.truncated, None);
    assert_eq!(rec.frames, b.len() as u64);
    // Last write per (kind, key), removals dropped, in last-write order; a null put stays.
    assert_eq!(
        rec.records,
        vec![
            Record::put("push", "a", json!([1, 2, 3])),
            put("a", json!({"n": 2, "s": "ü ✓ \" \\"})),
            put("c", json!(null)),
            put("d", json!({"big": "x".repeat(300)})),
        ]
    );
    assert_eq!(rec.records, model(&b, b.len()));
    // Tickets restart per open; 0 is durable at once.
    assert_eq!(store.durable(), 0);
    store.wait_durable(0, Duration::ZERO).unwrap();
    assert_eq!(store.append(&[put("a", json!(3))]).unwrap(), 1);
    assert_eq!(store.append::<serde_json::Value>(&[]).unwrap(), 1);
    store.wait_durable(1, T).unwrap();
    drop(store);
    let (_, rec) = open(d.path());
    assert_eq!(
        rec.records
            .iter()
            .find(|r| r.key == "a" && r.kind == "task")
            .unwrap()
            .op,
        Op::Put(json!(3))
    );
}

#[test]
fn removals_and_overwrites_survive_compaction_and_restart() {
    let d = TempDir::new("compact-restart");
    let b = batches();
    write_batches(d.path(), &b);
    let (store, _) = open(d.path());
    store.compact().unwrap();
    let t = store
        .append(&[Record::remove("task", "a"), put("e", json!(5))])
        .unwrap();
    store.wait_durable(t, T).unwrap();
    assert_eq!(store.stats().compactions, 1);
    store.close().unwrap();

    let mut all = b.clone();
    all.push(vec![Record::remove("task", "a"), put("e", json!(5))]);
    let (store, rec) = open(d.path());
    assert_eq!(rec.records, model(&all, all.len()));
    assert_eq!(
        rec.frames, 1,
        "only the append after the compaction is in the journal"
    );
    // A second compaction over a snapshot plus journal, then a reopen from the snapshot alone.
    store.compact().unwrap();
    drop(store);
    let (_, rec) = open(d.path());
    assert_eq!(rec.records, model(&all, all.len()));
    assert_eq!(rec.frames, 0);
    assert!(d.path().join("snapshot").exists());
    assert!(!d.path().join("snapshot.tmp").exists());
}

/// A snapshot of many frames (several per replay thread) under a journal that overwrites
/// and removes some of its keys: every thread count, none included, hands back the model's
/// state in the model's order, and no record the journal superseded is parsed at all.
#[test]
fn the_snapshot_streams_through_any_number_of_replay_threads() {
    let d = TempDir::new("replay-threads");
    let body = "x".repeat(2000);
    // About 6 MiB: six snapshot frames of 1 MiB and a bit.
    let first: Vec<Vec<Record>> = (0..30)
        .map(|b| {
            (0..100)
                .map(|i| put(&format!("t{b}-{i}"), json!({ "b": b, "i": i, "pad": body })))
                .collect()
        })
        .collect();
    write_batches(d.path(), &first);
    let (store, _) = open(d.path());
    store.compact().unwrap();
    let later = vec![
        vec![put("t0-0", json!("new")), Record::remove("task", "t29-99")],
        vec![Record::remove("task", "t7-7"), put("t7-7", json!("back"))],
        vec![Record::remove("task", "t3-1"), put("fresh", json!(1))],
    ];
    for b in &later {
        let t = store.append(b).unwrap();
        store.wait_durable(t, T).unwrap();
    }
    store.close().unwrap();
    let all: Vec<Vec<Record>> = first.iter().chain(&later).cloned().collect();
    let want = model(&all, all.len());
    assert_eq!(want.len(), 3000 - 2 + 1);
    for threads in [Some(0), Some(1), Some(2), Some(3), None] {
        let parsed = AtomicUsize::new(0);
        let mut got = Vec::new();
        let mut expected = None;
        let (store, opened) = Store::open_with(
            d.path(),
            Options {
                replay_threads: threads,
                ..opts()
            },
            &|_, _, body| {
                parsed.fetch_add(1, Ordering::Relaxed);
                serde_json::from_str::<serde_json::Value>(body.get()).unwrap()
            },
            &mut |r| match r {
                Recovering::Expect(n) => expected = Some(n),
                Recovering::Put { kind, key, body } => got.push(Record::put(kind, key, body)),
            },
        )
        .unwrap();
        drop(store);
        // Not assert_eq: a difference would print megabytes.
        assert!(got == want, "{threads:?} threads: {} records", got.len());
        assert_eq!(opened.frames, 3, "{threads:?}");
        // The journal's 3 live keys plus the snapshot's 3,000, some of them stale.
        assert_eq!(expected, Some(3000 + 3), "{threads:?}");
        assert_eq!(
            parsed.into_inner(),
            want.len(),
            "{threads:?}: only live records are parsed"
        );
    }
}

/// A snapshot damaged in a later frame is refused whatever the thread count, even though
/// the frames before it were already handed over; and nothing in the directory is touched
/// first: a stale segment below the snapshot stays, and so does the newest segment's torn
/// tail, for an operator to look at.
#[test]
fn a_snapshot_damaged_midway_is_refused_by_every_replay() {
    let d = TempDir::new("replay-damage");
    let body = "y".repeat(3000);
    let first: Vec<Vec<Record>> = (0..10)
        .map(|b| {
            (0..100)
                .map(|i| put(&format!("k{b}-{i}"), json!({ "pad": body })))
                .collect()
        })
        .collect();
    write_batches(d.path(), &first);
    let (store, _) = open(d.path());
    store.compact().unwrap();
    store.close().unwrap();
    let snap = d.path().join("snapshot");
    let mut bytes = fs::read(&snap).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x20;
    fs::write(&snap, &bytes).unwrap();
    let stale = d.path().join("journal.00000000000000000000");
    fs::write(&stale, b"covered by the snapshot").unwrap();
    let newest = only_segment_above(d.path(), 0);
    let mut torn = fs::read(&newest).unwrap();
    torn.extend_from_slice(b"\x10\0\0\0torn write");
    fs::write(&newest, &torn).unwrap();
    for threads in [Some(0), Some(2)] {
        let err = open_refused(d.path(), threads);
        // Named at the damaged frame (before the flipped byte), not only found short at
        // the end by the record count.
        assert!(
            matches!(&err, Error::Corrupt { file, offset, .. }
                if file.ends_with("snapshot") && *offset < at as u64),
            "{threads:?}: {err}"
        );
        assert!(stale.exists(), "{threads:?}: the stale segment was removed");
        assert_eq!(
            fs::read(&newest).unwrap(),
            torn,
            "{threads:?}: the torn tail was cut"
        );
    }
}

/// Why the store in `dir` does not open with `threads` replay threads.
fn open_refused(dir: &Path, threads: Option<usize>) -> Error {
    let opts = Options {
        replay_threads: threads,
        ..opts()
    };
    Store::open(dir, opts).err().expect("the store was refused")
}

/// What open makes of `bytes` as the only segment with `threads` replay threads: the
/// records, the frames replayed and the cut (at, damage offset, dropped bytes, damage), or
/// the offset it refused at; and the file as open left it.
type SegmentOutcome = (
    Result<(Vec<Record>, u64, Option<(u64, u64, u64, Damage)>), u64>,
    Vec<u8>,
);

/// Opens `bytes` as the only segment with `threads` replay threads. An open that succeeds
/// must also have numbered on from the last batch it kept: an append after it survives a
/// reopen on one thread, with no cut (a wrong count would make it look torn).
fn open_segment(bytes: &[u8], threads: Option<usize>) -> SegmentOutcome {
    let d = TempDir::new("threads-seg");
    let seg = d.path().join(disk::journal_name(0));
    fs::write(&seg, bytes).unwrap();
    let first = Options {
        replay_threads: threads,
        ..opts()
    };
    let got = match Store::open(d.path(), first) {
        Ok((store, rec)) => {
            let left = fs::read(&seg).unwrap();
            let n = store.append(&[put("after", json!(1))]).unwrap();
            store.wait_durable(n, T).unwrap();
            store.close().unwrap();
            let again = Options {
                replay_threads: Some(0),
                ..opts()
            };
            let (_, after) = Store::open(d.path(), again).unwrap();
            assert_eq!(
                after.truncated, None,
                "{threads:?} threads: the append was cut"
            );
            assert_eq!(after.records.last(), Some(&put("after", json!(1))));
            let cut = rec
                .truncated
                .map(|t| (t.at_offset, t.damage_offset, t.dropped_bytes, t.damage));
            return (Ok((rec.records, rec.frames, cut)), left);
        }
        Err(Error::Corrupt { offset, .. }) => Err(offset),
        Err(e) => panic!("{threads:?} threads: {e}"),
    };
    (got, fs::read(&seg).unwrap())
}

/// A journal of many batches, decoded on several threads (runs of batches in flight at
/// once), opens as it does on one, whole or damaged: the same records, the same cut or the
/// same refusal at the same offset, and the file left the same. Damage: a record frame
/// whose JSON is bad under a good checksum (early, midway, in the last batch), the same
/// followed by a broken checksum later in its batch (the bad JSON, earlier, is the one
/// named), flipped bytes across the file, and cuts inside the last batch.
#[test]
fn the_journal_opens_the_same_on_any_number_of_replay_threads() {
    // 303 batches of 1 to 3 frames, about 450 KiB: several runs of 64 KiB, with overwrites
    // and removals across them.
    let plan: Vec<Vec<Vec<Record>>> = (0..303u64)
        .map(|b| {
            (0..1 + b % 3)
                .map(|f| {
                    let k = format!("k{}", (b * 7 + f) % 150);
                    if (b + f) % 11 == 0 {
                        vec![Record::remove("task", &k)]
                    } else {
                        let pad = "p".repeat(((b * 37 + f * 101) % 1500) as usize);
                        vec![put(&k, json!({ "b": b, "f": f, "pad": pad }))]
                    }
                })
                .collect()
        })
        .collect();
    let payloads: Vec<Vec<Vec<u8>>> = plan
        .iter()
        .map(|a| a.iter().map(|r| serde_json::to_vec(r).unwrap()).collect())
        .collect();
    let full = build_segment_raw(0, &payloads);
    assert!(full.len() > 6 * 64 * 1024, "{}", full.len());
    let layout = batches_of(&full);
    let last = layout.last().unwrap();
    assert_eq!(last.frames.len(), 3);

    let bad_json = |spots: &[(usize, usize)]| {
        let mut p = payloads.clone();
        for &(b, f) in spots {
            p[b][f] = br#"[{"kind":"task","key":"x","op":"#.to_vec();
        }
        build_segment_raw(0, &p)
    };
    // Each case: its name, the segment, and where the damage must be named, if known.
    let mut cases: Vec<(String, Vec<u8>, Option<u64>)> = vec![("whole".into(), full.clone(), None)];
    for (b, f) in [(4, 0), (151, 1), (302, 2)] {
        let bytes = bad_json(&[(b, f)]);
        let at = batches_of(&bytes)[b].frames[f];
        cases.push((format!("bad JSON in batch {b}"), bytes, Some(at)));
    }
    for b in [200, 302] {
        // Bad JSON in the batch's first frame, a broken checksum in its last.
        let mut bytes = bad_json(&[(b, 0)]);
        let frames = batches_of(&bytes)[b].frames.clone();
        bytes[frames[2] as usize + 2] ^= 0x10;
        let name = format!("bad JSON, then a bad checksum, in batch {b}");
        cases.push((name, bytes, Some(frames[0])));
    }
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for _ in 0..24 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut bytes = full.clone();
        let at = (x % full.len() as u64) as usize;
        bytes[at] ^= 1 << ((x >> 40) % 8);
        cases.push((format!("bit flip at {at}"), bytes, None));
    }
    // Damage in one batch, and damage the reader finds in a later one: the earlier is named.
    for (b, later) in [(280, None), (40, Some(45))] {
        let mut bytes = bad_json(&[(b, 0)]);
        let at = batches_of(&bytes)[b].frames[0];
        match later {
            // A cut inside the last batch.
            None => bytes.truncate(batches_of(&bytes)[302].frames[1] as usize + 3),
            Some(l) => {
                let f = batches_of(&bytes)[l].frames[0];
                bytes[f as usize + 2] ^= 0x10;
            }
        }
        let name = format!("bad JSON in batch {b}, then damage in batch {later:?}");
        cases.push((name, bytes, Some(at)));
    }
    for cut in [
        last.start + 3,
        last.frames[1],
        last.frames[2] + 5,
        full.len() as u64 - 1,
    ] {
        cases.push((format!("cut at {cut}"), full[..cut as usize].to_vec(), None));
    }

    let appends: Vec<Vec<Record>> = plan.iter().flatten().cloned().collect();
    let (whole, _) = open_segment(&full, Some(0));
    assert!(
        whole == Ok((model(&appends, appends.len()), appends.len() as u64, None)),
        "the whole journal opens to the model"
    );
    for (name, bytes, named_at) in &cases {
        let (one, left) = open_segment(bytes, Some(0));
        for threads in [Some(1), Some(2), Some(4)] {
            let (got, left_now) = open_segment(bytes, threads);
            // Not assert_eq: a difference would print every record.
            assert!(got == one, "{name}: {threads:?} threads");
            assert!(
                left_now == left,
                "{name}: {threads:?} threads left the file otherwise"
            );
        }
        if let Some(at) = named_at {
            let named = match &one {
                Ok((_, _, Some((_, damage, _, _)))) => *damage,
                Err(offset) => *offset,
                Ok((_, _, None)) => panic!("{name}: opened whole"),
            };
            assert_eq!(named, *at, "{name}: the bad frame is named");
        }
    }
}

/// The newest segment above generation `gen`.
fn only_segment_above(dir: &Path, gen: u64) -> PathBuf {
    let mut segs: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.strip_prefix("journal.")
                .and_then(|g| g.parse::<u64>().ok())
                .is_some_and(|g| g > gen)
        })
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

/// A snapshot header that says it holds more records than its bytes could is refused as
/// damage, after reading: it sizes nothing (a count near 2^64 once asked for that much).
#[test]
fn a_snapshot_header_that_lies_about_its_count_sizes_nothing() {
    let d = TempDir::new("lying-header");
    let mut file = Vec::new();
    let header = json!({"format": "agentd-store-snapshot", "version": 1, "gen": 1,
                        "records": u64::MAX});
    super::frame::push_frame(&mut file, header.to_string().as_bytes());
    let records = json!([{"kind": "task", "key": "a", "op": {"put": 1}}]);
    super::frame::push_frame(&mut file, records.to_string().as_bytes());
    fs::write(d.path().join("snapshot"), &file).unwrap();
    for threads in [Some(0), Some(2)] {
        let err = open_refused(d.path(), threads);
        assert!(
            matches!(&err, Error::Corrupt { damage: Damage::BadPayload(why), .. }
                if why.contains("header says")),
            "{threads:?}: {err}"
        );
    }
}

/// Cutting the newest segment at any byte inside its last batch (header or frame) recovers
/// exactly the batches before it, truncates the file where that batch started, and says so.
#[test]
fn truncation_at_every_offset_of_the_last_batch() {
    let src = TempDir::new("trunc-src");
    let b = batches();
    write_batches(src.path(), &b);
    let seg = only_segment(src.path());
    let full = fs::read(&seg).unwrap();
    let layout = batches_of(&full);
    assert_eq!(layout.len(), b.len(), "one batch per acknowledged append");
    let last = layout.last().unwrap().start;
    for cut in last..full.len() as u64 {
        let d = TempDir::new("trunc");
        copy_dir(src.path(), d.path());
        let seg = d.path().join(seg.file_name().unwrap());
        fs::write(&seg, &full[..cut as usize]).unwrap();
        let (store, rec) = open(d.path());
        assert_eq!(rec.records, model(&b, b.len() - 1), "cut at {cut}");
        if cut == last {
            assert_eq!(
                rec.truncated, None,
                "a cut on a batch boundary is a clean end"
            );
        } else {
            let t = rec
                .truncated
                .unwrap_or_else(|| panic!("cut at {cut} not reported"));
            assert_eq!(
                (t.at_offset, t.dropped_bytes),
                (last, cut - last),
                "cut at {cut}"
            );
        }
        assert_eq!(fs::metadata(&seg).unwrap().len(), last);
        // The store goes on appending after the cut, and that survives.
        let n = store.append(&[put("after", json!(cut))]).unwrap();
        store.wait_durable(n, T).unwrap();
        assert_eq!(
            store.stats().journal_bytes,
            fs::metadata(&seg).unwrap().len()
        );
        drop(store);
        let (_, rec) = open(d.path());
        assert_eq!(rec.truncated, None);
        let mut want = model(&b, b.len() - 1);
        want.push(put("after", json!(cut)));
        assert_eq!(rec.records, want);
    }
}

/// Every single-bit flip is caught (crc, length or JSON). In the last batch it may be a torn
/// write, never acknowledged: that batch is cut off whole. Anywhere before it, a later batch
/// proves the damaged data had been synced: open refuses, naming the damaged frame, and
/// leaves the file as it was.
#[test]
fn bit_flips_refuse_synced_batches_and_cut_only_the_last() {
    let src = TempDir::new("flip-src");
    let b = batches();
    write_batches(src.path(), &b);
    let seg = only_segment(src.path());
    let full = fs::read(&seg).unwrap();
    let starts = frame_starts(&seg);
    let last = batches_of(&full).last().unwrap().start;
    // Deterministic pseudo-random positions (xorshift) over the whole file, plus every bit
    // of the segment header's frame header and of the last batch's header.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut bits: Vec<u64> = (0..400)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % full.len() as u64) * 8 + (x >> 32) % 8
        })
        .collect();
    bits.extend(0..64);
    bits.extend((0..64).map(|b| last * 8 + b));
    for bit in bits {
        let d = TempDir::new("flip");
        copy_dir(src.path(), d.path());
        let mut bytes = full.clone();
        bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
        let seg = d.path().join(seg.file_name().unwrap());
        fs::write(&seg, &bytes).unwrap();
        let hit = starts[starts.iter().rposition(|s| *s <= bit / 8).unwrap()];
        match Store::open(d.path(), opts()) {
            Ok((_, rec)) => {
                assert!(hit >= last, "bit {bit} in synced data was cut, not refused");
                assert_eq!(rec.records, model(&b, b.len() - 1), "bit {bit}");
                let t = rec.truncated.unwrap();
                assert_eq!((t.at_offset, t.damage_offset), (last, hit), "bit {bit}");
                assert_eq!(t.dropped_bytes, full.len() as u64 - last);
            }
            Err(Error::Corrupt { file, offset, .. }) => {
                assert!(hit < last, "bit {bit} in the last batch was refused");
                assert_eq!((file, offset), (seg.clone(), hit), "bit {bit}");
                assert_eq!(fs::read(&seg).unwrap(), bytes, "bit {bit}: file untouched");
            }
            Err(e) => panic!("bit {bit}: {e}"),
        }
    }
}

/// What a test expects of open after damage.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// The file is cut at this offset; the batches before it are recovered.
    Cut { at: u64, batches: usize },
    /// Open refuses with damage at this offset, leaving the file alone.
    Refuse { at: u64 },
}

/// Runs open on `bytes` as the only segment and checks the outcome. After a cut the store
/// must go on: an append after it survives a reopen with no further cut.
fn check_damage(name: &str, bytes: &[u8], plan: &[Vec<Vec<Record>>], expect: Expect) {
    let d = TempDir::new("damage");
    let seg = d.path().join(disk::journal_name(0));
    fs::write(&seg, bytes).unwrap();
    let appends: Vec<Vec<Record>> = plan.iter().flatten().cloned().collect();
    match (Store::open(d.path(), opts()), expect) {
        (Ok((store, rec)), Expect::Cut { at, batches }) => {
            let kept = plan[..batches].iter().map(Vec::len).sum();
            assert_eq!(rec.records, model(&appends, kept), "{name}");
            let t = rec.truncated.unwrap_or_else(|| panic!("{name}: no cut"));
            assert_eq!(t.at_offset, at, "{name}");
            assert_eq!(t.dropped_bytes, bytes.len() as u64 - at, "{name}");
            assert_eq!(fs::metadata(&seg).unwrap().len(), at, "{name}");
            let n = store.append(&[put("after", json!(name))]).unwrap();
            store.wait_durable(n, T).unwrap();
            drop(store);
            let (_, rec) = open(d.path());
            assert_eq!(rec.truncated, None, "{name}");
            let mut want = model(&appends, kept);
            want.push(put("after", json!(name)));
            assert_eq!(rec.records, want, "{name} after reopen");
        }
        (Err(Error::Corrupt { file, offset, .. }), Expect::Refuse { at }) => {
            assert_eq!((&file, offset), (&seg, at), "{name}");
            assert_eq!(fs::read(&seg).unwrap(), bytes, "{name}: file untouched");
            // Refused again: nothing was half done.
            let again = Store::open(d.path(), opts()).err().unwrap();
            assert!(
                matches!(again, Error::Corrupt { offset, .. } if offset == at),
                "{name}"
            );
        }
        (Ok((_, rec)), expect) => {
            panic!(
                "{name}: expected {expect:?}, opened with {:?}",
                rec.truncated
            )
        }
        (Err(e), expect) => panic!("{name}: expected {expect:?}, got {e}"),
    }
}

/// The audit's cases on a segment with batches of several frames: batch 1 (three frames)
/// and batch 2 (one) were acknowledged; batch 3 (three frames) was being written when the
/// machine crashed, so none of it was acknowledged and any part of it may be missing.
#[test]
fn damage_in_synced_batches_is_refused_and_a_torn_last_batch_cut() {
    let big = |k: &str| put(k, json!({"pad": "p".repeat(2000)}));
    let plan = vec![
        vec![vec![big("a1")], vec![big("a2")], vec![big("a3")]],
        vec![vec![put("b1", json!(1)), Record::remove("task", "a2")]],
        vec![vec![big("c1")], vec![big("c2")], vec![big("c3")]],
    ];
    let full = build_segment(0, &plan);
    let at = batches_of(&full);
    let (b1, b2, b3) = (&at[0], &at[1], &at[2]);
    assert!(
        b1.end > 4096 && b3.start < 8192 && full.len() > 8192,
        "{at:?}"
    );
    let flip = |offsets: &[u64]| {
        let mut v = full.clone();
        offsets.iter().for_each(|o| v[*o as usize] ^= 0x20);
        v
    };
    let zero = |from: u64, to: u64| {
        let mut v = full.clone();
        v[from as usize..to as usize].fill(0);
        v
    };
    let len = full.len() as u64;
    let cut3 = Expect::Cut {
        at: b3.start,
        batches: 2,
    };
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "a byte in the segment header",
            flip(&[12]),
            Expect::Refuse { at: 0 },
        ),
        (
            "a byte in the first batch header",
            flip(&[b1.start + 10]),
            Expect::Refuse { at: b1.start },
        ),
        (
            "a byte in the first record frame",
            flip(&[b1.frames[0] + 20]),
            Expect::Refuse { at: b1.frames[0] },
        ),
        (
            "a byte in a middle frame of an old batch",
            flip(&[b1.frames[1] + 100]),
            Expect::Refuse { at: b1.frames[1] },
        ),
        (
            "a length byte of a middle frame",
            flip(&[b1.frames[1] + 1]),
            Expect::Refuse { at: b1.frames[1] },
        ),
        (
            "bytes across a frame boundary in an old batch",
            flip(&[
                b1.frames[1] - 2,
                b1.frames[1] - 1,
                b1.frames[1],
                b1.frames[1] + 1,
            ]),
            Expect::Refuse { at: b1.frames[0] },
        ),
        (
            "bytes across the boundary of an old batch and the last",
            flip(&[b3.start - 2, b3.start - 1, b3.start, b3.start + 1]),
            Expect::Refuse { at: b2.frames[0] },
        ),
        (
            "a zeroed page in the middle",
            zero(4096, 8192),
            Expect::Refuse { at: b1.frames[1] },
        ),
        (
            "a byte in the header of the last batch",
            flip(&[b3.start + 12]),
            cut3,
        ),
        (
            "a byte in the last frame of the last batch",
            flip(&[len - 5]),
            cut3,
        ),
        (
            "bytes across a frame boundary in the last batch",
            flip(&[
                b3.frames[2] - 2,
                b3.frames[2] - 1,
                b3.frames[2],
                b3.frames[2] + 1,
            ]),
            cut3,
        ),
        ("zeroed tail pages", zero(8192, len), cut3),
        (
            "a hole in the last batch with good frames after it",
            zero(b3.frames[0], b3.frames[1]),
            cut3,
        ),
        (
            "the last batch's header page lost, its later frames whole",
            zero(b3.start, b3.frames[0] + 8),
            cut3,
        ),
        (
            "the file cut short mid-frame",
            full[..b3.frames[1] as usize + 50].to_vec(),
            cut3,
        ),
        (
            "the file cut short mid-header",
            full[..b3.start as usize + 5].to_vec(),
            cut3,
        ),
        (
            "the file cut after the last batch's header",
            full[..b3.frames[0] as usize].to_vec(),
            cut3,
        ),
        (
            "a zero-filled extension after the last batch",
            [&full[..], &[0u8; 4096]].concat(),
            Expect::Cut {
                at: len,
                batches: 3,
            },
        ),
    ];
    for (name, bytes, expect) in cases {
        check_damage(name, &bytes, &plan, expect);
    }
}

/// A segment the writer wrote has exactly the layout `build_segment` makes (so the damage
/// cases above test the real format), and the stats count its headers.
#[test]
fn the_writer_lays_out_segments_as_documented() {
    let d = TempDir::new("layout");
    let b = batches();
    write_batches(d.path(), &b);
    let seg = only_segment(d.path());
    let plan: Vec<Vec<Vec<Record>>> = b.iter().map(|a| vec![a.clone()]).collect();
    assert_eq!(fs::read(&seg).unwrap(), build_segment(0, &plan));
    let (store, rec) = open(d.path());
    assert_eq!(rec.frames, b.len() as u64);
    assert_eq!(
        store.stats().journal_bytes,
        fs::metadata(&seg).unwrap().len()
    );
    // Reopened, the writer numbers on from the last batch in the file.
    let t = store.append(&[put("z", json!(0))]).unwrap();
    store.wait_durable(t, T).unwrap();
    drop(store);
    let bytes = fs::read(&seg).unwrap();
    let last = frames_of(&bytes)
        .into_iter()
        .rev()
        .find(|(_, p)| p.starts_with(b"{\"batch\""))
        .unwrap();
    let head = String::from_utf8(last.1).unwrap();
    assert!(
        head.starts_with(&format!("{{\"batch\":{},", b.len() + 1)),
        "{head}"
    );
}

/// A good segment header that is not this segment's, or of a version this agentd does not
/// know, is no torn write: refused as a layout problem whatever follows it.
#[test]
fn a_foreign_segment_header_is_refused() {
    for (payload, says) in [
        (
            br#"{"format":"agentd-journal","version":3,"gen":0,"more":1}"#.as_slice(),
            "format version 3",
        ),
        (
            br#"{"format":"agentd-journal","version":2,"gen":4}"#,
            "holds segment 4",
        ),
    ] {
        let d = TempDir::new("foreign");
        let mut bytes = Vec::new();
        frame::push_frame(&mut bytes, payload);
        fs::write(d.path().join(disk::journal_name(0)), &bytes).unwrap();
        let err = Store::open(d.path(), opts()).err().unwrap();
        assert!(
            matches!(err, Error::Layout(_)) && err.to_string().contains(says),
            "{err}"
        );
    }
}

/// Segments of format 1 (bare record frames, before batch headers) still open. Damage with
/// a good frame after it is refused, since nothing shows it was never acknowledged; a torn
/// tail is cut as before. Appends then go to a new segment of format 2, and compaction
/// folds both.
#[test]
fn format_1_segments_open_and_are_read_strictly() {
    let b = batches();
    let mut v1 = Vec::new();
    let mut starts = Vec::new();
    for records in &b {
        starts.push(v1.len() as u64);
        frame::push_frame(&mut v1, &serde_json::to_vec(records).unwrap());
    }
    let write = |bytes: &[u8]| {
        let d = TempDir::new("v1");
        fs::write(d.path().join(disk::journal_name(0)), bytes).unwrap();
        d
    };

    let d = write(&v1);
    let (store, rec) = open(d.path());
    assert_eq!((rec.records, rec.truncated), (model(&b, b.len()), None));
    assert_eq!(store.stats().live_gen, 1, "appends go to a new segment");
    let t = store.append(&[put("new", json!(1))]).unwrap();
    store.wait_durable(t, T).unwrap();
    let mut all = b.clone();
    all.push(vec![put("new", json!(1))]);
    drop(store);
    let (store, rec) = open(d.path());
    assert_eq!(rec.records, model(&all, all.len()));
    assert_eq!(fs::read(d.path().join(disk::journal_name(0))).unwrap(), v1);
    store.compact().unwrap();
    drop(store);
    let (_, rec) = open(d.path());
    assert_eq!(rec.records, model(&all, all.len()));
    assert_eq!(rec.frames, 0);

    // A flipped byte in a middle frame, good frames after it: refused.
    let mut bytes = v1.clone();
    bytes[starts[2] as usize + 12] ^= 1;
    let d = write(&bytes);
    let err = Store::open(d.path(), opts()).err().unwrap();
    assert!(
        matches!(err, Error::Corrupt { offset, .. } if offset == starts[2]),
        "{err}"
    );
    assert!(err.to_string().contains("a good frame follows"), "{err}");
    // The same in the first frame.
    let mut bytes = v1.clone();
    bytes[3] ^= 1;
    let d = write(&bytes);
    let err = Store::open(d.path(), opts()).err().unwrap();
    assert!(matches!(err, Error::Corrupt { offset: 0, .. }), "{err}");
    // A torn last frame: cut there, as before.
    let last = *starts.last().unwrap();
    let d = write(&v1[..v1.len() - 3]);
    let (_, rec) = open(d.path());
    assert_eq!(rec.records, model(&b, b.len() - 1));
    assert_eq!(rec.truncated.unwrap().at_offset, last);
}

/// A crc-valid frame whose payload is not a record array: caught by the parser, truncated.
#[test]
fn bad_json_with_good_crc_is_truncated() {
    let d = TempDir::new("badjson");
    let b = batches();
    write_batches(d.path(), &b);
    let seg = only_segment(d.path());
    let len = fs::metadata(&seg).unwrap().len();
    let mut tail = Vec::new();
    frame::push_frame(&mut tail, b"{\"not\":\"an array\"}");
    frame::push_frame(&mut tail, br#"[{"kind":"task","key":"z","op":"remove"}]"#);
    let mut f = fs::OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&tail).unwrap();
    drop(f);
    let (_, rec) = open(d.path());
    assert_eq!(rec.records, model(&b, b.len()));
    let t = rec.truncated.unwrap();
    assert_eq!((t.at_offset, t.dropped_bytes), (len, tail.len() as u64));
    assert!(matches!(t.damage, Damage::BadPayload(_)), "{:?}", t.damage);
}

/// Leaves the directory as a crash at each compaction step would, and checks that open
/// recovers the same state each time and keeps working afterwards.
#[test]
fn compaction_interrupted_at_each_step() {
    let src = TempDir::new("cstep-src");
    let b = batches();
    // History: a snapshot, then more segments, so every step has something to lose.
    write_batches(src.path(), &b[..2]);
    {
        let (store, _) = open(src.path());
        store.compact().unwrap();
    }
    write_batches(src.path(), &b[2..]);
    let want = model(&b, b.len());
    let live = {
        let (store, rec) = open(src.path());
        assert_eq!(rec.records, want);
        store.stats().live_gen
    };
    let upto = live + 1;

    type Setup = fn(&Path, u64);
    let cases: [(&str, Setup); 7] = [
        ("tmp half written", |d, _| {
            fs::write(d.join("snapshot.tmp"), b"\x10\0\0\0garbage").unwrap()
        }),
        ("tmp complete, not renamed", |d, upto| {
            disk::compact(d, upto, Some(Step::TmpWritten)).unwrap();
        }),
        ("tmp complete, new segment created", |d, upto| {
            disk::compact(d, upto, Some(Step::TmpWritten)).unwrap();
            fs::write(d.join(disk::journal_name(upto)), b"").unwrap();
        }),
        (
            "rotated: new segment with records, old snapshot",
            |d, upto| {
                let mut f = Vec::new();
                frame::push_frame(&mut f, br#"[{"kind":"task","key":"rot","op":"remove"}]"#);
                fs::write(d.join(disk::journal_name(upto)), f).unwrap();
            },
        ),
        ("renamed, old segments not deleted", |d, upto| {
            disk::compact(d, upto, Some(Step::Renamed)).unwrap();
        }),
        ("renamed, stale tmp from an earlier attempt", |d, upto| {
            disk::compact(d, upto, Some(Step::Renamed)).unwrap();
            fs::write(d.join("snapshot.tmp"), b"junk").unwrap();
        }),
        ("complete", |d, upto| {
            disk::compact(d, upto, None).unwrap();
        }),
    ];
    for (name, setup) in cases {
        let d = TempDir::new("cstep");
        copy_dir(src.path(), d.path());
        setup(d.path(), upto);
        let (store, rec) = open(d.path());
        assert_eq!(rec.records, want, "{name}");
        assert_eq!(rec.truncated, None, "{name}");
        assert!(!d.path().join("snapshot.tmp").exists(), "{name}");
        // And it goes on: append, compact, reopen.
        let t = store.append(&[put("next", json!(name))]).unwrap();
        store.wait_durable(t, T).unwrap();
        store.compact().unwrap();
        drop(store);
        let (_, rec) = open(d.path());
        let mut more = want.clone();
        more.push(put("next", json!(name)));
        assert_eq!(rec.records, more, "{name} after reopen");
        let segs = fs::read_dir(d.path()).unwrap().filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .starts_with("journal.")
        });
        assert_eq!(segs.count(), 1, "{name}: old segments removed");
    }
}

#[test]
fn damage_outside_the_live_tail_is_refused() {
    let src = TempDir::new("refuse-src");
    let b = batches();
    write_batches(src.path(), &b[..3]);
    {
        let (store, _) = open(src.path());
        store.compact().unwrap();
    }
    write_batches(src.path(), &b[3..]);

    // A flipped byte in the snapshot.
    let d = TempDir::new("refuse-snap");
    copy_dir(src.path(), d.path());
    let snap = d.path().join("snapshot");
    let mut bytes = fs::read(&snap).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x40;
    fs::write(&snap, bytes).unwrap();
    let err = Store::open(d.path(), opts()).err().unwrap();
    assert!(
        matches!(err, Error::Corrupt { ref file, .. } if *file == snap),
        "{err}"
    );

    // A gap: the segment the snapshot points at is gone but a later one exists.
    let d = TempDir::new("refuse-gap");
    copy_dir(src.path(), d.path());
    let seg = only_segment(d.path());
    let gen: u64 = seg.extension().unwrap().to_str().unwrap().parse().unwrap();
    fs::rename(&seg, d.path().join(disk::journal_name(gen + 1))).unwrap();
    let err = Store::open(d.path(), opts()).err().unwrap();
    assert!(matches!(err, Error::Layout(_)), "{err}");

    // Damage in a closed segment (one that has a newer segment after it).
    let d = TempDir::new("refuse-closed");
    copy_dir(src.path(), d.path());
    let seg = only_segment(d.path());
    let mut bytes = fs::read(&seg).unwrap();
    bytes[10] ^= 1;
    fs::write(&seg, bytes).unwrap();
    fs::write(d.path().join(disk::journal_name(gen + 1)), b"").unwrap();
    let err = Store::open(d.path(), opts()).err().unwrap();
    assert!(
        matches!(err, Error::Corrupt { ref file, .. } if *file == seg),
        "{err}"
    );
}

struct Flag(Mutex<u32>);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        *self.0.lock().unwrap() += 1;
    }
}

#[test]
fn waker_and_callback_hear_each_fsync() {
    let d = TempDir::new("notify");
    let (store, _) = open(d.path());
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h = heard.clone();
    store.on_durable(move |n| h.lock().unwrap().push(n.clone()));
    let flag = Arc::new(Flag(Mutex::new(0)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);

    // Poll a ticket not handed out yet: certainly pending, and the waker is kept.
    assert!(store.poll_durable(1, &mut cx).is_pending());
    assert!(
        store.poll_durable(1, &mut cx).is_pending(),
        "the same waker is kept once"
    );
    let t = store.append(&[put("w", json!(1))]).unwrap();
    assert_eq!(t, 1);
    store.wait_durable(t, T).unwrap();
    // The wake happens on the writer thread just after the durable mark is published.
    for _ in 0..1000 {
        if *flag.0.lock().unwrap() > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(*flag.0.lock().unwrap(), 1);
    assert!(matches!(
        store.poll_durable(t, &mut cx),
        Poll::Ready(Ok(()))
    ));
    store.close().unwrap();
    assert_eq!(*heard.lock().unwrap(), vec![Notice::Durable(t)]);
}

#[test]
fn a_failed_fsync_never_claims_durability() {
    let d = TempDir::new("fatal");
    let (store, _) = open(d.path());
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h = heard.clone();
    store.on_durable(move |n| h.lock().unwrap().push(n.clone()));
    let t1 = store.append(&[put("ok", json!(1))]).unwrap();
    store.wait_durable(t1, T).unwrap();

    store.shared.fail_next_sync.store(true, Ordering::SeqCst);
    let t2 = store.append(&[put("lost", json!(2))]).unwrap();
    assert!(matches!(store.wait_durable(t2, T), Err(Error::Failed(_))));
    assert_eq!(store.durable(), t1, "the failed batch is never durable");
    assert!(matches!(
        store.append(&[put("x", json!(3))]),
        Err(Error::Failed(_))
    ));
    let flag = Arc::new(Flag(Mutex::new(0)));
    let waker = Waker::from(flag);
    assert!(matches!(
        store.poll_durable(t2, &mut Context::from_waker(&waker)),
        Poll::Ready(Err(_))
    ));
    assert!(matches!(store.compact(), Err(Error::Failed(_))));
    assert!(store.stats().failed.unwrap().contains("Input/output error"));
    assert!(matches!(store.close(), Err(Error::Failed(_))));
    let heard = heard.lock().unwrap();
    assert_eq!(heard[0], Notice::Durable(t1));
    assert!(matches!(heard[1], Notice::Failed(_)));
    assert_eq!(heard.len(), 2);
}

/// A failed store heals from the caller's state: a fresh snapshot, the old segments gone,
/// appends again, and a reopen finds exactly that state plus what came after. A heal that
/// fails (here `snapshot.tmp` is a directory, so it cannot be created) leaves the store
/// failed and can be tried again.
#[test]
fn a_failed_store_heals_from_the_state_in_memory() {
    let d = TempDir::new("heal");
    let (store, _) = open(d.path());
    let t1 = store
        .append(&[put("a", json!(1)), put("b", json!(1))])
        .unwrap();
    store.wait_durable(t1, T).unwrap();
    store.shared.fail_next_sync.store(true, Ordering::SeqCst);
    let t2 = store.append(&[put("c", json!(2))]).unwrap();
    assert!(matches!(store.wait_durable(t2, T), Err(Error::Failed(_))));
    let before: Vec<_> = segments(d.path());

    fs::create_dir(d.path().join(disk::SNAPSHOT_TMP)).unwrap();
    let state = [put("a", json!(1)), put("b", json!(1)), put("c", json!(2))];
    assert!(
        store.heal(&state).is_err(),
        "snapshot.tmp cannot be created"
    );
    assert!(store.stats().failed.is_some(), "still failed");
    assert!(matches!(
        store.append(&[put("x", json!(0))]),
        Err(Error::Failed(_))
    ));
    fs::remove_dir(d.path().join(disk::SNAPSHOT_TMP)).unwrap();

    store.heal(&state).unwrap();
    let stats = store.stats();
    assert!(stats.failed.is_none());
    assert_eq!(stats.heals, 1);
    assert_eq!(
        store.durable(),
        t2,
        "what the failed batch carried is in the snapshot"
    );
    let after = segments(d.path());
    assert_eq!(after.len(), 1, "one fresh segment: {after:?}");
    assert!(!before.contains(&after[0]), "the old segments are gone");
    let t3 = store
        .append(&[put("d", json!(3)), Record::remove("task", "a")])
        .unwrap();
    store.wait_durable(t3, T).unwrap();
    store.close().unwrap();

    let (_, rec) = open(d.path());
    assert_eq!(
        rec.records,
        vec![put("b", json!(1)), put("c", json!(2)), put("d", json!(3))]
    );
    assert!(rec.truncated.is_none());
}

fn segments(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("journal."))
        .collect();
    v.sort();
    v
}

#[test]
fn oversized_append_is_refused() {
    let d = TempDir::new("large");
    let (store, _) = Store::open(
        d.path(),
        Options {
            max_append_bytes: 100,
            ..opts()
        },
    )
    .unwrap();
    let err = store
        .append(&[put("k", json!("x".repeat(200)))])
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { max: 100, .. }), "{err}");
    assert_eq!(store.append(&[put("k", json!(1))]).unwrap(), 1);
}

#[test]
fn zero_filled_tail_is_cut() {
    let d = TempDir::new("zeros");
    let b = batches();
    write_batches(d.path(), &b);
    let seg = only_segment(d.path());
    let len = fs::metadata(&seg).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len + 4096)
        .unwrap();
    let (_, rec) = open(d.path());
    assert_eq!(rec.records, model(&b, b.len()));
    let t = rec.truncated.unwrap();
    assert_eq!(
        (t.at_offset, t.dropped_bytes, t.damage),
        (len, 4096, Damage::ZeroLength)
    );
}
