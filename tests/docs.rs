//! The documentation's examples, run as a reader would run them.
//!
//! - Every ```toml block of README.md and docs/*.md is a configuration that loads: each is
//!   written to a file and checked with `agentd --check-config --config FILE`, with every
//!   environment variable a `{{secret:NAME}}` in it names set to a dummy value. A block that
//!   cannot stand alone (it names certificate files, say) is marked ```toml fragment and
//!   skipped; there must be few of those.
//! - The README's quick start (the ```sh blocks under its "## Quick start" heading, with the
//!   `agentd` client) and docs/curl.md's walkthrough (the same with curl) each run with
//!   `bash -euo pipefail` against a real daemon started with examples/quickstart.toml, and
//!   print what the page says they print.

mod common;

use common::running::Running;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The repository root: the documents live here, and the quick start runs from here.
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// At least this many toml blocks are checked: fewer means the extractor broke (or the
/// docs lost their examples).
const MIN_TOML_BLOCKS: usize = 7;
/// At most this many toml blocks may be marked `fragment`.
const MAX_FRAGMENTS: usize = 2;

/// One fenced code block of a Markdown file.
struct Block {
    /// The file, relative to the repository root.
    file: String,
    /// The 1-based line of the opening fence.
    line: usize,
    /// The info string's words (```toml fragment → ["toml", "fragment"]).
    info: Vec<String>,
    text: String,
}

impl Block {
    fn lang(&self) -> &str {
        self.info.first().map_or("", String::as_str)
    }

    fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// The fenced (```) code blocks of `text`, with indented fences (in list items) too.
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(Block, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let block = Block {
                        file: file.to_owned(),
                        line: i + 1,
                        info: info.split_whitespace().map(str::to_owned).collect(),
                        text: String::new(),
                    };
                    open = Some((block, indent));
                }
            }
            Some((block, _)) if trimmed == "```" => out.push(block),
            Some((mut block, fence_indent)) => {
                // Lines of an indented block lose the fence's indentation.
                let cut = line.len() - line.trim_start().len();
                block.text.push_str(&line[cut.min(fence_indent)..]);
                block.text.push('\n');
                open = Some((block, fence_indent));
            }
        }
    }
    if let Some((block, _)) = open {
        panic!("{}: a code block is never closed", block.at());
    }
    out
}

/// README.md and every docs/*.md, as (path relative to the root, text).
fn documents() -> Vec<(String, String)> {
    let root = Path::new(ROOT);
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| {
            e.expect("docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text =
                std::fs::read_to_string(root.join(&n)).unwrap_or_else(|e| panic!("{n}: {e}"));
            (n, text)
        })
        .collect()
}

/// The names of the environment variables `{{secret:NAME}}` references in `text` read.
fn secret_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("{{secret:") {
        rest = &rest[at + "{{secret:".len()..];
        let end = rest.find("}}").unwrap_or(rest.len());
        names.insert(rest[..end].to_owned());
        rest = &rest[end..];
    }
    names
}

