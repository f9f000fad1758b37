//! The core's module layering, held as a test: the wire types (`a2a`) depend on nothing
//! else in the crate; the task store (`tasks`) on the wire types and leaf helpers, never on
//! the extensions, the methods or the connection; the audit feed never on the methods. A
//! module cycle makes a change in one module a change in every module of its cycle.

use std::path::Path;

/// Every `crate::<module>` a module's source names, with the file that names it.
fn uses(module: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let dir = root.join(module);
    if dir.is_dir() {
        for e in std::fs::read_dir(&dir).unwrap() {
            files.push(e.unwrap().path());
        }
    }
    let file = root.join(format!("{module}.rs"));
    if file.is_file() {
        files.push(file);
    }
    assert!(!files.is_empty(), "no source for {module}");
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != module {
                found.push((name, f.display().to_string()));
            }
        }
    }
    found
}

fn assert_depends_only_on(module: &str, allowed: &[&str]) {
    for (name, file) in uses(module) {
        assert!(
            allowed.contains(&name.as_str()),
            "{file} names crate::{name}: `{module}` may depend only on {allowed:?}"
        );
    }
}

#[test]
fn the_wire_types_depend_on_nothing_else() {
    assert_depends_only_on("a2a", &[]);
}

#[test]
fn the_task_store_depends_on_the_wire_types_and_leaves_only() {
    assert_depends_only_on("tasks", &["a2a", "auth", "time", "errors", "ids", "digest"]);
}

#[test]
fn the_audit_feed_does_not_depend_on_the_methods() {
    for (name, file) in uses("audit") {
        assert!(
            !matches!(name.as_str(), "rpc" | "conn"),
            "{file} names crate::{name}"
        );
    }
}

#[test]
fn sign_in_sessions_do_not_depend_on_the_task_store() {
    for (name, file) in uses("sessions") {
        assert!(
            !matches!(name.as_str(), "tasks" | "rpc" | "conn"),
            "{file} names crate::{name}"
        );
    }
}
