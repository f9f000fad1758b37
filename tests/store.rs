//! The durable store through its public API: the directory lock, many concurrent appenders
//! with compactions running underneath, and a child process killed with SIGKILL while it
//! appends, whose every reported-durable write must be there after reopen.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentd::store::{Error, Op, Options, Record, Store};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("agentd-store-it-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Opens a store right after another handle on it closed. Another test in this binary
/// spawns child processes, and a child between its fork and its exec holds a copy of every
/// descriptor, the lock's included, for a moment: the reopen retries briefly through that.
fn reopen(dir: &std::path::Path, opts: Options) -> (Store, agentd::store::Recovered) {
    try_reopen(dir, opts).unwrap()
}

/// [`reopen`], for an open that may fail.
fn try_reopen(
    dir: &std::path::Path,
    opts: Options,
) -> Result<(Store, agentd::store::Recovered), Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match Store::open(dir, opts.clone()) {
            Err(Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            other => return other,
        }
    }
}

/// Issue 15, item 2: 200 acknowledged appends, a clean close, one byte flipped in an early
/// frame. That used to be cut as a torn tail, losing nearly everything. Later batches prove
/// the damaged one was synced: open refuses, naming the file and the frame, and leaves the
/// file alone; with the byte restored everything is there.
#[test]
fn a_flipped_byte_under_acknowledged_appends_is_refused_not_cut() {
    let d = TempDir::new("flipped");
    let (store, _) = Store::open(&d.0, Options::default()).unwrap();
    for i in 0..200 {
        let t = store
            .append(&[Record::put("task", format!("t{i}"), json!({"i": i}))])
            .unwrap();
        store.wait_durable(t, T).unwrap();
    }
    store.close().unwrap();
    let segs: Vec<PathBuf> = fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("journal.")
        })
        .collect();
    let [seg] = &segs[..] else { panic!("{segs:?}") };
    let mut bytes = fs::read(seg).unwrap();
    // Record frames are those whose payload is a JSON array; take the fifth.
    let mut at = 0;
    let mut records = Vec::new();
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if bytes[at + 8] == b'[' {
            records.push((at, len));
        }
        at += 8 + len;
    }
    let (frame, len) = records[4];
    bytes[frame + 8 + len / 2] ^= 0x01;
    fs::write(seg, &bytes).unwrap();

    match try_reopen(&d.0, Options::default()) {
        Err(Error::Corrupt { file, offset, .. }) => {
            assert_eq!((&file, offset), (seg, frame as u64))
        }
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok((_, rec)) => panic!(
            "opened with {} of 200 records, cut: {:?}",
            rec.records.len(),
            rec.truncated
        ),
    }
    assert_eq!(fs::read(seg).unwrap(), bytes, "the file is left alone");
    bytes[frame + 8 + len / 2] ^= 0x01;
    fs::write(seg, &bytes).unwrap();
    let (_, rec) = reopen(&d.0, Options::default());
    assert_eq!((rec.records.len(), rec.truncated), (200, None));
}

#[test]
fn a_second_opener_is_refused_until_the_first_closes() {
    let d = TempDir::new("lock");
    let (first, _) = Store::open(&d.0, Options::default()).unwrap();
    let err = Store::open(&d.0, Options::default()).err().unwrap();
    match &err {
        Error::Locked { dir, holder } => {
            assert_eq!(dir, &d.0);
            assert_eq!(holder, &format!("pid {}", std::process::id()));
        }
        other => panic!("expected Locked, got {other}"),
    }
    assert!(
        err.to_string().contains("in use by another agentd"),
        "{err}"
    );
    first.close().unwrap();
    let (again, _) = reopen(&d.0, Options::default());
    drop(again);
}

/// The lock is on the directory: deleting `LOCK` (an operator tidying up, a cleanup script)
/// does not let a second store in, and what the first acknowledged stays.
#[test]
fn deleting_the_lock_file_does_not_let_a_second_opener_in() {
    let d = TempDir::new("lock-deleted");
    let (first, _) = Store::open(&d.0, Options::default()).unwrap();
    let t = first.append(&[Record::put("task", "a", json!(1))]).unwrap();
    first.wait_durable(t, T).unwrap();
    fs::remove_file(d.0.join("LOCK")).unwrap();
    let err = Store::open(&d.0, Options::default()).err().unwrap();
    match &err {
        Error::Locked { dir, holder } => {
            assert_eq!(dir, &d.0);
            // The message has lost its pid with the file, not its point.
            assert_eq!(holder, "");
        }
        other => panic!("expected Locked, got {other}"),
    }
    assert!(
        err.to_string()
            .contains("in use by another agentd (holder unknown)"),
        "{err}"
    );
    // The refused opener touched nothing: the first goes on, and all of it is there after.
    let t = first.append(&[Record::put("task", "b", json!(2))]).unwrap();
    first.wait_durable(t, T).unwrap();
    first.compact().unwrap();
    first.close().unwrap();
    let (again, rec) = reopen(&d.0, Options::default());
    let keys: Vec<&str> = rec.records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(
        fs::read_to_string(d.0.join("LOCK")).unwrap(),
        format!("pid {}\n", std::process::id()),
        "the next opener writes LOCK again"
    );
    drop(again);
}

