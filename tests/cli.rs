//! The binary's command line and startup refusals: run as a user would run it.

use std::process::Command;

fn agentd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentd"))
        .args(args)
        .env("AGENTD_LOG", "error")
        .output()
        .expect("agentd runs")
}

fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("agentd-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agentd.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn help_and_version() {
    let help = agentd(&["--help"]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in ["--config", "--driver", "127.0.0.1:8420", "AGENTD_LOG"] {
        assert!(text.contains(needle), "--help mentions {needle}: {text}");
    }
    let version = agentd(&["--version"]);
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("agentd {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    for args in [&["--bogus"][..], &["--driver", "tokio"], &["--config"]] {
        let out = agentd(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("agentd: "), "{args:?}: {err}");
    }
}

#[test]
fn configurations_it_cannot_honour_stop_startup() {
    let cases = [
        (
            "open",
            "[a2a]\nlisten = \"tcp://0.0.0.0:0\"\n",
            "plaintext is served only on loopback",
        ),
        (
            "no-cert",
            "[a2a]\nlisten = \"https://127.0.0.1:0\"\n",
            "needs a2a.tls.cert",
        ),
        (
            "no-scheme",
            "[a2a]\nlisten = \"https://0.0.0.0:0\"\n[a2a.tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n",
            "needs an authentication scheme",
        ),
        (
            "missing-cert-file",
            "[a2a]\nlisten = \"https://127.0.0.1:0\"\n[a2a.tls]\ncert = \"/nonexistent/c.pem\"\nkey = \"/k.pem\"\n",
            "/nonexistent/c.pem",
        ),
        ("typo", "[a2a]\nlisen = \"tcp://127.0.0.1:0\"\n", "line 2"),
        (
            "scheme",
            "[a2a]\nlisten = \"udp://127.0.0.1:0\"\n",
            "expected tcp://",
        ),
        ("zero", "[limits]\nmax_body_bytes = 0\n", "greater than 0"),
        (
            "rate-spec",
            "[a2a]\nlisten = \"tcp://127.0.0.1:0\"\n[[a2a.principals]]\nid = \"g\"\nrole = \"user\"\nmatch = { any = true }\nquotas = { rate = \"20 per minute\" }\n",
            "a2a.principals[0].quotas.rate",
        ),
        (
            "budget",
            "[a2a]\nlisten = \"tcp://127.0.0.1:0\"\n[[a2a.principals]]\nid = \"g\"\nrole = \"user\"\nmatch = { any = true }\nquotas = { budget = 100 }\n",
            "a2a.principals[0].quotas.budget: not supported",
        ),
    ];
    for (name, text, needle) in cases {
        let path = temp_config(name, text);
        let out = agentd(&["--config", path.to_str().unwrap()]);
        // A load error exits 2 (the surface's rule for configuration mistakes).
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{name}: {err}");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
    let out = agentd(&["--config", "/nonexistent/agentd.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/agentd.toml"));
}

#[test]
fn extensions_and_schemas_print_with_no_config_and_no_network() {
    let out = agentd(&["--extensions"]);
    assert!(out.status.success());
    let rows: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("--extensions prints JSON");
    let uris: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        [
            "https://agentd.dev/a2a/ext/command",
            "https://agentd.dev/a2a/ext/events",
            "https://agentd.dev/a2a/ext/task-annotations",
            "https://agentd.dev/a2a/binding/jsonrpc-unix"
        ],
        "registry order: extensions, then bindings"
    );
    assert!(rows
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["required"] == false));
    assert_eq!(
        rows[3]["schema"],
        serde_json::Value::Null,
        "the binding has no bundle"
    );
    for name in ["command", "events", "task-annotations"] {
        let out = agentd(&["--extension-schema", name]);
        assert!(out.status.success(), "{name}");
        let bundle: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            bundle["$id"],
            format!("https://agentd.dev/a2a/ext/{name}/schema.json")
        );
        assert!(
            out.stdout.ends_with(b"}\n"),
            "pretty-printed with a trailing newline"
        );
    }
    for (name, needle) in [
        ("nope", "command, events and task-annotations"),
        ("jsonrpc-unix", "no schema bundle"),
        ("Command", "no extension"),
    ] {
        let out = agentd(&["--extension-schema", name]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{name}"
        );
        assert!(out.stdout.is_empty());
    }
}
