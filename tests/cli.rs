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
    for (args, said) in [
        (
            &["--bogus"][..],
            "unknown argument \"--bogus\"; see agentd --help",
        ),
        (
            &["--driver", "tokio"],
            "--driver takes smol or std, not \"tokio\"",
        ),
        (&["--driver"], "--driver needs a name: smol or std"),
        (&["--config"], "--config needs a file"),
        (
            &["--listen"],
            "--listen needs a URL: tcp://127.0.0.1:PORT, https://HOST:PORT or unix:///PATH",
        ),
    ] {
        let out = agentd(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        // Said once, as a plain line a person reads: no debug rendering (`Some("tokio")`).
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("agentd: {said}\n"),
            "{args:?}"
        );
    }
}

#[test]
fn a_log_level_that_names_no_level_is_refused() {
    for bad in ["verbose", "debug,agentd=trace", "1"] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(["--check-config"])
            .env("AGENTD_LOG", bad)
            .output()
            .expect("agentd runs");
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with(&format!("agentd: AGENTD_LOG=\"{bad}\" names no log level")),
            "{bad}: {err}"
        );
    }
    for good in ["", "error", "WARN", "info", "Debug", "trace"] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(["--check-config"])
            .env("AGENTD_LOG", good)
            .output()
            .expect("agentd runs");
        assert!(out.status.success(), "{good:?}: {out:?}");
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
        (
            "zero",
            "[limits]\nmax_body_bytes = 0\n",
            "limits.max_body_bytes: must be from 1 to 4194304, not 0",
        ),
        // Issue 15, item 10: every numeric key has a range, checked at load.
        (
            "huge-ring",
            "[a2a.events]\nenabled = true\nring = 1000000000000\n",
            "a2a.events.ring: must be from 1 to 65536, not 1000000000000",
        ),
        (
            "idle-forever",
            "[limits]\nidle_timeout_ms = 18446744073709551615\n",
            "limits.idle_timeout_ms: must be from 1 to 86400000, not 18446744073709551615",
        ),
        (
            "request-forever",
            "[limits]\nrequest_timeout_ms = 18446744073709551615\n",
            "limits.request_timeout_ms: must be from 1 to 86400000, not 18446744073709551615",
        ),
        (
            "body-past-a-record",
            "[limits]\nmax_body_bytes = 4194305\n",
            "limits.max_body_bytes: must be from 1 to 4194304, not 4194305",
        ),
        (
            "push-timeout",
            "[a2a.push]\nenabled = true\ntimeout_ms = 18446744073709551615\n",
            "a2a.push.timeout_ms: must be from 1 to 300000, not 18446744073709551615",
        ),
        (
            "turn-timeout",
            "[agent]\ncommand = [\"/bin/cat\"]\nturn_timeout_ms = 18446744073709551615\n",
            "agent.turn_timeout_ms: must be from 1 to 86400000, not 18446744073709551615",
        ),
        (
            "step-timeout",
            "[[workflows]]\nname = \"w\"\n[[workflows.steps]]\nid = \"a\"\nkind = \"exec\"\nprogram = \"/bin/true\"\ntimeout_ms = 18446744073709551615\n",
            "workflow \"w\" step \"a\": timeout_ms: must be from 1 to 86400000, not 18446744073709551615",
        ),
        (
            "device-token-ttl",
            "[a2a.device_grant]\ntoken_ttl_s = 18446744073709551615\n",
            "a2a.device_grant.token_ttl_s: must be from 300 to 2592000, not 18446744073709551615",
        ),
        (
            "no-connections",
            "[limits]\nmax_connections = 0\n",
            "limits.max_connections: must be from 1 to 1048576, not 0",
        ),
        // Issue 15, item 10: a grant pattern that reaches an operator-only op.
        (
            "grant-admin-pattern",
            "[a2a]\nlisten = \"tcp://127.0.0.1:0\"\n[[a2a.principals]]\nid = \"g\"\nrole = \"user\"\ngrants = [\"admin.*\"]\nmatch = { any = true }\n",
            "a2a.principals[0].grants: \"admin.*\" (rule \"g\") would grant the operator-only ops admin.drain, admin.pause, admin.resume, admin.cancel, admin.set to role user",
        ),
        (
            "grant-auth-pattern",
            "[a2a]\nlisten = \"tcp://127.0.0.1:0\"\n[[a2a.principals]]\nid = \"g\"\nrole = \"agent\"\ngrants = [\"status\", \"auth.*\"]\nmatch = { any = true }\n",
            "a2a.principals[0].grants: \"auth.*\" (rule \"g\") would grant the operator-only ops auth.device.pending",
        ),
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
    // A unix socket path past sun_path's 107 bytes is a load error, not a socket no
    // client can reach.
    let long_unix = format!("[a2a]\nlisten = \"unix:///{}\"\n", "s".repeat(107));
    let mut cases = cases.to_vec();
    cases.push((
        "unix-path",
        long_unix.as_str(),
        "at most 107 bytes (sun_path), not 108",
    ));
    for (name, text, needle) in cases {
        let path = temp_config(name, text);
        let path = path.to_str().unwrap();
        // Start-up and --check-config refuse alike.
        for args in [
            &["--config", path][..],
            &["--check-config", "--config", path],
        ] {
            let out = agentd(args);
            // A load error exits 2 (the surface's rule for configuration mistakes).
            assert_eq!(out.status.code(), Some(2), "{name} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.matches(needle).count(), 1, "{name}: said once: {err}");
            assert!(out.stdout.is_empty(), "{name} {args:?}");
        }
        std::fs::remove_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
    }
    let out = agentd(&["--config", "/nonexistent/agentd.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/agentd.toml"));
}

