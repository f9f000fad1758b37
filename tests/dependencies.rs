//! The README promises a default build with no tokio, no hyper and no network client crate
//! (the daemon's own outbound calls, the OTLP exporter included, use the core's sans-io
//! client). Cargo.lock lists every crate any target of the workspace can link, so none of
//! them in it means none in the build.

/// Crates the promise rules out: async runtimes other than smol's, HTTP stacks and clients.
const RULED_OUT: &[&str] = &[
    "tokio",
    "hyper",
    "h2",
    "reqwest",
    "ureq",
    "isahc",
    "surf",
    "attohttpc",
    "curl",
    "tonic",
    "async-std",
];

#[test]
fn the_lock_file_holds_no_runtime_or_network_client_crate() {
    let lock = include_str!("../Cargo.lock");
    let names: Vec<&str> = lock
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .collect();
    assert!(
        names.contains(&"smol") && names.contains(&"serde_json"),
        "Cargo.lock was not read as expected: {} names",
        names.len()
    );
    let found: Vec<&&str> = names.iter().filter(|n| RULED_OUT.contains(n)).collect();
    assert!(found.is_empty(), "Cargo.lock pulls {found:?}");
}
