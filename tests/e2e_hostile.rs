//! Hostile input against the real `agentd` binary, every case on both drivers (`smol` and
//! `std`): connection floods, oversized and malformed bodies, JSON built to exhaust a
//! parser, clients that never read, half-closed sockets, smuggling-shaped framing and a
//! subscriber that never reads its event stream.
//!
//! After each hostile case the daemon must (a) still be running, (b) answer a fresh,
//! well-behaved client promptly ([`assert_served`]: a card GET and a JSON-RPC GetTask over
//! each listener, within [`PROMPT`]), and (c) where the attack is about memory, keep its
//! resident set bounded (`VmRSS` of `/proc/<pid>/status`). Each refusal is asserted with
//! the exact status or JSON-RPC code the core gives (see `core/src/http/parser.rs`,
//! `core/src/jsonrpc.rs`, `core/src/rpc.rs` and `core/src/conn.rs`).
//!
//! Not repeated here (see `tests/e2e_drivers.rs`): slowloris, idle close, 200 abandoned
//! connections, 1500 pipelined requests read back, byte-by-byte input, CL+TE smuggling.
//!
//! Figures (timings, RSS) are printed to stderr with a `[hostile]` prefix: run with
//! `-- --nocapture` to see them.

mod common;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Runs each listed `fn name(driver: &str)` as `smol_driver::name` and `std_driver::name`.
macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {
        mod smol_driver {
            $( #[test] fn $name() { super::$name("smol") } )*
        }
        mod std_driver {
            $( #[test] fn $name() { super::$name("std") } )*
        }
    };
}

both_drivers!(
    ten_thousand_abandoned_connections,
    a_burst_of_connects_is_queued_not_dropped,
    default_connection_limit_answers_503,
    oversized_bodies_are_refused_with_413,
    deeply_nested_json_is_refused,
    invalid_utf8_is_a_parse_error,
    duplicate_envelope_members_are_refused,
    huge_ids_are_echoed_byte_for_byte,
    pipelined_flood_that_never_reads_is_dropped,
    half_close_mid_body_closes_silently,
    smuggling_shaped_framing_is_refused_and_closed,
    slow_event_subscriber_is_cut_off,
    invalid_utf8_in_an_ignored_member_is_a_parse_error,
);

// ---------------------------------------------------------------------------------------
// Shared bounds and helpers
// ---------------------------------------------------------------------------------------

/// How fast a well-behaved client must be served after (or beside) an attack.
const PROMPT: Duration = Duration::from_secs(1);
/// `max_body_bytes` by default (2 MiB).
const MAX_BODY: usize = 2 * 1024 * 1024;
/// A task id no daemon holds: GetTask answers -32001.
const UNKNOWN_TASK: &str = "00000000-0000-4000-8000-000000000000";
const EVENTS_URI: &str = "https://agentd.dev/a2a/ext/events";
const MIB: u64 = 1024; // in KiB, the unit of VmRSS

/// The connection-flood cases hold 10,000 descriptors of this test process each (its
/// `RLIMIT_NOFILE` is shared by all tests) and briefly saturate the 2 CPUs: they take
/// this lock so no two floods overlap. Every other case runs beside them.
static FLOODS: Mutex<()> = Mutex::new(());

fn flood_alone() -> MutexGuard<'static, ()> {
    FLOODS.lock().unwrap_or_else(|p| p.into_inner())
}

fn note(driver: &str, case: &str, msg: impl AsRef<str>) {
    eprintln!("[hostile] {driver:>4} {case}: {}", msg.as_ref());
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), or a plain count (`Threads`).
fn proc_status(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("expected to read /proc/{pid}/status: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("expected a {key} line in /proc/{pid}/status"))
}

/// The daemon's resident set, KiB.
fn rss_kib(d: &Daemon) -> u64 {
    proc_status(d.pid(), "VmRSS")
}

/// Open descriptors of the daemon: its listeners, its own files, and one per connection it
/// accepted and has not closed yet.
fn fd_count(d: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .map(|r| r.count())
        .unwrap_or_else(|e| panic!("expected to list /proc/{}/fd: {e}", d.pid()))
}

/// Polls `f` every 5 ms until it holds; panics with `what` after `within`.
fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "expected {what} within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the daemon holds no more descriptors than `base` (its connections closed).
fn wait_fds_back(d: &Daemon, base: usize, within: Duration, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let now = fd_count(d);
        if now <= base {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "expected {what} within {within:?}: the daemon still holds {now} descriptors, \
             {} more than when idle",
            now - base
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// (a) alive, (b) a fresh well-behaved client on each listener gets the card and a GetTask
/// answer (-32001 for an unknown task) within [`PROMPT`].
fn assert_served(d: &mut Daemon, after: &str) {
    d.assert_alive();
    for via in Via::ALL {
        let t = Instant::now();
        let mut c = d.connect(via);
        c.stream
            .set_read_timeout(Some(PROMPT * 3))
            .expect("set a read timeout");
        let r = c
            .try_read_response_after(&get(CARD, &[]))
            .unwrap_or_else(|e| {
                panic!(
                    "[{}] {after}: expected a well-behaved client's card GET over {via:?} to be \
                     answered: {e}",
                    d.driver
                )
            });
        assert_eq!(
            r.status,
            200,
            "[{}] {after}: expected the card over {via:?}, got {} {:?}",
            d.driver,
            r.status,
            r.body_text()
        );
        let r = c
            .try_read_response_after(&rpc_request(
                "\"probe\"",
                "GetTask",
                &json!({ "id": UNKNOWN_TASK }),
            ))
            .unwrap_or_else(|e| {
                panic!(
                    "[{}] {after}: expected a GetTask over {via:?} to be answered: {e}",
                    d.driver
                )
            });
        assert_json_200(&r, "the probe GetTask");
        let doc = r.json();
        assert_eq!(
            (doc["error"]["code"].as_i64(), &doc["id"]),
            (Some(-32001), &json!("probe")),
            "[{}] {after}: expected GetTask of an unknown task to answer -32001: {doc}",
            d.driver
        );
        let took = t.elapsed();
        assert!(
            took < PROMPT,
            "[{}] {after}: expected a well-behaved client over {via:?} served within {PROMPT:?}, \
             took {took:?}",
            d.driver
        );
    }
}

trait SendRead {
    fn try_read_response_after(&mut self, req: &[u8]) -> io::Result<Response>;
}

impl<S: Read + Write> SendRead for Client<S> {
    fn try_read_response_after(&mut self, req: &[u8]) -> io::Result<Response> {
        self.stream.write_all(req)?;
        self.try_read_response(false)
    }
}

/// Asserts the RSS growth since `base` stays under `bound_mib` and says what it was.
fn assert_rss_within(d: &Daemon, case: &str, base: u64, bound_mib: u64, when: &str) -> u64 {
    let now = rss_kib(d);
    let grew = now.saturating_sub(base);
    note(
        &d.driver,
        case,
        format!("RSS {when}: {now} KiB (base {base} KiB, +{grew} KiB; bound +{bound_mib} MiB)"),
    );
    assert!(
        grew < bound_mib * MIB,
        "[{}] {case}: expected the daemon's RSS {when} within +{bound_mib} MiB of {base} KiB, \
         it is {now} KiB (+{} MiB)",
        d.driver,
        grew / MIB
    );
    now
}

/// Asserts a refusal that closes: `status`, `connection: close`, then EOF and nothing more.
fn assert_refused_and_closed<S: Transport>(
    c: &mut Client<S>,
    r: &Response,
    status: u16,
    what: &str,
) {
    assert_eq!(
        r.status,
        status,
        "expected {what} to be refused with {status}, got {} {:?}",
        r.status,
        r.body_text()
    );
    assert!(
        r.says_close(),
        "expected `connection: close` on the {status} to {what}: {:?}",
        r.headers
    );
    c.try_expect_eof(Duration::from_secs(3))
        .unwrap_or_else(|e| {
            panic!("expected the connection closed after the {status} to {what}: {e}")
        });
}

/// Reads whatever arrives until EOF (or a reset) or `quiet` without a byte. Returns the bytes
/// and whether the peer closed.
fn drain<S: Read>(
    s: &mut S,
    quiet: Duration,
    set_timeout: impl Fn(&S, Duration),
) -> (Vec<u8>, bool) {
    set_timeout(s, quiet);
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                ) =>
            {
                return (out, true)
            }
            Err(_) => return (out, false),
        }
    }
}

