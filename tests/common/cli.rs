//! The client subcommands' test helpers, shared by tests/e2e_client_cli.rs and
//! tests/e2e_client_cli_ops.rs: the real binary run as a client (to its end, or line by line),
//! a daemon with an agent script, a proxy that cuts a stream once, and the official A2A Python
//! SDK's server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{fresh_id, Daemon, Setup};

pub fn script(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

pub fn daemon(agent: &str, a2a: &str, env: &[(&str, &str)]) -> Daemon {
    Daemon::start_setup(
        "smol",
        &Setup {
            sections: format!("[agent]\ncommand = [\"python3\", \"{}\"]\n", script(agent)),
            a2a: a2a.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Setup::default()
        },
    )
}

pub fn cli_command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agentd"));
    c.args(args)
        .env_remove("AGENTD_TOKEN")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    c
}

/// Runs the client to its end (within 60 s, else it is killed and the test fails).
pub fn cli_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = cli_command(args);
    c.envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn agentd");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("agentd {args:?} did not end within 60 s: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn cli(args: &[&str]) -> Output {
    cli_env(args, &[])
}

pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs the client and expects exit 0; its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = cli(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "agentd {args:?}: {}",
        text(&out)
    );
    stdout(&out)
}

pub fn ok_json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("{args:?} --json is not JSON ({e}): {out}"))
}

/// Runs the client and expects exit `code`; its stderr.
pub fn fails(args: &[&str], code: i32) -> String {
    let out = cli(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "agentd {args:?}: {}",
        text(&out)
    );
    assert!(
        !stderr(&out).contains("panicked"),
        "agentd {args:?} panicked: {}",
        text(&out)
    );
    stderr(&out)
}

/// A client process whose stdout lines are read as they come.
pub struct Live {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Live {
    pub fn start(args: &[&str]) -> Live {
        let mut child = cli_command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agentd");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Live {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (10 s) for a line holding `needle`.
    pub fn until(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.seen.iter().any(|l| l.contains(needle)) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!("no line with {needle:?}; so far: {:#?}", self.seen),
            }
        }
    }