/// The lock follows the directory, not its name. Renamed while open, the directory keeps
/// the first store's data; a store opened at the old path gets a new directory and shares
/// nothing; the first store fails at its next rotation instead of writing into the new one.
#[test]
fn a_moved_directory_stops_the_store_rather_than_share_the_new_one() {
    let d = TempDir::new("moved");
    let moved = TempDir::new("moved-to");
    let (first, _) = Store::open(&d.0, Options::default()).unwrap();
    let t = first.append(&[Record::put("task", "a", json!(1))]).unwrap();
    first.wait_durable(t, T).unwrap();
    fs::rename(&d.0, &moved.0).unwrap();
    let (second, _) = Store::open(&d.0, Options::default()).unwrap();
    let t = second
        .append(&[Record::put("task", "other", json!(0))])
        .unwrap();
    second.wait_durable(t, T).unwrap();
    // Appends still land in the moved directory (the open segment) ...
    let t = first.append(&[Record::put("task", "b", json!(2))]).unwrap();
    first.wait_durable(t, T).unwrap();
    // ... until a rotation would create a file by path.
    let err = first.compact().unwrap_err();
    assert!(err.to_string().contains("no longer the directory"), "{err}");
    drop(first);
    drop(second);
    let keys = |dir: &Path| {
        let (_, rec) = reopen(dir, Options::default());
        rec.records.into_iter().map(|r| r.key).collect::<Vec<_>>()
    };
    assert_eq!(keys(&moved.0), ["a", "b"]);
    assert_eq!(keys(&d.0), ["other"]);
}

#[test]
fn concurrent_appenders_are_all_durable_and_all_recovered() {
    const THREADS: usize = 16;
    const EACH: usize = 200;
    let d = TempDir::new("concurrent");
    // A small threshold so several compactions run while the appenders write.
    let opts = Options {
        compact_after_bytes: 16 << 10,
        ..Options::default()
    };
    let (store, _) = Store::open(&d.0, opts.clone()).unwrap();
    let store = Arc::new(store);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let key = format!("{t}-{i}");
                    let mut batch = vec![Record::put("item", key, json!({"t": t, "i": i}))];
                    // Every fifth write removes the previous one again.
                    if i % 5 == 4 {
                        batch.push(Record::remove("item", format!("{t}-{}", i - 1)));
                    }
                    let ticket = store.append(&batch).unwrap();
                    store.wait_durable(ticket, T).unwrap();
                    assert!(store.durable() >= ticket);
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    let stats = store.stats();
    assert_eq!(stats.durable, (THREADS * EACH) as u64);
    assert!(stats.batches <= stats.appended);
    assert!(stats.compactions > 0, "{stats:?}");
    eprintln!(
        "{} appends in {} fsync batches, {} compactions",
        stats.appended, stats.batches, stats.compactions
    );
    Arc::into_inner(store).unwrap().close().unwrap();

    let (_, rec) = reopen(&d.0, opts);
    assert_eq!(rec.truncated, None);
    let got: HashMap<String, serde_json::Value> = rec
        .records
        .into_iter()
        .map(|r| match r.op {
            Op::Put(v) => (r.key, v),
            Op::Remove => panic!("recovery returns puts only"),
        })
        .collect();
    for t in 0..THREADS {
        for i in 0..EACH {
            let removed = i % 5 == 3;
            let v = got.get(&format!("{t}-{i}"));
            if removed {
                assert_eq!(v, None, "{t}-{i} was removed");
            } else {
                assert_eq!(v, Some(&json!({"t": t, "i": i})), "{t}-{i}");
            }
        }
    }
    assert_eq!(got.len(), THREADS * EACH * 4 / 5);
}

const CRASH_ENV: &str = "AGENTD_STORE_CRASH_CHILD_DIR";
const CRASH_THREADS: u64 = 8;
/// Each thread keeps its last `WINDOW` items: step `i` puts item `i`, removes item
/// `i - WINDOW` and sets the thread's counter to `i`, in one atomic append.
const WINDOW: u64 = 10;

fn crash_opts() -> Options {
    // Compactions every few hundred appends, so kills also land inside them.
    Options {
        compact_after_bytes: 48 << 10,
        ..Options::default()
    }
}

fn counter(records: &[Record], t: u64) -> Option<u64> {
    records
        .iter()
        .find(|r| r.kind == "counter" && r.key == t.to_string())
        .map(|r| match &r.op {
            Op::Put(v) => v.as_u64().unwrap(),
            Op::Remove => unreachable!(),
        })
}

