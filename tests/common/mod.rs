//! Shared helpers of the end-to-end tests: a [`Daemon`] that runs the real `agentd` binary on
//! a throwaway configuration, and a tiny raw HTTP/1.1 client ([`Client`]) that speaks to it
//! over TCP or a unix socket, byte for byte, with read timeouts so no test can hang.
//!
//! Only std and serde_json: every request is written by hand so the tests control exactly
//! what goes on the wire (splits, pipelining, malformed framing).

#![allow(dead_code)]

pub mod chromium;
pub mod cli;
pub mod full_disk;
pub mod receiver;
pub mod running;

use std::fmt::Write as _;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The drivers every end-to-end test runs against.
pub const DRIVERS: [&str; 2] = ["smol", "std"];

/// How long a client waits for any single read before the test fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the daemon may take to print its `listening` lines.
const START_TIMEOUT: Duration = Duration::from_secs(15);

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A directory a test owns under the system temp dir, unique per process and call, removed
/// on drop with everything in it.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Created now.
    pub fn new(name: &str) -> TempDir {
        let dir = TempDir::unmade(name);
        fs::create_dir_all(&dir.0).expect("create a temp dir");
        dir
    }

    /// Only named: whoever needs it creates it (a daemon its data directory, say).
    pub fn unmade(name: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        TempDir(std::env::temp_dir().join(format!(
            "agentd-test-{name}-{}-{}-{nanos:x}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::SeqCst)
        )))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Which listener of a [`Daemon`] to connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Tcp,
    Unix,
}

impl Via {
    pub const ALL: [Via; 2] = [Via::Tcp, Via::Unix];
}

/// More of a daemon's configuration than its limits.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// `key = value` lines of the `[limits]` section.
    pub limits: String,
    /// More `key = value` lines under `[a2a]` (after `listen`).
    pub a2a: String,
    /// Whole sections appended at the end (`[a2a.events]`, `[[a2a.principals]]`, ...).
    pub sections: String,
    /// Environment of the daemon (secret references read it).
    pub env: Vec<(String, String)>,
    /// The TCP listener is `https://` (the config must then carry `[a2a.tls]`).
    pub https: bool,
    /// The TCP entry of `a2a.listen` as TOML, instead of the plain URL: a table such as
    /// `{ url = "tcp://127.0.0.1:0", public_url = "...", behind_proxy = true }` (it must
    /// listen on 127.0.0.1, port 0).
    pub tcp_entry: Option<String>,
    /// The `[store]` data directory. Unset: `data/` in the daemon's own temp dir, so no two
    /// daemons share one (and nothing lands in the user's state dir). A test that restarts
    /// a daemon on the same data names a directory it owns. Ignored when `sections` has its
    /// own `[store]`.
    pub store_dir: Option<PathBuf>,
    /// A command the daemon is run under (`unshare ... sh -c '...; exec "$@"' sh`, say): its
    /// words come first, then the agentd binary and its arguments. It must `exec` agentd,
    /// so that the child process is the daemon.
    pub launcher: Vec<String>,
}

/// A running `agentd` child process with a TCP and a unix listener. Killed, waited for and
/// its temporary directory removed on drop.
pub struct Daemon {
    pub driver: String,
    child: Option<Child>,
    dir: PathBuf,
    /// `127.0.0.1:PORT` of the TCP listener.
    pub tcp: SocketAddr,
    /// Path of the unix listener's socket file.
    pub unix: PathBuf,
    /// The `listening` lines, as printed.
    pub listening: Vec<String>,
    stderr_path: PathBuf,
    /// Both listeners were announced: from now on an exit is a failure.
    started: bool,
}

/// Why [`Daemon::try_launch`] did not get a running daemon.
#[derive(Debug)]
pub struct LaunchError {
    pub message: String,
    /// The daemon's temp dir, left in place; the caller removes it.
    pub dir: PathBuf,
}

impl Daemon {
    /// A daemon with the default limits.
    pub fn start(driver: &str) -> Daemon {
        Daemon::start_with(driver, "")
    }

    /// A daemon whose config gets `limits` (TOML `key = value` lines) as its `[limits]`
    /// section.
    pub fn start_with(driver: &str, limits: &str) -> Daemon {
        let setup = Setup {
            limits: limits.to_owned(),
            ..Setup::default()
        };
        Daemon::start_setup(driver, &setup)
    }

