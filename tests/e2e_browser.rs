//! CORS as a real browser sees it: headless Chromium loads a page from a listed origin
//! (`[a2a.cors] origins`) whose script calls both drivers' daemons with `fetch`, and reads
//! the answers (200, the `a2a-extensions` echo, `totalSize`), the 401 and its readable
//! `WWW-Authenticate` challenge. The same page from an unlisted origin gets the public card
//! but its calls fail in the browser (a `TypeError`: the daemon answered 403 without CORS
//! headers).
//!
//! Needs Debian's `chromium`, which `scripts/test.sh` installs; without it the test fails (no skip).
//! The pages come from a small std HTTP server on loopback in this process. Chromium runs in
//! its own process group with a deadline; afterwards every process of the run is killed and
//! reaped (this process is made a child subreaper, so the helpers chromium orphans, such as
//! the crashpad handler that starts its own session, come back to it). Keep one chromium test
//! in this file: that cleanup takes any chromium child of this process for a leftover.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::chromium::{find_tool, pid, stop_leftovers};
use common::{bare, post, rpc_body, Daemon, Setup, RPC_HEADERS};
use rustix::process::Signal;
use serde_json::json;

const ANNOTATIONS: &str = "https://agentd.dev/a2a/ext/task-annotations";
const CHALLENGE: &str = "Bearer realm=\"agentd\"";
const BEARER_ENV: &str = "AGENTD_E2E_BEARER";
const PAGE: &str = include_str!("browser/page.html");

/// A whole chromium run, start to exit.
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(25);

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

