//! Push notifications on the real binary, against a real local HTTP receiver: the four
//! push-config methods, delivery with the registered authentication and token headers and
//! the spec's body (no history, no annotations), retries with backoff, giving up after the
//! bound (logged), and the SSRF refusals of private and loopback webhooks.

mod common;

use std::time::{Duration, Instant};

use common::receiver::Receiver;
use common::{get, post, Daemon, Setup, Via, RPC_HEADERS};
use serde_json::{json, Value};

const ANNOTATIONS_URI: &str = "https://agentd.dev/a2a/ext/task-annotations";

/// The receiver's webhook URL.
fn hook(rx: &Receiver) -> String {
    format!("{}/hook?k=1", rx.base())
}

fn daemon(push: &str) -> Daemon {
    Daemon::start_setup(
        "smol",
        &Setup {
            sections: format!("[a2a.push]\n{push}\n"),
            ..Setup::default()
        },
    )
}

/// `agentd_push_deliveries_total{outcome}` from `/metrics` (read as the operator, over the
/// unix socket).
fn deliveries(d: &Daemon, outcome: &str) -> String {
    let text = d
        .connect(Via::Unix)
        .request(&get("/metrics", &[]))
        .body_text();
    let series = format!("agentd_push_deliveries_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .to_owned()
}

fn call(d: &Daemon, method: &str, params: Value) -> Value {
    let ext = format!("A2A-Extensions: {ANNOTATIONS_URI}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    d.connect_tcp()
        .request(&post(
            &[RPC_HEADERS[0], RPC_HEADERS[1], &ext],
            body.to_string().as_bytes(),
        ))
        .json()
}

fn send_with_webhook(d: &Daemon, url: &str) -> Value {
    call(
        d,
        "SendMessage",
        json!({"message": {"role": "ROLE_USER", "messageId": "m-1", "parts": [{"text": "hi"}]},
               "configuration": {"taskPushNotificationConfig": {"url": url, "token": "tok-1",
                   "authentication": {"scheme": "Bearer", "credentials": "s3cret"}}}}),
    )
}

#[test]
fn deliveries_carry_auth_and_the_task_and_retry_with_backoff() {
    let rx = Receiver::start(vec![503, 503]);
    let d = daemon("enabled = true\nallow_private = true\nbackoff_ms = 50\n");
    let card = d.connect_tcp().get_card().json();
    assert_eq!(card["capabilities"]["pushNotifications"], true);

    let r = send_with_webhook(&d, &hook(&rx));
    let task = &r["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_REJECTED", "{r}");
    let id = task["id"].as_str().unwrap();

    // Two 503s, then the 200: three attempts, each the same POST.
    let hits = rx.wait_for(3, Duration::from_secs(10));
    assert_eq!(hits.len(), 3, "{hits:?}");
    for h in &hits {
        assert_eq!(h.path, "/hook?k=1");
        assert_eq!(h.header("authorization"), Some("Bearer s3cret"));
        assert_eq!(h.header("x-a2a-notification-token"), Some("tok-1"));
        assert_eq!(h.header("content-type"), Some("application/a2a+json"));
        let t = &h.body["task"];
        assert_eq!(t["id"], id);
        assert_eq!(t["status"]["state"], "TASK_STATE_REJECTED");
        assert!(
            t.get("history").is_none(),
            "no history in a webhook body: {t}"
        );
        assert!(
            t.get("metadata").is_none(),
            "no annotations in a webhook body: {t}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rx.hits().len(), 3, "nothing more after the 200");
    assert!(d.stderr().contains("a2a.push.delivered"), "{}", d.stderr());
    assert_eq!(
        deliveries(&d, "delivered"),
        "1",
        "one delivery, however many attempts"
    );
    assert_eq!(deliveries(&d, "failed"), "0");

    // The inline config was bound to the task; read-backs never show the credentials.
    let listed = call(&d, "ListTaskPushNotificationConfigs", json!({"taskId": id}));
    let configs = listed["result"]["configs"].as_array().unwrap().clone();
    assert_eq!(configs.len(), 1, "{listed}");
    assert_eq!(configs[0]["taskId"], id);
    assert_eq!(configs[0]["authentication"], json!({"scheme": "Bearer"}));
    assert!(configs[0].get("token").is_none());
    assert_eq!(listed["result"]["nextPageToken"], "");
}

#[test]
fn the_four_methods_manage_configs_per_task() {
    let rx = Receiver::start(vec![]);
    let d = daemon("enabled = true\nallow_private = true\n");
    let r = call(
        &d,
        "SendMessage",
        json!({"message": {"role": "ROLE_USER", "messageId": "m-2", "parts": [{"text": "x"}]}}),
    );
    let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();

    let created = call(
        &d,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "url": hook(&rx)}),
    );
    let cid = created["result"]["id"].as_str().unwrap().to_owned();
    assert!(!cid.is_empty(), "the server assigns an id: {created}");
    let named = call(
        &d,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "mine", "url": hook(&rx)}),
    );
    assert_eq!(named["result"]["id"], "mine");
    let got = call(
        &d,
        "GetTaskPushNotificationConfig",
        json!({"taskId": id, "id": "mine"}),
    );
    assert_eq!(got["result"]["url"], hook(&rx));
    let page = call(
        &d,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id, "pageSize": 1}),
    );
    assert_eq!(page["result"]["configs"].as_array().unwrap().len(), 1);
    let token = page["result"]["nextPageToken"].as_str().unwrap().to_owned();
    assert!(!token.is_empty());
    let rest = call(
        &d,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id, "pageToken": token}),
    );
    assert_eq!(rest["result"]["configs"].as_array().unwrap().len(), 1);
    assert_eq!(rest["result"]["nextPageToken"], "");
    let bad = call(
        &d,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id, "pageToken": "forged"}),
    );
    assert_eq!(bad["error"]["code"], -32602);

    let del = call(
        &d,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": id, "id": "mine"}),
    );
    assert_eq!(del["result"], json!({}));
    let again = call(
        &d,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": id, "id": "mine"}),
    );
    assert_eq!(again["result"], json!({}), "delete is idempotent");
    let gone = call(
        &d,
        "GetTaskPushNotificationConfig",
        json!({"taskId": id, "id": "mine"}),
    );
    assert_eq!(gone["error"]["code"], -32001);
    let unknown = call(
        &d,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": "nope", "url": hook(&rx)}),
    );
    assert_eq!(unknown["error"]["code"], -32001);
}

