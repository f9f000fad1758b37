//! The web console (`/console/`, docs/console.md) end to end.
//!
//! On the wire: 404 while `a2a.console.enabled` is off; while on, every file with its
//! content type, the strict CSP, nosniff, an entity tag that answers 304; GET and HEAD only;
//! unknown paths 404; and the CORS refusals of another origin exactly as without it.
//!
//! In a real headless Chromium, driven over the DevTools protocol on `--remote-debugging-pipe`
//! (fds 3 and 4, NUL-terminated JSON): the page refuses a wrong token and signs in with the
//! bearer; a workflow started from outside appears live from the events feed with its gate;
//! the gate's form, generated from its askSchema, is filled and answered in the browser and
//! the run completes in the page; a task is cancelled, the instance paused and resumed from
//! the page; a second tab signs in with the device grant; a daemon without the events
//! extension is followed by polling; and the page drains the daemon, which exits 0.
//! Screenshots land in target/; with AGENTD_UPDATE_SCREENSHOTS=1 also in docs/images/.
//!
//! Needs Debian's `chromium` (scripts/test.sh installs it); without it the test fails.
//! Chromium runs in its own process group with a deadline, and every process of it is killed
//! and reaped at the end (this process is a child subreaper). Keep one chromium test here:
//! that cleanup takes any chromium child of this process for a leftover.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::chromium::{find_tool, pid, stop_leftovers};
use common::{bare, get, post, rpc_body, task_state, Daemon, Setup, TempDir, RPC_HEADERS};
use rustix::process::Signal;
use serde_json::{json, Value};

const COMMAND: &str = "https://agentd.dev/a2a/ext/command";
const ANNOTATIONS: &str = "https://agentd.dev/a2a/ext/task-annotations";
const BEARER_ENV: &str = "AGENTD_E2E_BEARER";
const FILES: [(&str, &str); 4] = [
    ("/console", "text/html; charset=utf-8"),
    ("/console/", "text/html; charset=utf-8"),
    ("/console/console.js", "text/javascript; charset=utf-8"),
    ("/console/console.css", "text/css; charset=utf-8"),
];

/// The whole chromium session, start to drain.
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(150);
/// One DevTools call.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// A gate whose schema has a boolean, a string, an integer and an enum, and a run that
/// waits for a signal (to be cancelled).
const WORKFLOWS: &str = r#"
[[workflows]]
name = "release"
description = "Ask a person, then ship"

[[workflows.steps]]
id = "start"
kind = "a2a"
command = "release.start"
roles = ["user", "operator"]
schema = { type = "object", properties = { tag = { type = "string" } }, required = ["tag"], additionalProperties = false }

[[workflows.steps]]
id = "approve"
kind = "human"
prompt = "Ship {{inputs.tag}}?"
schema = { type = "object", properties = { approve = { type = "boolean" }, note = { type = "string" }, count = { type = "integer" }, env = { enum = ["prod", "staging"] } }, required = ["approve", "env"] }
channel = "ops"

[[workflows.steps]]
id = "ship"
kind = "exec"
program = "/bin/echo"
args = ["shipped {{inputs.tag}} approve={{steps.approve.output.approve}} env={{steps.approve.output.env}} count={{steps.approve.output.count}}"]

[[workflows]]
name = "waiter"
[[workflows.steps]]
id = "wait"
kind = "signal"
signal = "go"
"#;