fn tcp_timeout(s: &TcpStream, d: Duration) {
    s.set_read_timeout(Some(d)).unwrap();
}

/// A POST head to `/` with the JSON-RPC headers and `extra` lines, without a body.
fn rpc_head(extra: &[&str]) -> Vec<u8> {
    let mut s = String::from(
        "POST / HTTP/1.1\r\nHost: agentd.test\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n",
    );
    for h in extra {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// Sends a JSON-RPC body and returns the parsed answer (HTTP 200, application/json), and
/// checks the connection stays usable (JSON-RPC refusals keep it).
fn rpc_raw<S: Transport>(c: &mut Client<S>, body: &[u8], what: &str) -> (Response, Value) {
    let r = c.request(&post(&RPC_HEADERS, body));
    assert_json_200(&r, what);
    assert!(
        !r.says_close(),
        "expected a JSON-RPC refusal of {what} to keep the connection: {:?}",
        r.headers
    );
    let doc = r.json();
    (r, doc)
}

fn assert_rpc_error(doc: &Value, code: i64, id: &Value, what: &str) {
    assert_eq!(
        doc["error"]["code"].as_i64(),
        Some(code),
        "expected {what} to be refused with {code}, got {doc}"
    );
    assert_eq!(
        &doc["id"], id,
        "expected {what} answered with id {id}: {doc}"
    );
    assert!(
        doc.get("result").is_none(),
        "no result beside an error: {doc}"
    );
}

// ---------------------------------------------------------------------------------------
// 1. Ten thousand connections opened, held idle, abandoned
// ---------------------------------------------------------------------------------------

/// Connections opened per batch; the next batch waits until the daemon accepted this one,
/// so the listen backlog (128 with std's `TcpListener::bind`) never overflows into SYN
/// retransmits (1 s each).
const BATCH: usize = 100;

/// Opens `n` idle connections (every 10th over the unix socket), batch by batch, each batch
/// accepted (its descriptor held by the daemon) before the next.
fn open_idle(d: &Daemon, n: usize, base_fds: usize) -> (Vec<TcpStream>, Vec<UnixStream>) {
    let mut tcp = Vec::with_capacity(n);
    let mut unix = Vec::with_capacity(n / 10 + 1);
    let mut opened = 0;
    while opened < n {
        let batch = BATCH.min(n - opened);
        for i in opened..opened + batch {
            if i % 10 == 9 {
                unix.push(UnixStream::connect(&d.unix).unwrap_or_else(|e| {
                    panic!(
                        "[{}] expected idle unix connection {i} to open: {e}",
                        d.driver
                    )
                }));
            } else {
                tcp.push(TcpStream::connect(d.tcp).unwrap_or_else(|e| {
                    panic!(
                        "[{}] expected idle TCP connection {i} to open: {e}",
                        d.driver
                    )
                }));
            }
        }
        opened += batch;
        wait_until(
            Duration::from_secs(10),
            &format!(
                "[{}] the daemon to accept {opened} idle connections",
                d.driver
            ),
            || fd_count(d) >= base_fds + opened,
        );
    }
    (tcp, unix)
}

/// The soft `RLIMIT_NOFILE` of this process (what `ulimit -n` says; the daemon inherits it).
fn nofile_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// What one held idle connection may cost the daemon's RSS, KiB. smol holds no read buffer
/// while a connection waits (measured: about 4.2 KiB each for 10,000), so 8 KiB fails if a
/// per-connection buffer (16 KiB) comes back. The std driver gives each connection a thread:
/// its touched stack, its read buffer and the thread's bookkeeping (measured: about 41 KiB
/// each). Kernel socket buffers are not RSS.
fn per_conn_kib(driver: &str) -> u64 {
    match driver {
        "std" => 48,
        _ => 8,
    }
}
/// Allocator and runtime slack on top of the per-connection cost.
const SLACK_MIB: u64 = 16;

fn ten_thousand_abandoned_connections(driver: &str) {
    let _alone = flood_alone();
    const CASE: &str = "10k abandoned connections";
    // Both ends hold one descriptor per connection: this process for the client side, the
    // daemon (same limit, inherited) for the server side. Keep 200 spare for everything
    // else (listeners, probes, the test harness).
    let limit = nofile_limit();
    let n = 10_000usize.min(limit.saturating_sub(200) as usize);
    assert!(
        n >= 1000,
        "RLIMIT_NOFILE {limit} is too small for this case"
    );
    // smol's default max_connections is 10,000 and std's 1,024: raise it so every one of
    // the n connections is admitted (the default limit is its own case below). The std
    // driver gives each admitted connection a thread (2 MiB of stack reserved, a few KiB
    // touched): 10,000 threads start on this 2-CPU machine in 1.5-3.5 s, well within the
    // ~20 s budget, so both drivers take all n (no reduced count for std).
    let mut d = Daemon::start_with(driver, "max_connections = 20000");
    let base_fds = fd_count(&d);
    assert_served(&mut d, "start-up");
    wait_fds_back(&d, base_fds, Duration::from_secs(3), "the probes to close");
    let base_rss = rss_kib(&d);
    let per_conn = per_conn_kib(driver);
    let bound_mib = (n as u64 * per_conn).div_ceil(MIB) + SLACK_MIB;

    // Waves of n: the first shows the cost of n held connections and that every one is
    // closed once abandoned; the later ones, that the memory freed is reused rather than
    // kept per closed connection. Once each wave's memory is given back (below), the peaks
    // wobble by less than 4 MiB from wave to wave (measured, both drivers; when std kept
    // its threads' memory in several malloc arenas, its second wave grew 52-73 MiB). A
    // leak of 1 KiB per closed connection would add a steady 10 MiB a wave, 20 MiB over the
    // last two: the check is that those grow by less than 8 MiB.
    // HOSTILE_WAVES=n runs more.
    let waves: usize = std::env::var("HOSTILE_WAVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .max(4);
    let mut peak = Vec::with_capacity(waves);
    for wave in 0..waves {
        let t = Instant::now();
        let (tcp, unix) = open_idle(&d, n, base_fds);
        let opened_in = t.elapsed();
        let threads = proc_status(d.pid(), "Threads");
        note(
            driver,
            CASE,
            format!(
                "wave {wave}: RLIMIT_NOFILE {limit}; {n} idle connections ({} tcp, {} unix) \
                 accepted in {opened_in:?}; daemon fds {}, threads {threads}",
                tcp.len(),
                unix.len(),
                fd_count(&d)
            ),
        );
        assert!(
            opened_in < Duration::from_secs(25),
            "[{driver}] expected {n} connections accepted within 25 s, took {opened_in:?}"
        );
        // Served beside them: they hold slots, not the daemon.
        assert_served(
            &mut d,
            &format!("wave {wave}: with {n} idle connections held"),
        );
        peak.push(assert_rss_within(
            &d,
            CASE,
            base_rss,
            bound_mib,
            &format!("wave {wave}: with {n} held ({per_conn} KiB each + {SLACK_MIB} MiB)"),
        ));

        // Abandon them all at once: every close must be noticed and its slot freed.
        let t = Instant::now();
        drop((tcp, unix));
        wait_fds_back(
            &d,
            base_fds,
            Duration::from_secs(20),
            &format!("[{driver}] the daemon to close {n} abandoned connections"),
        );
        note(
            driver,
            CASE,
            format!(
                "wave {wave}: all {n} closed by the daemon {:?} after the drop began",
                t.elapsed()
            ),
        );
        if driver == "std" {
            // The descriptor closes before its thread returns: give the threads time to end.
            wait_until(
                Duration::from_secs(20),
                "[std] the connection threads to end after the drop",
                || proc_status(d.pid(), "Threads") < 32,
            );
        }
        assert_served(&mut d, &format!("wave {wave}: {n} connections abandoned"));
        assert_rss_within(
            &d,
            CASE,
            base_rss,
            bound_mib,
            &format!("wave {wave}: after they were abandoned"),
        );
        // And the memory comes back by itself, the daemon idle: it trims its allocator once
        // the connections fell far below their peak, and again as the burst's threads end
        // (`agentd::memory`, sampled every second). No request helps it along: when the std
        // driver's threads used several malloc arenas, the others' free tops came back only
        // when a later connection's thread happened to free a large block in them (a card
        // GET a second once hid that; CI then saw +44 MiB stay for 30 s). On a loaded 2-core
        // machine std's last threads take seconds to exit and the trimmer's own sleeps
        // stretch, so the window is 30 s.
        let back = Duration::from_secs(30);
        let back_mib = rss_back_mib(driver);
        let took = wait_until(
            back,
            &format!(
                "[{driver}] wave {wave}: the daemon's RSS back within {back_mib} MiB of \
                 its {base_rss} KiB at rest once {n} connections closed"
            ),
            || rss_kib(&d) <= base_rss + back_mib * MIB,
        );
        note(
            driver,
            CASE,
            format!(
                "wave {wave}: RSS back to {} KiB (base {base_rss} KiB) {took:?} after the \
                 connection threads ended",
                rss_kib(&d)
            ),
        );
    }
    let steps: Vec<i64> = peak.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
    note(
        driver,
        CASE,
        format!("peak RSS change from wave to wave, KiB: {steps:?}"),
    );
    let last_two = peak[waves - 1] as i64 - peak[waves - 3] as i64;
    assert!(
        last_two < 8 * MIB as i64,
        "[{driver}] expected waves {} and {} of {n} connections to reuse the memory of the \
         waves before, their peak RSS grew another {last_two} KiB (peaks {peak:?} KiB)",
        waves - 2,
        waves - 1
    );
}

/// How close to its RSS at rest the daemon must come back once a wave of connections has
/// closed (the allocator's free pages given back, `agentd::memory`), MiB. Measured: std
/// within 1 MiB every wave (a mutant std on four malloc arenas stays 9-45 MiB up, and fails
/// 8 MiB); smol within 1.3 MiB but now and then 6-7.7 MiB, what an arena of a thread that
/// has since ended keeps.
fn rss_back_mib(driver: &str) -> u64 {
    match driver {
        "std" => 8,
        _ => 16,
    }
}

/// A burst of connects, back to back, none waiting for the one before to be accepted: the
/// listen backlog (`limits.listen_backlog`, 4096 by default) queues them all, so none
/// waits for a SYN retransmit (1 s: with std's backlog of 128, ~470 of 600 did). Each TCP
/// connect must complete within 900 ms; the unix ones are made non-blocking, where a full
/// queue would answer EAGAIN. The machine-wide `ListenOverflows` counter is reported, not
/// asserted (other processes' listeners count there too).
fn a_burst_of_connects_is_queued_not_dropped(driver: &str) {
    let _alone = flood_alone();
    const CASE: &str = "connect burst";
    const TCP: usize = 600;
    const UNIX: usize = 200;
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096);
    if somaxconn < TCP {
        note(
            driver,
            CASE,
            format!("net.core.somaxconn {somaxconn} < {TCP}: skipped"),
        );
        return;
    }
    let mut d = Daemon::start_with(driver, "max_connections = 2000");
    let base_fds = fd_count(&d);
    assert_served(&mut d, "start-up");
    wait_fds_back(&d, base_fds, Duration::from_secs(3), "the probes to close");
    let overflows = listen_overflows();
    let t = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut tcp = Vec::with_capacity(TCP);
    for i in 0..TCP {
        let c = Instant::now();
        tcp.push(
            TcpStream::connect_timeout(&d.tcp, Duration::from_millis(900)).unwrap_or_else(|e| {
                panic!("[{driver}] expected connect {i} of a burst of {TCP} to be queued: {e}")
            }),
        );
        slowest = slowest.max(c.elapsed());
    }
    let addr = rustix::net::SocketAddrUnix::new(&d.unix).unwrap();
    let mut unix = Vec::with_capacity(UNIX);
    for i in 0..UNIX {
        let s = rustix::net::socket_with(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::NONBLOCK,
            None,
        )
        .unwrap();
        rustix::net::connect(&s, &addr).unwrap_or_else(|e| {
            panic!("[{driver}] expected unix connect {i} of a burst of {UNIX} to be queued: {e}")
        });
        unix.push(s);
    }
    let connected = t.elapsed();
    let accepted = wait_until(
        Duration::from_secs(20),
        &format!(
            "[{driver}] the daemon to accept a burst of {} connects",
            TCP + UNIX
        ),
        || fd_count(&d) >= base_fds + TCP + UNIX,
    );
    note(
        driver,
        CASE,
        format!(
            "{TCP} tcp + {UNIX} unix connects in {connected:?} (slowest tcp {slowest:?}), all \
             accepted {accepted:?} later; ListenOverflows +{} (machine-wide)",
            listen_overflows().saturating_sub(overflows)
        ),
    );
    drop((tcp, unix));
    wait_fds_back(
        &d,
        base_fds,
        Duration::from_secs(20),
        &format!("[{driver}] the daemon to close the burst's connections"),
    );
    assert_served(&mut d, "a burst of connects");
}

/// The kernel's `TcpExt: ListenOverflows` counter (machine-wide) from `/proc/net/netstat`.
fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter(|p| p.len() == 2 && p[0].starts_with("TcpExt:"))
        .find_map(|p| {
            let at = p[0]
                .split_whitespace()
                .position(|k| k == "ListenOverflows")?;
            p[1].split_whitespace().nth(at)?.parse().ok()
        })
        .unwrap_or(0)
}

/// The default `max_connections` (std: 1,024 — a thread per connection is std's design —
/// and smol: 10,000): with that many held, a newcomer on either listener gets
/// `HTTP/1.1 503 Service Unavailable` with `retry-after: 1` unasked, and is closed; once the
/// holders leave, service resumes.
fn default_connection_limit_answers_503(driver: &str) {
    let _alone = flood_alone();
    const CASE: &str = "default max_connections";
    let default_limit = match driver {
        "std" => 1024,
        _ => 10_000,
    };
    let limit = nofile_limit();
    if (default_limit + 200) as u64 > limit {
        note(
            driver,
            CASE,
            format!("skipped: RLIMIT_NOFILE {limit} below {default_limit} + 200"),
        );
        return;
    }
    let mut d = Daemon::start(driver);
    let base_fds = fd_count(&d);
    assert_served(&mut d, "start-up");
    wait_fds_back(&d, base_fds, Duration::from_secs(3), "the probes to close");
    let base_rss = rss_kib(&d);
    let t = Instant::now();
    let held = open_idle(&d, default_limit, base_fds);
    note(
        driver,
        CASE,
        format!("{default_limit} connections held after {:?}", t.elapsed()),
    );
    for via in Via::ALL {
        let mut extra = d.connect(via);
        let t = Instant::now();
        let r = extra.try_read_response(false).unwrap_or_else(|e| {
            panic!(
                "[{driver}] expected connection {} over {via:?} (past the default \
                 max_connections {default_limit}) to be answered 503 unasked: {e}",
                default_limit + 1
            )
        });
        assert!(
            t.elapsed() < PROMPT,
            "expected the 503 at once, took {:?}",
            t.elapsed()
        );
        assert_eq!(
            r.status, 503,
            "[{driver}] past the limit over {via:?}: {r:?}"
        );
        assert_eq!(r.reason, "Service Unavailable");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.header("content-length"), Some("0"));
        assert_refused_and_closed(
            &mut extra,
            &r,
            503,
            &format!("a connection past the limit over {via:?}"),
        );
    }
    d.assert_alive();
    let bound_mib = (default_limit as u64 * per_conn_kib(driver)).div_ceil(MIB) + SLACK_MIB;
    assert_rss_within(
        &d,
        CASE,
        base_rss,
        bound_mib,
        &format!("with {default_limit} held"),
    );
    drop(held);
    wait_fds_back(
        &d,
        base_fds,
        Duration::from_secs(20),
        "the held connections to close",
    );
    assert_served(&mut d, "the connection limit was reached and released");
}

