//! The official A2A Python SDK (`a2a-sdk`, pinned in tests/interop/requirements.txt) as a
//! strict client of the real binary, on both drivers. `tests/interop/setup.sh` builds the
//! venv on first use (from PyPI); a machine that cannot build it fails this test rather
//! than skipping it, so a green run always means the SDK really ran.

use std::process::Command;

fn run_suite(driver: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/run.sh");
    let out = Command::new("bash")
        .arg(script)
        .args([
            "--driver",
            driver,
            env!("CARGO_BIN_EXE_agentd"),
            "--",
            "-q",
            "-p",
            "no:cacheprovider",
        ])
        .output()
        .expect("bash runs the interop suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "interop suite failed on the {driver} driver\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    // pytest's summary: make sure tests actually ran and none failed.
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .unwrap_or_default();
    assert!(!summary.contains("failed"), "{summary}");
    assert!(
        summary.contains(" passed"),
        "no pytest summary in\n{stdout}"
    );
}

#[test]
fn python_sdk_interop_smol() {
    run_suite("smol");
}

#[test]
fn python_sdk_interop_std() {
    run_suite("std");
}