#[test]
fn a_listed_origin_reads_the_answers_and_an_unlisted_one_is_refused() {
    let chromium = find_tool("chromium").unwrap_or_else(|| {
        panic!(
            "chromium is not installed: this test drives a real headless Chromium. scripts/test.sh \
             installs it (apt-get install -y --no-install-recommends chromium)"
        )
    });
    // Chromium's orphaned helpers come back to this process, to be reaped.
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let work = TempDir::new("agentd-e2e-browser");

    let listed = PageServer::start();
    let unlisted = PageServer::start();
    let listed_origin = format!("http://127.0.0.1:{}", listed.port);
    let unlisted_origin = format!("http://127.0.0.1:{}", unlisted.port);

    let token = format!(
        "e2e-browser-{}-{:x}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    let mut daemons: Vec<Daemon> = common::DRIVERS
        .iter()
        .map(|driver| start_daemon(driver, &token, &listed_origin))
        .collect();
    let targets: Vec<_> = daemons
        .iter()
        .map(|d| json!({"driver": d.driver, "url": format!("http://{}/", d.tcp)}))
        .collect();
    let config = json!({"token": token, "targets": targets});
    let page = PAGE.replace("__CONFIG__", &config.to_string());
    listed.set_page(&page);
    unlisted.set_page(&page);

    // The listed origin: everything readable.
    let run = run_chromium(&chromium, &format!("{listed_origin}/page.html"), &work.0);
    assert_eq!(
        listed.requests(),
        vec!["GET /page.html"],
        "expected chromium to load the page from {listed_origin}"
    );
    run.expect("done", "yes");
    for d in &daemons {
        let p = &d.driver;
        run.expect(&format!("{p}.card.status"), "200");
        run.expect(&format!("{p}.authed.status"), "200");
        run.expect(&format!("{p}.authed.extensions"), ANNOTATIONS);
        run.expect(&format!("{p}.authed.totalSize"), "0");
        run.expect(&format!("{p}.anon.status"), "401");
        run.expect(&format!("{p}.anon.challenge"), CHALLENGE);
    }

    // An unlisted origin: the card (public) is reached, every call fails in the browser.
    let run = run_chromium(&chromium, &format!("{unlisted_origin}/page.html"), &work.0);
    assert_eq!(
        unlisted.requests(),
        vec!["GET /page.html"],
        "expected chromium to load the page from {unlisted_origin}"
    );
    run.expect("done", "yes");
    for d in &daemons {
        let p = &d.driver;
        run.expect(&format!("{p}.card.status"), "200");
        for call in ["authed", "anon"] {
            let key = format!("{p}.{call}.error");
            let error = run.get(&key);
            assert!(
                error.is_some_and(|e| e.starts_with("TypeError")),
                "expected the {call} fetch from the unlisted origin {unlisted_origin} to the \
                 {p} daemon to reject with a TypeError, got {key} = {error:?}; {}",
                run.report()
            );
            let status = format!("{p}.{call}.status");
            assert!(
                run.get(&status).is_none(),
                "expected no status readable from the unlisted origin, got {status} = {:?}",
                run.get(&status)
            );
        }
    }

    // What the browser met there, on the wire: 403, no CORS header, preflight and call alike.
    for d in &mut daemons {
        let origin = format!("Origin: {unlisted_origin}");
        let mut c = d.connect_tcp();
        let preflight = c.request(&bare(
            "OPTIONS",
            "/",
            &[
                &origin,
                "Access-Control-Request-Method: POST",
                "Access-Control-Request-Headers: a2a-extensions,a2a-version,authorization,content-type",
            ],
        ));
        let auth = format!("Authorization: Bearer {token}");
        let mut c = d.connect_tcp();
        let call = c.request(&post(
            &[RPC_HEADERS[0], RPC_HEADERS[1], &origin, &auth],
            &rpc_body("1", "ListTasks", &json!({})),
        ));
        for (what, resp) in [("preflight", &preflight), ("call", &call)] {
            assert_eq!(
                resp.status, 403,
                "expected the {} daemon to refuse the unlisted origin's {what} with 403: {:?}",
                d.driver, resp.headers
            );
            assert!(
                resp.headers
                    .iter()
                    .all(|(n, _)| !n.starts_with("access-control-")),
                "expected no CORS header on the {} daemon's 403 to the {what}: {:?}",
                d.driver,
                resp.headers
            );
        }
        d.assert_alive();
    }
}

// ---------------------------------------------------------------------------------------
// Chromium.

/// What a chromium `--dump-dom` run produced.
struct BrowserRun {
    url: String,
    dom: String,
    stderr: String,
    /// `KEY -> VALUE` of every `<div id="r:KEY">VALUE</div>`.
    results: BTreeMap<String, String>,
}

impl BrowserRun {
    fn get(&self, key: &str) -> Option<&str> {
        self.results.get(key).map(String::as_str)
    }

    fn expect(&self, key: &str, want: &str) {
        assert_eq!(
            self.get(key),
            Some(want),
            "expected {key} = {want:?} in the page {}; {}",
            self.url,
            self.report()
        );
    }

    fn report(&self) -> String {
        let noise = ["dbus", "unexpected operator"];
        let stderr: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| !noise.iter().any(|n| l.contains(n)))
            .collect();
        format!(
            "results {:#?}\nchromium stderr (noise filtered):\n{}\nDOM tail:\n{}",
            self.results,
            stderr.join("\n"),
            tail(&self.dom, 3000)
        )
    }
}

/// The last `n` bytes of `s` or a little more, cut at a char boundary.
fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[i..]
}