    /// Writes the config (after `prepare` ran on the fresh temp dir, whose `a.sock` is the
    /// unix listener's path) and starts the daemon. `Err` says why it did not start (the
    /// lines it printed, its exit status and its stderr) and hands the temp dir, left in
    /// place, to the caller to inspect and remove.
    pub fn try_launch(
        driver: &str,
        limits: &str,
        prepare: impl FnOnce(&Path),
    ) -> Result<Daemon, LaunchError> {
        let setup = Setup {
            limits: limits.to_owned(),
            ..Setup::default()
        };
        Daemon::try_launch_setup(driver, &setup, prepare)
    }

    /// A daemon with more configuration: see [`Setup`].
    pub fn start_setup(driver: &str, setup: &Setup) -> Daemon {
        Daemon::start_prepared(driver, setup, |_| {})
    }

    /// [`Daemon::start_setup`] after `prepare` ran on the fresh temp dir (e.g. to chmod it),
    /// as in [`Daemon::try_launch`]. Panics, removing the temp dir, if the daemon does not
    /// start.
    pub fn start_prepared(driver: &str, setup: &Setup, prepare: impl FnOnce(&Path)) -> Daemon {
        Daemon::try_launch_setup(driver, setup, prepare).unwrap_or_else(|e| {
            let _ = fs::remove_dir_all(&e.dir);
            panic!("{}", e.message)
        })
    }

    /// [`Daemon::try_launch`] with more configuration: see [`Setup`].
    pub fn try_launch_setup(
        driver: &str,
        setup: &Setup,
        prepare: impl FnOnce(&Path),
    ) -> Result<Daemon, LaunchError> {
        let limits = setup.limits.as_str();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "agentd-e2e-{}-{}-{nanos:x}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).expect("create the daemon's temp dir");
        let unix = dir.join("a.sock");
        prepare(&dir);
        let config = dir.join("agentd.toml");
        let tcp_entry = setup.tcp_entry.clone().unwrap_or_else(|| {
            format!(
                "\"{}://127.0.0.1:0\"",
                if setup.https { "https" } else { "tcp" }
            )
        });
        let mut text = format!(
            "[a2a]\nlisten = [{tcp_entry}, \"unix://{}\"]\n",
            unix.display()
        );
        text.push_str(&setup.a2a);
        text.push('\n');
        if !limits.trim().is_empty() {
            text.push_str("\n[limits]\n");
            text.push_str(limits);
            text.push('\n');
        }
        text.push_str(&setup.sections);
        if !setup.sections.contains("[store]") {
            let data = setup.store_dir.clone().unwrap_or_else(|| dir.join("data"));
            text.push_str(&format!(
                "\n[store]\ndir = {:?}\n",
                data.display().to_string()
            ));
        }
        fs::write(&config, text).expect("write the daemon's config");
        let stderr_path = dir.join("stderr.log");
        let stderr = fs::File::create(&stderr_path).expect("create the stderr log");
        let agentd = env!("CARGO_BIN_EXE_agentd");
        let mut command = match setup.launcher.split_first() {
            Some((program, words)) => {
                let mut c = Command::new(program);
                c.args(words).arg(agentd);
                c
            }
            None => Command::new(agentd),
        };
        let mut child = command
            .arg("--driver")
            .arg(driver)
            .arg("--config")
            .arg(&config)
            .envs(setup.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn agentd");

        // Read stdout on a thread; it keeps draining until the child exits, then the
        // channel disconnects.
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });

        let mut daemon = Daemon {
            driver: driver.to_owned(),
            child: Some(child),
            dir,
            tcp: "127.0.0.1:0".parse().unwrap(),
            unix: PathBuf::new(),
            listening: Vec::new(),
            stderr_path,
            started: false,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        let mut tcp = None;
        let mut unix_path = None;
        while tcp.is_none() || unix_path.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line
                        .strip_prefix("listening http://")
                        .or_else(|| line.strip_prefix("listening https://"))
                    {
                        let addr = rest.trim_end_matches('/');
                        match addr.parse::<SocketAddr>() {
                            Ok(a) => tcp = Some(a),
                            Err(e) => {
                                let message = format!(
                                    "expected `listening http://IP:PORT/`, got {line:?}: {e}"
                                );
                                return Err(daemon.fail(message));
                            }
                        }
                    } else if let Some(rest) = line.strip_prefix("listening unix://") {
                        unix_path = Some(PathBuf::from(rest));
                    }
                    daemon.listening.push(line);
                }
                Err(e) => {
                    let status = match e {
                        // stdout closed: the process is ending; reap it.
                        mpsc::RecvTimeoutError::Disconnected => {
                            daemon.child.as_mut().and_then(wait_briefly)
                        }
                        mpsc::RecvTimeoutError::Timeout => None,
                    };
                    let message = format!(
                        "expected agentd --driver {driver} to print two `listening` lines within {:?}; \
                         got {:?}; exit status {status:?}; stderr:\n{}",
                        START_TIMEOUT,
                        daemon.listening,
                        daemon.stderr()
                    );
                    return Err(daemon.fail(message));
                }
            }
        }
        daemon.tcp = tcp.unwrap();
        daemon.unix = unix_path.unwrap();
        if daemon.unix != unix {
            let message = format!(
                "expected the unix listener at {}, it says {}",
                unix.display(),
                daemon.unix.display()
            );
            return Err(daemon.fail(message));
        }
        daemon.started = true;
        Ok(daemon)
    }

    /// Stops a daemon that did not start properly, keeping its temp dir for the caller.
    fn fail(mut self, message: String) -> LaunchError {
        self.kill();
        LaunchError {
            message,
            dir: std::mem::take(&mut self.dir),
        }
    }

    /// Ends the daemon now (SIGKILL) and reaps it, as a crash would. Its temp dir stays
    /// until drop, which then expects nothing more of the process.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The daemon's process id (e.g. for `/proc/<pid>/status`). Panics once it was killed.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("the daemon was killed: no pid")
            .id()
    }

    /// What the daemon logged so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// `http://127.0.0.1:PORT/`, as the card should name it.
    pub fn tcp_url(&self) -> String {
        format!("http://{}/", self.tcp)
    }

    /// `unix:///path`, as the card should name it.
    pub fn unix_url(&self) -> String {
        format!("unix://{}", self.unix.display())
    }

    /// The daemon's temp dir: its config, `stderr.log` and the unix socket `a.sock`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits up to `within` for the daemon to exit on its own and returns its status
    /// (`None`: still running).
    #[allow(dead_code)]
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            let status = self.child.as_mut()?.try_wait().ok().flatten();
            if let Some(status) = status {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls GetTask until task `id` is in state `want` (a `TASK_STATE_*` name); panics
    /// with the task as it stood after 20 s.
    #[allow(dead_code)]
    pub fn wait_task_state(&self, id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let t = self
                .connect_tcp()
                .rpc_ok("GetTask", serde_json::json!({"id": id}));
            if task_state(&t) == want {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} never reached {want}: {t}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends the daemon a signal by name (`TERM`, `INT`, ...).
    #[allow(dead_code)]
    pub fn signal(&self, name: &str) {
        let pid = self.pid().to_string();
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(&pid)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{name} {pid}");
    }

    /// Panics (with the daemon's stderr) if the process has exited.
    pub fn assert_alive(&mut self) {
        let status = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        if let Some(status) = status {
            panic!(
                "expected agentd --driver {} to keep running, but it exited with {status}; stderr:\n{}",
                self.driver,
                self.stderr()
            );
        }
    }

    pub fn connect_tcp(&self) -> Client<TcpStream> {
        let s = TcpStream::connect(self.tcp)
            .unwrap_or_else(|e| panic!("expected to connect to {}: {e}", self.tcp));
        s.set_nodelay(true).unwrap();
        Client::new(s)
    }

    pub fn connect_unix(&self) -> Client<UnixStream> {
        let s = UnixStream::connect(&self.unix)
            .unwrap_or_else(|e| panic!("expected to connect to {}: {e}", self.unix.display()));
        Client::new(s)
    }

    /// A client over either listener.
    pub fn connect(&self, via: Via) -> Client<Box<dyn Transport>> {
        match via {
            Via::Tcp => {
                let c = self.connect_tcp();
                Client::new(Box::new(c.stream) as Box<dyn Transport>)
            }
            Via::Unix => {
                let c = self.connect_unix();
                Client::new(Box::new(c.stream) as Box<dyn Transport>)
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let mut exited_early = None;
        if let Some(mut child) = self.child.take() {
            if let Ok(Some(status)) = child.try_wait() {
                exited_early = Some(status);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let stderr = self.stderr();
        if !self.dir.as_os_str().is_empty() {
            let _ = fs::remove_dir_all(&self.dir);
        }
        if let Some(status) = exited_early {
            if self.started && !std::thread::panicking() {
                panic!(
                    "expected agentd --driver {} to be running until the test stopped it, \
                     but it exited with {status}; stderr:\n{stderr}",
                    self.driver
                );
            }
        }
    }
}

/// The exit status of a child that is ending, waiting at most 2 s for it.
fn wait_briefly(child: &mut Child) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// What the client needs from a socket besides `Read + Write`.
pub trait Transport: Read + Write + Send {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    fn shutdown_write(&self) -> io::Result<()>;
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    fn try_clone_box(&self) -> io::Result<Box<dyn Transport>>;
}

impl Transport for TcpStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, d)
    }
    fn try_clone_box(&self) -> io::Result<Box<dyn Transport>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl Transport for UnixStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, d)
    }
    fn try_clone_box(&self) -> io::Result<Box<dyn Transport>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl Transport for Box<dyn Transport> {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        (**self).set_read_timeout(d)
    }
    fn shutdown_write(&self) -> io::Result<()> {
        (**self).shutdown_write()
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        (**self).set_write_timeout(d)
    }
    fn try_clone_box(&self) -> io::Result<Box<dyn Transport>> {
        (**self).try_clone_box()
    }
}

