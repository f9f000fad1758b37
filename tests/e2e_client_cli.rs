//! The client subcommands of the real binary (`agentd card|send|get|list|cancel|subscribe`)
//! against a real daemon, over TCP and over the unix socket: human and `--json` output,
//! refusals and their exit statuses, paging, cancel, streaming sends, subscribe, and a
//! subscribe that resumes with Last-Event-ID after its connection is cut by a proxy.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cli::*;
use common::{fresh_id, Daemon, Setup, TempDir};
use serde_json::{json, Value};

const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";

fn echo_daemon() -> Daemon {
    daemon("examples/agents/echo_agent.py", "", &[])
}

fn paced_daemon() -> Daemon {
    daemon("tests/agents/paced.py", "", &[])
}

/// A task the test starts itself (returnImmediately), for the paced agent.
fn start_task(d: &Daemon, text: &str) -> String {
    let r = d.connect_tcp().rpc_ok(
        "SendMessage",
        json!({"message": {"role": "ROLE_USER", "messageId": fresh_id(), "parts": [{"text": text}]},
               "configuration": {"returnImmediately": true}}),
    );
    r["task"]["id"].as_str().expect("a task id").to_owned()
}

#[test]
fn card_for_people_and_as_served_over_tcp_and_unix() {
    let d = echo_daemon();
    let url = d.tcp_url();
    let human = ok(&["card", &url]);
    for needle in [
        "agentd",
        "interfaces:",
        &format!("JSONRPC 1.0  {url}"),
        "capabilities: streaming",
        "skills:",
        "conversation",
        "extensions:",
        COMMAND_URI,
    ] {
        assert!(
            human.contains(needle),
            "card output lacks {needle:?}:\n{human}"
        );
    }
    assert!(!human.contains('\x1b'), "no colour on a pipe:\n{human}");
    let card = ok_json(&["card", &url, "--json"]);
    let served = d.connect_tcp().get_card().json();
    assert_eq!(card, served, "--json prints the card as served");

    let unix = d.unix_url();
    let human = ok(&["card", &unix]);
    assert!(
        human.contains(&format!(
            "https://agentd.dev/a2a/binding/jsonrpc-unix 1.0  {unix}"
        )),
        "{human}"
    );
}

#[test]
fn send_get_and_list_over_both_listeners() {
    let d = echo_daemon();
    for url in [d.tcp_url(), d.unix_url()] {
        let out = ok(&["send", &url, "hello", "--no-stream"]);
        assert!(out.contains("state    completed"), "{out}");
        assert!(out.contains("message  echo: hello"), "{out}");
        assert!(out.contains("artifact echo: hello"), "{out}");
        let id = out
            .lines()
            .find_map(|l| l.strip_prefix("task     "))
            .expect("a task line")
            .trim()
            .to_owned();

        // The same task read back, with its history.
        let got = ok(&["get", &url, &id, "--history", "5"]);
        assert!(
            got.contains(&id) && got.contains("state    completed"),
            "{got}"
        );
        assert!(
            got.contains("history") && got.contains("user: hello"),
            "{got}"
        );
        assert!(got.contains("agent: echoing"), "{got}");
        let t = ok_json(&["get", &url, &id, "--json"]);
        assert_eq!(t["id"], id.as_str());
        assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED");

        // --json: the result as served; --context and --data reach the message.
        let r = ok_json(&[
            "send",
            &url,
            "again",
            "--no-stream",
            "--json",
            "--context",
            "ctx-cli",
            "--data",
            r#"{"k":[1,2]}"#,
        ]);
        let task = &r["task"];
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
        assert_eq!(task["contextId"], "ctx-cli");
        let t = ok_json(&[
            "get",
            &url,
            task["id"].as_str().unwrap(),
            "--history",
            "5",
            "--json",
        ]);
        let user = t["history"]
            .as_array()
            .and_then(|h| h.iter().find(|m| m["role"] == "ROLE_USER"))
            .unwrap_or_else(|| panic!("no user message in the history: {t}"));
        let parts = &user["parts"];
        assert_eq!(parts[0]["text"], "again", "{t}");
        assert_eq!(parts[1]["data"], json!({"k": [1, 2]}), "{t}");
    }

    // agentd takes text and data parts: a file part is refused with -32005.
    let dir = TempDir::new("cli-file");
    let file = dir.path().join("a.bin");
    std::fs::write(&file, [0u8, 1, 2, 250]).unwrap();
    let err = fails(
        &[
            "send",
            &d.tcp_url(),
            "x",
            "--file",
            &file.display().to_string(),
            "--no-stream",
        ],
        1,
    );
    assert!(
        err.contains("error -32005 CONTENT_TYPE_NOT_SUPPORTED"),
        "{err}"
    );
    fails(
        &["send", &d.tcp_url(), "x", "--file", "/nonexistent/file"],
        2,
    );

    // A turn that waits for input is continued with --task.
    let url = d.tcp_url();
    let out = ok(&["send", &url, "confirm deploy", "--no-stream"]);
    assert!(out.contains("state    input-required"), "{out}");
    assert!(out.contains("Approve 'confirm deploy'?"), "{out}");
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("task     "))
        .unwrap()
        .trim()
        .to_owned();
    let more = ok(&[
        "send",
        &url,
        "--data",
        r#"{"approve":true}"#,
        "--no-stream",
        "--task",
        &id,
    ]);
    assert!(more.contains(&id), "{more}");
    assert!(
        more.contains("message  confirmed: confirm deploy"),
        "{more}"
    );
}