fn token() -> String {
    format!(
        "e2e-console-{}-{:x}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// A daemon with the operator's bearer `token`, the workflows and `sections`.
fn daemon(token: &str, sections: &str) -> Daemon {
    daemon_on("smol", token, sections)
}

fn daemon_on(driver: &str, token: &str, sections: &str) -> Daemon {
    let setup = Setup {
        a2a: format!("bearer = \"{{{{secret:{BEARER_ENV}}}}}\""),
        sections: format!("{sections}\n{WORKFLOWS}"),
        env: vec![(BEARER_ENV.into(), token.into())],
        ..Setup::default()
    };
    Daemon::start_setup(driver, &setup)
}

/// A command sent as the operator (bearer), answered at once (`returnImmediately`); the
/// whole JSON-RPC answer. `agentd run` starts the gated run below; this is for the runs that
/// wait for a signal (a blocking send, which is what `agentd run` makes, returns only when
/// a run ends or stops at a gate) and for reading `status` and approving a device.
fn command(d: &Daemon, token: &str, envelope: Value) -> Value {
    let params = json!({
        "message": {
            "role": "ROLE_USER",
            "messageId": common::fresh_id(),
            "extensions": [COMMAND],
            "parts": [{"data": {"agentd": envelope}}],
        },
        "configuration": {"returnImmediately": true},
    });
    let ext = format!("A2A-Extensions: {COMMAND}, {ANNOTATIONS}");
    let auth = format!("Authorization: Bearer {token}");
    let r = d.connect_tcp().request(&post(
        &[RPC_HEADERS[0], RPC_HEADERS[1], &ext, &auth],
        &rpc_body("1", "SendMessage", &params),
    ));
    assert_eq!(r.status, 200, "{envelope}: {}", r.body_text());
    r.json()
}

/// GetTask as the operator, with the task's annotations.
fn get_task(d: &Daemon, token: &str, id: &str) -> Value {
    let auth = format!("Authorization: Bearer {token}");
    let ext = format!("A2A-Extensions: {ANNOTATIONS}");
    let r = d.connect_tcp().request(&post(
        &[RPC_HEADERS[0], RPC_HEADERS[1], &auth, &ext],
        &rpc_body("1", "GetTask", &json!({"id": id})),
    ));
    let doc = r.json();
    assert!(doc.get("error").is_none(), "GetTask {id}: {doc}");
    doc["result"].clone()
}

/// Polls [`get_task`] until the task is in state `want`; panics after 20 s.
fn wait_state(d: &Daemon, token: &str, id: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = get_task(d, token, id);
        if task_state(&t) == want {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} never reached {want}: {t}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------
// On the wire.

#[test]
fn the_console_is_off_by_default_and_served_with_strict_headers_when_on() {
    for driver in common::DRIVERS {
        console_on_the_wire(driver);
    }
}

fn console_on_the_wire(driver: &str) {
    let t = token();
    let origin = "http://127.0.0.1:9";
    let cors = format!("[a2a.cors]\norigins = [\"{origin}\"]\n");
    let mut off = daemon_on(driver, &t, &cors);
    let mut on = daemon_on(
        driver,
        &t,
        &format!("{cors}[a2a.console]\nenabled = true\n"),
    );

    for (path, _) in FILES {
        let r = off.connect_tcp().request(&get(path, &[]));
        assert_eq!(r.status, 404, "{path} with the console off");
    }
    // --print-config says which.
    for (d, want) in [(&off, "false"), (&on, "true")] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentd"))
            .arg("--print-config")
            .arg("--config")
            .arg(d.dir().join("agentd.toml"))
            .env(BEARER_ENV, &t)
            .output()
            .expect("run agentd --print-config");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            printed.contains(&format!("[a2a.console]\nenabled = {want}\n")),
            "{printed}"
        );
    }

    for (path, kind) in FILES {
        let r = on.connect_tcp().request(&get(path, &[]));
        assert_eq!(r.status, 200, "GET {path}: {:?}", r.headers);
        assert_eq!(r.header("content-type"), Some(kind), "{path}");
        let csp = r.header("content-security-policy").unwrap_or_default();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(
                csp.contains(directive),
                "{path}: CSP {csp:?} lacks {directive}"
            );
        }
        assert!(!csp.contains("unsafe-"), "{path}: CSP {csp:?}");
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(r.header("cache-control"), Some("no-cache"), "{path}");
        assert!(!r.body.is_empty(), "{path}");
        // Revalidation by the entity tag.
        let etag = r.header("etag").expect("an entity tag").to_owned();
        let again = on
            .connect_tcp()
            .request(&get(path, &[&format!("If-None-Match: {etag}")]));
        assert_eq!(again.status, 304, "{path} with its own tag");
        assert!(again.body.is_empty());
        // HEAD: the length, no body.
        let mut c = on.connect_tcp();
        c.send(&bare("HEAD", path, &[]));
        let head = c.read_head_response();
        assert_eq!(head.status, 200, "HEAD {path}");
        assert_eq!(
            head.header("content-length"),
            Some(r.body.len().to_string().as_str()),
            "HEAD {path}"
        );
        // Nothing but GET and HEAD.
        let refused = on.connect_tcp().request(&bare("DELETE", path, &[]));
        assert_eq!(refused.status, 405, "DELETE {path}");
        assert_eq!(refused.header("allow"), Some("GET, HEAD"), "DELETE {path}");
    }
    let index = on.connect_tcp().request(&get("/console/", &[])).body_text();
    assert!(
        index.contains("src=\"/console/console.js\"") && !index.contains("<script>"),
        "the page loads its one script from its own origin, inline nothing: {index}"
    );
    for path in [
        "/console/nope.js",
        "/console/console.js/",
        "/consolex",
        "/console/..",
    ] {
        let r = on.connect_tcp().request(&get(path, &[]));
        assert_eq!(r.status, 404, "{path}");
    }

    // Another origin: the same refusals with the console as without, and the console's files
    // carry no CORS grant (a page elsewhere cannot read them).
    let other = "Origin: http://127.0.0.1:10";
    for d in [&mut off, &mut on] {
        let auth = format!("Authorization: Bearer {t}");
        let preflight = d.connect_tcp().request(&bare(
            "OPTIONS",
            "/",
            &[other, "Access-Control-Request-Method: POST"],
        ));
        let call = d.connect_tcp().request(&post(
            &[RPC_HEADERS[0], RPC_HEADERS[1], other, &auth],
            &rpc_body("1", "ListTasks", &json!({})),
        ));
        for (what, r) in [("preflight", &preflight), ("call", &call)] {
            assert_eq!(r.status, 403, "{what} from another origin");
            assert!(
                r.headers
                    .iter()
                    .all(|(n, _)| !n.starts_with("access-control-")),
                "{what}: {:?}",
                r.headers
            );
        }
        // The listed origin still reads its answers.
        let listed = d.connect_tcp().request(&post(
            &[
                RPC_HEADERS[0],
                RPC_HEADERS[1],
                &format!("Origin: {origin}"),
                &auth,
            ],
            &rpc_body("1", "ListTasks", &json!({})),
        ));
        assert_eq!(listed.status, 200);
        assert_eq!(listed.header("access-control-allow-origin"), Some(origin));
        d.assert_alive();
    }
    // The console's own origin (the listener's, as the card names it) calls same-origin
    // while the console is on; without the console it is as unlisted as any other.
    for (d, want) in [(&off, 403), (&on, 200)] {
        let own = format!("Origin: http://{}", d.tcp);
        let r = d.connect_tcp().request(&post(
            &[
                RPC_HEADERS[0],
                RPC_HEADERS[1],
                &own,
                &format!("Authorization: Bearer {t}"),
            ],
            &rpc_body("1", "ListTasks", &json!({})),
        ));
        assert_eq!(r.status, want, "{own}: {}", r.body_text());
        assert!(
            r.headers
                .iter()
                .all(|(n, _)| !n.starts_with("access-control-")),
            "{:?}",
            r.headers
        );
        // A host name that only resolves here (DNS rebinding) is another origin.
        let rebound = format!("Origin: http://rebound.example:{}", d.tcp.port());
        let r = d.connect_tcp().request(&post(
            &[
                RPC_HEADERS[0],
                RPC_HEADERS[1],
                &rebound,
                &format!("Authorization: Bearer {t}"),
            ],
            &rpc_body("1", "ListTasks", &json!({})),
        ));
        assert_eq!(r.status, 403, "{rebound}");
    }
    let js = on
        .connect_tcp()
        .request(&get("/console/console.js", &[other]));
    assert_eq!(js.status, 200);
    assert!(
        js.headers
            .iter()
            .all(|(n, _)| !n.starts_with("access-control-")),
        "{:?}",
        js.headers
    );
}

