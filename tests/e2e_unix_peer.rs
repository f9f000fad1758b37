//! The unix listener serves only the daemon's own uid or root, on the real binary, both
//! drivers: the socket file is mode 0600 and owned by the daemon's uid, so another uid cannot
//! even connect; and when the file is widened anyway (a misconfigured or inherited
//! permission), the daemon still closes that uid's connections (`SO_PEERCRED`) before it
//! reads a byte and logs `unix socket peer refused`, while root keeps being served. A peer
//! the kernel admitted is the operator: it needs no bearer even where TCP does.
//!
//! The test runs as root (as CI does) and acts as another uid, 65534 (`nobody`), through
//! util-linux's `setpriv` (or `runuser`), with a tiny `python3` socket client. Missing tools
//! fail the test with what to install: `scripts/test.sh` installs them. Every wait is bounded.

mod common;

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{post, rpc_body, rpc_request, Daemon, Setup, RPC_HEADERS};
use serde_json::json;

/// The other uid (and gid) the client runs as: `nobody` on Debian.
const OTHER_UID: u32 = 65534;
/// Its name, for `runuser`.
const OTHER_USER: &str = "nobody";
const UNIX_BINDING: &str = "https://agentd.dev/a2a/binding/jsonrpc-unix";
const BEARER_ENV: &str = "AGENTD_E2E_BEARER";
const REFUSAL_LOG: &str = "unix socket peer refused";

/// How long a client run as the other uid may take, start to exit.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);

mod smol_driver {
    #[test]
    fn unix_socket_serves_only_its_own_uid_or_root() {
        super::unix_socket_serves_only_its_own_uid_or_root("smol")
    }
    #[test]
    fn unix_peer_needs_no_bearer() {
        super::unix_peer_needs_no_bearer("smol")
    }
    #[test]
    fn a_refused_uid_gets_no_byte_even_at_the_connection_limit() {
        super::a_refused_uid_gets_no_byte_even_at_the_connection_limit("smol")
    }
}

