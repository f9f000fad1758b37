//! Identity on the real binary, both drivers: bearer rules give a non-operator its own view
//! (its feed has gaps where others' events were), and the device grant signs a device in,
//! after which revoking its session ends its feed stream with goodbye "revoked".

mod common;

use std::time::{Duration, Instant};

use common::{post, rpc_body, Daemon, Setup, Via};
use serde_json::{json, Value};

const EVENTS: &str = "A2A-Extensions: https://agentd.dev/a2a/ext/events";
const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";

fn setup(device_grant: bool, deadline_ms: u64) -> Setup {
    let mut sections =
        format!("[a2a.events]\nenabled = true\nstream_deadline_ms = {deadline_ms}\n");
    sections.push_str(
        "[[a2a.principals]]\nid = \"peer-a\"\nrole = \"agent\"\nmatch = { bearer_ref = \"{{secret:E2E_PEER}}\" }\n",
    );
    if device_grant {
        sections.push_str("[a2a.device_grant]\nenabled = true\n");
    }
    Setup {
        a2a: "bearer = \"{{secret:E2E_OP}}\"".into(),
        sections,
        env: vec![
            ("E2E_OP".into(), "op-token".into()),
            ("E2E_PEER".into(), "peer-token".into()),
        ],
        ..Setup::default()
    }
}

fn call(d: &Daemon, token: &str, method: &str, params: Value, extra: &[&str]) -> common::Response {
    let auth = format!("Authorization: Bearer {token}");
    let mut headers = vec![
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        auth.as_str(),
    ];
    headers.extend_from_slice(extra);
    d.connect(Via::Tcp)
        .request(&post(&headers, &rpc_body("1", method, &params)))
}

fn op(d: &Daemon, envelope: Value) -> Value {
    let params = json!({"message": {"role":"ROLE_USER","messageId":common::fresh_id(),"extensions":[COMMAND_URI],"parts":[{"data":{"agentd": envelope}}]}});
    let ext = format!("A2A-Extensions: {COMMAND_URI}");
    call(d, "op-token", "SendMessage", params, &[ext.as_str()]).json()
}

fn event_seqs(r: &common::Response) -> Vec<u64> {
    r.sse_events()
        .iter()
        .filter_map(|f| f["result"]["event"]["seq"].as_u64())
        .collect()
}

fn send(d: &Daemon, token: &str) -> String {
    let params = json!({"message": {"role":"ROLE_USER","messageId":common::fresh_id(),"parts":[{"text":"hi"}]}});
    let r = call(d, token, "SendMessage", params, &[]);
    r.json()["result"]["task"]["id"]
        .as_str()
        .expect("a task")
        .to_owned()
}

fn visibility(driver: &str) {
    let d = Daemon::start_setup(driver, &setup(false, 800));
    send(&d, "op-token"); // seq 1, 2: the operator's
    let mine = send(&d, "peer-token"); // seq 3, 4: agent:peer-a's
                                       // Without a credential: 401 with the challenge (a bearer ends the implicit operator).
    let r = d
        .connect(Via::Tcp)
        .request(&common::rpc_request("1", "ListTasks", &json!({})));
    assert_eq!(r.status, 401, "{driver}");
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer realm="agentd""#)
    );
    // The agent sees its own task only, and its feed has gaps.
    let list = call(&d, "peer-token", "ListTasks", json!({}), &[]).json();
    assert_eq!(list["result"]["totalSize"], 1, "{driver}");
    assert_eq!(list["result"]["tasks"][0]["id"], mine.as_str());
    let feed = call(
        &d,
        "peer-token",
        "agentd.events/SubscribeToEvents",
        json!({"fromSeq": 0}),
        &[EVENTS],
    );
    assert_eq!(
        event_seqs(&feed),
        [3, 4],
        "{driver}: gaps where the operator's events were"
    );
    let feed = call(
        &d,
        "op-token",
        "agentd.events/SubscribeToEvents",
        json!({"fromSeq": 0}),
        &[EVENTS],
    );
    assert_eq!(
        event_seqs(&feed),
        [1, 2, 3, 4],
        "{driver}: the operator sees every event"
    );
    // The extended card narrows to the agent.
    let card = call(&d, "peer-token", "GetExtendedAgentCard", json!({}), &[]).json();
    let ops: Vec<&str> = card["result"]["capabilities"]["extensions"][0]["params"]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        ops,
        ["status", "workflow.run", "workflow.status"],
        "{driver}"
    );
    // The unix socket is the operator, whatever is configured.
    let r = d
        .connect(Via::Unix)
        .request(&common::rpc_request("1", "ListTasks", &json!({})));
    assert_eq!(r.json()["result"]["totalSize"], 2, "{driver}");
}