#[test]
fn list_filters_and_pages() {
    let d = echo_daemon();
    let url = d.tcp_url();
    for n in 0..3 {
        ok(&[
            "send",
            &url,
            &format!("paged {n}"),
            "--no-stream",
            "--context",
            "pages",
        ]);
    }
    ok(&[
        "send",
        &url,
        "elsewhere",
        "--no-stream",
        "--context",
        "other",
    ]);

    let page1 = ok(&["list", &url, "--context", "pages", "--page-size", "2"]);
    let lines: Vec<&str> = page1.lines().collect();
    assert!(
        lines[0].starts_with("TASK") && lines[0].contains("STATE"),
        "{page1}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains("completed")).count(),
        2,
        "{page1}"
    );
    assert!(
        page1.contains("echo: paged 2") && page1.contains("echo: paged 1"),
        "{page1}"
    );
    assert!(page1.contains("2 of 3 tasks"), "{page1}");
    let token = page1
        .lines()
        .find_map(|l| l.strip_prefix("next page: --page-token "))
        .unwrap_or_else(|| panic!("no next page token:\n{page1}"))
        .trim()
        .to_owned();
    let page2 = ok(&[
        "list",
        &url,
        "--context",
        "pages",
        "--page-size",
        "2",
        "--page-token",
        &token,
    ]);
    assert!(page2.contains("echo: paged 0"), "{page2}");
    assert!(!page2.contains("next page"), "{page2}");
    assert!(!page2.contains("elsewhere"), "{page2}");

    let all = ok_json(&["list", &url, "--state", "completed", "--json"]);
    assert_eq!(all["tasks"].as_array().map(Vec::len), Some(4), "{all}");
    let none = ok(&["list", &url, "--state", "working"]);
    assert!(none.contains("no tasks"), "{none}");
    let bad = fails(&["list", &url, "--state", "sleeping"], 1);
    assert!(bad.contains("error -32602"), "{bad}");
}

