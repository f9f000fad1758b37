//! A full disk for the end-to-end tests: the daemon's data directory on a small tmpfs,
//! mounted in a mount namespace of the daemon's own, filled and freed through
//! `/proc/<pid>/root`. Needs `unshare` and `mount` (util-linux): as root it unshares the
//! mount namespace; as another user it maps itself to root in a user namespace first, as
//! unprivileged users may.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{post, rpc_body, Daemon, Via, RPC_HEADERS};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next().map(|u| u == "0"))
        .unwrap_or(false)
}

/// Runs the daemon with a tmpfs of `size_kib` over `data`, in a mount namespace of its own.
/// `seed`: files copied in first (a data directory from an earlier run). `full`: the disk is
/// filled before the daemon starts.
pub fn tmpfs_launcher(data: &Path, size_kib: u32, seed: Option<&Path>, full: bool) -> Vec<String> {
    let quote = |p: &Path| format!("'{}'", p.display());
    let mut script = format!(
        "mount -t tmpfs -o size={size_kib}k,mode=0700 agentd-test {d} || exit 97; ",
        d = quote(data)
    );
    if let Some(seed) = seed {
        script.push_str(&format!(
            "cp -a {s}/. {d}/ || exit 98; ",
            s = quote(seed),
            d = quote(data)
        ));
    }
    if full {
        script.push_str(&format!(
            "head -c 1G /dev/zero > {d}/filler 2>/dev/null; ",
            d = quote(data)
        ));
    }
    script.push_str("exec \"$@\"");
    let mut words: Vec<String> = vec!["unshare".into()];
    if !is_root() {
        words.extend(["--user".into(), "--map-root-user".into()]);
    }
    words.extend([
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        script,
        "sh".into(),
    ]);
    words
}

/// The daemon's view of a path in its own mount namespace.
pub fn inside(d: &Daemon, path: &Path) -> PathBuf {
    Path::new(&format!("/proc/{}/root", d.pid())).join(path.strip_prefix("/").unwrap())
}

/// Fills the daemon's disk: writes `filler` until the kernel says ENOSPC.
pub fn fill(d: &Daemon, data: &Path) -> PathBuf {
    let path = inside(d, &data.join("filler"));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("create the filler in the daemon's tmpfs");
    let chunk = vec![0u8; 64 << 10];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling the tmpfs: expected ENOSPC, got {e}"),
        }
    }
    path
}

/// The `store` member of the status document.
pub fn store_status(d: &Daemon) -> Value {
    let params = json!({"message": {
        "role": "ROLE_USER", "messageId": "status", "extensions": [COMMAND_URI],
        "parts": [{"data": {"agentd": {"op": "status"}}}],
    }});
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let headers = [RPC_HEADERS[0], RPC_HEADERS[1], ext.as_str()];
    let v = d
        .connect(Via::Tcp)
        .request(&post(&headers, &rpc_body("1", "SendMessage", &params)))
        .json();
    v["result"]["message"]["parts"][0]["data"]["store"].clone()
}

pub fn wait_healed(d: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let s = store_status(d);
        if s["state"] == "ok" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the store heals once space returns: {s}; stderr:\n{}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Copies the files of a flat directory.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Freezes the daemon (a crash at this instant, as far as its files are concerned), copies
/// its data directory out of its namespace, and kills it: the copy is what a restart after a
/// SIGKILL finds.
pub fn crash_and_copy(d: &mut Daemon, data: &Path, to: &Path) {
    d.signal("STOP");
    copy_dir(&inside(d, data), to);
    d.kill();
    let _ = std::fs::remove_file(to.join("filler"));
}
