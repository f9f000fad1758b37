//! The `exec` step: run a program (no shell) with templated arguments, a timeout and a
//! cancel switch; its stdout becomes the step's output, a non-zero exit fails the step.

use std::io::Read;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::workflow::OutputMode;

/// Bytes of stdout kept as the output; more fails the step rather than cutting it silently.
pub const MAX_STDOUT: usize = 1024 * 1024;
/// Bytes of stderr's tail quoted in a failure.
const STDERR_TAIL: usize = 2048;

/// One program to run.
#[derive(Clone, Debug)]
pub struct ExecJob {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub output: OutputMode,
}

/// Runs the job to its end, its timeout, or `cancel`. The child runs in its own process
/// group, and the whole group is killed on timeout or cancel, so nothing it started lingers.
pub fn run(job: &ExecJob, cancel: &Arc<AtomicBool>) -> Result<Value, String> {
    let path_env = job
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    // This thread waits for the child to its end, so the child may die with it (`child`).
    let mut child = super::child::command(&job.program, &job.args, path_env, None)
        .and_then(|mut cmd| {
            cmd.envs(job.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .map_err(|e| format!("cannot run {}: {e}", job.program))?;
    let stdout = child.stdout.take().map(|s| reader(s, MAX_STDOUT + 1));
    let stderr = child.stderr.take().map(|s| reader(s, 64 * 1024));
    let deadline = Instant::now() + job.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for {}: {e}", job.program)),
        }
        let why = if cancel.load(Ordering::Relaxed) {
            Some("canceled".to_owned())
        } else if Instant::now() >= deadline {
            Some(format!("timed out after {} ms", job.timeout.as_millis()))
        } else {
            None
        };
        if let Some(why) = why {
            kill_group(&child);
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{} {why}", job.program));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = stdout.map(join).unwrap_or_default();
    let err = stderr.map(join).unwrap_or_default();
    if !status.success() {
        let tail = tail(&err);
        let how = match status.code() {
            Some(c) => format!("exit status {c}"),
            None => "killed by a signal".to_owned(),
        };
        return Err(if tail.is_empty() {
            format!("{} failed: {how}", job.program)
        } else {
            format!("{} failed: {how}: {tail}", job.program)
        });
    }
    if out.len() > MAX_STDOUT {
        return Err(format!(
            "{} wrote more than {MAX_STDOUT} bytes to stdout",
            job.program
        ));
    }
    let text = String::from_utf8_lossy(&out);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    match job.output {
        OutputMode::Text => Ok(Value::String(text.to_owned())),
        OutputMode::Json => {
            serde_json::from_str(text).map_err(|e| format!("{} printed no JSON: {e}", job.program))
        }
        OutputMode::Auto => {
            Ok(serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())))
        }
    }
}

fn kill_group(child: &std::process::Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

fn reader<R: Read + Send + 'static>(mut r: R, cap: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        // Read to the end even past the cap, so the child never blocks on a full pipe.
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            let room = cap.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        kept
    })
}

fn join(h: std::thread::JoinHandle<Vec<u8>>) -> Vec<u8> {
    h.join().unwrap_or_default()
}

fn tail(err: &[u8]) -> String {
    let s = String::from_utf8_lossy(err);
    let s = s.trim();
    let mut start = s.len().saturating_sub(STDERR_TAIL);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(program: &str, args: &[&str], timeout_ms: u64) -> ExecJob {
        ExecJob {
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: vec![("AGENTD_TEST".into(), "yes".into())],
            timeout: Duration::from_millis(timeout_ms),
            output: OutputMode::Auto,
        }
    }

    #[test]
    fn stdout_is_the_output_json_or_text() {
        let no = Arc::new(AtomicBool::new(false));
        assert_eq!(
            run(&job("/bin/echo", &["{\"a\":1}"], 5000), &no).unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(
            run(&job("/bin/echo", &["hello"], 5000), &no).unwrap(),
            "hello"
        );
        let env = run(&job("/bin/sh", &["-c", "echo $AGENTD_TEST"], 5000), &no).unwrap();
        assert_eq!(env, "yes");
    }

    #[test]
    fn failures_say_why() {
        let no = Arc::new(AtomicBool::new(false));
        let e = run(&job("/bin/sh", &["-c", "echo oops >&2; exit 3"], 5000), &no).unwrap_err();
        assert!(e.contains("exit status 3") && e.contains("oops"), "{e}");
        let e = run(&job("/nonexistent/prog", &[], 5000), &no).unwrap_err();
        assert!(e.contains("cannot run"), "{e}");
        let started = Instant::now();
        let e = run(&job("/bin/sh", &["-c", "sleep 30 & sleep 30"], 200), &no).unwrap_err();
        assert!(e.contains("timed out"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn cancel_kills_the_program() {
        let cancel = Arc::new(AtomicBool::new(false));
        let c = cancel.clone();
        let t = std::thread::spawn(move || run(&job("/bin/sleep", &["30"], 60_000), &c));
        std::thread::sleep(Duration::from_millis(100));
        cancel.store(true, Ordering::Relaxed);
        let e = t.join().unwrap().unwrap_err();
        assert!(e.contains("canceled"), "{e}");
    }
}