/// One HTTP response as read off the wire.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    /// Names lower-cased, values trimmed, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked when it was chunked.
    pub body: Vec<u8>,
    /// The body came with `transfer-encoding: chunked` and its terminating 0-length chunk.
    pub chunked: bool,
    /// Sizes of the chunks of a chunked body, in order (the final 0 included).
    pub chunk_sizes: Vec<usize>,
}

impl Response {
    /// The first value of a header by (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "expected a JSON body, got {e}: status {} body {:?}",
                self.status,
                self.body_text()
            )
        })
    }

    /// Whether the daemon announced it closes the connection after this response.
    pub fn says_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    }

    /// The `data:` payloads of an SSE body, each parsed as JSON, in order. Comments (`:`)
    /// are skipped.
    pub fn sse_events(&self) -> Vec<Value> {
        let text = self.body_text();
        let mut events = Vec::new();
        for block in text.split("\n\n") {
            let mut data = String::new();
            for line in block.lines() {
                if let Some(d) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            if !data.is_empty() {
                events.push(serde_json::from_str(&data).unwrap_or_else(|e| {
                    panic!("expected every SSE data payload to be JSON ({e}): {data:?}")
                }));
            }
        }
        events
    }
}

/// A raw HTTP/1.1 client over one connection. Reads are bounded by [`READ_TIMEOUT`].
pub struct Client<S: Read + Write> {
    pub stream: S,
    buf: Vec<u8>,
}

impl<S: Transport> Client<S> {
    /// A second handle on the socket, e.g. for a writer thread.
    pub fn clone_stream(&self) -> Box<dyn Transport> {
        self.stream.try_clone_box().expect("clone the socket")
    }

    pub fn new(stream: S) -> Self {
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("set a read timeout");
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// Half-closes: the daemon reads EOF.
    pub fn shutdown_write(&self) {
        self.stream.shutdown_write().expect("shutdown(Write)");
    }

    /// Expects the daemon to close the connection within `within`: a read returns EOF (a
    /// reset counts as closed too). Bytes still buffered or arriving fail the check.
    pub fn try_expect_eof(&mut self, within: Duration) -> Result<Duration, String> {
        if !self.buf.is_empty() {
            return Err(format!(
                "unexpected bytes before the close: {:?}",
                String::from_utf8_lossy(&self.buf)
            ));
        }
        let start = Instant::now();
        self.stream
            .set_read_timeout(Some(within.max(Duration::from_millis(1))))
            .unwrap();
        let mut b = [0u8; 4096];
        let r = self.stream.read(&mut b);
        self.stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        match r {
            Ok(0) => Ok(start.elapsed()),
            Ok(n) => Err(format!(
                "got {n} more bytes instead of EOF: {:?}",
                String::from_utf8_lossy(&b[..n])
            )),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                ) =>
            {
                Ok(start.elapsed())
            }
            Err(e) => Err(format!(
                "no EOF within {within:?} ({e}): the connection stayed open"
            )),
        }
    }

