//! `agentd login` / `agentd logout` against a real daemon with the device grant on: the
//! client shows a code, an operator approves it, the token is kept per origin (mode 0600 in
//! a 0700 directory) and used by the other subcommands when no bearer is given; logout
//! revokes it on the server. A denied sign-in, an expired kept token, and a server without
//! the device grant each end the way the docs say.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::cli::{cli_command, cli_env};
use common::{post, rpc_body, Daemon, Setup, TempDir, Via};
use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";

fn daemon(device_grant: bool) -> Daemon {
    Daemon::start_setup(
        "smol",
        &Setup {
            a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
            sections: if device_grant {
                "[a2a.device_grant]\nenabled = true\n".into()
            } else {
                String::new()
            },
            env: vec![("E2E_OP".into(), "op-token".into())],
            ..Setup::default()
        },
    )
}

/// The client with its config directory at `config` and no token from the environment.
fn cli(config: &Path, args: &[&str]) -> Command {
    let mut c = cli_command(args);
    c.env("XDG_CONFIG_HOME", config)
        .env("HOME", config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run(config: &Path, args: &[&str]) -> Output {
    let dir = config.to_str().expect("a UTF-8 temp path");
    cli_env(args, &[("XDG_CONFIG_HOME", dir), ("HOME", dir)])
}

/// Waits for a client started by [`start_login`] (its stderr already taken) to end.
fn wait(child: &mut Child, what: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agentd {what:?} did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Output {
        status: child.wait().expect("wait"),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    if let Some(mut s) = child.stdout.take() {
        let _ = std::io::Read::read_to_end(&mut s, &mut out.stdout);
    }
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Starts `agentd login` and returns it with the user code it showed on stderr (the rest of
/// its stderr is collected by a thread, returned by the receiver at its end).
fn start_login(config: &Path, url: &str) -> (Child, String, mpsc::Receiver<String>) {
    let mut child = cli(config, &["login", url, "--client-id", "laptop"])
        .spawn()
        .expect("spawn agentd login");
    let stderr = child.stderr.take().expect("stderr");
    let (code_tx, code_rx) = mpsc::channel();
    let (rest_tx, rest_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("approve the code ") {
                let code = line[at + "approve the code ".len()..].trim().to_owned();
                let _ = code_tx.send(code);
            }
            all.push_str(&line);
            all.push('\n');
        }
        let _ = rest_tx.send(all);
    });
    let code = code_rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "login showed no code: {:?}",
                rest_rx.recv_timeout(Duration::from_secs(5))
            )
        });
    (child, code, rest_rx)
}