#[test]
fn a_non_operator_sees_its_own_smol() {
    visibility("smol");
}

#[test]
fn a_non_operator_sees_its_own_std() {
    visibility("std");
}

fn form(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn device_flow(driver: &str) {
    let d = Daemon::start_setup(driver, &setup(true, 30_000));
    let grant = d
        .connect(Via::Tcp)
        .request(&form("/oauth2/device_authorization", "client_id=laptop"))
        .json();
    let user_code = grant["user_code"].as_str().unwrap();
    let approved = op(
        &d,
        json!({"op": "auth.device.approve", "user_code": user_code, "as": "alice"}),
    );
    assert_eq!(
        approved["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{driver}: {approved}"
    );
    let poll = format!(
        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code={}&client_id=laptop",
        grant["device_code"].as_str().unwrap()
    );
    let issued = d
        .connect(Via::Tcp)
        .request(&form("/oauth2/token", &poll))
        .json();
    let token = issued["access_token"]
        .as_str()
        .expect("a session token")
        .to_owned();
    let task = send(&d, &token);
    let sessions = op(&d, json!({"op": "auth.sessions"}));
    let sid = sessions["result"]["message"]["parts"][0]["data"]["sessions"][0]["sid"]
        .as_str()
        .unwrap()
        .to_owned();

    // The session's feed stream, left open; then the operator revokes the session.
    let mut stream = d.connect(Via::Tcp);
    let auth = format!("Authorization: Bearer {token}");
    let headers = [
        "Content-Type: application/json",
        "A2A-Version: 1.0",
        auth.as_str(),
        EVENTS,
    ];
    stream.send(&post(
        &headers,
        &rpc_body(
            "7",
            "agentd.events/SubscribeToEvents",
            &json!({"fromSeq": 0}),
        ),
    ));
    std::thread::sleep(Duration::from_millis(200));
    let revoked_at = Instant::now();
    let revoked = op(&d, json!({"op": "auth.sessions.revoke", "sid": sid}));
    assert_eq!(
        revoked["result"]["task"]["artifacts"][0]["parts"][0]["data"]["revoked"], 1,
        "{driver}"
    );
    let r = stream.read_response();
    assert!(
        revoked_at.elapsed() < Duration::from_secs(2),
        "{driver}: ended within a tick, not at the deadline"
    );
    let frames = r.sse_events();
    let last = frames.last().expect("frames");
    assert_eq!(
        last["result"]["goodbye"]["reason"], "revoked",
        "{driver}: {frames:?}"
    );
    assert!(frames
        .iter()
        .any(|f| f["result"]["event"]["data"]["task"]["id"] == task.as_str()));
    // The token is dead; what the session's principal owns is not.
    let r = call(&d, &token, "ListTasks", json!({}), &[]);
    assert_eq!(r.status, 401);
    let r = call(&d, "op-token", "GetTask", json!({"id": task}), &[]);
    assert_eq!(r.json()["result"]["id"], task.as_str());
}

#[test]
fn device_sign_in_and_revocation_smol() {
    device_flow("smol");
}

#[test]
fn device_sign_in_and_revocation_std() {
    device_flow("std");
}