/// A temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("agentd-docs-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn every_toml_block_in_the_docs_loads() {
    let tmp = TempDir::new("toml");
    let mut checked = 0;
    let mut fragments = Vec::new();
    let mut failures = Vec::new();
    for (file, text) in documents() {
        for block in blocks(&file, &text) {
            if block.lang() != "toml" {
                continue;
            }
            if block.info.iter().any(|w| w == "fragment") {
                fragments.push(block.at());
                continue;
            }
            checked += 1;
            let path = tmp
                .0
                .join(format!("{}-{}.toml", file.replace('/', "_"), block.line));
            std::fs::write(&path, &block.text).expect("write the block");
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentd"));
            cmd.arg("--check-config")
                .arg("--config")
                .arg(&path)
                .current_dir(ROOT)
                .env("XDG_STATE_HOME", &tmp.0)
                .env_remove("AGENTD_LOG");
            // A distinct value per variable: two credentials may not hold the same secret.
            for name in secret_names(&block.text) {
                cmd.env(&name, format!("docs-test-secret-{name}"));
            }
            let out = cmd.output().expect("agentd runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || !stdout.contains("the configuration is valid") {
                failures.push(format!(
                    "{} (a ```toml block) does not load: exit {:?} (a line N in the error is \
                     line {}+N of {})\n{}{}",
                    block.at(),
                    out.status.code(),
                    block.line,
                    block.file,
                    stdout,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} toml blocks do not load (mark one that cannot stand alone \
         ```toml fragment):\n\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        fragments.len() <= MAX_FRAGMENTS,
        "{} toml blocks are marked fragment ({}), at most {MAX_FRAGMENTS} may be: make them \
         whole configurations",
        fragments.len(),
        fragments.join(", ")
    );
    assert!(
        checked >= MIN_TOML_BLOCKS,
        "only {checked} toml blocks were found in README.md and docs/*.md, expected at least \
         {MIN_TOML_BLOCKS}: is the extractor broken?"
    );
}

/// The ```sh blocks of `file`'s `heading` section, in order.
fn section_blocks(file: &str, heading: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(file)).expect(file);
    let all = blocks(file, &text);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_end() == heading)
        .unwrap_or_else(|| panic!("{file} has a {heading:?} heading"))
        + 1;
    let end = lines[start..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |i| start + i);
    all.into_iter()
        .filter(|b| b.lang() == "sh" && b.line > start && b.line <= end)
        .collect()
}

/// A line with every task or context id (a UUID) replaced by `ID`, every workflow run id
/// (`run-<base36>-<n>`) by `RUN` and every run of digits by `N`: ids, seq numbers and times
/// differ from run to run.
fn normalized(line: &str) -> String {
    let line = without_run_ids(&without_uuids(line.trim()));
    let mut out = String::new();
    let mut in_digits = false;
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('N');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

/// `text` with each word `run-<alphanumerics>-<digits>` replaced by `RUN`.
fn without_run_ids(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            let is_run = w
                .strip_prefix("run-")
                .and_then(|r| r.rsplit_once('-'))
                .is_some_and(|(stamp, n)| {
                    !stamp.is_empty()
                        && stamp.bytes().all(|b| b.is_ascii_alphanumeric())
                        && !n.is_empty()
                        && n.bytes().all(|b| b.is_ascii_digit())
                });
            if is_run {
                "RUN"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with each 8-4-4-4-12 hex UUID replaced by `ID`.
fn without_uuids(text: &str) -> String {
    const SHAPE: [usize; 5] = [8, 4, 4, 4, 12];
    let b = text.as_bytes();
    let is_uuid_at = |i: usize| {
        let mut at = i;
        for (n, len) in SHAPE.iter().enumerate() {
            if b.len() < at + len || !b[at..at + len].iter().all(u8::is_ascii_hexdigit) {
                return false;
            }
            at += len;
            if n < 4 {
                if b.get(at) != Some(&b'-') {
                    return false;
                }
                at += 1;
            }
        }
        true
    };
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if (i == 0 || !b[i - 1].is_ascii_hexdigit()) && is_uuid_at(i) {
            out.push_str("ID");
            i += 36;
        } else {
            let c = text[i..].chars().next().unwrap_or_default();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

#[test]
fn the_readme_quick_start_runs_as_written() {
    walkthrough_runs_as_written(
        "README.md",
        "## Quick start",
        &[
            "message  echo: hello",
            "state    input-required",
            "message  Deploy web with 3 replicas?",
            "artifact result: deploy of web approved",
            " input-required  Deploy web with 3 replicas?",
            " approve start",
            " deploy completed",
        ],
    );
}

#[test]
fn the_curl_walkthrough_runs_as_written() {
    walkthrough_runs_as_written(
        "docs/curl.md",
        "## Walkthrough with curl",
        &[
            "TASK_STATE_COMPLETED - echo: hello",
            "TASK_STATE_INPUT_REQUIRED - Deploy web with 3 replicas?",
            "artifact result: deploy of web approved",
            "hello: newest seq",
            " task TASK_STATE_INPUT_REQUIRED",
            " step approve start",
            " run deploy completed",
        ],
    );
}

/// Runs the ```sh blocks of `file`'s `heading` section with `bash -euo pipefail` against a
/// real daemon started with examples/quickstart.toml, with the binary under test first on
/// `PATH` (a block's `target/release` is this test's binary directory); checks the output
/// holds each of `needles` and every `# …` line the blocks show.
fn walkthrough_runs_as_written(file: &str, heading: &str, needles: &[&str]) {
    let quick = section_blocks(file, heading);
    assert!(
        quick.len() >= 5,
        "{file} {heading} has {} sh blocks; expected the helpers, the card, a message, \
         the workflow, its answer and the feed",
        quick.len()
    );
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_agentd"))
        .parent()
        .expect("the binary's directory")
        .to_owned();

    let tmp = TempDir::new("quickstart");
    let state = tmp.0.join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let daemon_log = tmp.0.join("daemon.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentd"));
    cmd.args([
        "--config",
        "examples/quickstart.toml",
        "--listen",
        "tcp://127.0.0.1:0",
    ])
    .current_dir(ROOT)
    .env("XDG_STATE_HOME", &state)
    .env_remove("AGENTD_LOG")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(&daemon_log).expect("daemon log"));
    let mut daemon = Running::spawn(cmd, "the quick start daemon");
    let log = || std::fs::read_to_string(&daemon_log).unwrap_or_default();

    // The port it bound: its `listening http://127.0.0.1:PORT/` line.
    let stdout = daemon.child.stdout.take().expect("daemon stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let url = loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => {
                if let Some(url) = line.strip_prefix("listening ") {
                    break url.to_owned();
                }
            }
            Err(_) => panic!(
                "the daemon printed no listening line in 30 s; its log:\n{}",
                log()
            ),
        }
    };
    let port = url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|rest| rest.strip_suffix('/'))
        .unwrap_or_else(|| panic!("unexpected listener {url}"));

    let script: String = quick
        .iter()
        .map(|b| b.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
        .replace("127.0.0.1:8420", &format!("127.0.0.1:{port}"))
        .replace("$PWD/target/release", &bin_dir.display().to_string());
    assert!(
        script.contains(&format!("127.0.0.1:{port}")),
        "{file} {heading} names no http://127.0.0.1:8420/"
    );
    let script_file = tmp.0.join("quickstart.sh");
    std::fs::write(&script_file, &script).expect("write the script");
    let out_file = tmp.0.join("quickstart.out");
    let err_file = tmp.0.join("quickstart.err");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.env("PATH", path)
        .env_remove("AGENTD_TOKEN")
        .env("NO_COLOR", "1")
        .arg("-euo")
        .arg("pipefail")
        .arg(&script_file)
        .current_dir(ROOT)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).expect("script output"))
        .stderr(std::fs::File::create(&err_file).expect("script errors"));
    let mut run = Running::spawn(cmd, "the quick start script");
    let status = run.wait_until(Instant::now() + Duration::from_secs(120));
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    let errors = std::fs::read_to_string(&err_file).unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!(
            "the quick start did not finish in 120 s; so far:\n{output}\ndaemon log:\n{}",
            log()
        )
    });
    drop(run);
    assert!(
        status.success(),
        "the quick start failed ({status}):\n--- stdout\n{output}\n--- stderr\n{errors}\n\
         --- daemon log\n{}",
        log()
    );

    for needle in needles {
        assert!(
            output.contains(needle),
            "the quick start's output lacks {needle:?}:\n{output}"
        );
    }

    // What the README shows under each command (`# …` lines) is what it printed, up to
    // numbers (feed seq values).
    let printed: BTreeSet<String> = output.lines().map(normalized).collect();
    for block in &quick {
        for line in block.text.lines() {
            let Some(shown) = line.trim_start().strip_prefix('#') else {
                continue;
            };
            let shown = shown
                .trim()
                .replace("127.0.0.1:8420", &format!("127.0.0.1:{port}"));
            if shown.is_empty() || shown == "…" {
                continue;
            }
            assert!(
                printed.contains(&normalized(&shown)),
                "{file}:{} shows {shown:?}, which the walkthrough did not print:\n{output}",
                block.line
            );
        }
    }

    // Stopped by its guard: SIGTERM, a drain, exit 0.
    daemon.signal(rustix::process::Signal::TERM);
    let stopped = daemon.wait_until(Instant::now() + Duration::from_secs(15));
    assert!(
        stopped.is_some_and(|s| s.success()),
        "the daemon did not drain and exit 0 on SIGTERM ({stopped:?}); its log:\n{}",
        log()
    );
}