/// Not a test on its own: the body of the child process `crash_test_kills_an_appender`
/// starts. Without the environment variable it does nothing.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CRASH_ENV) else {
        return;
    };
    let (store, rec) = Store::open(&dir, crash_opts()).unwrap();
    let store = Arc::new(store);
    let starts: Vec<u64> = (0..CRASH_THREADS)
        .map(|t| counter(&rec.records, t).map_or(0, |c| c + 1))
        .collect();
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let handles: Vec<_> = (0..CRASH_THREADS)
        .map(|t| {
            let (store, out, start) = (store.clone(), out.clone(), starts[t as usize]);
            std::thread::spawn(move || {
                for i in start.. {
                    let mut batch = vec![
                        Record::put(
                            "item",
                            format!("{t}-{i}"),
                            json!({"t": t, "i": i, "pad": "p".repeat(64)}),
                        ),
                        Record::put("counter", t.to_string(), json!(i)),
                    ];
                    if i >= WINDOW {
                        batch.push(Record::remove("item", format!("{t}-{}", i - WINDOW)));
                    }
                    let ticket = store.append(&batch).unwrap();
                    store.wait_durable(ticket, T).unwrap();
                    // Reported only after durability: the parent's contract.
                    let mut o = out.lock().unwrap();
                    writeln!(o, "D {t} {i} {ticket}").unwrap();
                    o.flush().unwrap();
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
}

#[test]
fn crash_test_kills_an_appender() {
    let d = TempDir::new("crash");
    let exe = std::env::current_exe().unwrap();
    // Kill after different amounts of work so the kill lands in different places: mid
    // write, mid fsync, mid compaction.
    for (round, kill_after) in [150usize, 700, 60, 1500, 400].into_iter().enumerate() {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CRASH_ENV, &d.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut reported: Vec<(u64, u64)> = Vec::new();
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while reported.len() < kill_after && Instant::now() < deadline {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("child exited early");
            }
            if let Some(d) = parse(&line) {
                reported.push(d);
            }
        }
        if round == 0 {
            // Another process holds the directory: refused while the child lives.
            assert!(matches!(
                Store::open(&d.0, crash_opts()),
                Err(Error::Locked { .. })
            ));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Lines the child wrote before it died are still in the pipe.
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        reported.extend(rest.lines().filter_map(parse));
        assert!(
            reported.len() >= kill_after,
            "round {round}: only {} reported",
            reported.len()
        );

        let (store, rec) = Store::open(&d.0, crash_opts()).unwrap();
        if let Some(t) = &rec.truncated {
            eprintln!("round {round}: recovery cut {t}");
        }
        let items: HashMap<&str, &serde_json::Value> = rec
            .records
            .iter()
            .filter(|r| r.kind == "item")
            .map(|r| match &r.op {
                Op::Put(v) => (r.key.as_str(), v),
                Op::Remove => unreachable!(),
            })
            .collect();
        for t in 0..CRASH_THREADS {
            let max = reported
                .iter()
                .filter(|(rt, _)| *rt == t)
                .map(|(_, i)| *i)
                .max();
            let c = counter(&rec.records, t);
            // Nothing reported durable is lost ...
            if let Some(max) = max {
                assert!(
                    c.is_some_and(|c| c >= max),
                    "round {round} thread {t}: counter {c:?} < reported {max}"
                );
            }
            // ... and what is there is exactly the state after some whole prefix of the
            // thread's atomic appends: the last WINDOW items, nothing older or newer.
            let Some(c) = c else { continue };
            for i in c.saturating_sub(WINDOW - 1)..=c {
                let want = json!({"t": t, "i": i, "pad": "p".repeat(64)});
                assert_eq!(
                    items.get(format!("{t}-{i}").as_str()),
                    Some(&&want),
                    "round {round}: {t}-{i}"
                );
            }
            let kept = items
                .keys()
                .filter(|k| k.starts_with(&format!("{t}-")))
                .count() as u64;
            assert_eq!(
                kept,
                (c + 1).min(WINDOW),
                "round {round} thread {t}: stray items"
            );
        }
        eprintln!(
            "round {round}: {} reported durable, recovered {} records ({} journal frames)",
            reported.len(),
            rec.records.len(),
            rec.frames
        );
        store.close().unwrap();
    }
    let leftovers: Vec<_> = fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        !leftovers.iter().any(|n| n == "snapshot.tmp"),
        "{leftovers:?}"
    );
    assert!(
        Path::new(&d.0).join("snapshot").exists(),
        "compactions ran: {leftovers:?}"
    );
}

fn parse(line: &str) -> Option<(u64, u64)> {
    let mut it = line.strip_prefix("D ")?.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}
