//! Two agentd instances delegating to each other: the example in `examples/delegation/`
//! (the front's workflow delegates its build to the worker over the worker's unix socket,
//! asks a person, then tells the worker), the same over TCP, and a peer that is gone
//! failing the step with the reason.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";

/// A daemon started from a config file; killed on drop.
struct Instance {
    child: Child,
    /// The `listening` URLs it printed.
    urls: Vec<String>,
    log: PathBuf,
}

impl Instance {
    fn start(config: &Path, log: PathBuf, listeners: usize) -> Instance {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentd"))
            .arg("--config")
            .arg(config)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn agentd");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut urls = Vec::new();
        while urls.len() < listeners {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(line) => {
                    if let Some(u) = line.strip_prefix("listening ") {
                        urls.push(u.to_owned());
                    }
                }
                Err(_) => panic!(
                    "agentd did not start: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        }
        Instance { child, urls, log }
    }

    fn tcp(&self) -> String {
        let u = self.urls.iter().find(|u| u.starts_with("http://")).unwrap();
        u.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request over a fresh connection; returns the JSON body.
fn request(stream: &mut dyn ReadWrite, body: &Value, extensions: Option<&str>) -> Value {
    let body = body.to_string();
    let ext = extensions
        .map(|e| format!("A2A-Extensions: {e}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n{ext}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (_, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn tcp(addr: &str) -> Box<dyn ReadWrite> {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    Box::new(s)
}

fn unix(path: &str) -> Box<dyn ReadWrite> {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    Box::new(s)
}

fn ship(front: &str, target: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "role": "ROLE_USER", "messageId": format!("m-{target}"), "extensions": [COMMAND_URI],
        "parts": [{"data": {"agentd": {"op": "ship.start", "target": target}}}]}}});
    request(&mut *tcp(front), &body, Some(COMMAND_URI))
}

fn answer(front: &str, task: &str, approve: bool) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": {
        "role": "ROLE_USER", "messageId": format!("a-{task}"), "taskId": task,
        "parts": [{"data": {"approve": approve}}]}}});
    request(&mut *tcp(front), &body, None)
}

/// The example's config files, with its socket directory, port and agent path made this
/// test's own; `peer` replaces the front's peer endpoint when given.
fn example(dir: &Path, peer: Option<&str>) -> (PathBuf, PathBuf) {
    let here = env!("CARGO_MANIFEST_DIR");
    let fix = |text: String| {
        text.replace("/tmp/agentd-example", dir.to_str().unwrap())
            .replace("tcp://127.0.0.1:8420", "tcp://127.0.0.1:0")
    };
    let worker =
        fix(std::fs::read_to_string(format!("{here}/examples/delegation/worker.toml")).unwrap());
    let mut front =
        fix(std::fs::read_to_string(format!("{here}/examples/delegation/front.toml")).unwrap());
    if let Some(p) = peer {
        let unix = format!("unix://{}/worker.sock", dir.display());
        front = front.replace(&unix, p);
    }
    let (w, f) = (dir.join("worker.toml"), dir.join("front.toml"));
    std::fs::write(&w, worker).unwrap();
    std::fs::write(&f, front).unwrap();
    (w, f)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agentd-deleg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run_the_example(front: &Instance, worker_rpc: impl Fn(&Value) -> Value) {
    let addr = front.tcp();
    let started = ship(&addr, "app");
    let t = &started["result"]["task"];
    assert_eq!(
        t["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED",
        "{started}\n{}",
        std::fs::read_to_string(&front.log).unwrap_or_default()
    );
    assert_eq!(
        t["status"]["message"]["parts"][0]["text"], "Ship app.tar.gz?",
        "the delegated build's output fills the question"
    );
    let id = t["id"].as_str().unwrap().to_owned();
    let done = answer(&addr, &id, true);
    let t = &done["result"]["task"];
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    // The worker's echo agent answered the announcement; it is the run's output.
    let result = t["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifactId"] == format!("{id}.result"))
        .unwrap();
    assert_eq!(result["parts"][0]["text"], "shipped app.tar.gz");

    // On the worker: the build ran as a command task, and the announcement as a turn.
    let listed = worker_rpc(
        &json!({"jsonrpc": "2.0", "id": 3, "method": "ListTasks", "params": {"includeArtifacts": true}}),
    );
    let tasks = listed["result"]["tasks"].as_array().unwrap().clone();
    assert_eq!(tasks.len(), 2, "{listed}");
    assert!(
        tasks
            .iter()
            .all(|t| t["status"]["state"] == "TASK_STATE_COMPLETED"),
        "{listed}"
    );
    let build = tasks.iter().find(|t| {
        t["artifacts"].as_array().is_some_and(|a| {
            a.iter()
                .any(|a| a["parts"][0]["data"]["built_by"] == "worker")
        })
    });
    assert!(build.is_some(), "the worker's build task: {listed}");
}

#[test]
fn the_example_delegates_over_a_unix_socket() {
    let dir = temp_dir("unix");
    let (w, f) = example(&dir, None);
    let worker = Instance::start(&w, dir.join("worker.log"), 1);
    let front = Instance::start(&f, dir.join("front.log"), 1);
    let sock = dir.join("worker.sock").to_str().unwrap().to_owned();
    run_the_example(&front, |body| request(&mut *unix(&sock), body, None));
    drop((front, worker));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_example_delegates_over_tcp_and_a_gone_peer_fails_the_step() {
    let dir = temp_dir("tcp");
    // The worker also listens on TCP; the front's peer is its http:// endpoint.
    let (w, _) = example(&dir, None);
    let text = std::fs::read_to_string(&w).unwrap().replace(
        &format!("listen = \"unix://{}/worker.sock\"", dir.display()),
        &format!(
            "listen = [\"tcp://127.0.0.1:0\", \"unix://{}/worker.sock\"]",
            dir.display()
        ),
    );
    std::fs::write(&w, text).unwrap();
    let mut worker = Instance::start(&w, dir.join("worker.log"), 2);
    let (_, f) = example(&dir, Some(&format!("http://{}", worker.tcp())));
    let front = Instance::start(&f, dir.join("front.log"), 1);
    let worker_addr = worker.tcp();
    run_the_example(&front, |body| request(&mut *tcp(&worker_addr), body, None));

    // The worker goes away: the next delegation fails its step, and the run, saying why.
    let _ = worker.child.kill();
    let _ = worker.child.wait();
    let r = ship(&front.tcp(), "lib");
    let t = &r["result"]["task"];
    assert_eq!(t["status"]["state"], "TASK_STATE_FAILED", "{r}");
    let why = t["status"]["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(
        why.contains("step build failed") && why.contains("peer worker"),
        "{why}"
    );
    drop(front);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The example's own script, as a reader runs it (with this build of agentd): it prints the
/// gate and the shipped artifact, needs no free port 8420, and leaves nothing behind.
#[test]
fn the_example_script_runs_and_cleans_up() {
    let tmp = std::env::temp_dir().join(format!("agentd-run-sh-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    // Whoever holds the default port does not matter to it.
    let held = std::net::TcpListener::bind("127.0.0.1:8420").ok();
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/delegation/run.sh"
        ))
        .env("AGENTD_BIN", env!("CARGO_BIN_EXE_agentd"))
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs the example");
    drop(held);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("TASK_STATE_INPUT_REQUIRED - Ship app.tar.gz?"),
        "{stdout}"
    );
    assert!(
        stdout.contains("TASK_STATE_COMPLETED - [{'text': 'shipped app.tar.gz'}]"),
        "{stdout}"
    );
    assert!(left.is_empty(), "the example left {left:?} behind");
}