#[test]
fn cancel_and_refusals_exit_with_their_status() {
    let d = paced_daemon();
    let url = d.tcp_url();
    let gates = TempDir::new("cli-cancel");
    let id = start_task(&d, &gates.path().join("g").display().to_string());
    d.wait_task_state(&id, "TASK_STATE_WORKING");
    let out = ok(&["cancel", &url, &id]);
    assert!(
        out.contains(&id) && out.contains("state    canceled"),
        "{out}"
    );

    // Refused calls: the code, the reason and the message, exit 1.
    let err = fails(&["cancel", &url, &id], 1);
    assert!(err.contains("error -32002 TASK_NOT_CANCELABLE"), "{err}");
    let err = fails(&["get", &url, "no-such-task"], 1);
    assert!(err.contains("error -32001 TASK_NOT_FOUND"), "{err}");
    let err = fails(&["get", &d.unix_url(), "no-such-task", "--json"], 1);
    assert!(err.contains("-32001"), "{err}");

    // Usage: exit 2.
    for args in [
        vec!["get", url.as_str()],
        vec!["get", url.as_str(), "t", "--history", "many"],
        vec!["send", url.as_str()],
        vec!["send", url.as_str(), "x", "--data", "{not json"],
        vec!["list", url.as_str(), "--bogus"],
        vec!["card", "ftp://x/"],
        vec!["card", "http://10.1.2.3/"],
    ] {
        let err = fails(&args, 2);
        assert!(err.starts_with("agentd "), "{args:?}: {err}");
    }
    // Connection: exit 3.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let err = fails(&["card", &format!("http://127.0.0.1:{port}/")], 3);
    assert!(err.contains("cannot connect"), "{err}");
    let missing = gates.path().join("none.sock");
    fails(&["list", &format!("unix://{}", missing.display())], 3);

    // A server that answers nonsense: exit 4, no panic.
    for answer in [
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n[]",
        "HTTP/1.1 500 Oops\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbad",
        "garbage\r\n\r\n",
    ] {
        let server = Nonsense::start(answer);
        for args in [
            vec!["card".to_owned(), server.url()],
            vec!["get".to_owned(), server.url(), "t".to_owned()],
            vec!["list".to_owned(), server.url()],
        ] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let err = fails(&args, 4);
            assert!(err.contains("bad answer"), "{answer:?} {args:?}: {err}");
        }
    }
}

