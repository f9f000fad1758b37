//! Events-feed subscribers for bench/run.sh's `events` scenario, in Rust (std only; run.sh
//! compiles it with `rustc -O`): the same flags, protocol and `EVENTS_RESULT` line as
//! `events_sub.py`, at a fraction of its CPU. With 100 subscribers the Python client reads
//! about 300-400k frames/s in all and takes as much CPU as the daemon, so it, not the
//! daemon, decided whether the subscribers kept up; this one reads each subscription on its
//! own thread with blocking reads and scans the frames line by line.
//!
//! Phases (as in events_sub.py): connect and subscribe all N, wait for every `hello`, create
//! --ready-file; read until --stop-file appears; open one more subscription only for the
//! newest seq its hello reports, then let every subscriber drain up to it (at most --drain
//! seconds); write one `EVENTS_RESULT key=value ...` line to --out. Everything is bounded by
//! --max-seconds.
//!
//! Parsing is shallow: an SSE frame is one `data: ` line (the daemon's JSON has no raw
//! newline), a chunk-size line is skipped, and the line `0` (the chunked terminator) is the
//! end of the stream. Only the frame's leading
//! `{"id":1,"jsonrpc":"2.0","result":{"event":{"kind":"…","seq":N` is read.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const EVENTS_URI: &str = "https://agentd.dev/a2a/ext/events";
const BODY: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"agentd.events/SubscribeToEvents","params":{"fromSeq":0}}"#;
const FRAME: &[u8] = br#"data: {"id":1,"jsonrpc":"2.0","result":{"#;
const EVENT: &[u8] = br#""event":{"kind":""#;
const HELLO: &[u8] = br#""hello":{"#;
const GOODBYE: &[u8] = br#""goodbye":{"reason":""#;

struct Args {
    host: String,
    port: u16,
    subs: usize,
    ready_file: String,
    stop_file: String,
    out: String,
    drain: f64,
    connect_timeout: f64,
    max_seconds: f64,
    recv: usize,
}

fn args() -> Args {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 0,
        subs: 0,
        ready_file: String::new(),
        stop_file: String::new(),
        out: String::new(),
        drain: 10.0,
        connect_timeout: 10.0,
        max_seconds: 120.0,
        recv: 256 * 1024,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        let num = |v: &str| -> f64 { v.parse().unwrap_or_else(|_| fail(&format!("bad {flag}"))) };
        match flag.as_str() {
            "--host" => a.host = value,
            "--port" => a.port = num(&value) as u16,
            "--subs" => a.subs = num(&value) as usize,
            "--ready-file" => a.ready_file = value,
            "--stop-file" => a.stop_file = value,
            "--out" => a.out = value,
            "--drain" => a.drain = num(&value),
            "--connect-timeout" => a.connect_timeout = num(&value),
            "--max-seconds" => a.max_seconds = num(&value),
            "--recv" => a.recv = num(&value) as usize,
            _ => fail(&format!("unknown flag {flag}")),
        }
    }
    if a.port == 0 || a.out.is_empty() || a.ready_file.is_empty() || a.stop_file.is_empty() {
        fail("--port, --subs, --ready-file, --stop-file and --out are required");
    }
    if !["127.0.0.1", "::1", "localhost"].contains(&a.host.as_str()) {
        fail("loopback only");
    }
    a
}

fn fail(why: &str) -> ! {
    eprintln!("events_reader: {why}");
    std::process::exit(2)
}

/// What one subscriber saw.
#[derive(Default)]
struct Sub {
    status: u16,
    head_done: bool,
    hello_seq: Option<u64>,
    frames: u64,
    first_seq: Option<u64>,
    last_seq: u64,
    gaps: u64,
    gap_events: u64,
    dups: u64,
    /// `goodbye:<reason>`, `cutoff`, `eof` or `error:<what>`; `None` while open.
    end: Option<String>,
    goodbye: Option<String>,
    t_first: Option<Instant>,
    t_last: Option<Instant>,
    bytes: u64,
}