// ---------------------------------------------------------------------------------------
// In the browser.

#[test]
fn the_console_signs_in_follows_a_run_answers_its_gate_and_operates_the_instance() {
    let chromium = find_tool("chromium").unwrap_or_else(|| {
        panic!(
            "chromium is not installed: this test drives a real headless Chromium. scripts/test.sh \
             installs it (apt-get install -y --no-install-recommends chromium)"
        )
    });
    // Chromium's orphaned helpers come back to this process, to be reaped.
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let t = token();
    // A short feed deadline: the page must resume across the stream ending again and again.
    // A fixed port and a store of the test's own, so the daemon can be restarted under the
    // page (the feed's numbers then start afresh: the page must resync).
    let work = TempDir::new("agentd-e2e-console");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let echo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/agents/echo_agent.py")
        .display()
        .to_string();
    let setup = Setup {
        a2a: format!("bearer = \"{{{{secret:{BEARER_ENV}}}}}\""),
        sections: format!(
            "[a2a.console]\nenabled = true\n\
             [a2a.events]\nenabled = true\nstream_deadline_ms = 1500\n\
             [a2a.device_grant]\nenabled = true\nscopes = [\"user\", \"operator\"]\n\
             [[subagents]]\nname = \"echo\"\ncommand = [\"python3\", {echo:?}]\n{WORKFLOWS}"
        ),
        env: vec![(BEARER_ENV.into(), t.clone())],
        tcp_entry: Some(format!("\"tcp://127.0.0.1:{port}\"")),
        store_dir: Some(work.path().join("data")),
        ..Setup::default()
    };
    let mut d = Daemon::start_setup("smol", &setup);
    let base = format!("http://{}", d.tcp);
    let mut b = Browser::start(&chromium, work.path());

    // Sign-in: a wrong token is refused in the page, the bearer is taken.
    b.open(&format!("{base}/console"));
    b.wait_for(
        "the card read and the device sign-in offered",
        "document.getElementById('instance').textContent === 'agentd' && \
         !document.getElementById('device').hidden",
    );
    b.eval(&sign_in_js("not-the-token"));
    b.wait_for(
        "the wrong token refused",
        "document.getElementById('signin-error').textContent.includes('401')",
    );
    assert_eq!(b.eval("document.getElementById('app').hidden"), json!(true));
    b.eval(&sign_in_js(&t));
    b.wait_for(
        "signed in and following the feed",
        "!document.getElementById('app').hidden && \
         document.getElementById('conn').dataset.mode === 'live'",
    );
    assert_eq!(
        b.eval("sessionStorage.getItem('agentd.console.token')"),
        json!(t),
        "the token is kept in sessionStorage"
    );

    // A run, started from outside, shows up live with its gate.
    // Started with the client, `agentd run`: it checks the workflow's command against the
    // extended card and blocks until the run stops at its gate.
    let started = common::cli::cli_env(
        &[
            "run",
            &format!("{base}/"),
            "release.start",
            "--arg",
            "tag=v9",
            "--json",
        ],
        &[("AGENTD_TOKEN", &t)],
    );
    assert_eq!(
        started.status.code(),
        Some(0),
        "agentd run: {}",
        common::cli::text(&started)
    );
    let started: Value = serde_json::from_slice(&started.stdout).expect("run --json is JSON");
    let task = started["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task for the run: {started}"))
        .to_owned();
    assert_eq!(
        task_state(&started["task"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{started}"
    );
    let run = wait_state(&d, &t, &task, "TASK_STATE_INPUT_REQUIRED");
    let run_id = run["metadata"][ANNOTATIONS]["link"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("the run's id in the annotations: {run}"))
        .to_owned();
    let gate = format!("document.querySelector('[data-gate=\"{task}\"]')");
    let run_el = format!("document.querySelector('[data-run=\"{run_id}\"]')");
    b.wait_for(
        "the run waiting at its gate",
        &format!(
            "{run_el} && {run_el}.dataset.status === 'waiting' && \
             {run_el}.querySelector('[data-step=\"approve\"]').dataset.state === 'waiting' && \
             {run_el}.querySelector('[data-step=\"start\"]').dataset.state === 'done' && \
             {run_el}.querySelector('[data-step=\"ship\"]').dataset.state === 'pending' && \
             {gate} && {gate}.querySelector('h3').textContent === 'Ship v9?'"
        ),
    );
    // The form follows the schema: a checkbox, a text, a number, a select of the enum.
    let kinds = b.eval(&format!(
        "[...{gate}.querySelectorAll('input,select,textarea')].map(e => e.name + ':' + (e.type || e.tagName))"
    ));
    assert_eq!(
        kinds,
        json!([
            "approve:checkbox",
            "count:number",
            "env:select-one",
            "note:text"
        ])
    );
    b.screenshot("console-gate", work.path());

    // Answered in the browser: the run completes in the page with the typed answer.
    b.eval(&format!(
        "(() => {{ const g = {gate};
           g.querySelector('[name=approve]').click();
           g.querySelector('[name=note]').value = 'from the console';
           g.querySelector('[name=count]').value = '3';
           const env = g.querySelector('[name=env]');
           env.value = [...env.options].find(o => o.textContent === '\"prod\"').value;
           g.querySelector('form').requestSubmit(); return true; }})()"
    ));
    b.wait_for(
        "the run completed in the page",
        &format!(
            "{run_el} && {run_el}.dataset.status === 'completed' && \
             {run_el}.querySelector('.output').textContent.includes('approve=true env=prod count=3') && \
             !{gate} && \
             document.querySelector('[data-task=\"{task}\"]').dataset.state === 'TASK_STATE_COMPLETED' && \
             document.getElementById('status').textContent.includes('\"runs\": 1')"
        ),
    );
    let done = get_task(&d, &t, &task);
    assert_eq!(task_state(&done), "TASK_STATE_COMPLETED", "{done}");
    let answer = done["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["role"] == "ROLE_USER"
                && m["messageId"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("console-"))
        })
        .find_map(|m| m["parts"][0].get("data"))
        .cloned();
    assert_eq!(
        answer,
        Some(json!({"approve": true, "note": "from the console", "count": 3, "env": "prod"})),
        "the gate's answer, typed by the schema: {done}"
    );

    // The feed stream ends at its deadline (1.5 s here); the page resumes from its last
    // seq, and what happens next (the cancel below) still reaches it.
    b.wait_for(
        "a goodbye, and the feed followed again",
        "[...document.querySelectorAll('#log li')].some(l => l.textContent.includes('goodbye (deadline)')) && \
         document.getElementById('conn').dataset.mode === 'live'",
    );

    // Cancel from the page.
    let waiting = command(&d, &t, json!({"op": "workflow.run", "workflow": "waiter"}));
    let waiter = waiting["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task for the waiter: {waiting}"))
        .to_owned();
    let row = format!("document.querySelector('[data-task=\"{waiter}\"]')");
    b.wait_for(
        "the waiter's task with a cancel button",
        &format!("{row} && {row}.querySelector('button')"),
    );
    b.eval(&format!("{row}.querySelector('button').click(), true"));
    b.wait_for(
        "the waiter cancelled in the page",
        &format!(
            "{row} && {row}.dataset.state === 'TASK_STATE_CANCELED' && \
             document.querySelector('[data-run][data-status=\"cancelled\"] [data-step=\"wait\"]')?.dataset.state === 'stopped'"
        ),
    );
    assert_eq!(
        task_state(&get_task(&d, &t, &waiter)),
        "TASK_STATE_CANCELED"
    );

    // A subagent appears under Agents, with its state.
    let sent = command(
        &d,
        &t,
        json!({"op": "subagent.send", "handle": "echo:a", "message": "ping"}),
    );
    assert!(sent.get("error").is_none(), "{sent}");
    b.wait_for(
        "the subagent",
        "document.querySelector('[data-subagent=\"echo:a\"]')?.textContent.includes('subagent echo:a')",
    );

    b.screenshot("console-done", work.path());

    // Pause and resume as the operator.
    let paused = |d: &Daemon| {
        command(d, &t, json!({"op": "status"}))["result"]["message"]["parts"][0]["data"]["paused"]
            .clone()
    };
    b.eval("document.getElementById('op-pause').click(), true");
    b.wait_for(
        "paused",
        "document.getElementById('lifecycle').dataset.state === 'paused' && \
         document.getElementById('status').textContent.includes('\"paused\": true')",
    );
    assert_eq!(paused(&d), json!(true));
    b.eval("document.getElementById('op-resume').click(), true");
    b.wait_for(
        "resumed",
        "document.getElementById('lifecycle').dataset.state === 'running'",
    );
    assert_eq!(paused(&d), json!(false));

    // The daemon restarts under the page: the page reconnects, is told it missed events
    // (its cursor is from before the restart), reads the state again, and follows on.
    d.kill();
    b.wait_for(
        "the feed lost",
        "document.getElementById('conn').dataset.mode === 'reconnecting'",
    );
    let mut d = Daemon::start_setup("smol", &setup);
    b.wait_for(
        "the feed resynced after the restart",
        "[...document.querySelectorAll('#log li')].some(l => l.textContent.includes('events were missed')) && \
         document.getElementById('conn').dataset.mode === 'live'",
    );
    // Read again: the tasks from before the restart are still listed.
    b.wait_for(
        "the tasks kept across the restart",
        &format!(
            "document.querySelector('[data-task=\"{task}\"]') && \
             document.querySelector('[data-task=\"{waiter}\"]')"
        ),
    );
    let after = command(&d, &t, json!({"op": "workflow.run", "workflow": "waiter"}));
    let after = after["result"]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task for the waiter: {after}"))
        .to_owned();
    b.wait_for(
        "a task started after the restart, live",
        &format!(
            "document.querySelector('[data-task=\"{after}\"]')?.dataset.state === 'TASK_STATE_WORKING'"
        ),
    );

    // A second tab (its own sessionStorage) signs in with the device grant.
    b.new_tab();
    b.open(&format!("{base}/console/"));
    b.wait_for(
        "the device sign-in offered",
        "!document.getElementById('device').hidden",
    );
    b.eval(
        "document.getElementById('device-scope').value = 'operator'; \
         document.getElementById('device-start').click(), true",
    );
    let code = b.wait_for(
        "a user code",
        "document.getElementById('user-code').textContent || null",
    );
    let approved = command(
        &d,
        &t,
        json!({"op": "auth.device.approve", "user_code": code, "as": "ops-console", "scope": "operator"}),
    );
    assert!(approved.get("error").is_none(), "{approved}");
    b.wait_for(
        "signed in by the device grant",
        "!document.getElementById('app').hidden && \
         document.getElementById('conn').dataset.mode === 'live' && \
         document.querySelectorAll('[data-task]').length >= 2",
    );
    let session = b.eval("sessionStorage.getItem('agentd.console.token')");
    assert!(
        session.as_str().is_some_and(|s| !s.is_empty() && s != t),
        "the device's own token: {session}"
    );

    // A listener that declares no credential has only the implicit loopback operator,
    // which a browser never is: the page says so instead of offering a sign-in.
    let bare_daemon = Daemon::start_setup(
        "std",
        &Setup {
            sections: "[a2a.console]\nenabled = true\n".into(),
            ..Setup::default()
        },
    );
    b.new_tab();
    b.open(&format!("http://{}/console/", bare_daemon.tcp));
    b.wait_for(
        "no sign-in offered without a credential",
        "document.getElementById('token-form').hidden && \
         document.getElementById('signin-error').textContent.includes('never its implicit operator')",
    );
    drop(bare_daemon);

    // Without the events extension the page polls ListTasks.
    let plain = daemon(&t, "[a2a.console]\nenabled = true\n");
    b.new_tab();
    b.open(&format!("http://{}/console/", plain.tcp));
    b.wait_for(
        "the card read",
        "document.getElementById('instance').textContent === 'agentd'",
    );
    b.eval(&sign_in_js(&t));
    b.wait_for(
        "polling",
        "document.getElementById('conn').dataset.mode === 'polling' && \
         !document.getElementById('operator').hidden",
    );
    let other = command(
        &plain,
        &t,
        json!({"op": "workflow.run", "workflow": "waiter"}),
    );
    let other = other["result"]["task"]["id"].as_str().unwrap().to_owned();
    b.wait_for(
        "the polled task",
        &format!("document.querySelector('[data-task=\"{other}\"]') !== null"),
    );
    drop(plain);

    // Drain from the first tab: two clicks, and the daemon exits 0.
    b.switch_tab(0);
    b.eval("document.getElementById('op-drain').click(), true");
    b.eval("document.getElementById('op-drain').click(), true");
    let status = d.wait_exit(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "expected the drain from the page to exit the daemon 0, got {status:?}; stderr: {}",
        d.stderr()
    );
    b.stop();
}