    /// [`Client::try_expect_eof`] that panics with `what` when the connection stays open.
    pub fn expect_eof(&mut self, what: &str) -> Duration {
        self.try_expect_eof(Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("expected the daemon to close the connection {what}: {e}"))
    }
}

impl<S: Read + Write> Client<S> {
    /// Writes raw bytes, all of them, in one `write_all`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("expected to write {} bytes: {e}", bytes.len()));
        self.stream.flush().unwrap();
    }

    /// Writes bytes one `write` call per byte.
    pub fn send_byte_by_byte(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.stream
                .write_all(std::slice::from_ref(b))
                .unwrap_or_else(|e| panic!("expected to write a byte: {e}"));
            self.stream.flush().unwrap();
        }
    }

    /// Reads more bytes into the buffer; `Ok(0)` at EOF.
    fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn fill_or_fail(&mut self, what: &str) -> io::Result<()> {
        match self.fill() {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed while reading {what}; buffered {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            )),
            Ok(_) => Ok(()),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!(
                    "{e} while reading {what}; buffered {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            )),
        }
    }

    /// Takes one CRLF- (or LF-) terminated line off the buffer, reading as needed.
    fn take_line(&mut self, what: &str) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            if self.buf.len() > 1 << 20 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            self.fill_or_fail(what)?;
        }
    }

    fn take_exact(&mut self, n: usize, what: &str) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill_or_fail(what)?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads one response. `head_request`: the request was HEAD, so no body follows.
    /// Interim (1xx) responses are returned as responses of their own.
    pub fn try_read_response(&mut self, head_request: bool) -> io::Result<Response> {
        let status_line = self.take_line("the status line")?;
        let status_line = String::from_utf8_lossy(&status_line).into_owned();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|_| version.starts_with("HTTP/1."))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("not an HTTP/1.x status line: {status_line:?}"),
                )
            })?;
        let reason = parts.next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        loop {
            let line = self.take_line("the response headers")?;
            if line.is_empty() {
                break;
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            let (name, value) = line.split_once(':').ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("malformed header line {line:?}"),
                )
            })?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let mut resp = Response {
            status,
            reason,
            headers,
            body: Vec::new(),
            chunked: false,
            chunk_sizes: Vec::new(),
        };
        if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(resp);
        }
        let te = resp
            .header("transfer-encoding")
            .map(str::to_ascii_lowercase);
        if te.as_deref().is_some_and(|t| t.contains("chunked")) {
            loop {
                let line = self.take_line("a chunk size")?;
                let text = String::from_utf8_lossy(&line).into_owned();
                let hex = text.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(hex, 16).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("malformed chunk size line {text:?}"),
                    )
                })?;
                resp.chunk_sizes.push(size);
                if size == 0 {
                    // Trailers until the empty line.
                    loop {
                        if self.take_line("the chunked trailer")?.is_empty() {
                            break;
                        }
                    }
                    resp.chunked = true;
                    break;
                }
                let data = self.take_exact(size, "chunk data")?;
                resp.body.extend_from_slice(&data);
                let end = self.take_exact(2, "a chunk's CRLF")?;
                if end != b"\r\n" {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("chunk data not followed by CRLF: {end:?}"),
                    ));
                }
            }
        } else if let Some(len) = resp.header("content-length") {
            let n: usize = len.parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("malformed content-length {len:?}"),
                )
            })?;
            resp.body = self.take_exact(n, "the body")?;
        } else {
            // Delimited by the close.
            loop {
                match self.fill() {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
            }
            resp.body = std::mem::take(&mut self.buf);
        }
        Ok(resp)
    }

    /// Reads one response or fails the test.
    pub fn read_response(&mut self) -> Response {
        self.try_read_response(false)
            .unwrap_or_else(|e| panic!("expected an HTTP response: {e}"))
    }

    /// Reads the response to a HEAD request (no body).
    pub fn read_head_response(&mut self) -> Response {
        self.try_read_response(true)
            .unwrap_or_else(|e| panic!("expected an HTTP response to HEAD: {e}"))
    }

    /// Sends `bytes` and reads one response.
    pub fn request(&mut self, bytes: &[u8]) -> Response {
        self.send(bytes);
        self.read_response()
    }

    /// Bytes received and not yet consumed by a response.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// GET the agent card.
    pub fn get_card(&mut self) -> Response {
        self.request(&get(CARD, &[]))
    }

    /// Sends a JSON-RPC call with the standard headers and returns the whole response
    /// document; asserts HTTP 200 with an `application/json` body.
    pub fn rpc(&mut self, id: &str, method: &str, params: Value) -> Value {
        let resp = self.request(&rpc_request(id, method, &params));
        assert_json_200(&resp, method);
        let doc = resp.json();
        assert_eq!(
            doc["jsonrpc"], "2.0",
            "expected jsonrpc \"2.0\" in the answer to {method}: {doc}"
        );
        doc
    }

    /// A JSON-RPC call that must succeed: returns `result`.
    pub fn rpc_ok(&mut self, method: &str, params: Value) -> Value {
        let doc = self.rpc("1", method, params);
        assert!(
            doc.get("error").is_none(),
            "expected {method} to succeed, got error {}",
            doc["error"]
        );
        doc["result"].clone()
    }

    /// A JSON-RPC call that must fail with `code`: returns `error`.
    pub fn rpc_err(&mut self, method: &str, params: Value, code: i64) -> Value {
        let doc = self.rpc("7", method, params);
        assert_eq!(
            doc["error"]["code"].as_i64(),
            Some(code),
            "expected {method} to fail with JSON-RPC error {code}, got {doc}"
        );
        assert!(
            doc.get("result").is_none(),
            "expected no result beside an error: {doc}"
        );
        doc["error"].clone()
    }
}