#[test]
fn check_config_validates_without_binding_or_touching_the_store() {
    // The configured port is held by someone else and the store directory does not exist:
    // a check binds nothing and creates nothing, so neither matters to it.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let dir = std::env::temp_dir().join(format!("agentd-cli-{}-check", std::process::id()));
    let store = dir.join("state");
    let path = temp_config(
        "check",
        &format!(
            "[a2a]\nlisten = [\"tcp://127.0.0.1:{port}\"]\n[store]\ndir = \"{}\"\n",
            store.display()
        ),
    );
    let out = agentd(&["--check-config", "--config", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}: the configuration is valid\n", path.display())
    );
    assert!(
        !store.exists(),
        "--check-config created the store directory"
    );
    // The same file refuses to start for real, since the port is taken: the check above
    // really did not bind.
    let out = agentd(&["--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on"));
    let out = agentd(&["--check-config"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "the embedded default: the configuration is valid\n"
    );
    // --listen is checked like a2a.listen.
    let out = agentd(&["--check-config", "--listen", "tcp://0.0.0.0:8420"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("plaintext is served only on loopback"));
    drop(held);
    std::fs::remove_dir_all(&dir).unwrap();
}

trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

#[test]
fn listen_on_the_command_line_replaces_the_configured_listeners() {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = std::env::temp_dir().join(format!("agentd-cli-{}-listen", std::process::id()));
    let sock = dir.join("a.sock");
    // The file names a port nobody will ever reach; --listen replaces it with two others.
    let path = temp_config(
        "listen",
        "[a2a]\nlisten = [\"tcp://127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n",
    );
    /// Kills the daemon however the test ends.
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut daemon = Running(
        Command::new(env!("CARGO_BIN_EXE_agentd"))
            .args(["--config", path.to_str().unwrap()])
            .args(["--listen", "tcp://127.0.0.1:0"])
            .args(["--listen", &format!("unix://{}", sock.display())])
            .env("AGENTD_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("agentd starts"),
    );
    let mut lines = BufReader::new(daemon.0.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    let tcp = first
        .strip_prefix("listening http://127.0.0.1:")
        .unwrap_or_else(|| panic!("{first}"));
    assert_ne!(tcp, "1/", "the file's listener was not replaced");
    assert_eq!(second, format!("listening unix://{}", sock.display()));
    let card = |mut s: Box<dyn ReadWrite>| {
        s.write_all(
            b"GET /.well-known/agent-card.json HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        answer
    };
    let over_tcp = card(Box::new(
        std::net::TcpStream::connect(format!("127.0.0.1:{}", tcp.trim_end_matches('/'))).unwrap(),
    ));
    assert!(
        over_tcp.contains(&format!("http://127.0.0.1:{tcp}")),
        "{over_tcp}"
    );
    let over_unix = card(Box::new(
        std::os::unix::net::UnixStream::connect(&sock).unwrap(),
    ));
    assert!(
        over_unix.contains(&format!("unix://{}", sock.display())),
        "{over_unix}"
    );
    drop(daemon);
    std::fs::remove_dir_all(&dir).unwrap();
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