fn sign_in_js(token: &str) -> String {
    format!(
        "document.getElementById('token').value = {}; \
         document.getElementById('token-form').requestSubmit(), true",
        json!(token)
    )
}

// ---------------------------------------------------------------------------------------
// Chromium over the DevTools protocol.

/// A headless chromium on `--remote-debugging-pipe`: commands go to its fd 3, answers and
/// events come from its fd 4, each a JSON text ended by a NUL.
struct Browser {
    pgid: u32,
    child: std::process::Child,
    to: ChildStdin,
    from: mpsc::Receiver<Value>,
    next: u64,
    /// The sessions of the tabs opened, in order; the last is the one driven.
    tabs: Vec<String>,
    session: String,
    deadline: Instant,
    stderr: PathBuf,
}

impl Browser {
    fn start(chromium: &Path, work: &Path) -> Browser {
        let home = work.join("home");
        fs::create_dir_all(&home).expect("create chromium's HOME");
        let stderr = work.join("chromium.stderr");
        let log = fs::File::create(&stderr).expect("create chromium's stderr log");
        // The shell hands chromium our stdin as its fd 3 and our stdout as its fd 4 (the
        // pipe's ends), then execs it: the process is chromium, in a group of its own.
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 </dev/null >/dev/null"#)
            .arg(chromium)
            .args(common::chromium::HEADLESS_FLAGS)
            .args(["--hide-scrollbars", "--remote-debugging-pipe"])
            .arg(format!(
                "--user-data-dir={}",
                work.join("profile").display()
            ))
            .arg("about:blank");
        let mut child = common::chromium::isolate(&mut cmd, &home, work)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("expected to start {}: {e}", chromium.display()));
        let pgid = child.id();
        let to = child.stdin.take().expect("piped stdin");
        let mut out = child.stdout.take().expect("piped stdout");
        let (tx, from) = mpsc::channel();
        std::thread::spawn(move || {
            let mut pending = Vec::new();
            let mut buf = [0u8; 65536];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.iter().position(|b| *b == 0) {
                    let msg: Vec<u8> = pending.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&msg[..end]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            pgid,
            child,
            to,
            from,
            next: 1,
            tabs: Vec::new(),
            session: String::new(),
            deadline: Instant::now() + CHROMIUM_DEADLINE,
            stderr,
        };
        b.new_tab();
        b
    }

    /// One DevTools call on the browser (`session` empty) or the driven tab.
    fn send(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        if let Err(e) = self.to.write_all(&bytes).and_then(|_| self.to.flush()) {
            panic!("expected chromium to take {method}: {e}; {}", self.report());
        }
        let until = (Instant::now() + CALL_TIMEOUT).min(self.deadline);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.from.recv_timeout(left) {
                Ok(v) if v["id"] == id => {
                    if let Some(e) = v.get("error") {
                        panic!("DevTools {method} failed: {e}; {}", self.report());
                    }
                    return v["result"].clone();
                }
                Ok(_) => {} // an event, or another call's late answer
                Err(_) => panic!(
                    "expected chromium to answer {method} within {CALL_TIMEOUT:?} (and the whole \
                     session within {CHROMIUM_DEADLINE:?}); {}",
                    self.report()
                ),
            }
        }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.send(Some(&s), method, params)
    }

