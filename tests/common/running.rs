//! A process group a test starts: stopped gracefully (SIGTERM to the group, then SIGKILL
//! after 10 s) and reaped when dropped, whatever happened in the test.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A process group started for the test, stopped (and reaped) when dropped, whatever happened.
pub struct Running {
    pub child: Child,
    what: &'static str,
}

impl Running {
    pub fn spawn(mut cmd: Command, what: &'static str) -> Running {
        // Its own process group, so stopping it reaches whatever it started.
        cmd.process_group(0);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {what}: {e}"));
        Running { child, what }
    }

    pub fn signal(&self, signal: rustix::process::Signal) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, signal);
        }
    }

    /// Waits for the exit until `deadline`; `None` if it is still running then.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<std::process::ExitStatus> {
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Already exited (and reaped): its pid may be someone else's by now, so no signal.
        // (The daemon's children die with it; bash waited for its own.)
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // A graceful stop first (the daemon drains and shuts its agents down), then a kill.
        self.signal(rustix::process::Signal::TERM);
        if self
            .wait_until(Instant::now() + Duration::from_secs(10))
            .is_none()
        {
            eprintln!("{} did not stop on SIGTERM: killing it", self.what);
            self.signal(rustix::process::Signal::KILL);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
