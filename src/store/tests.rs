//! Store tests on real files in temp directories: recovery from every torn tail, bit flips,
//! compaction interrupted at each step, the fatal-fsync path. Concurrency, the lock and the
//! SIGKILL crash test live in `tests/store.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use serde_json::json;

use super::disk::{self, Step};
use super::frame::{FrameReader, Next};
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

/// Appends each batch as its own frame, waits for durability, closes.
fn write_batches(dir: &Path, batches: &[Vec<Record>]) {
    let (store, _) = open(dir);
    let mut last = 0;
    for b in batches {
        last = store.append(b).unwrap();
    }
    store.wait_durable(last, T).unwrap();
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

/// Start offsets of every frame in a file.
fn frame_starts(path: &Path) -> Vec<u64> {
    let bytes = fs::read(path).unwrap();
    let mut r = FrameReader::new(&bytes[..], bytes.len() as u64);
    let mut out = Vec::new();
    loop {
        match r.next().unwrap() {
            Next::Frame { offset, .. } => out.push(offset),
            Next::End => return out,
            Next::Bad { offset, damage } => panic!("damage at {offset}: {damage}"),
        }
    }
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
    assert_eq!(store.append(&[]).unwrap(), 1);
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

/// Cutting the newest segment at any byte inside its last frame recovers exactly the frames
/// before it, truncates the file there, and says so.
#[test]
fn truncation_at_every_offset_of_the_last_frame() {
    let src = TempDir::new("trunc-src");
    let b = batches();
    write_batches(src.path(), &b);
    let seg = only_segment(src.path());
    let full = fs::read(&seg).unwrap();
    let starts = frame_starts(&seg);
    let last = *starts.last().unwrap();
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
                "a cut on a frame boundary is a clean end"
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
        drop(store);
        let (_, rec) = open(d.path());
        assert_eq!(rec.truncated, None);
        let mut want = model(&b, b.len() - 1);
        want.push(put("after", json!(cut)));
        assert_eq!(rec.records, want);
    }
}

/// Every single-bit flip in the segment ends replay at the frame it hit (crc, length or
/// JSON), never produces a state other than a prefix, and never crashes open.
#[test]
fn bit_flips_in_the_journal_recover_a_prefix() {
    let src = TempDir::new("flip-src");
    let b = batches();
    write_batches(src.path(), &b);
    let seg = only_segment(src.path());
    let full = fs::read(&seg).unwrap();
    let starts = frame_starts(&seg);
    // Deterministic pseudo-random positions (xorshift), biased to the tail, plus every bit
    // of the last frame's header.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut bits: Vec<u64> = (0..400)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let span = if i % 2 == 0 {
                full.len() as u64 - starts[starts.len() - 1]
            } else {
                full.len() as u64
            };
            (full.len() as u64 - 1 - x % span) * 8 + (x >> 32) % 8
        })
        .collect();
    bits.extend((0..64).map(|b| starts[starts.len() - 1] * 8 + b));
    for bit in bits {
        let d = TempDir::new("flip");
        copy_dir(src.path(), d.path());
        let mut bytes = full.clone();
        bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
        let seg = d.path().join(seg.file_name().unwrap());
        fs::write(&seg, &bytes).unwrap();
        let hit = starts.iter().rposition(|s| *s <= bit / 8).unwrap();
        let (_, rec) = open(d.path());
        assert_eq!(rec.records, model(&b, hit), "bit {bit} in frame {hit}");
        let t = rec.truncated.unwrap();
        assert_eq!(t.at_offset, starts[hit], "bit {bit}");
        assert_eq!(t.dropped_bytes, full.len() as u64 - starts[hit]);
    }
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
fn a_failed_fsync_is_fatal_and_never_claims_durability() {
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