impl Sub {
    /// Consumes `data`, keeping an incomplete line in `pending`.
    fn feed(&mut self, pending: &mut Vec<u8>, data: &[u8], now: Instant) {
        self.bytes += data.len() as u64;
        pending.extend_from_slice(data);
        let mut start = 0;
        if !self.head_done {
            let Some(i) = find(pending, b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8_lossy(&pending[..i]).to_ascii_lowercase();
            self.status = head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if self.status != 200 || !head.contains("chunked") {
                self.end = Some(format!("error:http-{}", self.status));
                return;
            }
            self.head_done = true;
            start = i + 4;
        }
        let Some(last_nl) = pending.iter().rposition(|&b| b == b'\n') else {
            pending.drain(..start);
            return;
        };
        let mut events = false;
        for line in pending[start..=last_nl].split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(rest) = line.strip_prefix(FRAME) {
                if let Some(rest) = rest.strip_prefix(EVENT) {
                    // A frame of another shape is not counted (as events_sub.py's pattern
                    // does not match it).
                    if let Some(seq) = seq_after_kind(rest) {
                        events = true;
                        self.event(seq);
                    }
                } else if rest.starts_with(HELLO) && self.hello_seq.is_none() {
                    self.hello_seq = find(rest, br#""seq":"#).map(|i| digits(&rest[i + 6..]));
                } else if let Some(reason) = rest.strip_prefix(GOODBYE) {
                    // The feed's last frame: the stream has ended, whether or not its
                    // terminator is read.
                    let end = reason.iter().position(|&b| b == b'"').unwrap_or(0);
                    let reason = String::from_utf8_lossy(&reason[..end]).into_owned();
                    self.end = Some(format!("goodbye:{reason}"));
                    self.goodbye = Some(reason);
                }
            } else if line == b"0" && self.goodbye.is_none() {
                // The chunked terminator without a goodbye: the feed cut the stream off.
                self.end = Some("cutoff".into());
            }
        }
        if events {
            self.t_first.get_or_insert(now);
            self.t_last = Some(now);
        }
        pending.drain(..=last_nl);
    }

    fn event(&mut self, seq: u64) {
        self.frames += 1;
        self.first_seq.get_or_insert(seq);
        let last = self.last_seq;
        if seq <= last {
            self.dups += 1;
            return;
        }
        if seq != last + 1 {
            self.gaps += 1;
            self.gap_events += seq - last - 1;
        }
        self.last_seq = seq;
    }
}

/// `kind…","seq":N` → N; `None` for any other shape (seqs start at 1).
fn seq_after_kind(rest: &[u8]) -> Option<u64> {
    let end = rest.iter().position(|&b| b == b'"')?;
    let seq = digits(rest[end..].strip_prefix(br#"","seq":"#)?);
    (seq > 0).then_some(seq)
}

fn digits(s: &[u8]) -> u64 {
    s.iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0, |n, b| n * 10 + u64::from(b - b'0'))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn request(host: &str, port: u16) -> Vec<u8> {
    format!(
        "POST / HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n\
         A2A-Version: 1.0\r\nA2A-Extensions: {EVENTS_URI}\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes()
}

fn connect(a: &Args) -> std::io::Result<TcpStream> {
    let addr = format!("{}:{}", a.host, a.port);
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&addr)?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs_f64(a.connect_timeout))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// One short-lived subscription, only for the newest seq its hello reports.
fn newest_seq(a: &Args) -> Option<u64> {
    let mut s = connect(a).ok()?;
    s.write_all(&request(&a.host, a.port)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(100))).ok()?;
    let deadline = Instant::now() + Duration::from_secs_f64(a.connect_timeout);
    let (mut sub, mut pending, mut buf) = (Sub::default(), Vec::new(), vec![0; 64 * 1024]);
    while Instant::now() < deadline && sub.hello_seq.is_none() && sub.end.is_none() {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => sub.feed(&mut pending, &buf[..n], Instant::now()),
            Err(e) if waited(&e) => {}
            Err(_) => break,
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    sub.hello_seq
}

/// A read that timed out or was interrupted: the stream is still open.
fn waited(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
    matches!(e.kind(), WouldBlock | TimedOut | Interrupted)
}

/// What the reader threads and the main thread share.
struct Shared {
    hellos: AtomicUsize,
    failed: AtomicUsize,
    /// Each subscriber's highest seq, or `u64::MAX` once its stream ended.
    progress: Vec<AtomicU64>,
    done: AtomicBool,
}

fn read_loop(mut s: TcpStream, idx: usize, shared: Arc<Shared>, recv: usize) -> Sub {
    let mut sub = Sub::default();
    let (mut pending, mut buf) = (Vec::with_capacity(recv), vec![0u8; recv]);
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut said_hello = false;
    while !shared.done.load(Ordering::Relaxed) && sub.end.is_none() {
        match s.read(&mut buf) {
            Ok(0) => sub.end = Some("eof".into()),
            Ok(n) => sub.feed(&mut pending, &buf[..n], Instant::now()),
            Err(e) if waited(&e) => {}
            Err(e) => sub.end = Some(format!("error:{:?}", e.kind())),
        }
        if !said_hello && sub.hello_seq.is_some() {
            said_hello = true;
            shared.hellos.fetch_add(1, Ordering::Relaxed);
        }
        shared.progress[idx].store(sub.last_seq, Ordering::Relaxed);
    }
    if sub.end.is_some() {
        shared.progress[idx].store(u64::MAX, Ordering::Relaxed);
        if !said_hello {
            shared.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    sub
}

/// The process's user + system CPU seconds, from /proc/self/stat (clock ticks of 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split(' ').collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn main() {
    let a = args();
    let start = Instant::now();
    let hard_deadline = start + Duration::from_secs_f64(a.max_seconds);
    let mut result: Vec<(String, String)> = vec![
        ("subs".into(), a.subs.to_string()),
        ("status".into(), "ok".into()),
    ];
    let write_out = |result: &[(String, String)]| {
        let line: Vec<String> = result.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = std::fs::write(&a.out, format!("EVENTS_RESULT {}\n", line.join(" ")));
    };
    let set = |result: &mut Vec<(String, String)>, k: &str, v: String| match result
        .iter_mut()
        .find(|(key, _)| key == k)
    {
        Some(slot) => slot.1 = v,
        None => result.push((k.into(), v)),
    };

    // 1. Connect and subscribe.
    let shared = Arc::new(Shared {
        hellos: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        progress: (0..a.subs).map(|_| AtomicU64::new(0)).collect(),
        done: AtomicBool::new(false),
    });
    let req = request(&a.host, a.port);
    let mut threads = Vec::with_capacity(a.subs);
    for idx in 0..a.subs {
        let s = match connect(&a).and_then(|mut s| s.write_all(&req).map(|()| s)) {
            Ok(s) => s,
            Err(e) => {
                set(&mut result, "status", format!("error:{:?}", e.kind()));
                write_out(&result);
                shared.done.store(true, Ordering::Relaxed);
                std::process::exit(1);
            }
        };
        let shared = shared.clone();
        let recv = a.recv;
        threads.push(
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || read_loop(s, idx, shared, recv))
                .expect("a reader thread"),
        );
    }
    let hello_deadline = Instant::now() + Duration::from_secs_f64(a.connect_timeout);
    while shared.hellos.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed) < a.subs {
        if Instant::now() > hello_deadline {
            let missing = a.subs - shared.hellos.load(Ordering::Relaxed);
            set(&mut result, "status", format!("no-hello:{missing}"));
            write_out(&result);
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // A stream that ended after its hello, before the load, failed too.
    let ended_early = shared
        .progress
        .iter()
        .any(|p| p.load(Ordering::Relaxed) == u64::MAX);
    if shared.failed.load(Ordering::Relaxed) > 0 || ended_early {
        set(&mut result, "status", "subscribe-failed".into());
        write_out(&result);
        std::process::exit(1);
    }
    let _ = std::fs::write(&a.ready_file, "");
    let cpu0 = cpu_seconds();

    // 2. Read until run.sh says the load is over.
    loop {
        if Instant::now() > hard_deadline {
            set(&mut result, "status", "timeout".into());
            break;
        }
        if std::path::Path::new(&a.stop_file).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // 3. The newest seq, then drain towards it.
    let ok = result.iter().any(|(k, v)| k == "status" && v == "ok");
    let newest = if ok { newest_seq(&a) } else { None };
    let t_stop = Instant::now();
    if let Some(newest) = newest {
        let drain_deadline = hard_deadline.min(t_stop + Duration::from_secs_f64(a.drain));
        while Instant::now() < drain_deadline
            && !shared
                .progress
                .iter()
                .all(|p| p.load(Ordering::Relaxed) >= newest)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    shared.done.store(true, Ordering::Relaxed);
    let subs: Vec<Sub> = threads
        .into_iter()
        .map(|t| t.join().unwrap_or_default())
        .collect();
    let newest = newest.unwrap_or_else(|| {
        if ok {
            set(&mut result, "status", "no-newest".into());
        }
        subs.iter().map(|s| s.last_seq).max().unwrap_or(0)
    });

    // 4. Report, with the keys and meanings of events_sub.py.
    let t0 = subs.iter().filter_map(|s| s.t_first).min();
    let t1 = subs.iter().filter_map(|s| s.t_last).max();
    let frames: u64 = subs.iter().map(|s| s.frames).sum();
    let dur = match (t0, t1) {
        (Some(t0), Some(t1)) if t1 > t0 => (t1 - t0).as_secs_f64(),
        _ => 0.0,
    };
    let rates: Vec<f64> = subs
        .iter()
        .map(|s| match (s.t_last, t0) {
            (Some(l), Some(t0)) if l > t0 => s.frames as f64 / (l - t0).as_secs_f64(),
            _ => 0.0,
        })
        .collect();
    let ended = |s: &Sub, p: &str| s.end.as_deref().is_some_and(|e| e.starts_with(p));
    let complete = subs
        .iter()
        .filter(|s| {
            s.gap_events == 0
                && s.dups == 0
                && s.last_seq >= newest
                && (s.first_seq.is_none_or(|f| f == 1) || newest == 0)
                && s.end.is_none()
        })
        .count();
    let sum = |f: fn(&Sub) -> u64| subs.iter().map(f).sum::<u64>();
    let mean = if rates.is_empty() {
        0.0
    } else {
        rates.iter().sum::<f64>() / rates.len() as f64
    };
    let min = rates.iter().cloned().fold(f64::INFINITY, f64::min);
    let kv: Vec<(&str, String)> = vec![
        ("newest", newest.to_string()),
        ("frames", frames.to_string()),
        ("duration_s", format!("{dur:.3}")),
        (
            "total_eps",
            format!("{:.1}", if dur > 0.0 { frames as f64 / dur } else { 0.0 }),
        ),
        ("sub_eps_mean", format!("{mean:.1}")),
        (
            "sub_eps_min",
            format!("{:.1}", if min.is_finite() { min } else { 0.0 }),
        ),
        ("complete", complete.to_string()),
        ("gaps", sum(|s| s.gaps).to_string()),
        ("gap_events", sum(|s| s.gap_events).to_string()),
        (
            "head_missed",
            sum(|s| s.first_seq.map_or(0, |f| f - 1)).to_string(),
        ),
        ("dups", sum(|s| s.dups).to_string()),
        (
            "cutoffs",
            subs.iter()
                .filter(|s| ended(s, "cutoff"))
                .count()
                .to_string(),
        ),
        (
            "eofs",
            subs.iter()
                .filter(|s| ended(s, "eof") || ended(s, "error:"))
                .count()
                .to_string(),
        ),
        (
            "goodbyes",
            subs.iter()
                .filter(|s| ended(s, "goodbye:"))
                .count()
                .to_string(),
        ),
        (
            "lagging",
            subs.iter()
                .filter(|s| s.end.is_none() && s.last_seq < newest)
                .count()
                .to_string(),
        ),
        (
            "missed_tail",
            subs.iter()
                .map(|s| newest.saturating_sub(s.last_seq))
                .sum::<u64>()
                .to_string(),
        ),
        ("bytes", sum(|s| s.bytes).to_string()),
        ("drain_s", format!("{:.3}", t_stop.elapsed().as_secs_f64())),
        ("cpu_s", format!("{:.2}", cpu_seconds() - cpu0)),
    ];
    for (k, v) in kv {
        set(&mut result, k, v);
    }
    write_out(&result);
    for (i, s) in subs.iter().enumerate() {
        if s.end.is_some() || s.last_seq < newest || s.gap_events > 0 || s.dups > 0 {
            eprintln!(
                "sub {i}: frames={} first={:?} last={} gaps={}/{} dups={} end={:?}",
                s.frames, s.first_seq, s.last_seq, s.gaps, s.gap_events, s.dups, s.end
            );
        }
    }
}