mod std_driver {
    #[test]
    fn unix_socket_serves_only_its_own_uid_or_root() {
        super::unix_socket_serves_only_its_own_uid_or_root("std")
    }
    #[test]
    fn unix_peer_needs_no_bearer() {
        super::unix_peer_needs_no_bearer("std")
    }
    #[test]
    fn a_refused_uid_gets_no_byte_even_at_the_connection_limit() {
        super::a_refused_uid_gets_no_byte_even_at_the_connection_limit("std")
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

fn unix_socket_serves_only_its_own_uid_or_root(driver: &str) {
    assert_root();
    let as_other = OtherUid::find();
    let mut d = start(driver, "a-token-the-unix-peer-never-needs");

    // The file: a socket, mode 0600, owned by the daemon's uid.
    let meta = fs::symlink_metadata(&d.unix)
        .unwrap_or_else(|e| panic!("expected the socket at {}: {e}", d.unix.display()));
    assert!(
        meta.file_type().is_socket(),
        "expected {} to be a socket",
        d.unix.display()
    );
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o600,
        "expected the {driver} daemon's socket to be mode 0600, it is {:o}",
        meta.permissions().mode() & 0o7777
    );
    let daemon_uid = euid(&d);
    assert_eq!(
        meta.uid(),
        daemon_uid,
        "expected the socket to be owned by the daemon's uid {daemon_uid}, it is owned by {}",
        meta.uid()
    );

    // Another uid cannot connect at all: the mode refuses it (the directory is 0755, so the
    // refusal is the socket file's).
    let run = as_other.connect_and_get_card(&d.unix);
    run.assert_uid();
    assert_eq!(
        run.value("connect"),
        Some("EACCES"),
        "expected uid {OTHER_UID} to be refused by the 0600 mode (EACCES) on the {driver} \
         daemon's socket; the client said:\n{}",
        run.transcript()
    );

    // Widened by hand: the other uid now reaches the daemon, which closes it unanswered.
    fs::set_permissions(&d.unix, fs::Permissions::from_mode(0o666)).expect("chmod 0666");
    let run = as_other.connect_and_get_card(&d.unix);
    run.assert_uid();
    assert_eq!(
        run.value("connect"),
        Some("ok"),
        "expected uid {OTHER_UID} to connect once the socket is 0666; the client said:\n{}",
        run.transcript()
    );
    // The request may or may not be written before the daemon's close lands (EPIPE when
    // not); the end is EOF, or a reset when the daemon closed with the request unread.
    let end = run.value("end");
    assert!(
        matches!(end, Some("eof" | "ECONNRESET" | "EPIPE")),
        "expected the {driver} daemon to close uid {OTHER_UID}'s connection (EOF or reset), \
         got {end:?}; the client said:\n{}",
        run.transcript()
    );
    assert_eq!(
        run.value("received"),
        Some("0"),
        "expected no HTTP byte at all for uid {OTHER_UID}; the client said:\n{}",
        run.transcript()
    );
    let line = wait_for_log(&d, |l| {
        l.contains(REFUSAL_LOG) && l.contains(&format!("uid={OTHER_UID}"))
    });
    assert!(
        line.is_some(),
        "expected the {driver} daemon to log `{REFUSAL_LOG}` with uid={OTHER_UID}; stderr:\n{}",
        d.stderr()
    );

    // Root, on the same (widened) socket, right after: served.
    let mut c = d.connect_unix();
    let resp = c.get_card();
    assert_eq!(
        resp.status,
        200,
        "expected root to get the card over the {driver} unix socket: {} {:?}",
        resp.reason,
        resp.body_text()
    );
    let card = resp.json();
    let iface = &card["supportedInterfaces"][0];
    assert_eq!(
        iface["protocolBinding"], UNIX_BINDING,
        "expected the unix card's interface to name the jsonrpc-unix binding: {card}"
    );
    assert_eq!(
        iface["url"],
        format!("unix://{}", d.unix.display()),
        "expected the unix card's interface url: {card}"
    );
    // The refusal is logged for the refused uid only, never for root.
    assert!(
        !d.stderr()
            .lines()
            .any(|l| l.contains(REFUSAL_LOG) && l.contains("uid=0")),
        "expected no refusal logged for root; stderr:\n{}",
        d.stderr()
    );
    d.assert_alive();
}

fn unix_peer_needs_no_bearer(driver: &str) {
    let token = "e2e-unix-peer-token";
    let mut d = start(driver, token);

    // No Authorization over the unix socket: the kernel vouched for the peer.
    let mut c = d.connect_unix();
    let result = c.rpc_ok("ListTasks", json!({}));
    assert_eq!(
        result["totalSize"], 0,
        "expected ListTasks over the {driver} unix socket to list no task: {result}"
    );

    // The same call over TCP is refused: the bearer is in force there.
    let mut t = d.connect_tcp();
    let resp = t.request(&rpc_request("1", "ListTasks", &json!({})));
    assert_eq!(
        resp.status,
        401,
        "expected ListTasks without Authorization over TCP to answer 401 on the {driver} \
         daemon with a bearer: {} {:?}",
        resp.reason,
        resp.body_text()
    );
    assert_eq!(
        resp.header("www-authenticate"),
        Some("Bearer realm=\"agentd\""),
        "expected the bearer challenge"
    );
    // And with the token it is served.
    let auth = format!("Authorization: Bearer {token}");
    let headers = [RPC_HEADERS[0], RPC_HEADERS[1], auth.as_str()];
    let resp = t.request(&post(&headers, &rpc_body("2", "ListTasks", &json!({}))));
    common::assert_json_200(&resp, "ListTasks with the bearer over TCP");
    assert_eq!(resp.json()["result"]["totalSize"], 0);
    d.assert_alive();
}

// ---------------------------------------------------------------------------------------
// Acting as another uid.

/// How to run a command as [`OTHER_UID`], and the python that uid can run.
struct OtherUid {
    /// `setpriv …` or `runuser …`, ready for the command.
    prefix: Vec<String>,
    python: PathBuf,
}

/// The client: connects, sends a whole card request, reads to the end; prints `key value`
/// lines. Socket errors are reported by errno name.
const CLIENT: &str = r#"
import errno, os, socket, sys
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
print("uid", os.getuid(), flush=True)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect", name(e))
    sys.exit(0)
print("connect ok", flush=True)
got = b""
try:
    s.sendall(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n")
    print("sent all", flush=True)
    while True:
        b = s.recv(65536)
        if not b:
            print("end eof")
            break
        got += b
except socket.timeout:
    print("end timeout")
except OSError as e:
    print("end", name(e))
print("received", len(got))
print("bytes", repr(got[:300]))
"#;

impl OtherUid {
    /// Fails (never skips) when a tool is missing, saying what `scripts/test.sh` installs.
    fn find() -> OtherUid {
        let prefix = if let Some(setpriv) = find_tool("setpriv") {
            vec![
                setpriv.display().to_string(),
                format!("--reuid={OTHER_UID}"),
                format!("--regid={OTHER_UID}"),
                "--clear-groups".into(),
                "--".into(),
            ]
        } else if let Some(runuser) = find_tool("runuser") {
            vec![
                runuser.display().to_string(),
                "-u".into(),
                OTHER_USER.into(),
                "--".into(),
            ]
        } else {
            panic!(
                "neither setpriv nor runuser is installed: this test needs one to act as uid \
                 {OTHER_UID} (Debian package util-linux, which scripts/test.sh installs)"
            );
        };
        // Not a python under /root (pyenv): the other uid could not run it.
        let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
            .iter()
            .map(PathBuf::from)
            .find(|p| {
                fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o001 != 0)
            })
            .unwrap_or_else(|| {
                panic!(
                    "no python3 that uid {OTHER_UID} can run in /usr/bin or /usr/local/bin: \
                     this test's client needs one (Debian package python3-minimal, which \
                     scripts/test.sh installs)"
                )
            });
        OtherUid { prefix, python }
    }

    /// Runs the client as the other uid against `socket`, bounded by [`CLIENT_TIMEOUT`].
    fn connect_and_get_card(&self, socket: &Path) -> ClientRun {
        let mut cmd = Command::new(&self.prefix[0]);
        cmd.args(&self.prefix[1..])
            .arg(&self.python)
            .arg("-I")
            .arg("-c")
            .arg(CLIENT)
            .arg(socket)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let what = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("expected to start {what}: {e}"));
        let stdout = drain(child.stdout.take().unwrap());
        let stderr = drain(child.stderr.take().unwrap());
        let deadline = Instant::now() + CLIENT_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("expected the client run as uid {OTHER_UID} to end within {CLIENT_TIMEOUT:?}: {what}");
                }
            }
        };
        let out = stdout
            .recv_timeout(Duration::from_secs(2))
            .unwrap_or_default();
        let err = stderr
            .recv_timeout(Duration::from_secs(2))
            .unwrap_or_default();
        assert!(
            status.success(),
            "expected the client run as uid {OTHER_UID} to exit 0, it exited {status}:\n\
             stdout:\n{out}\nstderr:\n{err}"
        );
        ClientRun { out, err }
    }
}