fn operator_op(d: &Daemon, envelope: Value) -> Value {
    let params = json!({"message": {"role":"ROLE_USER","messageId":common::fresh_id(),"extensions":[COMMAND_URI],"parts":[{"data":{"agentd": envelope}}]}});
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    let r = d.connect(Via::Tcp).request(&post(
        &[
            "Content-Type: application/json",
            "A2A-Version: 1.0",
            "Authorization: Bearer op-token",
            ext.as_str(),
        ],
        &rpc_body("1", "SendMessage", &params),
    ));
    let doc = r.json();
    assert_eq!(
        doc["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{envelope}: {doc}"
    );
    doc
}

fn list_status(d: &Daemon, token: &str) -> u16 {
    let auth = format!("Authorization: Bearer {token}");
    d.connect(Via::Tcp)
        .request(&post(
            &[
                "Content-Type: application/json",
                "A2A-Version: 1.0",
                auth.as_str(),
            ],
            &rpc_body("1", "ListTasks", &json!({})),
        ))
        .status
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

#[test]
fn login_keeps_a_private_token_that_the_other_subcommands_use_and_logout_revokes_it() {
    let d = daemon(true);
    let url = d.tcp_url();
    let origin = format!("http://{}", d.tcp);
    let home = TempDir::new("agentd-e2e-login");
    let config = home.path().join("cfg");

    // Without a kept token the server wants a credential.
    let anonymous = run(&config, &["list", &url]);
    assert_ne!(
        anonymous.status.code(),
        Some(0),
        "{}",
        text(&anonymous.stdout)
    );

    let (mut login, code, stderr) = start_login(&config, &url);
    assert!(
        code.len() >= 8 && code.contains('-'),
        "a user code like WNKF-TTFH: {code:?}"
    );
    operator_op(
        &d,
        json!({"op": "auth.device.approve", "user_code": code, "as": "alice"}),
    );
    let out = wait(&mut login, &["login"]);
    let err = stderr
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{}{err}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains(&format!("signed in to {origin}")),
        "{}",
        text(&out.stdout)
    );

    let file = config.join("agentd/credentials.json");
    assert_eq!(mode(&file), 0o600, "the token file is the user's alone");
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    let kept: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let token = kept["tokens"][origin.as_str()]["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("a token for {origin}: {kept}"))
        .to_owned();
    assert!(token.starts_with("agentd_at_"), "{token}");
    assert!(
        !text(&out.stdout).contains(&token),
        "the token is not printed"
    );

    // The kept token signs the other subcommands in: a task sent is alice's.
    let listed = run(&config, &["list", &url, "--json"]);
    assert_eq!(
        listed.status.code(),
        Some(0),
        "{}",
        common::cli::text(&listed)
    );
    let sent = run(&config, &["send", &url, "hello", "--no-stream", "--json"]);
    assert_eq!(sent.status.code(), Some(0), "{}", text(&sent.stdout));
    let sent: Value = serde_json::from_slice(&sent.stdout).expect("json");
    let task = sent["task"]["id"]
        .as_str()
        .or(sent["id"].as_str())
        .unwrap()
        .to_owned();
    let mine = run(&config, &["get", &url, &task, "--json"]);
    assert_eq!(mine.status.code(), Some(0), "{}", common::cli::text(&mine));
    // --bearer still wins over the kept token.
    let other = run(&config, &["list", &url, "--bearer", "not-a-token"]);
    assert_ne!(other.status.code(), Some(0));

    // Logout revokes it on the server and forgets it here.
    assert_eq!(list_status(&d, &token), 200);
    let out = run(&config, &["logout", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", common::cli::text(&out));
    assert_eq!(
        list_status(&d, &token),
        401,
        "the server no longer takes it"
    );
    let kept: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(kept["tokens"].get(origin.as_str()).is_none(), "{kept}");
    assert_eq!(mode(&file), 0o600);
    let again = run(&config, &["logout", &url]);
    assert_eq!(again.status.code(), Some(0));
    assert!(text(&again.stdout).contains("not signed in"));
}

#[test]
fn a_denied_sign_in_exits_1_and_keeps_nothing() {
    let d = daemon(true);
    let url = d.tcp_url();
    let home = TempDir::new("agentd-e2e-login-deny");
    let config = home.path().join("cfg");
    let (mut login, code, stderr) = start_login(&config, &url);
    operator_op(&d, json!({"op": "auth.device.deny", "user_code": code}));
    let out = wait(&mut login, &["login"]);
    let err = stderr
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_default();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("denied"), "{err}");
    assert!(!config.join("agentd/credentials.json").exists());
}

#[test]
fn an_expired_kept_token_is_not_sent_and_a_server_without_the_grant_is_refused() {
    let d = daemon(true);
    let url = d.tcp_url();
    let home = TempDir::new("agentd-e2e-login-expired");
    let config = home.path().join("cfg");
    std::fs::create_dir_all(config.join("agentd")).unwrap();
    // The operator's own token, kept as if by login but expired: never offered.
    let kept = json!({"version": 1, "tokens": {format!("http://{}", d.tcp): {"access_token": "op-token", "expires_at": 1, "scope": "operator"}}});
    std::fs::write(config.join("agentd/credentials.json"), kept.to_string()).unwrap();
    let out = run(&config, &["list", &url]);
    assert_ne!(out.status.code(), Some(0), "an expired token was used");
    // The same entry, unexpired, is used (so the refusal above is the expiry's).
    let fresh = json!({"version": 1, "tokens": {format!("http://{}", d.tcp): {"access_token": "op-token", "expires_at": 4_000_000_000u64, "scope": "operator"}}});
    std::fs::write(config.join("agentd/credentials.json"), fresh.to_string()).unwrap();
    let out = run(&config, &["list", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", common::cli::text(&out));

    let plain = daemon(false);
    let out = run(&config, &["login", &plain.tcp_url()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("offers no sign-in by device grant"), "{err}");
}