// ---------------------------------------------------------------------------------------
// 2. Bodies over max_body_bytes
// ---------------------------------------------------------------------------------------

fn oversized_bodies_are_refused_with_413(driver: &str) {
    const CASE: &str = "oversized bodies";
    let mut d = Daemon::start(driver);
    assert_served(&mut d, "start-up");
    let base_rss = rss_kib(&d);
    for via in Via::ALL {
        // Content-Length one past the default 2 MiB: refused from the head alone; not one
        // body byte is sent.
        for (what, cl, extra) in [
            (
                "Content-Length max_body_bytes + 1",
                (MAX_BODY + 1).to_string(),
                None,
            ),
            (
                "Content-Length 10^18",
                "1000000000000000000".to_owned(),
                None,
            ),
            (
                "Content-Length max_body_bytes + 1 with Expect: 100-continue",
                (MAX_BODY + 1).to_string(),
                Some("Expect: 100-continue"),
            ),
        ] {
            let what = format!("{what} over {via:?}");
            let mut c = d.connect(via);
            let cl_line = format!("Content-Length: {cl}");
            let mut lines = vec![cl_line.as_str()];
            lines.extend(extra);
            let t = Instant::now();
            // A 100 Continue would come back as its own response: the first must be the 413.
            let r = c.request(&rpc_head(&lines));
            assert!(t.elapsed() < PROMPT, "expected the 413 to {what} at once");
            assert_eq!(r.body_text(), "request body too large\n", "{what}");
            assert_refused_and_closed(&mut c, &r, 413, &what);
        }

        // Chunked: exactly 2 MiB in 32 chunks of 64 KiB is within the limit; the next
        // chunk-size line (1 byte more) is over it: 413 before that chunk's data.
        let what = format!("a chunked body growing past 2 MiB over {via:?}");
        let mut c = d.connect(via);
        let mut req = rpc_head(&["Transfer-Encoding: chunked"]);
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..(MAX_BODY / chunk.len()) {
            req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            req.extend_from_slice(&chunk);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"1\r\n");
        let r = c.request(&req);
        assert_eq!(r.body_text(), "request body too large\n", "{what}");
        assert_refused_and_closed(&mut c, &r, 413, &what);

        // One chunk that alone is over the limit: refused from its size line.
        let what = format!("a single chunk of max_body_bytes + 1 over {via:?}");
        let mut c = d.connect(via);
        let mut req = rpc_head(&["Transfer-Encoding: chunked"]);
        req.extend_from_slice(format!("{:x}\r\n", MAX_BODY + 1).as_bytes());
        let r = c.request(&req);
        assert_refused_and_closed(&mut c, &r, 413, &what);

        // The bound is inclusive: exactly 2 MiB (a ListTasks padded with spaces) is served.
        let mut c = d.connect(via);
        let mut body = rpc_body("\"max\"", "ListTasks", &json!({ "pageSize": 1 }));
        body.resize(MAX_BODY, b' ');
        let r = c.request(&post(&RPC_HEADERS, &body));
        assert_json_200(&r, "a body of exactly 2 MiB");
        assert!(r.json().get("result").is_some(), "{:?}", r.body_text());
    }
    assert_served(&mut d, "oversized bodies");
    // A 2 MiB body is buffered whole once (plus its chunked framing): a few times 2 MiB.
    assert_rss_within(&d, CASE, base_rss, 32, "after the oversized bodies");
}

