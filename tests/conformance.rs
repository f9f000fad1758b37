//! The overview's "How conformance is checked", as checks that fail when a claim stops being
//! true:
//! - the eleven core method names are the official SDK's (read from the installed a2a-sdk's
//!   own service descriptor), and the route table serves those and the declared extension
//!   methods only;
//! - the pages name only methods and URIs that are served.

use std::process::Command;

use agentd_core::a2a::CoreMethod;
use agentd_core::ext::registry::{Ext, Route, EVENTS_METHOD, UNIX_BINDING_URI};

/// The method names of the A2A service in the installed official SDK.
fn sdk_method_names() -> Vec<String> {
    let setup = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/setup.sh");
    let out = Command::new("bash")
        .arg(setup)
        .output()
        .expect("run the interop setup");
    assert!(
        out.status.success(),
        "the interop venv (a2a-sdk) could not be built:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let venv = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let script = "from a2a.types import a2a_pb2\n\
                  for m in a2a_pb2.DESCRIPTOR.services_by_name['A2AService'].methods: print(m.name)";
    let out = Command::new(format!("{venv}/bin/python"))
        .args(["-c", script])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_method_table_is_the_sdks() {
    let mut sdk = sdk_method_names();
    sdk.sort();
    let mut ours: Vec<String> = CoreMethod::ALL
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    ours.sort();
    assert_eq!(
        ours, sdk,
        "agentd's core methods are exactly the official SDK's"
    );
    assert_eq!(ours.len(), 11);
}

#[test]
fn the_route_table_serves_the_core_and_declared_extension_methods_only() {
    for m in CoreMethod::ALL {
        assert_eq!(Route::from_name(m.name()), Some(Route::Core(m)));
    }
    assert_eq!(Route::from_name(EVENTS_METHOD), Some(Route::Events));
    for name in [
        "message/send",
        "tasks/get",
        "SetTaskPushNotificationConfig",
        "GetAgentCard",
        "agent/getAuthenticatedExtendedCard",
        "SubscribeToEvents",
        "a2a.status",
        "Pair",
        "sendMessage",
        "SendMessage ",
        "",
    ] {
        assert_eq!(Route::from_name(name), None, "{name:?} is not served");
    }
}

/// Every JSON-RPC method the README names in a request is served, every agentd.dev URI it
/// names is in the registry (or a bundle address), and every method-shaped name it puts in
/// code spans is a core method.
#[test]
fn the_pages_name_only_what_is_served() {
    let uris: Vec<String> = Ext::ALL
        .iter()
        .flat_map(|e| [e.uri().to_owned(), e.schema_url()])
        .chain([UNIX_BINDING_URI.to_owned()])
        .collect();
    let pages = [
        "README.md",
        "bench/README.md",
        "fuzz/README.md",
        "core/README.md",
        "docs/agent-protocol.md",
        "examples/delegation/front.toml",
        "examples/delegation/worker.toml",
    ];
    for page in pages {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (i, _) in text.match_indices("\"method\":\"") {
            let rest = &text[i + 10..];
            let name = &rest[..rest.find('"').unwrap_or(0)];
            assert!(
                Route::from_name(name).is_some(),
                "{page} sends method {name:?}, which is not served"
            );
        }
        for (i, _) in text.match_indices("https://agentd.dev/") {
            let rest = &text[i..];
            let end = rest
                .find(|c: char| c.is_whitespace() || "`\"',)<>]".contains(c))
                .unwrap_or(rest.len());
            let uri = rest[..end].trim_end_matches(['.', ':']);
            assert!(
                uris.iter().any(|u| u == uri),
                "{page} names {uri}, which agentd does not declare"
            );
        }
        let verbs = [
            "Send",
            "Get",
            "List",
            "Cancel",
            "Subscribe",
            "Create",
            "Delete",
        ];
        for span in text.split('`').skip(1).step_by(2) {
            let word = span.trim();
            // An extension method (`agentd.events/SubscribeToEvents`) must be routed.
            if word.starts_with("agentd.") && word.contains('/') && !word.contains(' ') {
                assert!(
                    Route::from_name(word).is_some(),
                    "{page} names `{word}`, which is not a served method"
                );
            }
            let method_shaped = verbs.iter().any(|v| word.starts_with(v))
                && word.chars().all(|c| c.is_ascii_alphanumeric())
                && word.chars().next().is_some_and(|c| c.is_ascii_uppercase());
            if method_shaped {
                assert!(
                    CoreMethod::from_name(word).is_some(),
                    "{page} names `{word}`, which is not a served method"
                );
            }
        }
    }
}