/// A server answering every request with the same bytes.
struct Nonsense {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Nonsense {
    fn start(answer: &'static str) -> Nonsense {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut buf = [0u8; 4096];
                        let _ = s.read(&mut buf);
                        let _ = s.write_all(answer.as_bytes());
                        let _ = s.shutdown(Shutdown::Both);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Nonsense {
            port,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Nonsense {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn bearer_from_the_flag_or_the_environment() {
    let d = daemon(
        "examples/agents/echo_agent.py",
        "bearer = \"{{secret:E2E_CLI_TOKEN}}\"",
        &[("E2E_CLI_TOKEN", "s3cret-token")],
    );
    let url = d.tcp_url();
    // The card is public.
    ok(&["card", &url]);
    let err = fails(&["list", &url], 1);
    assert!(
        err.contains("-31401") && err.contains("UNAUTHENTICATED"),
        "{err}"
    );
    let err = fails(&["list", &url, "--bearer", "wrong"], 1);
    assert!(err.contains("-31401"), "{err}");
    let out = ok(&[
        "send",
        &url,
        "hi",
        "--no-stream",
        "--bearer",
        "s3cret-token",
    ]);
    assert!(out.contains("echo: hi"), "{out}");
    let out = cli_env(&["list", &url], &[("AGENTD_TOKEN", "s3cret-token")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("echo: hi"), "{}", text(&out));
}

#[test]
fn streaming_send_prints_updates_as_they_arrive() {
    let d = paced_daemon();
    let gates = TempDir::new("cli-stream");
    for url in [d.tcp_url(), d.unix_url()] {
        let gate = gates
            .path()
            .join(format!("g{}", url.len()))
            .display()
            .to_string();
        let mut live = Live::start(&["send", &url, &gate]);
        live.until("task     ");
        live.until("artifact part-1: one");
        assert!(
            !live.seen.iter().any(|l| l.contains("part-2")),
            "{:#?}",
            live.seen
        );
        std::fs::write(format!("{gate}.1"), "").unwrap();
        live.until("artifact part-2: two");
        live.until("step 2");
        std::fs::write(format!("{gate}.2"), "").unwrap();
        let (code, out, err) = live.finish();
        assert_eq!(code, Some(0), "{out}\n{err}");
        assert!(out.contains("artifact part-3: three"), "{out}");
        assert!(out.contains("state    completed  done"), "{out}");
    }

    // --json: one line per stream result, the last one final.
    let gate = gates.path().join("j").display().to_string();
    std::fs::write(format!("{gate}.1"), "").unwrap();
    std::fs::write(format!("{gate}.2"), "").unwrap();
    let out = ok(&["send", &d.tcp_url(), &gate, "--json"]);
    let events: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(events[0].get("task").is_some(), "{out}");
    assert_eq!(
        events
            .iter()
            .filter(|e| e.get("artifactUpdate").is_some())
            .count(),
        3,
        "{out}"
    );
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{out}"
    );
}

#[test]
fn subscribe_follows_a_task_to_its_end() {
    let d = paced_daemon();
    let gates = TempDir::new("cli-subscribe");
    for url in [d.tcp_url(), d.unix_url()] {
        let gate = gates
            .path()
            .join(format!("s{}", url.len()))
            .display()
            .to_string();
        let id = start_task(&d, &gate);
        d.wait_task_state(&id, "TASK_STATE_WORKING");
        let mut live = Live::start(&["subscribe", &url, &id]);
        live.until(&id);
        live.until("part-1: one");
        std::fs::write(format!("{gate}.1"), "").unwrap();
        live.until("part-2: two");
        std::fs::write(format!("{gate}.2"), "").unwrap();
        let (code, out, err) = live.finish();
        assert_eq!(code, Some(0), "{out}\n{err}");
        assert!(
            out.contains("part-3: three") && out.contains("completed"),
            "{out}"
        );
    }
    // A finished task cannot be subscribed to: the refusal, exit 1.
    let err = fails(&["subscribe", &d.tcp_url(), "no-such-task"], 1);
    assert!(err.contains("-32001"), "{err}");
}

#[test]
fn subscribe_resumes_with_last_event_id_after_a_drop() {
    let d = paced_daemon();
    let gates = TempDir::new("cli-resume");
    let gate = gates.path().join("r").display().to_string();
    let id = start_task(&d, &gate);
    d.wait_task_state(&id, "TASK_STATE_WORKING");
    let proxy = CuttingProxy::start(d.tcp);
    let mut live = Live::start(&["subscribe", &proxy.url(), &id]);
    live.until("part-1: one");
    // The proxy cuts the first stream once it carried part-1; the client reconnects.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !proxy.cut.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the proxy never cut the stream");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(format!("{gate}.1"), "").unwrap();
    live.until("part-2: two");
    std::fs::write(format!("{gate}.2"), "").unwrap();
    let (code, out, err) = live.finish();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        err.contains("stream dropped") && err.contains("reconnecting with Last-Event-ID"),
        "{err}"
    );
    assert!(
        out.contains("part-3: three") && out.contains("completed"),
        "{out}"
    );
    assert_eq!(
        out.matches("part-1: one").count(),
        1,
        "no event twice:\n{out}"
    );
    assert!(
        proxy.resumed.load(Ordering::SeqCst),
        "the second request had Last-Event-ID"
    );
}

#[test]
fn help_lists_the_subcommands_and_the_daemon_flags_still_work() {
    let help = ok(&["help"]);
    for sub in [
        "card",
        "send",
        "get",
        "list",
        "cancel",
        "subscribe",
        "Exit status",
    ] {
        assert!(help.contains(sub), "{help}");
    }
    let full = ok(&["--help"]);
    assert!(
        full.contains("--config FILE") && full.contains("agentd subscribe URL TASK"),
        "{full}"
    );
    let sub = ok(&["list", "--help"]);
    assert!(sub.starts_with("Usage: agentd list URL"), "{sub}");
    let err = fails(&["card"], 2);
    assert!(err.contains("missing URL"), "{err}");
}

#[test]
fn https_with_a_ca_and_mutual_tls() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};

    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "agentd cli e2e CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(params, ca_key);
    let leaf = |cn: &str, sans: Vec<SanType>| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let dns = |n: &str| SanType::DnsName(n.try_into().unwrap());
    let dir = TempDir::new("cli-tls");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let server = leaf(
        "agentd",
        vec![SanType::IpAddress("127.0.0.1".parse().unwrap())],
    );
    let (cert, key, ca) = (
        write("server.pem", &server.0),
        write("server.key", &server.1),
        write("ca.pem", &ca_pem),
    );
    let peer = leaf("peer-a", vec![dns("peer-a.agents.example")]);
    let (peer_cert, peer_key) = (write("peer.pem", &peer.0), write("peer.key", &peer.1));
    let stranger = leaf("stranger", vec![dns("stranger.example")]);
    let (s_cert, s_key) = (write("s.pem", &stranger.0), write("s.key", &stranger.1));
    let d = Daemon::start_setup(
        "smol",
        &Setup {
            https: true,
            sections: format!(
                "[a2a.tls]\ncert = \"{cert}\"\nkey = \"{key}\"\nclient_ca = \"{ca}\"\n\
                 [[a2a.principals]]\nid = \"peer-a\"\nrole = \"user\"\nmatch = {{ san = \"*.agents.example\" }}\n"
            ),
            ..Setup::default()
        },
    );
    let url = format!("https://{}/", d.tcp);
    let tls = ["--ca", &ca, "--cert", &peer_cert, "--key", &peer_key];
    let mut args = vec!["card", url.as_str()];
    args.extend(tls);
    let out = ok(&args);
    assert!(out.contains(&format!("JSONRPC 1.0  {url}")), "{out}");
    let mut args = vec!["list", url.as_str()];
    args.extend(tls);
    let out = ok(&args);
    assert!(out.contains("no tasks"), "{out}");

    // A certificate no rule names: the server's refusal, exit 1.
    let err = fails(
        &[
            "list", &url, "--ca", &ca, "--cert", &s_cert, "--key", &s_key,
        ],
        1,
    );
    assert!(err.contains("-31403"), "{err}");
    // No client certificate, or a server the system's CAs do not know: no connection.
    fails(&["list", &url, "--ca", &ca], 3);
    let other = KeyPair::generate().unwrap();
    let mut op = CertificateParams::new(Vec::<String>::new()).unwrap();
    op.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let other_ca = write("other-ca.pem", &op.self_signed(&other).unwrap().pem());
    let out = cli_env(
        &["list", &url, "--cert", &peer_cert, "--key", &peer_key],
        &[("SSL_CERT_FILE", other_ca.as_str())],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    // --cert without --key is a usage error.
    fails(&["list", &url, "--cert", &peer_cert], 2);
}

#[test]
fn against_the_python_sdk_server() {
    let sdk = SdkServer::start();
    let url = sdk.url.as_str();

    let card = ok(&["card", url]);
    assert!(
        card.contains("sdk echo") && card.contains("version 1.0.0"),
        "{card}"
    );
    assert!(card.contains(&format!("JSONRPC 1.0  {url}")), "{card}");
    assert!(!card.contains("extensions:"), "it declares none: {card}");
    let served = ok_json(&["card", url, "--json"]);
    assert_eq!(served["name"], "sdk echo");

    // A blocking send, then the same task read back.
    let out = ok(&["send", url, "hello", "--no-stream"]);
    assert!(out.contains("state    completed"), "{out}");
    assert!(
        out.contains("message  echo: hello") && out.contains("artifact echo: hello"),
        "{out}"
    );
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("task     "))
        .expect("a task line")
        .trim()
        .to_owned();
    let got = ok(&["get", url, &id, "--history", "5"]);
    assert!(
        got.contains("state    completed") && got.contains("user: hello"),
        "{got}"
    );
    let t = ok_json(&["get", url, &id, "--json"]);
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{t}");

    // A streamed send: the updates as they come, to completed.
    let out = ok(&["send", url, "streamed"]);
    assert!(out.contains("state    working  echoing"), "{out}");
    assert!(out.contains("artifact echo: streamed"), "{out}");
    assert!(out.contains("state    completed  echo: streamed"), "{out}");

    // Paging through a context.
    for n in 0..3 {
        ok(&[
            "send",
            url,
            &format!("paged {n}"),
            "--no-stream",
            "--context",
            "sdk-pages",
        ]);
    }
    let page1 = ok(&["list", url, "--context", "sdk-pages", "--page-size", "2"]);
    assert_eq!(
        page1.lines().filter(|l| l.contains("completed")).count(),
        2,
        "{page1}"
    );
    let token = page1
        .lines()
        .find_map(|l| l.strip_prefix("next page: --page-token "))
        .unwrap_or_else(|| panic!("no next page token:\n{page1}"))
        .trim()
        .to_owned();
    let page2 = ok(&[
        "list",
        url,
        "--context",
        "sdk-pages",
        "--page-size",
        "2",
        "--page-token",
        &token,
    ]);
    assert_eq!(
        page2.lines().filter(|l| l.contains("completed")).count(),
        1,
        "{page2}"
    );
    assert!(!page2.contains("next page"), "{page2}");

    // Subscribe to a working task, cancel it: the subscriber sees the end.
    let id = sdk.working_task();
    let mut live = Live::start(&["subscribe", url, &id]);
    live.until("working");
    let out = ok(&["cancel", url, &id]);
    assert!(out.contains("state    canceled"), "{out}");
    let (code, out, err) = live.finish();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("canceled"), "{out}");

