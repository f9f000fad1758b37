//! The connection bound under the open-file limit (`RLIMIT_NOFILE`), on both drivers: the
//! daemon raises its soft limit to the hard one, lowers `limits.max_connections` to what
//! the limit leaves after its reserve (and says so once), answers connections past the
//! bound 503 at once — never a silent timeout — with one throttled warning for many
//! refusals, serves again once connections close, and when `accept` itself runs out of
//! descriptors answers 503 with a spare one instead of spinning.
//!
//! The daemon runs with a limit set for it alone (`setrlimit` between fork and exec); the
//! tests lower a running daemon's soft limit with `prlimit(2)`.

mod common;

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{get, post, rpc_body, Client, Response, CARD, DRIVERS, RPC_HEADERS};
use rustix::process::{Resource, Rlimit};
use serde_json::json;

/// How long a refused client may wait for its 503.
const PROMPT: Duration = Duration::from_secs(2);

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// An `agentd` started under an open-file limit of its own, with one TCP listener and no
/// store on disk. Killed, reaped and its temp dir removed on drop.
struct Limited {
    driver: &'static str,
    child: Option<Child>,
    dir: PathBuf,
    tcp: SocketAddr,
}

impl Limited {
    /// Starts `agentd --driver DRIVER` with `RLIMIT_NOFILE` soft:hard and `limits`
    /// (`key = value` lines) as its `[limits]`.
    fn start(driver: &'static str, soft: u64, hard: u64, limits: &str) -> Limited {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "agentd-e2e-fd-{}-{}-{nanos:x}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).expect("create the daemon's temp dir");
        let config = dir.join("agentd.toml");
        fs::write(
            &config,
            format!(
                "[a2a]\nlisten = [\"tcp://127.0.0.1:0\"]\n\n[store]\nkind = \"memory\"\n\n\
                 [limits]\n{limits}\n"
            ),
        )
        .expect("write the daemon's config");
        let stderr = fs::File::create(dir.join("stderr.log")).expect("create the stderr log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentd"));
        cmd.arg("--driver")
            .arg(driver)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        let limit = Rlimit {
            current: Some(soft),
            maximum: Some(hard),
        };
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // setrlimit system call (async-signal-safe); it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::setrlimit(Resource::Nofile, limit).map_err(io::Error::from)
            });
        }
        let mut child = cmd.spawn().expect("spawn agentd");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut d = Limited {
            driver,
            child: Some(child),
            dir,
            tcp: "127.0.0.1:0".parse().unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("listening http://") {
                        d.tcp = rest.trim_end_matches('/').parse().expect("a TCP address");
                        return d;
                    }
                }
                Err(e) => panic!(
                    "expected agentd --driver {driver} under RLIMIT_NOFILE {soft}:{hard} to \
                     print its `listening` line: {e:?}; stderr:\n{}",
                    d.stderr()
                ),
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn stderr(&self) -> String {
        fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// The lines of the log that contain `needle`.
    fn log_lines(&self, needle: &str) -> Vec<String> {
        self.stderr()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    fn assert_alive(&mut self) {
        let status = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        if let Some(status) = status {
            panic!(
                "expected agentd --driver {} to keep running, it exited with {status}; \
                 stderr:\n{}",
                self.driver,
                self.stderr()
            );
        }
    }

    fn connect(&self) -> Client<TcpStream> {
        let s = TcpStream::connect_timeout(&self.tcp, PROMPT)
            .unwrap_or_else(|e| panic!("[{}] expected to connect: {e}", self.driver));
        s.set_nodelay(true).unwrap();
        let c = Client::new(s);
        c.stream.set_read_timeout(Some(PROMPT)).unwrap();
        c
    }

    /// A client whose request for the card was answered 200: it holds a connection slot.
    fn admitted(&self, what: &str) -> Client<TcpStream> {
        let mut c = self.connect();
        c.send(&get(CARD, &[]));
        let r = c
            .try_read_response(false)
            .unwrap_or_else(|e| panic!("[{}] {what}: expected the card: {e}", self.driver));
        assert_eq!(r.status, 200, "[{}] {what}: {r:?}", self.driver);
        c
    }

    /// A client answered 503 unasked and closed, within [`PROMPT`] of connecting.
    fn refused(&self, what: &str) -> Client<TcpStream> {
        let t = Instant::now();
        let mut c = self.connect();
        let r = c.try_read_response(false).unwrap_or_else(|e| {
            panic!(
                "[{}] {what}: expected a 503 within {PROMPT:?}, got {e} after {:?}; stderr:\n{}",
                self.driver,
                t.elapsed(),
                self.stderr()
            )
        });
        assert_busy(&r, self.driver, what);
        c.try_expect_eof(PROMPT)
            .unwrap_or_else(|e| panic!("[{}] {what}: expected the 503 to close: {e}", self.driver));
        c
    }

    /// Waits (up to 5 s) until a new client is served the card again.
    fn served_again(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut c = self.connect();
            c.send(&get(CARD, &[]));
            let r = c.try_read_response(false);
            match r {
                Ok(r) if r.status == 200 => return,
                other => assert!(
                    Instant::now() < deadline,
                    "[{}] {what}: expected a new client to be served, got {other:?}",
                    self.driver
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `Max open files` of `/proc/<pid>/limits`: (soft, hard).
    fn nofile(&self) -> (String, String) {
        let limits = fs::read_to_string(format!("/proc/{}/limits", self.pid())).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("a Max open files line");
        let mut f = line["Max open files".len()..].split_whitespace();
        (f.next().unwrap().to_owned(), f.next().unwrap().to_owned())
    }

    /// The descriptor numbers the daemon holds.
    fn fds(&self) -> Vec<u64> {
        let mut fds: Vec<u64> = fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        fds.sort_unstable();
        fds
    }

    /// Waits (up to 5 s) until the daemon holds at most `n` descriptors.
    fn wait_fds(&self, n: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let fds = self.fds();
            if fds.len() <= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "[{}] {what}: expected at most {n} descriptors, the daemon holds {}: {fds:?}",
                self.driver,
                fds.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// CPU time the daemon used so far, in clock ticks (utime + stime).
    fn cpu_ticks(&self) -> u64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        // After the command: state is field 3, utime 14 and stime 15.
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    /// Sets the running daemon's soft open-file limit, keeping its hard one.
    fn set_soft_limit(&self, soft: u64) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).expect("a pid");
        let hard = self.nofile().1.parse::<u64>().expect("a finite hard limit");
        rustix::process::prlimit(
            Some(pid),
            Resource::Nofile,
            Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            },
        )
        .expect("prlimit the daemon");
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("[{}] daemon stderr:\n{}", self.driver, self.stderr());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn assert_busy(r: &Response, driver: &str, what: &str) {
    assert_eq!(r.status, 503, "[{driver}] {what}: {r:?}");
    assert_eq!(r.reason, "Service Unavailable", "[{driver}] {what}");
    assert_eq!(r.header("retry-after"), Some("1"), "[{driver}] {what}");
}

/// The number a `key=N` field of a log line carries.
fn field(line: &str, key: &str) -> u64 {
    let at = line
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"));
    line[at + key.len() + 2..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{key}= is not a number in {line:?}"))
}

const LOWERED: &str = "limits.max_connections lowered";
const REFUSED: &str = "connection limit reached";
const ACCEPT_FAILED: &str = "accept failed";

/// Clients answered while `accept` fails with EMFILE: each may wait for the accept loop's
/// back-off (up to 1 s) before the spare descriptor answers it.
const ACCEPT_FAILS: usize = 8;

/// Under a soft and hard limit of 128, with more clients than that: the bound is lowered to
/// 64 (128 less its reserve: 64 + 128/16, at most half), said once; the 65th client and
/// every one after get 503 at once; one throttled warning stands for all of them; service
/// resumes when connections close. Then, the daemon's soft limit cut below the descriptors
/// it holds, `accept` fails with EMFILE: clients still get 503 at once (the spare
/// descriptor), the daemon does not spin, and that warning is throttled too.
fn bound_under_a_low_fd_limit(driver: &'static str) {
    let default_max = if driver == "std" { 1024 } else { 10_000 };
    let mut d = Limited::start(driver, 128, 128, "");
    assert_eq!(d.nofile(), ("128".into(), "128".into()));
    let base_fds = d.fds().len();

    // (a) One line says the bound was lowered, naming the key and both numbers.
    let lowered = d.log_lines(LOWERED);
    assert_eq!(
        lowered.len(),
        1,
        "[{driver}] expected one line saying the bound was lowered: {lowered:?}"
    );
    assert_eq!(field(&lowered[0], "configured"), default_max, "{lowered:?}");
    assert_eq!(field(&lowered[0], "fd_limit"), 128, "{lowered:?}");
    let bound = field(&lowered[0], "lowered_to") as usize;
    assert_eq!(
        bound, 64,
        "[{driver}] 128 less a reserve of 64: {lowered:?}"
    );

    // The bound's worth of clients hold connections.
    let mut held: Vec<Client<TcpStream>> = (0..bound)
        .map(|i| d.admitted(&format!("client {i} of the bound {bound}")))
        .collect();

    // (b) Past it, more clients than the limit has descriptors: each gets 503 at once.
    let extra = 150;
    let t = Instant::now();
    let refused: Vec<Client<TcpStream>> = (0..extra)
        .map(|i| d.refused(&format!("client {} past the bound {bound}", bound + i)))
        .collect();
    let took = t.elapsed();
    d.assert_alive();
    assert!(
        bound + extra > 128,
        "more clients than the daemon has descriptors"
    );

    // (d) One warning (two if the interval passed meanwhile) stands for all of them.
    let warnings = d.log_lines(REFUSED);
    assert!(
        !warnings.is_empty() && warnings.len() <= 2,
        "[{driver}] expected {extra} refusals in {took:?} to be logged in one or two \
         throttled lines, got {}: {warnings:?}",
        warnings.len()
    );
    assert!(warnings[0].contains("WARN"), "{warnings:?}");
    assert_eq!(field(&warnings[0], "max_connections"), bound as u64);
    let failed = d.log_lines(ACCEPT_FAILED);
    assert!(
        failed.is_empty(),
        "[{driver}] under the bound, accept has descriptors: {failed:?}"
    );
    drop(refused);

    // (c) Once some connections close, a new client is served.
    held.truncate(bound - 10);
    d.served_again("after 10 of the held connections closed");
    // The flush of the suppressed count rides on an admission after the interval: not
    // awaited here (10 s), but the count never exceeds what was refused.
    let counted: u64 = d
        .log_lines(REFUSED)
        .iter()
        .map(|l| field(l, "refused"))
        .sum();
    assert!(counted <= extra as u64, "[{driver}] {counted} > {extra}");

    // Out of descriptors below the bound: cut the soft limit to the lowest free descriptor
    // number, so the next one the daemon opens fails with EMFILE. First the daemon must
    // have closed every connection the test let go of, or the cut frees those numbers.
    d.wait_fds(base_fds + held.len(), "the closed connections to be let go");
    let fds = d.fds();
    let lowest_free = (0..).find(|n| !fds.contains(n)).unwrap();
    d.set_soft_limit(lowest_free);
    // The std driver's accept thread, blocked in `accept`, took its descriptor number
    // before the cut: the next client may still be admitted. Any after it is not.
    let mut first = d.connect();
    first.send(&get(CARD, &[]));
    let r = first.try_read_response(false).unwrap_or_else(|e| {
        panic!("[{driver}] the first client after the cut: expected 200 or 503: {e}")
    });
    assert!(matches!(r.status, 200 | 503), "[{driver}] {r:?}");
    let before = d.cpu_ticks();
    let t = Instant::now();
    let shed: Vec<Client<TcpStream>> = (0..ACCEPT_FAILS)
        .map(|i| d.refused(&format!("client {i} while accept fails with EMFILE")))
        .collect();
    let took = t.elapsed();
    drop(shed);
    // A listener left readable with EMFILE would be spun on: the daemon stays idle.
    std::thread::sleep(Duration::from_secs(1));
    let ticks = d.cpu_ticks() - before;
    let failed = d.log_lines(ACCEPT_FAILED);
    assert!(
        !failed.is_empty() && failed.len() <= 2,
        "[{driver}] expected the failed accepts of {took:?} to be logged in one or two \
         throttled lines: {failed:?}"
    );
    assert!(failed[0].contains("out of file descriptors"), "{failed:?}");
    assert!(
        ticks < 50,
        "[{driver}] expected the daemon idle while out of descriptors, it used {ticks} clock \
         ticks in {:?}",
        t.elapsed()
    );
    d.assert_alive();

    // The limit back: served again.
    d.set_soft_limit(128);
    d.served_again("after the soft limit was restored");
    drop(held);
    d.served_again("after every held connection closed");
    d.assert_alive();
}

/// (e) With a hard limit above the soft one, the daemon raises its soft limit to the hard
/// one (and says so), and lowers the bound only if the raised limit still calls for it.
fn soft_limit_raised_to_the_hard_one(driver: &'static str) {
    let default_max: u64 = if driver == "std" { 1024 } else { 10_000 };
    // 4096, or what this process may hand down if its own hard limit is lower.
    let own_hard = rustix::process::getrlimit(Resource::Nofile)
        .maximum
        .unwrap_or(u64::MAX);
    let hard = own_hard.min(4096);
    assert!(
        hard > 256,
        "this test needs a hard RLIMIT_NOFILE above 256, not {hard}"
    );
    let d = Limited::start(driver, 256, hard, "");
    assert_eq!(
        d.nofile(),
        (hard.to_string(), hard.to_string()),
        "[{driver}] /proc/<pid>/limits"
    );
    let raised = d.log_lines("open-file limit (RLIMIT_NOFILE) raised");
    assert_eq!(raised.len(), 1, "[{driver}] {raised:?}");
    assert!(
        raised[0].contains("from=256") && raised[0].contains(&format!("to={hard}")),
        "{raised:?}"
    );
    // The reserve: 64 + 1/16 of the limit, at most half (4096 keeps 320: room for 3776).
    let room = hard - (64 + hard / 16).min(hard / 2);
    let lowered = d.log_lines(LOWERED);
    if default_max > room {
        assert_eq!(lowered.len(), 1, "[{driver}] {lowered:?}");
        assert_eq!(field(&lowered[0], "lowered_to"), room, "{lowered:?}");
    } else {
        assert!(lowered.is_empty(), "[{driver}] {lowered:?}");
    }
    let mut c = d.connect();
    c.send(&get(CARD, &[]));
    assert_eq!(c.read_response().status, 200);

    // A configured bound the limit allows is kept, and nothing is said about it. The
    // programs the daemon starts get the limit it inherited back, not its raised one.
    drop(d);
    let d = Limited::start(
        driver,
        256,
        hard,
        &format!("max_connections = 100\n{SHOW_LIMIT}"),
    );
    assert!(d.log_lines(LOWERED).is_empty(), "[{driver}]");
    let mut c = d.connect();
    c.send(&get(CARD, &[]));
    assert_eq!(c.read_response().status, 200);
    let run = json!({"message": {"role": "ROLE_USER", "messageId": "fd",
        "extensions": [COMMAND_URI],
        "parts": [{"data": {"agentd": {"op": "workflow.run", "workflow": "fd"}}}]}});
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let mut c = d.connect();
    c.send(&post(
        &[RPC_HEADERS[0], RPC_HEADERS[1], &ext],
        &rpc_body("1", "SendMessage", &run),
    ));
    let r = c.read_response().json();
    let task = &r["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "[{driver}] {r}"
    );
    assert_eq!(
        task["artifacts"][0]["parts"][0]["data"], 256,
        "[{driver}] {r}"
    );
}

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";

/// A workflow whose exec step prints its own soft open-file limit.
const SHOW_LIMIT: &str = r#"
[[workflows]]
name = "fd"
[[workflows.steps]]
id = "start"
kind = "a2a"
[[workflows.steps]]
id = "show"
kind = "exec"
program = "python3"
args = ["-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"]
"#;

#[test]
fn bound_under_a_low_fd_limit_smol() {
    bound_under_a_low_fd_limit(DRIVERS[0]);
}

#[test]
fn bound_under_a_low_fd_limit_std() {
    bound_under_a_low_fd_limit(DRIVERS[1]);
}

#[test]
fn soft_limit_raised_to_the_hard_one_smol() {
    soft_limit_raised_to_the_hard_one(DRIVERS[0]);
}

#[test]
fn soft_limit_raised_to_the_hard_one_std() {
    soft_limit_raised_to_the_hard_one(DRIVERS[1]);
}