    /// Opens a tab (its own sessionStorage) and drives it from now on.
    fn new_tab(&mut self) {
        let target = self.send(None, "Target.createTarget", json!({"url": "about:blank"}));
        let attached = self.send(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        self.session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        self.tabs.push(self.session.clone());
        self.call("Page.enable", json!({}));
        self.call("Runtime.enable", json!({}));
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
    }

    fn switch_tab(&mut self, n: usize) {
        self.session = self.tabs[n].clone();
    }

    fn open(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url}));
        assert!(r.get("errorText").is_none(), "navigate to {url}: {r}");
    }

    /// Evaluates `expr` in the tab; its value (promises awaited). An exception fails the test.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!(
                "the page threw evaluating {expr}: {e}; {}",
                self.page_report()
            );
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is truthy (not null, false, 0 or ""); its value.
    fn wait_for(&mut self, what: &str, expr: &str) -> Value {
        let until = (Instant::now() + Duration::from_secs(30)).min(self.deadline);
        loop {
            let r = self.call(
                "Runtime.evaluate",
                json!({"expression": expr, "returnByValue": true}),
            );
            let v = r["result"]["value"].clone();
            let truthy = !matches!(&v, Value::Null | Value::Bool(false))
                && v != json!(0)
                && v != json!("")
                && r.get("exceptionDetails").is_none();
            if truthy {
                return v;
            }
            if Instant::now() >= until {
                panic!(
                    "expected the page to show {what} ({expr}); last {r}; {}",
                    self.page_report()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the tab into target/, and into docs/images/ with AGENTD_UPDATE_SCREENSHOTS=1.
    fn screenshot(&mut self, name: &str, work: &Path) {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64_decode(r["data"].as_str().expect("screenshot data"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let mut out = vec![
            target.join(format!("{name}.png")),
            work.join(format!("{name}.png")),
        ];
        if std::env::var("AGENTD_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
            out.push(root.join("docs/images").join(format!("{name}.png")));
        }
        for p in out {
            if let Some(dir) = p.parent() {
                let _ = fs::create_dir_all(dir);
            }
            fs::write(&p, &png).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        }
    }

    fn page_report(&mut self) -> String {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": "document.body ? document.body.innerText : ''", "returnByValue": true}),
        );
        let text = r["result"]["value"].as_str().unwrap_or_default().to_owned();
        format!("page text:\n{text}\n{}", self.report())
    }

    fn report(&self) -> String {
        let stderr = fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.contains("dbus") && !l.contains("unexpected operator"))
            .collect();
        format!("chromium stderr (noise filtered):\n{}", lines.join("\n"))
    }

    /// Closes the browser; the rest is [`Drop`]'s.
    fn stop(mut self) {
        let _ = self.send(None, "Browser.close", json!({}));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(pid(self.pgid), Signal::KILL);
        let _ = self.child.wait();
        stop_leftovers(self.pgid);
    }
}

/// Standard base64 (the screenshot's PNG).
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