/// Loads `url` in a fresh headless chromium and dumps the DOM, bounded by
/// [`CHROMIUM_TIMEOUT`]; every process of the run is gone when it returns.
fn run_chromium(chromium: &Path, url: &str, work: &Path) -> BrowserRun {
    let n = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
    let profile = work.join(format!("profile-{n}"));
    let home = work.join(format!("home-{n}"));
    fs::create_dir_all(&home).expect("create chromium's HOME");
    let stderr_path = work.join(format!("chromium-{n}.stderr"));
    let stderr_file = fs::File::create(&stderr_path).expect("create chromium's stderr log");
    let mut cmd = Command::new(chromium);
    cmd.args(common::chromium::HEADLESS_FLAGS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--virtual-time-budget=5000")
        .arg("--dump-dom")
        .arg(url);
    let mut child = common::chromium::isolate(&mut cmd, &home, work)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr_file))
        .spawn()
        .unwrap_or_else(|e| panic!("expected to start {}: {e}", chromium.display()));
    let pgid = child.id();
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = BufReader::new(stdout).read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    let deadline = Instant::now() + CHROMIUM_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => break None,
        }
    };
    if status.is_none() {
        let _ = rustix::process::kill_process_group(pid(pgid), Signal::KILL);
        let _ = child.wait();
    }
    stop_leftovers(pgid);
    let dom = rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    let stderr = fs::read_to_string(&stderr_path).unwrap_or_default();
    let run = BrowserRun {
        url: url.to_owned(),
        results: results(&dom),
        dom,
        stderr,
    };
    match status {
        None => panic!(
            "expected chromium to dump {url} within {CHROMIUM_TIMEOUT:?}; killed it; {}",
            run.report()
        ),
        Some(s) if !s.success() => panic!(
            "expected chromium to exit 0, it exited {s}; {}",
            run.report()
        ),
        Some(_) => run,
    }
}

/// The `<div id="r:KEY">VALUE</div>` of a dumped DOM.
fn results(dom: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = dom;
    while let Some(i) = rest.find("<div id=\"r:") {
        rest = &rest[i + "<div id=\"r:".len()..];
        let Some((key, after)) = rest.split_once("\">") else {
            break;
        };
        let Some((value, after)) = after.split_once("</div>") else {
            break;
        };
        out.insert(unescape(key), unescape(value));
        rest = after;
    }
    out
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

// ---------------------------------------------------------------------------------------
// The page server.

/// Serves one page at `/page.html` on `127.0.0.1:PORT` (404 elsewhere), a thread per
/// connection, each read bounded. Stopped and joined on drop.
struct PageServer {
    port: u16,
    page: Arc<Mutex<String>>,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PageServer {
    fn start() -> PageServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a page server");
        listener.set_nonblocking(true).expect("nonblocking accept");
        let port = listener.local_addr().unwrap().port();
        let page = Arc::new(Mutex::new(String::new()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, l, s) = (page.clone(), log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (p, l) = (p.clone(), l.clone());
                        conns.push(std::thread::spawn(move || serve_page(stream, &p, &l)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        PageServer {
            port,
            page,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn set_page(&self, html: &str) {
        *self.page.lock().unwrap() = html.to_owned();
    }

    /// `METHOD PATH` of the requests served, favicon probes left out.
    fn requests(&self) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|r| !r.contains("favicon"))
            .cloned()
            .collect()
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request per connection: the head is read (bounded), the answer closes.
fn serve_page(mut stream: TcpStream, page: &Mutex<String>, log: &Mutex<Vec<String>>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let mut first = head.lines().next().unwrap_or_default().split(' ');
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    log.lock().unwrap().push(format!("{method} {path}"));
    let (status, body) = if method == "GET" && path == "/page.html" {
        ("200 OK", page.lock().unwrap().clone())
    } else {
        ("404 Not Found", String::from("not here\n"))
    };
    let kind = if status.starts_with("200") {
        "text/html; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
         cache-control: no-store\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes());
    let _ = stream.flush();
}

// ---------------------------------------------------------------------------------------
// Chromium's work dir, and the daemons.

/// A temp dir removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}-{nanos:x}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A [`common::Daemon`] with a bearer (read from [`BEARER_ENV`], set on the child) and one
/// listed CORS origin.
fn start_daemon(driver: &str, bearer: &str, origin: &str) -> Daemon {
    let setup = Setup {
        a2a: format!("bearer = \"{{{{secret:{BEARER_ENV}}}}}\""),
        sections: format!("[a2a.cors]\norigins = [\"{origin}\"]\n"),
        env: vec![(BEARER_ENV.into(), bearer.into())],
        ..Setup::default()
    };
    Daemon::start_setup(driver, &setup)
}