    // A file part: its bytes, name and media type reach the server.
    let dir = TempDir::new("cli-sdk-file");
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "file body\n").unwrap();
    let r = ok_json(&[
        "send",
        url,
        "with a file",
        "--file",
        &file.display().to_string(),
        "--no-stream",
        "--json",
    ]);
    assert_eq!(r["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
    let t = ok_json(&[
        "get",
        url,
        r["task"]["id"].as_str().unwrap(),
        "--history",
        "5",
        "--json",
    ]);
    let user = t["history"]
        .as_array()
        .and_then(|h| h.iter().find(|m| m["role"] == "ROLE_USER"))
        .unwrap_or_else(|| panic!("no user message: {t}"));
    assert_eq!(user["parts"][1]["raw"], "ZmlsZSBib2R5Cg==", "{t}");
    assert_eq!(user["parts"][1]["filename"], "notes.txt", "{t}");
    assert_eq!(user["parts"][1]["mediaType"], "text/plain", "{t}");

    // Its refusals: exit 1 with the code.
    let err = fails(&["cancel", url, &id], 1);
    assert!(err.contains("error -32002"), "{err}");
    let err = fails(&["get", url, "no-such-task"], 1);
    assert!(err.contains("error -32001"), "{err}");
}

#[test]
fn a_blocking_send_on_a_terminal_shows_a_progress_line() {
    let d = paced_daemon();
    let gates = TempDir::new("cli-progress");
    let gate = gates.path().join("p").display().to_string();
    // `script` runs the client on a pseudo-terminal (util-linux).
    let command = format!(
        "{} send {} {gate} --no-stream",
        env!("CARGO_BIN_EXE_agentd"),
        d.tcp_url()
    );
    let mut child = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(format!("{gate}.1"), "").unwrap();
    std::fs::write(format!("{gate}.2"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the client on a terminal did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let all = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("waiting for the answer 1s"),
        "a progress line: {all:?}"
    );
    assert!(all.contains("\x1b[2K"), "the line is cleared: {all:?}");
    assert!(
        all.contains("\x1b[32mcompleted\x1b[0m"),
        "colour on a terminal: {all:?}"
    );

    // NO_COLOR: a terminal without colour.
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) runs");
    let all = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("state    completed"), "{all:?}");
    assert!(!all.contains("\x1b[3"), "no colour with NO_COLOR: {all:?}");
}