pub const CARD: &str = "/.well-known/agent-card.json";

/// `METHOD PATH HTTP/1.1` with `Host` and `extra` header lines (each without CRLF), no body.
pub fn bare(method: &str, path: &str, extra: &[&str]) -> Vec<u8> {
    let mut s = format!("{method} {path} HTTP/1.1\r\nHost: agentd.test\r\n");
    for h in extra {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// A GET request.
pub fn get(path: &str, extra: &[&str]) -> Vec<u8> {
    bare("GET", path, extra)
}

/// A POST to `/` with `headers` (each a full header line without CRLF) and a
/// Content-Length body.
pub fn post(headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut s = String::from("POST / HTTP/1.1\r\nHost: agentd.test\r\n");
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    let _ = write!(s, "Content-Length: {}\r\n\r\n", body.len());
    let mut out = s.into_bytes();
    out.extend_from_slice(body);
    out
}

/// The headers a conforming JSON-RPC call carries.
pub const RPC_HEADERS: [&str; 2] = ["Content-Type: application/json", "A2A-Version: 1.0"];

/// A JSON-RPC request body.
pub fn rpc_body(id: &str, method: &str, params: &Value) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#).into_bytes()
}

/// A complete JSON-RPC POST. `id` is JSON text (`"\"a\""`, `"1"`).
pub fn rpc_request(id: &str, method: &str, params: &Value) -> Vec<u8> {
    post(&RPC_HEADERS, &rpc_body(id, method, params))
}

/// A messageId not used before in this test process: a send is idempotent per (caller,
/// messageId), so each new message needs its own.
pub fn fresh_id() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("m-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// SendMessage params with one text part.
pub fn text_message(message_id: &str, text: &str) -> Value {
    serde_json::json!({
        "message": {
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"text": text}]
        }
    })
}

/// Asserts a 200 `application/json` response.
pub fn assert_json_200(resp: &Response, what: &str) {
    assert_eq!(
        resp.status,
        200,
        "expected HTTP 200 for {what}, got {} {}: {:?}",
        resp.status,
        resp.reason,
        resp.body_text()
    );
    assert!(
        resp.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "expected content-type application/json for {what}, got {:?}",
        resp.header("content-type")
    );
}

/// A Task's `status.state` (empty when there is none).
#[allow(dead_code)]
pub fn task_state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

/// The interop venv's python (tests/interop/setup.sh builds the venv once from PyPI, with
/// the independent readers the tests check agentd's output with: the A2A SDK, the
/// Prometheus and OTLP parsers); built once per test process.
pub fn interop_python() -> &'static str {
    static PY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let setup = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/setup.sh");
        let out = Command::new("bash")
            .arg(setup)
            .output()
            .expect("bash runs tests/interop/setup.sh");
        assert!(
            out.status.success(),
            "the interop venv could not be built:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let venv = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        format!("{venv}/bin/python")
    })
}