// ---------------------------------------------------------------------------------------
// 3. JSON nested 100,000 deep
// ---------------------------------------------------------------------------------------

fn deeply_nested_json_is_refused(driver: &str) {
    const CASE: &str = "deep JSON";
    const DEPTH: usize = 100_000;
    let mut d = Daemon::start(driver);
    assert_served(&mut d, "start-up");
    let base_rss = rss_kib(&d);
    let open = "[".repeat(DEPTH);
    let close = "]".repeat(DEPTH);
    let deep = format!("{open}{close}");
    let deep_obj = format!("{}1{}", "{\"a\":".repeat(DEPTH), "}".repeat(DEPTH));
    for via in Via::ALL {
        let mut c = d.connect(via);
        let t = Instant::now();
        // The envelope itself 100,000 arrays deep: a top-level array is a batch, whose
        // elements the envelope visitor skips as `IgnoredAny` (serde_json skips iteratively,
        // so no recursion and no depth limit): -32600, id null ("batch requests are not
        // supported").
        let (_, doc) = rpc_raw(&mut c, deep.as_bytes(), "a body of 100,000 nested arrays");
        assert_rpc_error(
            &doc,
            -32600,
            &Value::Null,
            "a body of 100,000 nested arrays",
        );
        // 100,000 nested objects under an unknown member: skipped the same way; the request
        // then lacks an id: -32600, id null.
        let body = format!(r#"{{"jsonrpc":"2.0","method":"GetTask","x":{deep_obj}}}"#);
        let (_, doc) = rpc_raw(
            &mut c,
            body.as_bytes(),
            "an unknown member 100,000 objects deep",
        );
        assert_rpc_error(
            &doc,
            -32600,
            &Value::Null,
            "an unknown member 100,000 objects deep",
        );
        // Unterminated: the skip runs into the end of the body: not JSON, -32700, id null.
        let (_, doc) = rpc_raw(&mut c, open.as_bytes(), "100,000 unclosed `[`");
        assert_rpc_error(&doc, -32700, &Value::Null, "100,000 unclosed `[`");

        // Deep params: the envelope skips `params` as a raw value (iteratively, no depth
        // limit), so the id is known. What happens next depends on where the depth is:
        // - under a member the method's request type does not have: skipped the same way,
        //   and the request is served as if it were not there;
        // - in a typed field (a string, a `Struct`): the typed read fails, on the type or
        //   on serde_json's recursion limit (128): -32602 with the id echoed.
        // `None`: answered with a result; `Some(code)`: refused with that code.
        let text_part = r#"[{"text":"x"}]"#;
        for (method, params, code, what) in [
            (
                "GetTask",
                format!(r#"{{"id":"{UNKNOWN_TASK}","extra":{deep}}}"#),
                Some(-32001),
                "GetTask with an unknown member 100,000 arrays deep",
            ),
            (
                "ListTasks",
                format!(r#"{{"pageSize":1,"extra":{deep_obj}}}"#),
                None,
                "ListTasks with an unknown member 100,000 objects deep",
            ),
            (
                "GetTask",
                format!(r#"{{"id":{deep}}}"#),
                Some(-32602),
                "GetTask whose id is 100,000 arrays deep",
            ),
            (
                "SendMessage",
                format!(
                    r#"{{"message":{{"messageId":"deep1","role":"ROLE_USER","parts":{text_part},"metadata":{{"k":{deep}}}}}}}"#
                ),
                Some(-32602),
                "SendMessage with message metadata 100,000 arrays deep",
            ),
            (
                "SendMessage",
                format!(
                    r#"{{"message":{{"messageId":"deep2","role":"ROLE_USER","parts":[{{"data":{deep_obj}}}]}}}}"#
                ),
                Some(-32602),
                "SendMessage with a data part 100,000 objects deep",
            ),
        ] {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":"deep","method":"{method}","params":{params}}}"#);
            let (_, doc) = rpc_raw(&mut c, body.as_bytes(), what);
            match code {
                Some(code) => assert_rpc_error(&doc, code, &json!("deep"), what),
                None => {
                    assert_eq!(doc["id"], "deep", "{what}: {doc}");
                    assert!(doc["result"].is_object(), "expected {what} served: {doc}");
                }
            }
        }
        // Params that are a deep array: not an object, refused before any parsing.
        let body = format!(r#"{{"jsonrpc":"2.0","id":9,"method":"GetTask","params":{deep}}}"#);
        let (_, doc) = rpc_raw(&mut c, body.as_bytes(), "params that are a deep array");
        assert_rpc_error(&doc, -32602, &json!(9), "params that are a deep array");
        // A deep id: skipped raw, then refused as neither string nor number (id null).
        let body = format!(r#"{{"jsonrpc":"2.0","id":{deep},"method":"GetTask"}}"#);
        let (_, doc) = rpc_raw(&mut c, body.as_bytes(), "an id that is a deep array");
        assert_rpc_error(&doc, -32600, &Value::Null, "an id that is a deep array");
        // The same connection still works.
        assert_eq!(c.get_card().status, 200);
        note(
            driver,
            CASE,
            format!("{via:?}: 10 deep documents answered in {:?}", t.elapsed()),
        );
    }
    assert_served(&mut d, "deeply nested JSON");
    assert_rss_within(&d, CASE, base_rss, 32, "after the deep documents");
}

// ---------------------------------------------------------------------------------------
// 4. Bytes that are not UTF-8
// ---------------------------------------------------------------------------------------

fn invalid_utf8_is_a_parse_error(driver: &str) {
    let mut d = Daemon::start(driver);
    let cases: [(&str, &[u8]); 5] = [
        (
            "0xFF in the id string",
            b"{\"jsonrpc\":\"2.0\",\"id\":\"a\xffb\",\"method\":\"GetTask\",\"params\":{\"id\":\"x\"}}",
        ),
        (
            "0xFF in a params string",
            b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"GetTask\",\"params\":{\"id\":\"\xff\"}}",
        ),
        (
            "0xFF in the method string",
            b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"Get\xffTask\",\"params\":{\"id\":\"x\"}}",
        ),
        (
            "0xFF in a member name",
            b"{\"jsonrpc\":\"2.0\",\"id\":4,\"\xff\":1,\"method\":\"GetTask\",\"params\":{\"id\":\"x\"}}",
        ),
        (
            "an overlong UTF-8 encoding (0xC0 0xAF) in a message text",
            b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"SendMessage\",\"params\":{\"message\":{\"messageId\":\"u\",\"role\":\"ROLE_USER\",\"parts\":[{\"text\":\"\xc0\xaf\"}]}}}",
        ),
    ];
    for via in Via::ALL {
        let mut c = d.connect(via);
        for (what, body) in cases {
            let what = format!("{what} over {via:?}");
            let (_, doc) = rpc_raw(&mut c, body, &what);
            // Not UTF-8 is not JSON: -32700, and no id could be trusted.
            assert_rpc_error(&doc, -32700, &Value::Null, &what);
        }
        assert_eq!(c.get_card().status, 200);
    }
    assert_served(&mut d, "invalid UTF-8");
}

/// Known bug. `jsonrpc::parse_request` skips envelope members it does not know with
/// `IgnoredAny`, and serde_json's `SliceRead::ignore_str` skips a string without checking its
/// bytes are UTF-8 (only strings it returns, or buffers as a `RawValue`, are checked). So a
/// body that is not UTF-8, hence not JSON (RFC 8259 §8.1), is served as a request when its
/// bad bytes sit in such a member, e.g. (GetTask answers -32001 where -32700 is due):
///
/// ```text
/// {"jsonrpc":"2.0","id":4,"method":"GetTask","params":{"id":"x"},"x":"<0xFF>"}
/// ```
///
/// The same byte anywhere else (the id, the method, a member name, inside params) is -32700.
fn invalid_utf8_in_an_ignored_member_is_a_parse_error(driver: &str) {
    let mut d = Daemon::start(driver);
    let cases: [(&str, &[u8]); 2] = [
        (
            "0xFF in the string value of an unknown envelope member",
            b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"GetTask\",\"params\":{\"id\":\"x\"},\"x\":\"\xff\"}",
        ),
        (
            "0xFF 0xFE in an array under an unknown envelope member",
            b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ListTasks\",\"x\":[\"\xff\xfe\"]}",
        ),
    ];
    for via in Via::ALL {
        let mut c = d.connect(via);
        for (what, body) in cases {
            let what = format!("{what} over {via:?}");
            let (_, doc) = rpc_raw(&mut c, body, &what);
            assert_rpc_error(&doc, -32700, &Value::Null, &what);
        }
    }
    assert_served(&mut d, "invalid UTF-8 in an ignored member");
}

// ---------------------------------------------------------------------------------------
// 5. Duplicate members of the envelope
// ---------------------------------------------------------------------------------------

fn duplicate_envelope_members_are_refused(driver: &str) {
    let mut d = Daemon::start(driver);
    let cases: [(&str, &str); 5] = [
        (
            "\"id\":1,\"id\":2",
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"GetTask","params":{"id":"x"}}"#,
        ),
        (
            "the same id twice",
            r#"{"jsonrpc":"2.0","id":"s","method":"GetTask","id":"s","params":{"id":"x"}}"#,
        ),
        (
            "two methods (the second would win elsewhere)",
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","method":"CancelTask","params":{"id":"x"}}"#,
        ),
        (
            "two params",
            r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"},"params":{"id":"y"}}"#,
        ),
        (
            "two jsonrpc members",
            r#"{"jsonrpc":"1.0","jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#,
        ),
    ];
    for via in Via::ALL {
        let mut c = d.connect(via);
        for (what, body) in cases {
            let what = format!("{what} over {via:?}");
            let (_, doc) = rpc_raw(&mut c, body.as_bytes(), &what);
            // The envelope visitor refuses a repeated member instead of letting one win:
            // -32600, id null (which id would it be?).
            assert_rpc_error(&doc, -32600, &Value::Null, &what);
            assert!(
                doc["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("duplicate member")),
                "expected the message to name the duplicate: {doc}"
            );
        }
        assert_eq!(c.get_card().status, 200);
    }
    assert_served(&mut d, "duplicate envelope members");
}

// ---------------------------------------------------------------------------------------
// 6. Ids of 100 KB (and one near the body limit)
// ---------------------------------------------------------------------------------------

fn huge_ids_are_echoed_byte_for_byte(driver: &str) {
    const CASE: &str = "huge ids";
    let mut d = Daemon::start(driver);
    let base_rss = rss_kib(&d);
    let numeric = format!("9{}", "8".repeat(100 * 1024 - 1));
    let negative_exp = format!("-1.{}e-{}", "5".repeat(50 * 1024), "7".repeat(50 * 1024));
    let string = format!("\"{}\"", "\\u0041b\\n\\\"é".repeat(100 * 1024 / 14));
    // Near the limit: the whole body just under 2 MiB.
    let near = format!("\"{}\"", "z".repeat(MAX_BODY - 200));
    let ids = [
        ("a 100 KB number", numeric.as_str()),
        (
            "a 100 KB negative number with a 50 KB exponent",
            negative_exp.as_str(),
        ),
        ("a 100 KB string of escapes", string.as_str()),
        ("a string id making the body ~2 MiB", near.as_str()),
    ];
    for via in Via::ALL {
        let mut c = d.connect(via);
        for (what, id) in ids {
            let what = format!("{what} ({} bytes) over {via:?}", id.len());
            for (method, params, ok) in [
                ("GetTask", json!({ "id": UNKNOWN_TASK }), false),
                ("ListTasks", json!({ "pageSize": 1 }), true),
            ] {
                let req = rpc_request(id, method, &params);
                assert!(
                    req.len() < MAX_BODY + 1024,
                    "the request fits the body limit"
                );
                let r = c.request(&req);
                assert_json_200(&r, &what);
                let raw = &r.body;
                // Exactly the bytes sent, as the id member.
                let needle = format!("\"id\":{id},");
                let at = find(raw, needle.as_bytes());
                assert!(
                    at.is_some(),
                    "[{driver}] expected {what} echoed byte for byte in the answer to {method} \
                     ({} bytes back, starting {:?})",
                    raw.len(),
                    String::from_utf8_lossy(&raw[..raw.len().min(120)])
                );
                // (Not parsed as a serde_json::Value: a 100 KB number is out of its range.)
                let member = if ok { "\"result\":" } else { "\"error\":" };
                assert!(
                    find(raw, member.as_bytes()).is_some(),
                    "expected {member} in the answer to {method}: {:.300}",
                    r.body_text()
                );
            }
        }
        // And on every event of a stream.
        let id = string.as_str();
        let r = c.request(&rpc_request(
            id,
            "SendStreamingMessage",
            &text_message(&common::fresh_id(), "x"),
        ));
        assert_eq!(r.status, 200);
        let needle = format!("\"id\":{id},");
        let n = count(&r.body, needle.as_bytes());
        assert_eq!(
            n, 2,
            "[{driver}] expected the 100 KB id on both SSE events over {via:?}"
        );
    }
    assert_served(&mut d, "huge ids");
    assert_rss_within(&d, CASE, base_rss, 32, "after the huge ids");
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    let mut n = 0;
    let mut rest = hay;
    while let Some(i) = find(rest, needle) {
        n += 1;
        rest = &rest[i + needle.len()..];
    }
    n
}

// ---------------------------------------------------------------------------------------
// 7. 50,000 pipelined requests from a client that never reads
// ---------------------------------------------------------------------------------------

fn pipelined_flood_that_never_reads_is_dropped(driver: &str) {
    const CASE: &str = "never-reading flood";
    const N: usize = 50_000;
    const WRITE_TIMEOUT_MS: u64 = 1000;
    let mut d = Daemon::start_with(driver, &format!("write_timeout_ms = {WRITE_TIMEOUT_MS}"));
    let base_fds = fd_count(&d);
    assert_served(&mut d, "start-up");
    wait_fds_back(&d, base_fds, Duration::from_secs(3), "the probes to close");
    let base_rss = rss_kib(&d);

    let req = rpc_request("1", "GetTask", &json!({ "id": UNKNOWN_TASK }));
    let flood = req.repeat(N);
    let total = flood.len();
    let c = d.connect_tcp();
    // A small send buffer on our side (the kernel doubles it to 64 KiB), so how much of the
    // flood is taken before the stall measures the daemon, not loopback autotuning (which
    // let this socket alone hold up to 4 MiB). The receive side keeps its defaults.
    rustix::net::sockopt::set_socket_send_buffer_size(&c.stream, 32 * 1024).expect("SO_SNDBUF");
    let mut w = c.stream.try_clone().unwrap();
    // Bounded: if the daemon neither reads nor drops us, the writer gives up after 15 s.
    w.set_write_timeout(Some(Duration::from_secs(15))).unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (wc, dc) = (written.clone(), done.clone());
    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut at = 0;
        let r = loop {
            if at == flood.len() {
                break Ok(());
            }
            let end = (at + 16 * 1024).min(flood.len());
            match w.write(&flood[at..end]) {
                Ok(n) => {
                    at += n;
                    wc.store(at, Ordering::SeqCst);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        dc.store(true, Ordering::SeqCst);
        r
    });

    // The stall: nothing more is accepted for 300 ms (the daemon stopped reading).
    let mut last = (0, Instant::now());
    wait_until(Duration::from_secs(10), "the flood to stall or end", || {
        let now = written.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        }
        done.load(Ordering::SeqCst) || last.1.elapsed() > Duration::from_millis(300)
    });
    let stalled_at = written.load(Ordering::SeqCst);
    let stalled_after = start.elapsed();
    let still_open = fd_count(&d) > base_fds;
    note(
        driver,
        CASE,
        format!(
            "writes stalled after {stalled_at} of {total} bytes (~{} of {N} requests) at \
             {stalled_after:?}; connection still held: {still_open}",
            stalled_at / req.len()
        ),
    );
    assert!(
        stalled_at < total,
        "[{driver}] expected the daemon to stop reading a client that never reads: all \
         {total} bytes were taken"
    );
    // Served meanwhile, while the flood's connection is stalled.
    assert_served(&mut d, "a flood stalled on its unread answers");
    // The daemon holds at most its input bound (one max-size request: ~2.1 MiB) and its
    // output bound (256 KiB) for the stalled connection.
    assert_rss_within(&d, CASE, base_rss, 32, "while the flood is stalled");

    // Dropped after write_timeout_ms of unread output: the writer sees the reset (or broken
    // pipe) and the daemon's descriptor goes.
    wait_fds_back(
        &d,
        base_fds,
        Duration::from_secs(10),
        &format!(
            "[{driver}] the stalled flood to be dropped after write_timeout_ms {WRITE_TIMEOUT_MS}"
        ),
    );
    let since_stall = start.elapsed() - stalled_after;
    let res = writer.join().unwrap();
    note(
        driver,
        CASE,
        format!(
            "dropped {:?} after the stall was seen ({:?} after the flood began); writer: {res:?}",
            since_stall,
            start.elapsed()
        ),
    );
    match &res {
        Err(e) => assert!(
            matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ),
            "[{driver}] expected the writer cut off by the drop (reset / broken pipe), got {e}"
        ),
        Ok(()) => panic!("[{driver}] the whole flood was written: no backpressure"),
    }
    // What reached us before the drop: a prefix of the answers, then the end.
    let mut s = c.stream;
    let (bytes, closed) = drain(&mut s, Duration::from_secs(2), tcp_timeout);
    let answers = count(&bytes, b"HTTP/1.1 200 OK\r\n");
    note(
        driver,
        CASE,
        format!(
            "{answers} answers ({} bytes) were readable after the drop",
            bytes.len()
        ),
    );
    assert!(closed, "[{driver}] expected the dropped connection closed");
    assert!(
        answers < N,
        "[{driver}] expected the daemon to have answered only a prefix, it answered all {N}"
    );
    assert_served(&mut d, "the never-reading flood was dropped");
    assert_rss_within(&d, CASE, base_rss, 32, "after the drop");
}

// ---------------------------------------------------------------------------------------
// 8. Half-closed mid-body
// ---------------------------------------------------------------------------------------

fn half_close_mid_body_closes_silently(driver: &str) {
    // A body deadline far beyond the waits below: a 408 would mean the EOF went unnoticed.
    let mut d = Daemon::start_with(driver, "body_timeout_ms = 10000");
    let body = rpc_body("1", "ListTasks", &json!({ "pageSize": 1 }));
    let half = body.len() / 2;
    for via in Via::ALL {
        // Content-Length body, half of it, then shutdown(Write). `Connection::handle_eof`
        // in the reading state sets `closing` with nothing to answer: the daemon closes at
        // once, without a 408 and without a byte.
        let mut c = d.connect(via);
        let mut req = rpc_head(&[&format!("Content-Length: {}", body.len())]);
        req.extend_from_slice(&body[..half]);
        c.send(&req);
        c.shutdown_write();
        let took = c
            .try_expect_eof(Duration::from_secs(3))
            .unwrap_or_else(|e| {
                panic!("[{driver}] half a Content-Length body then EOF over {via:?}: {e}")
            });
        assert!(took < PROMPT, "expected the close at once, took {took:?}");

        // Chunked, mid-chunk.
        let mut c = d.connect(via);
        let mut req = rpc_head(&["Transfer-Encoding: chunked"]);
        req.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        req.extend_from_slice(&body[..half]);
        c.send(&req);
        c.shutdown_write();
        c.try_expect_eof(Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("[{driver}] half a chunk then EOF over {via:?}: {e}"));

        // A complete request, then half of a second: the first is answered, the second
        // dropped silently.
        let mut c = d.connect(via);
        let mut req = post(&RPC_HEADERS, &body);
        req.extend(rpc_head(&[&format!("Content-Length: {}", body.len())]));
        req.extend_from_slice(&body[..half]);
        c.send(&req);
        c.shutdown_write();
        let r = c.read_response();
        assert_json_200(&r, "the complete request before half a body");
        assert_eq!(r.json()["id"], 1);
        c.try_expect_eof(Duration::from_secs(3))
            .unwrap_or_else(|e| {
                panic!("[{driver}] after answering the complete request over {via:?}: {e}")
            });
    }
    assert_served(&mut d, "half-closed bodies");
}

// ---------------------------------------------------------------------------------------
// 9. Smuggling-shaped framing not covered elsewhere
// ---------------------------------------------------------------------------------------

fn smuggling_shaped_framing_is_refused_and_closed(driver: &str) {
    let mut d = Daemon::start(driver);
    // Each followed by a smuggled card GET that must never be answered.
    let h = "POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n";
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            // Joined as "chunked,chunked": chunked applied twice is not a coding agentd
            // decodes (parser: anything but exactly `chunked` is 501).
            "Transfer-Encoding: chunked twice",
            format!("{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
                .into_bytes(),
            501,
        ),
        (
            "Transfer-Encoding: chunked, chunked",
            format!("{h}Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n").into_bytes(),
            501,
        ),
        (
            "Transfer-Encoding: xchunked",
            format!("{h}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n").into_bytes(),
            501,
        ),
        (
            "Transfer-Encoding: chunked then identity",
            format!(
                "{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n"
            )
            .into_bytes(),
            501,
        ),
        (
            "Content-Length: 1,2",
            format!("{h}Content-Length: 1,2\r\n\r\n{{}}").into_bytes(),
            400,
        ),
        (
            // httparse refuses whitespace between a field name and its colon.
            "a space before the colon of Content-Length",
            format!("{h}Content-Length : 2\r\n\r\n{{}}").into_bytes(),
            400,
        ),
        (
            "a space before the colon of Transfer-Encoding",
            format!("{h}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n").into_bytes(),
            400,
        ),
        (
            // LF-only line endings are read (RFC 9112 §2.2); the two lengths conflict.
            "an LF-only request with two different Content-Length",
            b"POST / HTTP/1.1\nHost: a\nContent-Type: application/json\nA2A-Version: 1.0\n\
Content-Length: 2\nContent-Length: 3\n\n{}"
                .to_vec(),
            400,
        ),
        (
            "an obs-fold continuation of Transfer-Encoding",
            format!("{h}Transfer-Encoding: identity\r\n chunked\r\n\r\n0\r\n\r\n").into_bytes(),
            400,
        ),
        (
            "a NUL in a header value",
            format!("{h}X-Smuggle: a\0b\r\nContent-Length: 2\r\n\r\n{{}}").into_bytes(),
            400,
        ),
    ];
    for via in Via::ALL {
        for (what, req, status) in &cases {
            let what = format!("{what} over {via:?}");
            let mut c = d.connect(via);
            let mut bytes = req.clone();
            bytes.extend(get(CARD, &[]));
            let r = c.request(&bytes);
            // Nothing after the refusal: the smuggled GET is never answered.
            assert_refused_and_closed(&mut c, &r, *status, &what);
        }
        // Identical Content-Length values, LF-only: allowed (RFC 9110 §8.6), and served.
        let mut c = d.connect(via);
        let body = rpc_body("\"lf\"", "ListTasks", &json!({}));
        let req = format!(
            "POST / HTTP/1.1\nHost: a\nContent-Type: application/json\nA2A-Version: 1.0\n\
Content-Length: {n}\nContent-Length: {n}\n\n",
            n = body.len()
        );
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(&body);
        let r = c.request(&bytes);
        assert_json_200(&r, "an LF-only request with two equal Content-Length");
        assert_eq!(r.json()["id"], "lf");
    }
    assert_served(&mut d, "smuggling-shaped framing");
}

// ---------------------------------------------------------------------------------------
// 10. An events subscriber that never reads
// ---------------------------------------------------------------------------------------

fn feed_request() -> Vec<u8> {
    let body = br#"{"jsonrpc":"2.0","id":7,"method":"agentd.events/SubscribeToEvents","params":{"fromSeq":0}}"#;
    let ext = format!("A2A-Extensions: {EVENTS_URI}");
    let mut headers = RPC_HEADERS.to_vec();
    headers.push(&ext);
    post(&headers, body)
}

/// `n` SendMessages pipelined on one unix connection (a writer thread, reads in order).
/// Each makes a task that goes SUBMITTED then REJECTED (no agent): two feed events.
fn create_tasks(d: &Daemon, n: usize) {
    let mut c = d.connect(Via::Unix);
    let mut bytes = Vec::new();
    for i in 0..n {
        bytes.extend(rpc_request(
            &i.to_string(),
            "SendMessage",
            &text_message(&format!("flood-{i}"), "hello"),
        ));
    }
    let mut w = c.clone_stream();
    let writer = std::thread::spawn(move || w.write_all(&bytes));
    for i in 0..n {
        let r = c.read_response();
        assert_eq!(r.status, 200, "SendMessage {i}");
        if i % 1000 == 0 {
            assert_eq!(r.json()["id"], i, "answers in order");
        }
    }
    writer.join().unwrap().expect("all SendMessages written");
}

/// Splits a raw HTTP/1.1 chunked response as far as it goes: the head, the de-chunked body,
/// and whether the last chunk arrived.
fn dechunk(raw: &[u8]) -> (String, Vec<u8>, bool) {
    let Some(end) = find(raw, b"\r\n\r\n") else {
        return (String::from_utf8_lossy(raw).into_owned(), Vec::new(), false);
    };
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut rest = &raw[end + 4..];
    let mut body = Vec::new();
    loop {
        let Some(nl) = find(rest, b"\r\n") else {
            return (head, body, false);
        };
        let Ok(size) = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap_or("x"), 16)
        else {
            return (head, body, false);
        };
        if size == 0 {
            return (head, body, true);
        }
        let data = &rest[nl + 2..];
        if data.len() < size {
            body.extend_from_slice(data);
            return (head, body, false);
        }
        body.extend_from_slice(&data[..size]);
        rest = data.get(size + 2..).unwrap_or(&[]);
    }
}

fn slow_event_subscriber_is_cut_off(driver: &str) {
    const CASE: &str = "never-reading event subscriber";
    const TASKS: usize = 5000;
    const WRITE_TIMEOUT_MS: u64 = 1000;
    let setup = Setup {
        limits: format!("write_timeout_ms = {WRITE_TIMEOUT_MS}"),
        // The default ring (1024 events) and stream deadline (10 min): the stream must end
        // because its reader fell behind, not by time.
        sections: "[a2a.events]\nenabled = true\n".into(),
        ..Setup::default()
    };
    let mut d = Daemon::start_setup(driver, &setup);
    let base_fds = fd_count(&d);
    assert_served(&mut d, "start-up");
    wait_fds_back(&d, base_fds, Duration::from_secs(3), "the probes to close");
    let base_rss = rss_kib(&d);

    // Subscribe from the start and never read. Over the unix socket: its buffering is the
    // sender's fixed send buffer (~208 KiB here), so the daemon's writes stall once that and
    // its own 256 KiB output bound are full, and stay stalled. Over loopback TCP the kernel
    // first absorbs up to tcp_wmem's maximum (4 MiB here) of the stream, and the receiving
    // kernel's queue collapsing and zero-window probes then let a few bytes through now and
    // then, each of which restarts write_timeout_ms (a timeout without progress, as nginx's
    // send_timeout): the drop comes, but seconds later and at no predictable time.
    let mut sub = d.connect_unix();
    sub.send(&feed_request());
    std::thread::sleep(Duration::from_millis(50));

    let t = Instant::now();
    create_tasks(&d, TASKS);
    let created_in = t.elapsed();
    note(
        driver,
        CASE,
        format!(
            "{TASKS} tasks ({} events) created in {created_in:?}",
            2 * TASKS
        ),
    );
    // Served while the subscriber is stalled (or already dropped).
    assert_served(&mut d, "a never-reading subscriber beside 5000 new tasks");
    // Dropped: its output went unread for write_timeout_ms.
    let dropped = wait_fds_back(
        &d,
        base_fds,
        Duration::from_secs(10),
        &format!("[{driver}] the never-reading subscriber to be dropped"),
    );
    note(
        driver,
        CASE,
        format!("subscriber's connection gone {dropped:?} after the tasks were in ({:?} after they began)", t.elapsed()),
    );
    let mut s = sub.stream;
    let (raw, closed) = drain(&mut s, Duration::from_secs(2), |s, d| {
        s.set_read_timeout(Some(d)).unwrap()
    });
    let (head, body, ended) = dechunk(&raw);
    assert!(
        head.starts_with("HTTP/1.1 200 OK"),
        "[{driver}] expected the feed's head: {head:?}"
    );
    let text = String::from_utf8_lossy(&body);
    let frames: Vec<Value> = text
        .split("\n\n")
        .filter_map(|block| {
            let data: String = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.trim_start())
                .collect();
            serde_json::from_str(&data).ok()
        })
        .collect();
    let hello = frames.first().map(|f| f["result"]["hello"].is_object());
    assert_eq!(hello, Some(true), "[{driver}] expected the hello first");
    let events = frames
        .iter()
        .filter(|f| f["result"]["event"].is_object())
        .count();
    let goodbyes = frames
        .iter()
        .filter(|f| f["result"]["goodbye"].is_object())
        .count();
    note(
        driver,
        CASE,
        format!(
            "the subscriber got {} bytes: hello + {events} of {} events, goodbye: {goodbyes}, \
             last chunk: {ended}, closed: {closed}",
            raw.len(),
            2 * TASKS
        ),
    );
    assert_eq!(
        goodbyes, 0,
        "[{driver}] a cut-off subscriber gets no goodbye"
    );
    assert!(
        events < 2 * TASKS,
        "[{driver}] expected the subscriber cut off before all {} events",
        2 * TASKS
    );
    // Cut off either way: the stream ended (last chunk) or the connection was dropped.
    assert!(
        closed || ended,
        "[{driver}] expected the never-reading subscriber's stream ended or its connection closed"
    );
    assert_served(&mut d, "the never-reading subscriber was cut off");
    // 5000 tasks are kept (max_tasks 10,000) and the ring holds 1024 events: a few MiB.
    // The subscriber itself may hold only its 256 KiB output bound.
    assert_rss_within(&d, CASE, base_rss, 64, "after the subscriber was cut off");
}