/// What the client printed.
struct ClientRun {
    out: String,
    err: String,
}

impl ClientRun {
    /// The rest of the first line starting with `key `.
    fn value(&self, key: &str) -> Option<&str> {
        self.out
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
    }

    fn assert_uid(&self) {
        assert_eq!(
            self.value("uid"),
            Some(OTHER_UID.to_string().as_str()),
            "expected the client to run as uid {OTHER_UID}:\n{}",
            self.transcript()
        );
    }

    fn transcript(&self) -> String {
        format!("stdout:\n{}stderr:\n{}", self.out, self.err)
    }
}

/// Reads a pipe to its end on a thread.
fn drain(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

/// An executable named `name` on PATH or in the usual system directories.
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

fn assert_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test must run as root (CI does): it acts as uid {OTHER_UID} and checks that root \
         is served"
    );
}

// ---------------------------------------------------------------------------------------
// The launcher.

/// A [`common::Daemon`] with a bearer (read from [`BEARER_ENV`], set on the child) and info
/// logs. Its temp dir is mode 0755, traversable by the other uid whatever the umask: the
/// socket's own mode decides.
/// The uid check comes before admission: at the connection limit, a uid that may not be
/// served still gets no byte of HTTP (not the busy 503), and the refusal is logged.
fn a_refused_uid_gets_no_byte_even_at_the_connection_limit(driver: &str) {
    assert_root();
    let as_other = OtherUid::find();
    let setup = Setup {
        limits: "max_connections = 1".into(),
        env: vec![("AGENTD_LOG".into(), "info".into())],
        ..Setup::default()
    };
    let d = Daemon::start_prepared(driver, &setup, |dir| {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).expect("chmod the temp dir")
    });
    // Root holds the one slot.
    let mut held = d.connect_unix();
    assert_eq!(held.get_card().status, 200, "{driver}: root is served");
    fs::set_permissions(&d.unix, fs::Permissions::from_mode(0o666)).expect("chmod 0666");
    let run = as_other.connect_and_get_card(&d.unix);
    run.assert_uid();
    assert_eq!(
        run.value("received"),
        Some("0"),
        "expected no HTTP byte (not a 503) for uid {OTHER_UID} on the {driver} daemon at its \
         connection limit; the client said:\n{}",
        run.transcript()
    );
    let line = wait_for_log(&d, |l| {
        l.contains(REFUSAL_LOG) && l.contains(&format!("uid={OTHER_UID}"))
    });
    assert!(
        line.is_some(),
        "expected the {driver} daemon to log the refusal; stderr:\n{}",
        d.stderr()
    );
    drop(held);
}

fn start(driver: &str, bearer: &str) -> Daemon {
    let setup = Setup {
        a2a: format!("bearer = \"{{{{secret:{BEARER_ENV}}}}}\""),
        env: vec![
            (BEARER_ENV.into(), bearer.into()),
            ("AGENTD_LOG".into(), "info".into()),
        ],
        ..Setup::default()
    };
    Daemon::start_prepared(driver, &setup, |dir| {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).expect("chmod the temp dir")
    })
}

/// The first stderr line of `d` that `want` accepts, waiting up to 5 s for it.
fn wait_for_log(d: &Daemon, want: impl Fn(&str) -> bool) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(l) = d.stderr().lines().find(|l| want(l)) {
            return Some(l.to_owned());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The effective uid of `d`'s process, as the kernel reports it.
fn euid(d: &Daemon) -> u32 {
    let pid = d.pid();
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("expected /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
        .unwrap_or_else(|| panic!("expected a Uid: line in /proc/{pid}/status:\n{status}"))
}
