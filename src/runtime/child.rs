//! The processes the runtime starts (agents, subagents, exec steps) die with the daemon,
//! however it dies, and take everything they started with them.
//!
//! Each child runs in a process group of its own, so a kill reaches whatever it started;
//! the runtime kills that group whenever it ends a child. That leaves an unclean death of
//! the daemon itself (SIGKILL, a crash, the OOM killer): nothing would then kill the group,
//! and an agent that ignores the end of its input would outlive the daemon for good.
//!
//! So the daemon does not start the program directly. It starts a *keeper*: its own binary
//! again (`agentd --keep-process-group -- PROGRAM ARGS…`), a single-purpose process that
//! leads the child's group, runs the program in it with the stdio it was given, and exits
//! as the program did. The kernel sends the keeper SIGTERM when the daemon goes away
//! (`PR_SET_PDEATHSIG`), and the keeper answers any SIGTERM, SIGHUP or SIGINT by killing
//! its whole group, itself included. The keeper costs one small process per child; it
//! loads no configuration and starts no runtime.
//!
//! The kernel sends the death signal when the *thread* that forked the keeper exits, not
//! the process, so a child is spawned only from a thread that lives as long as the child is
//! wanted: an agent's monitor thread, or the worker thread that waits for an exec step.
//!
//! Without a keeper (the library used on its own, as the unit tests do), the program is
//! started directly with `PR_SET_PDEATHSIG` = SIGKILL: it still dies with the daemon, but
//! what it started may not.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use rustix::process::Signal;

/// The argument that makes `agentd` a keeper (see the module docs).
pub const KEEPER_FLAG: &str = "--keep-process-group";

static KEEPER: OnceLock<PathBuf> = OnceLock::new();

/// Starts every later child through a keeper running `exe` (the daemon's own binary, which
/// must answer [`KEEPER_FLAG`] by calling [`keeper_main`]).
pub fn use_keeper(exe: PathBuf) {
    let _ = KEEPER.set(exe);
}

/// A command that runs `program` with `args` in a process group of its own that dies with
/// the daemon. `cwd` is the directory it will run in (a relative program path is looked up
/// there). The program is looked up now, so a missing or non-executable one is an error
/// from here, as it would be from a direct spawn, not a keeper that exits 127.
pub fn command(
    program: &str,
    args: &[String],
    path_env: Option<&str>,
    cwd: Option<&Path>,
) -> io::Result<Command> {
    let found = find_program(program, path_env, cwd)?;
    let (mut cmd, signal) = match KEEPER.get() {
        Some(exe) => {
            let mut cmd = Command::new(exe);
            // `ps` shows `agentd --keep-process-group -- PROGRAM …`, not /proc/self/exe.
            cmd.arg0("agentd")
                .arg(KEEPER_FLAG)
                .arg("--")
                .arg(&found)
                .args(args);
            (cmd, Signal::TERM)
        }
        None => {
            let mut cmd = Command::new(&found);
            cmd.args(args);
            (cmd, Signal::KILL)
        }
    };
    // Its own group: a kill reaches what it started, and a terminal's ^C to agentd does not
    // reach it behind agentd's back.
    cmd.process_group(0);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let parent = rustix::process::getpid();
    // The open-file limit the daemon inherited (it raises its own for its connections).
    let soft_nofile = agentd_io_common::os::inherited_soft_fd_limit();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe work is allowed. It makes raw system calls (prlimit, prctl, getppid)
    // through rustix, allocates nothing, takes no lock and touches no shared state.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(soft) = soft_nofile {
                use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
                let hard = getrlimit(Resource::Nofile).maximum;
                setrlimit(
                    Resource::Nofile,
                    Rlimit {
                        current: soft,
                        maximum: hard,
                    },
                )
                .map_err(io::Error::from)?;
            }
            rustix::process::set_parent_process_death_signal(Some(signal))
                .map_err(io::Error::from)?;
            // The daemon may have died between the fork and the prctl; the signal would then
            // never come, so the child gives up on its own.
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::from(io::ErrorKind::Interrupted));
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// Where `program` is, as `execvp` would find it: a name with a slash is a path (relative
/// to `cwd`), any other is searched in `PATH`.
fn find_program(program: &str, path_env: Option<&str>, cwd: Option<&Path>) -> io::Result<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        })
    };
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(
            rustix::io::Errno::NOENT.raw_os_error(),
        ));
    }
    if program.contains('/') {
        let path = Path::new(program);
        let at = match cwd {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        };
        return match std::fs::metadata(&at) {
            Err(e) => Err(e),
            Ok(_) if executable(&at) => Ok(path.to_path_buf()),
            Ok(_) => Err(io::Error::from_raw_os_error(
                rustix::io::Errno::ACCESS.raw_os_error(),
            )),
        };
    }
    let search = path_env
        .map(OsString::from)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| io::Error::from_raw_os_error(rustix::io::Errno::NOENT.raw_os_error()))
}

/// The keeper's whole life: `args` are what follows [`KEEPER_FLAG`] (`-- PROGRAM ARGS…`).
/// Runs the program in this process's group and exits as it did; a SIGTERM (the daemon
/// died), SIGHUP or SIGINT kills the whole group first.
pub fn keeper_main(args: impl Iterator<Item = OsString>) -> ! {
    let mut args = args.skip_while(|a| a == "--");
    let Some(program) = args.next() else {
        eprintln!("agentd {KEEPER_FLAG}: no program to run");
        std::process::exit(2);
    };
    // The handlers are in place before the program starts, so no signal can slip between.
    let group = rustix::process::getpgrp();
    match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGINT,
    ]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                if signals.forever().next().is_some() {
                    let _ = rustix::process::kill_process_group(group, Signal::KILL);
                }
            });
        }
        Err(e) => {
            eprintln!("agentd {KEEPER_FLAG}: signal handlers: {e}");
            std::process::exit(126);
        }
    }
    let status = match Command::new(&program).args(args).status() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("agentd: cannot run {}: {e}", program.to_string_lossy());
            std::process::exit(127);
        }
    };
    // What the program left in the group is the runtime's to kill when it reaps this
    // process (it kills the group then), or this process's if the daemon dies first.
    if let Some(code) = status.code() {
        std::process::exit(code);
    }
    // Killed by a signal: die of the same one, so the daemon reports what really happened.
    let sig = status.signal().unwrap_or(Signal::KILL.as_raw());
    let _ = signal_hook::low_level::emulate_default_handler(sig);
    std::process::exit(128 + sig);
}