    /// Waits (20 s) for the exit; the status, all of stdout, stderr.
    /// Kills a client that runs until stopped (`watch`); all of stdout, stderr.
    pub fn stop(mut self) -> (String, String) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(l);
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (self.seen.join("\n"), err)
    }

    pub fn finish(mut self) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the client did not end; stdout so far: {:#?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(l);
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status.code(), self.seen.join("\n"), err)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which stream a [`CuttingProxy`] cuts, and what a resumed request looks like (both read
/// on the request lowercased, head and body).
#[derive(Clone, Copy)]
pub struct Cut {
    /// The method of the stream to cut (lowercase), such as `subscribetotask`.
    pub method: &'static str,
    /// The first stream is cut once its answer carried this text.
    pub after: &'static str,
    /// Whether a request of that method resumes an earlier stream (it is then not cut).
    pub resumes: fn(&str) -> bool,
}

/// A TCP proxy to the daemon that cuts the first stream of a method (a SubscribeToTask, by
/// default) once it has carried a given text (the first artifact), and notes whether a later
/// one resumed (carried `Last-Event-ID`). While `hold` is set, a resuming request waits
/// before it reaches the daemon.
pub struct CuttingProxy {
    port: u16,
    pub cut: Arc<AtomicBool>,
    pub resumed: Arc<AtomicBool>,
    pub hold: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the subscribe tests cut: the first SubscribeToTask once it carried `part-1`.
pub const CUT_SUBSCRIBE: Cut = Cut {
    method: "subscribetotask",
    after: "part-1",
    resumes: |req| req.contains("last-event-id:"),
};

impl CuttingProxy {
    pub fn start(upstream: std::net::SocketAddr) -> CuttingProxy {
        CuttingProxy::cutting(upstream, CUT_SUBSCRIBE)
    }

    pub fn cutting(upstream: std::net::SocketAddr, rule: Cut) -> CuttingProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let resumed = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let flags = Flags {
            cut: cut.clone(),
            resumed: resumed.clone(),
            hold: hold.clone(),
            stop: stop.clone(),
        };
        let thread = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !flags.stop.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((client, _)) => {
                        let f = flags.clone();
                        conns.push(std::thread::spawn(move || {
                            relay(client, upstream, rule, &f)
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for t in conns {
                let _ = t.join();
            }
        });
        CuttingProxy {
            port,
            cut,
            resumed,
            hold,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Waits (10 s) until the proxy has cut the stream.
    pub fn wait_cut(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.cut.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the proxy never cut the stream");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.hold.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Clone)]
struct Flags {
    cut: Arc<AtomicBool>,
    resumed: Arc<AtomicBool>,
    hold: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

/// One proxied exchange: the whole request, then the answer relayed until it ends (or is
/// cut).
fn relay(mut client: TcpStream, upstream: std::net::SocketAddr, rule: Cut, f: &Flags) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_read_timeout(Some(Duration::from_millis(100)));
    let Some(req) = read_request(&mut client, Instant::now() + Duration::from_secs(5)) else {
        return;
    };
    let mut buf = [0u8; 16384];
    let text = String::from_utf8_lossy(&req).to_ascii_lowercase();
    let ours = text.contains(rule.method);
    let resuming = ours && (rule.resumes)(&text);
    if resuming {
        f.resumed.store(true, Ordering::SeqCst);
        while f.hold.load(Ordering::SeqCst) && !f.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let cut_this = ours && !resuming && !f.cut.load(Ordering::SeqCst);
    let Ok(mut up) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = up.set_read_timeout(Some(Duration::from_millis(100)));
    if up.write_all(&req).is_err() {
        return;
    }
    let mut seen = Vec::new();
    while !f.stop.load(Ordering::SeqCst) {
        match up.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
                if cut_this {
                    seen.extend_from_slice(&buf[..n]);
                    if String::from_utf8_lossy(&seen).contains(rule.after) {
                        f.cut.store(true, Ordering::SeqCst);
                        break;
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = up.shutdown(Shutdown::Both);
}

/// The official A2A Python SDK's server (tests/interop/sdk_server.py), in a venv that
/// tests/interop/setup.sh builds on first use from PyPI (a machine that cannot build it
/// fails this test rather than skipping it). Killed and reaped on drop.
pub struct SdkServer {
    child: Child,
    pub url: String,
    pub addr: std::net::SocketAddr,
}

impl SdkServer {
    pub fn start() -> SdkServer {
        let root = env!("CARGO_MANIFEST_DIR");
        let venv = std::path::Path::new(root).join("target/sdk-server-venv");
        let setup = Command::new("bash")
            .arg(format!("{root}/tests/interop/setup.sh"))
            .env("AGENTD_INTEROP_VENV", &venv)
            .env(
                "AGENTD_INTEROP_EXTRA_REQUIREMENTS",
                format!("{root}/tests/interop/sdk-server-requirements.txt"),
            )
            .env(
                "AGENTD_INTEROP_CHECK",
                "a2a.server, starlette, sse_starlette, uvicorn",
            )
            .stdin(Stdio::null())
            .output()
            .expect("bash runs tests/interop/setup.sh");
        assert!(
            setup.status.success(),
            "the SDK server's venv could not be built: {}",
            String::from_utf8_lossy(&setup.stderr)
        );
        let mut child = Command::new(venv.join("bin/python"))
            .arg(format!("{root}/tests/interop/sdk_server.py"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the SDK server");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut first = String::new();
            let mut r = BufReader::new(out);
            let _ = r.read_line(&mut first);
            let _ = tx.send(first);
            // Drain the rest, so the server never blocks on a full pipe.
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let Some(url) = line.trim().strip_prefix("listening ").map(str::to_owned) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the SDK server did not start: {line:?}");
        };
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("an address");
        SdkServer { child, url, addr }
    }

    /// A task left working (the executor waits on a "wait" turn), sent with
    /// returnImmediately by the test itself.
    pub fn working_task(&self) -> String {
        let s = TcpStream::connect(self.addr).expect("connect to the SDK server");
        let r = super::Client::new(s).rpc_ok(
            "SendMessage",
            json!({"message": {"role": "ROLE_USER", "messageId": fresh_id(), "parts": [{"text": "wait here"}]},
                   "configuration": {"returnImmediately": true}}),
        );
        r["task"]["id"].as_str().expect("a task id").to_owned()
    }
}

impl Drop for SdkServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request read from `stream`: its head, then as much body as Content-Length
/// says. `None` when the peer closed or `deadline` passed first (read timeouts set on the
/// stream are waited out until then).
pub fn read_request(stream: &mut impl Read, deadline: Instant) -> Option<Vec<u8>> {
    let mut req = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        if let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&req[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if req.len() >= end + 4 + len {
                return Some(req);
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        match stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => req.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
}