#[test]
fn private_and_loopback_webhooks_are_refused_without_the_switch() {
    let rx = Receiver::start(vec![]);
    let d = daemon("enabled = true\n");
    let r = send_with_webhook(&d, &hook(&rx));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("push url refused"),
        "{r}"
    );
    let r = call(
        &d,
        "SendMessage",
        json!({"message": {"role": "ROLE_USER", "messageId": "m-3", "parts": [{"text": "x"}]}}),
    );
    let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();
    for url in [
        hook(&rx),
        "https://10.1.2.3/hook".to_owned(),
        "https://169.254.169.254/latest".to_owned(),
        "https://[::1]/x".to_owned(),
        "http://hooks.example.com/".to_owned(),
    ] {
        let e = call(
            &d,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": url}),
        );
        assert_eq!(e["error"]["code"], -32602, "{url}: {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("push url refused"),
            "{e}"
        );
    }
    assert!(rx.hits().is_empty(), "nothing was sent");
}

#[test]
fn a_delivery_gives_up_after_the_bound_and_says_so() {
    let rx = Receiver::start(vec![500; 10]);
    let d = daemon("enabled = true\nallow_private = true\nmax_attempts = 2\nbackoff_ms = 20\n");
    let r = send_with_webhook(&d, &hook(&rx));
    assert!(r.get("result").is_some(), "{r}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.stderr().contains("a2a.push.failed") {
        assert!(
            Instant::now() < deadline,
            "no a2a.push.failed line: {}",
            d.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        rx.hits().len(),
        2,
        "exactly max_attempts tries: {}",
        d.stderr()
    );
    assert!(d.stderr().contains("attempts=2"), "{}", d.stderr());
    assert_eq!(deliveries(&d, "failed"), "1");
    assert_eq!(deliveries(&d, "delivered"), "0");
}

#[test]
fn push_is_refused_while_disabled() {
    let d = Daemon::start("std");
    let card = d.connect_tcp().get_card().json();
    assert_eq!(card["capabilities"]["pushNotifications"], false);
    let e = call(
        &d,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": "t", "url": "https://x.example/"}),
    );
    assert_eq!(e["error"]["code"], -32003);
}

#[test]
fn push_configs_survive_a_restart_and_deliveries_go_on() {
    let rx = Receiver::start(vec![]);
    let data = std::env::temp_dir().join(format!("agentd-push-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let setup = Setup {
        sections: "[a2a.push]\nenabled = true\nallow_private = true\nbackoff_ms = 20\n[a2a.introspection]\nenabled = true\n".into(),
        store_dir: Some(data.clone()),
        ..Setup::default()
    };
    // A task parked at a gate (a workflow's human step) with a webhook registered.
    let mut setup_wf = setup.clone();
    setup_wf.sections.push_str(
        "[[workflows]]\nname = \"gate\"\n[[workflows.steps]]\nid = \"ask\"\nkind = \"human\"\nprompt = \"ok?\"\n",
    );
    let mut d = Daemon::start_setup("smol", &setup_wf);
    let env = json!({"message": {"role": "ROLE_USER", "messageId": "m-w", "extensions": ["https://agentd.dev/a2a/ext/command"],
        "parts": [{"data": {"agentd": {"op": "workflow.run", "workflow": "gate"}}}]},
        "configuration": {"returnImmediately": true}});
    let ext = "A2A-Extensions: https://agentd.dev/a2a/ext/command";
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": env});
    let r = d
        .connect_tcp()
        .request(&post(
            &[RPC_HEADERS[0], RPC_HEADERS[1], ext],
            body.to_string().as_bytes(),
        ))
        .json();
    let id = r["result"]["task"]["id"].as_str().unwrap().to_owned();
    let c = call(
        &d,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "id": "keep", "url": hook(&rx), "token": "t-9"}),
    );
    assert_eq!(c["result"]["id"], "keep", "{c}");
    // (Registered after the gate opened: nothing was delivered yet.)
    let before = rx.hits().len();
    d.kill();

    // After the restart the config is there, and the task's end (it was in flight, so the
    // restart fails it with the reason) is delivered to it.
    let d = Daemon::start_setup("std", &setup_wf);
    let got = call(
        &d,
        "GetTaskPushNotificationConfig",
        json!({"taskId": id, "id": "keep"}),
    );
    assert_eq!(got["result"]["url"], hook(&rx), "{got}");
    let hits = rx.wait_for(before + 1, Duration::from_secs(10));
    let last = hits.last().unwrap();
    assert_eq!(last.body["task"]["id"], id);
    assert_eq!(
        last.body["task"]["status"]["state"], "TASK_STATE_FAILED",
        "{:?}",
        last.body
    );
    assert_eq!(last.header("x-a2a-notification-token"), Some("t-9"));
    drop(d);
    let _ = std::fs::remove_dir_all(&data);
}
