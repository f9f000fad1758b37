//! What agentd publishes is what it speaks: the checked-in `schemas/` equal what the binary
//! prints (`--extensions`, `--extension-schema`), every golden example validates against its
//! bundle, and a live answer's annotations validate too. Set AGENTD_BLESS=1 to rewrite the
//! checked-in files after a deliberate change.

use std::path::PathBuf;
use std::process::Command;

use agentd_core::ext::{bundle, examples, Ext};

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

fn agentd(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(args)
        .output()
        .expect("agentd runs");
    assert!(
        out.status.success(),
        "agentd {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Compares a checked-in file with what it must hold, or rewrites it when blessing.
fn check_file(path: PathBuf, expected: &str, stale: &mut Vec<String>) {
    if std::env::var_os("AGENTD_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, expected).unwrap();
        return;
    }
    match std::fs::read_to_string(&path) {
        Ok(actual) if actual == expected => {}
        Ok(_) => stale.push(format!(
            "{} differs from what the binary emits",
            path.display()
        )),
        Err(e) => stale.push(format!("{}: {e}", path.display())),
    }
}

#[test]
fn checked_in_schemas_equal_what_the_binary_emits() {
    let dir = schemas_dir();
    let mut stale = Vec::new();
    check_file(
        dir.join("extensions.json"),
        &agentd(&["--extensions"]),
        &mut stale,
    );
    for ext in Ext::ALL {
        let printed = agentd(&["--extension-schema", ext.name()]);
        assert_eq!(
            printed,
            bundle::render(&bundle::bundle(ext)),
            "the CLI prints the library's bundle"
        );
        check_file(
            dir.join(ext.name()).join("schema.json"),
            &printed,
            &mut stale,
        );
    }
    let mut expected_examples = std::collections::BTreeSet::new();
    for (ext, stem, doc) in examples::all() {
        let path = dir
            .join(ext.name())
            .join("examples")
            .join(format!("{stem}.json"));
        expected_examples.insert(path.clone());
        check_file(path, &bundle::render(&doc), &mut stale);
    }
    // Nothing stale left behind: every checked-in example is one the code produces.
    for ext in Ext::ALL {
        let Ok(entries) = std::fs::read_dir(dir.join(ext.name()).join("examples")) else {
            continue;
        };
        for e in entries.flatten() {
            if !expected_examples.contains(&e.path()) {
                stale.push(format!("{} is not a generated example", e.path().display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "run AGENTD_BLESS=1 cargo test --test schemas after a deliberate change:\n{}",
        stale.join("\n")
    );
}

#[test]
fn golden_examples_validate_against_their_bundles() {
    for (ext, stem, doc) in examples::all() {
        let validator =
            jsonschema::draft202012::new(&bundle::bundle(ext)).expect("bundle compiles");
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{}/{stem}: {errors:?}", ext.name());
    }
}

#[test]
fn bundles_refuse_what_they_must() {
    let command = jsonschema::draft202012::new(&bundle::bundle(Ext::Command)).unwrap();
    for bad in [
        serde_json::json!({"agentd": {"op": "status", "extra": 1}}),
        serde_json::json!({"agentd": {"op": "workflow.run"}}),
        serde_json::json!({"agentd": {"op": ""}}),
        serde_json::json!({}),
    ] {
        assert!(!command.is_valid(&bad), "{bad}");
    }
    let annotations = jsonschema::draft202012::new(&bundle::bundle(Ext::TaskAnnotations)).unwrap();
    assert!(!annotations.is_valid(&serde_json::json!({"link": {"kind": "job", "id": "x"}, "created": "x", "statusHistory": []})));
}
