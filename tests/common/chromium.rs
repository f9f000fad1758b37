//! Headless Chromium's leftovers, shared by the browser tests (tests/e2e_browser.rs,
//! tests/e2e_console.rs): where chromium is, and how every process of a run is killed and
//! reaped afterwards (the test process is made a child subreaper, so the helpers chromium
//! orphans come back to it).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

/// The flags every headless run takes: no sandbox (tests run as root), no GPU, and nothing
/// that reaches past loopback (no QUIC, no proxy, no background or component fetches).
pub const HEADLESS_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-proxy-server",
];

/// Keeps a chromium command to itself: `home` as its HOME and config/cache dirs, `work` as
/// its directory and TMPDIR, no flags from the environment, and a process group of its own (for
/// [`stop_leftovers`]).
pub fn isolate<'c>(cmd: &'c mut Command, home: &Path, work: &Path) -> &'c mut Command {
    // TMPDIR too: chromium makes its profile's singleton socket dir there
    // (`org.chromium.Chromium.*`), which a killed run leaves behind; under `work` it goes
    // with the test's own files.
    cmd.env("HOME", home)
        .env("TMPDIR", work)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env_remove("CHROMIUM_FLAGS")
        .current_dir(work)
        .process_group(0)
}

pub fn pid(raw: u32) -> Pid {
    let raw = i32::try_from(raw).expect("a pid fits an i32");
    assert!(raw > 1, "never signal init or everything");
    Pid::from_raw(raw).expect("a nonzero pid")
}

/// Kills and reaps what is left of a chromium run: its process group, and the chromium
/// processes this (subreaper) process inherited from it (the crashpad handler leaves the
/// group). Only processes named `chrom…` are touched. Bounded to 5 s.
pub fn stop_leftovers(pgid: u32) {
    let me = std::process::id();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let _ = rustix::process::kill_process_group(pid(pgid), Signal::KILL);
        let mut left = Vec::new();
        for p in processes() {
            let ours = p.ppid == me;
            if !p.comm.starts_with("chrom") || !(ours || p.pgid == pgid) {
                continue;
            }
            if p.state == 'Z' {
                if ours {
                    let _ = rustix::process::waitpid(Some(pid(p.pid)), WaitOptions::NOHANG);
                    left.push(p);
                }
                // Someone else's zombie is dead already, and not ours to reap.
                continue;
            }
            let _ = rustix::process::kill_process(pid(p.pid), Signal::KILL);
            left.push(p);
        }
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            eprintln!("chromium processes still there after 5 s: {left:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug)]
struct Proc {
    pid: u32,
    ppid: u32,
    pgid: u32,
    state: char,
    comm: String,
}

/// Every process in /proc: `pid (comm) state ppid pgrp …` of its `stat`.
fn processes() -> Vec<Proc> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let open = stat.find('(')?;
            let close = stat.rfind(')')?;
            let comm = stat[open + 1..close].to_owned();
            let mut f = stat[close + 1..].split_whitespace();
            let state = f.next()?.chars().next()?;
            let ppid = f.next()?.parse().ok()?;
            let pgid = f.next()?.parse().ok()?;
            Some(Proc {
                pid,
                ppid,
                pgid,
                state,
                comm,
            })
        })
        .collect()
}

/// An executable named `name` on PATH or in /usr/bin.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}
