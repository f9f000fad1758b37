//! The core driven in memory: every answer and refusal of the HTTP and JSON-RPC layers,
//! the task lifecycle against a fake host, split and pipelined input, and every deadline
//! on a fake clock.

mod support;

use agentd_core::a2a::types::{Artifact, Part, TaskState};
use agentd_core::{Completion, CompletionError, Effect};
use serde_json::{json, Value};
use support::*;

fn artifact(h: &mut Harness, task_id: &str, id: &str, text: &str, append: bool) {
    h.inst
        .handle_completion(
            Completion::Artifact {
                task_id: task_id.into(),
                artifact: Artifact {
                    artifact_id: id.into(),
                    description: String::new(),
                    extensions: vec![],
                    metadata: None,
                    name: "out".into(),
                    parts: vec![Part::text(text)],
                },
                append,
                last_chunk: !append,
            },
            h.now,
        )
        .expect("artifact accepted");
}

/// Sends a message with returnImmediately and returns the new task id.
fn new_task(h: &mut Harness, c: &mut Client, text: &str) -> String {
    let out = c.feed(
        h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message(text, &fresh_id()), "configuration": {"returnImmediately": true}}),
        ),
    );
    let task = one(&out).json()["result"]["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_SUBMITTED");
    let id = h.turn();
    assert_eq!(task["id"], id.as_str());
    id
}

fn rpc_result(h: &mut Harness, c: &mut Client, method: &str, params: Value) -> Value {
    let r = one(&c.feed(h, &call(method, 9, params)));
    let j = r.json();
    assert!(j.get("error").is_none(), "{method} failed: {j}");
    j["result"].clone()
}

fn rpc_error(
    h: &mut Harness,
    c: &mut Client,
    method: &str,
    params: Value,
    code: i64,
    reason: Option<&str>,
) -> Value {
    let r = one(&c.feed(h, &call(method, 9, params)));
    assert_rpc_error(&r, code, reason)
}

// ---------------------------------------------------------------- HTTP layer

#[test]
fn card_get_head_etag_and_refusals() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let get = one(&c.feed(&mut h, CARD_GET));
    assert_eq!(get.status, 200);
    assert_eq!(get.header("content-type"), Some("application/json"));
    assert_eq!(get.header("cache-control"), Some("public, max-age=60"));
    let card = get.json();
    assert_eq!(
        card["supportedInterfaces"],
        json!([{"protocolBinding":"JSONRPC","protocolVersion":"1.0","url":"http://127.0.0.1:8420/"}])
    );
    let caps = &card["capabilities"];
    assert_eq!(caps["extendedAgentCard"], false);
    assert_eq!(caps["pushNotifications"], false);
    assert_eq!(caps["streaming"], true);
    for key in [
        "name",
        "description",
        "version",
        "skills",
        "defaultInputModes",
        "defaultOutputModes",
    ] {
        assert!(card.get(key).is_some(), "card lacks {key}");
    }
    let etag = get.header("etag").unwrap().to_owned();

    // HEAD: the GET's headers, its length, and no body.
    let head = c.feed(
        &mut h,
        b"HEAD /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let text = String::from_utf8(head).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\n"), "no body after the head: {text}");
    let length = format!("content-length: {}\r\n", get.body.len());
    assert!(text.contains(&length), "{text}");

    let cond = format!("GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"nope\", W/{etag}\r\n\r\n");
    let not_modified = one(&c.feed(&mut h, cond.as_bytes()));
    assert_eq!(not_modified.status, 304);
    assert_eq!(not_modified.header("etag"), Some(etag.as_str()));

    let post = one(&c.feed(
        &mut h,
        b"POST /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    ));
    assert_eq!(
        (post.status, post.header("allow")),
        (405, Some("GET, HEAD, OPTIONS"))
    );
    assert!(
        !c.conn.is_finished(),
        "a bodiless refusal keeps the connection"
    );

    // The old pre-1.0 card name is not served.
    let old = one(&c.feed(
        &mut h,
        b"GET /.well-known/agent.json HTTP/1.1\r\nHost: x\r\n\r\n",
    ));
    assert_eq!(old.status, 404);
}

#[test]
fn unix_listener_card_names_the_binding() {
    let mut h = Harness::new();
    let mut c = h.conn_on(1);
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    assert_eq!(
        card["supportedInterfaces"],
        json!([{"protocolBinding":"https://agentd.dev/a2a/binding/jsonrpc-unix","protocolVersion":"1.0","url":"unix:///run/a.sock"}])
    );
}

#[test]
fn route_refusals_have_their_statuses() {
    let cases: &[(&[u8], u16, Option<&str>, bool)] = &[
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 405, Some("POST, OPTIONS"), false),
        (b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 405, Some("POST, OPTIONS"), true),
        (b"GET /rpc HTTP/1.1\r\nHost: x\r\n\r\n", 404, None, false),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}", 415, None, true),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 415, None, true),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/jsonx\r\nContent-Length: 0\r\n\r\n", 415, None, false),
        (b"OPTIONS / HTTP/1.1\r\nHost: x\r\n\r\n", 204, Some("POST, OPTIONS"), false),
        (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 204, Some("GET, HEAD, POST, OPTIONS"), false),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, None, true),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n", 400, None, true),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9999999\r\n\r\n", 413, None, true),
        (b"POST / HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n", 400, None, true),
        (b"GARBAGE\r\n\r\n", 400, None, true),
    ];
    for (req, status, allow, closes) in cases {
        let mut h = Harness::new();
        let mut c = h.conn();
        let r = one(&c.feed(&mut h, req));
        let what = String::from_utf8_lossy(req);
        assert_eq!(r.status, *status, "{what}");
        assert_eq!(r.header("allow"), *allow, "{what}");
        assert_eq!(c.conn.is_finished(), *closes, "closes after {what}");
        if *closes {
            assert_eq!(r.header("connection"), Some("close"), "{what}");
            // Nothing after the refusal is read.
            assert!(c.feed(&mut h, CARD_GET).is_empty());
        }
    }
}

#[test]
fn header_block_and_count_limits_answer_431() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let mut req = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    req.resize(17 * 1024, b'a');
    let r = one(&c.feed(&mut h, &req));
    assert_eq!(r.status, 431);
    assert!(c.conn.is_finished());

    let mut h = Harness::with(|cfg| cfg.conn.http.max_headers = 4);
    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        b"GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\n\r\n",
    ));
    assert_eq!(r.status, 431);
}

#[test]
fn body_limit_counts_decoded_chunked_bytes() {
    let mut h = Harness::with(|cfg| cfg.conn.http.max_body_bytes = 10);
    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n",
    ));
    assert_eq!(r.status, 413);
    assert!(c.conn.is_finished());
}

#[test]
fn chunked_request_body_is_answered() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let body = r#"{"jsonrpc":"2.0","id":"c","method":"GetTask","params":{"id":"nope"}}"#;
    let (a, b) = body.split_at(20);
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let j = assert_rpc_error(
        &one(&c.feed(&mut h, req.as_bytes())),
        -32001,
        Some("TASK_NOT_FOUND"),
    );
    assert_eq!(j["id"], "c");
}

#[test]
fn expect_continue_is_answered_before_the_body() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#;
    let head = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    assert_eq!(
        c.feed(&mut h, head.as_bytes()),
        b"HTTP/1.1 100 Continue\r\n\r\n"
    );
    assert_rpc_error(&one(&c.feed(&mut h, body.as_bytes())), -32001, None);

    // A request refused from its head gets no 100: the final answer, and the body unread.
    let mut c = h.conn();
    let r = one(&c.feed(&mut h, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"));
    assert_eq!(r.status, 415);
    assert!(c.conn.is_finished());
}

#[test]
fn http10_keep_alive_and_connection_close() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let r = one(&c.feed(&mut h, b"GET /.well-known/agent-card.json HTTP/1.0\r\n\r\n"));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.conn.is_finished());

    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        b"GET /.well-known/agent-card.json HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    ));
    assert_eq!(r.header("connection"), Some("keep-alive"));
    assert!(!c.conn.is_finished());

    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.conn.is_finished());
}

// ---------------------------------------------------------------- JSON-RPC layer

#[test]
fn envelope_and_version_refusals() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let cases: &[(&str, i64, &str)] = &[
        ("{", -32700, "null"),
        ("", -32700, "null"),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]"#,
            -32600,
            "null",
        ),
        (r#"{"jsonrpc":"2.0","method":"GetTask"}"#, -32600, "null"),
        (
            r#"{"jsonrpc":"2.0","id":null,"method":"GetTask"}"#,
            -32600,
            "null",
        ),
        (
            r#"{"jsonrpc":"2.0","id":[1],"method":"GetTask"}"#,
            -32600,
            "null",
        ),
        (r#"{"id":5,"method":"GetTask"}"#, -32600, "5"),
        (r#"{"jsonrpc":"2.0","id":"a","method":1}"#, -32600, "\"a\""),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"GetTask","params":"x"}"#,
            -32602,
            "5",
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"message/send","params":{}}"#,
            -32601,
            "5",
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"sendMessage","params":{}}"#,
            -32601,
            "5",
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"SubscribeToEvents","params":{}}"#,
            -32601,
            "5",
        ),
    ];
    for (body, code, id) in cases {
        let r = one(&c.feed(&mut h, &rpc(body)));
        let j = assert_rpc_error(&r, *code, None);
        assert_eq!(j["id"].to_string(), *id, "{body}");
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
    let j = rpc_error(
        &mut h,
        &mut c,
        "agentd.events/SubscribeToEvents",
        json!({"fromSeq":0}),
        -32601,
        Some("EXTENSION_NOT_DECLARED"),
    );
    assert_eq!(j["error"]["data"][0]["domain"], "agentd.dev");

    // A2A-Version: missing, empty, 0.3 and 1.1 are refused; 1.0.x is served.
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"GetTask","params":{"id":"x"}}"#;
    for version in [None, Some(""), Some("0.3"), Some("1.1"), Some("2.0")] {
        let header = version
            .map(|v| format!("A2A-Version: {v}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{header}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let j = assert_rpc_error(
            &one(&c.feed(&mut h, req.as_bytes())),
            -32009,
            Some("VERSION_NOT_SUPPORTED"),
        );
        assert_eq!(j["id"], 7);
        assert_eq!(j["error"]["data"][0]["domain"], "a2a-protocol.org");
        assert_eq!(
            j["error"]["data"][0]["metadata"]["supportedVersions"],
            "1.0"
        );
    }
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\ncontent-type: Application/JSON; charset=utf-8\r\na2a-version: 1.0.3\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_rpc_error(
        &one(&c.feed(&mut h, req.as_bytes())),
        -32001,
        Some("TASK_NOT_FOUND"),
    );
}

#[test]
fn ids_are_echoed_byte_for_byte() {
    let mut h = Harness::new();
    let mut c = h.conn();
    for id in [
        "0",
        "-7",
        "\"\"",
        "\"x\\u0041\"",
        "123456789012345678901234567890",
        "1.50",
    ] {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"GetTask","params":{{"id":"x"}}}}"#);
        let r = one(&c.feed(&mut h, &rpc(&body)));
        let text = String::from_utf8(r.body).unwrap();
        assert!(
            text.contains(&format!(",\"id\":{id},")),
            "{id} not echoed exactly in {text}"
        );
    }
}

#[test]
fn params_refusals_name_the_field() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let bad_sends: &[(Value, &str)] = &[
        (json!({}), "message"),
        (
            json!({"message": {"role":"ROLE_USER","parts":[{"text":"a"}]}}),
            "message.messageId",
        ),
        (
            json!({"message": {"role":"ROLE_AGENT","messageId":"m","parts":[{"text":"a"}]}}),
            "message.role",
        ),
        (
            json!({"message": {"messageId":"m","parts":[{"text":"a"}]}}),
            "message.role",
        ),
        (
            json!({"message": {"role":"ROLE_USER","messageId":"m","parts":[]}}),
            "message.parts",
        ),
        (
            json!({"message": {"role":"ROLE_USER","messageId":"m","parts":[{}]}}),
            "message.parts[0]",
        ),
        (
            json!({"message": {"role":"ROLE_USER","messageId":"m","parts":[{"text":"a","data":1}]}}),
            "message.parts[0]",
        ),
        (
            json!({"message": {"role":"user","messageId":"m","parts":[{"text":"a"}]}}),
            "message.role",
        ),
        (
            json!({"message": text_message("a", "m"), "configuration": {"historyLength": -1}}),
            "configuration.historyLength",
        ),
    ];
    for (params, field) in bad_sends {
        let j = rpc_error(&mut h, &mut c, "SendMessage", params.clone(), -32602, None);
        let details = j["error"]["data"].as_array().expect("details");
        let bad = details
            .iter()
            .find(|d| d["@type"] == "type.googleapis.com/google.rpc.BadRequest")
            .expect("BadRequest");
        assert_eq!(bad["fieldViolations"][0]["field"], *field, "{params}");
    }
    assert_eq!(h.inst.task_count(), 0, "nothing refused creates a task");
    assert!(h.take_effects().is_empty(), "nothing refused runs");

    let j = rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({"message": {"role":"ROLE_USER","messageId":"m","parts":[{"url":"https://x/y.pdf","mediaType":"application/pdf"}]}}),
        -32005,
        Some("CONTENT_TYPE_NOT_SUPPORTED"),
    );
    assert!(j["error"]["message"]
        .as_str()
        .unwrap()
        .contains("application/pdf"));
    rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({"message": text_message("a", "m"), "configuration": {"taskPushNotificationConfig": {"url": "https://x"}}}),
        -32003,
        Some("PUSH_NOTIFICATION_NOT_SUPPORTED"),
    );
    assert_eq!(h.inst.task_count(), 0);
    for (method, params) in [
        ("GetTask", json!({})),
        ("GetTask", json!({"id": "x", "historyLength": -2})),
        ("CancelTask", json!({})),
        ("SubscribeToTask", json!({})),
        ("ListTasks", json!({"pageSize": 0})),
        ("ListTasks", json!({"pageSize": 101})),
        ("ListTasks", json!({"pageToken": "not-a-token"})),
        ("ListTasks", json!({"statusTimestampAfter": "yesterday"})),
        ("ListTasks", json!({"status": "TASK_STATE_DONE"})),
        ("ListTasks", json!({"historyLength": -1})),
    ] {
        rpc_error(&mut h, &mut c, method, params, -32602, None);
    }
}

#[test]
fn unsupported_methods_answer_their_codes() {
    let mut h = Harness::new();
    let mut c = h.conn();
    for method in [
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
    ] {
        rpc_error(
            &mut h,
            &mut c,
            method,
            json!({"taskId": "t", "id": "c", "url": "https://x"}),
            -32003,
            Some("PUSH_NOTIFICATION_NOT_SUPPORTED"),
        );
    }
    // GetExtendedAgentCard with params absent, as the spec's example sends it.
    let r = one(&c.feed(
        &mut h,
        &rpc(r#"{"jsonrpc":"2.0","id":3,"method":"GetExtendedAgentCard"}"#),
    ));
    assert_rpc_error(&r, -32004, Some("UNSUPPORTED_OPERATION"));
}

// ---------------------------------------------------------------- lifecycle

#[test]
fn blocking_send_waits_for_the_host() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let out = c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m-1")}),
        ),
    );
    assert!(
        out.is_empty(),
        "a blocking send answers only once the task settles"
    );
    assert!(
        !c.conn.wants_read(),
        "no further request is read while one is pending"
    );
    let (task_id, context_id, message) = match h.take_effects().as_slice() {
        [Effect::Turn {
            task_id,
            context_id,
            message,
            ..
        }] => (task_id.clone(), context_id.clone(), message.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(message.task_id, task_id);
    assert_eq!(message.context_id, context_id);
    assert!(!context_id.is_empty());

    let wakes = c.wakes();
    complete(&mut h, &task_id, TaskState::Working, None);
    artifact(&mut h, &task_id, "a1", "part one", false);
    artifact(&mut h, &task_id, "a1", " and two", true);
    assert_eq!(
        c.wakes(),
        wakes,
        "a blocking send is not woken for the updates before the task settles"
    );
    assert!(
        c.poll(&mut h).is_empty(),
        "working is not the end of a turn"
    );
    complete(&mut h, &task_id, TaskState::Completed, Some("done"));
    assert!(c.wakes() > wakes, "the waiting connection is woken");
    let task = one(&c.poll(&mut h)).json()["result"]["task"].clone();
    assert_eq!(task["id"], task_id.as_str());
    assert_eq!(task["contextId"], context_id.as_str());
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(task["status"]["message"]["role"], "ROLE_AGENT");
    assert_eq!(
        task["status"]["message"]["messageId"],
        format!("{task_id}.status.1")
    );
    assert_eq!(
        task["artifacts"][0]["parts"],
        json!([{"text":"part one"},{"text":" and two"}])
    );
    assert_eq!(task["history"][0]["messageId"], "m-1");
    assert!(c.conn.wants_read(), "back to reading after the answer");
    assert_eq!(h.inst.subscription_count(), 0);

    // A terminal task never changes again.
    let err = h
        .inst
        .handle_completion(
            Completion::Status {
                task_id: task_id.clone(),
                state: TaskState::Working,
                message: None,
            },
            h.now,
        )
        .unwrap_err();
    assert_eq!(err, CompletionError::TaskTerminal(TaskState::Completed));
    assert_eq!(
        h.inst.handle_completion(
            Completion::Status {
                task_id: "nope".into(),
                state: TaskState::Failed,
                message: None
            },
            h.now
        ),
        Err(CompletionError::UnknownTask)
    );
}

#[test]
fn input_required_turns_continue_the_task() {
    let mut h = Harness::new();
    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("deploy?", "m-1")}),
        ),
    );
    let task_id = h.turn();
    complete(
        &mut h,
        &task_id,
        TaskState::InputRequired,
        Some("which environment?"),
    );
    let task = one(&c.poll(&mut h)).json()["result"]["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    let context_id = task["contextId"].as_str().unwrap().to_owned();

    // A contextId that is not the task's is refused, and changes nothing.
    let mut wrong = text_message("prod", "m-2");
    wrong["taskId"] = json!(task_id);
    wrong["contextId"] = json!("other");
    rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({"message": wrong}),
        -32602,
        None,
    );
    assert!(h.take_effects().is_empty());

    let mut answer = text_message("prod", "m-2");
    answer["taskId"] = json!(task_id);
    assert!(c
        .feed(&mut h, &call("SendMessage", 2, json!({"message": answer})))
        .is_empty());
    match h.take_effects().as_slice() {
        [Effect::Turn {
            task_id: t,
            context_id: ctx,
            message,
            ..
        }] => {
            assert_eq!(t, &task_id);
            assert_eq!(ctx, &context_id);
            assert_eq!(message.message_id, "m-2");
        }
        other => panic!("{other:?}"),
    }
    complete(&mut h, &task_id, TaskState::Completed, Some("deployed"));
    let task = one(&c.poll(&mut h)).json()["result"]["task"].clone();
    let ids: Vec<_> = task["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["messageId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["m-1", format!("{task_id}.status.1").as_str(), "m-2"]);

    // Terminal: refused with -32004, nothing queued.
    let mut late = text_message("again", "m-3");
    late["taskId"] = json!(task_id);
    rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({"message": late}),
        -32004,
        Some("UNSUPPORTED_OPERATION"),
    );
    let mut unknown = text_message("x", "m-4");
    unknown["taskId"] = json!("no-such-task");
    rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({"message": unknown}),
        -32001,
        Some("TASK_NOT_FOUND"),
    );
    assert!(h.take_effects().is_empty());
}

#[test]
fn a_client_context_id_is_kept_and_history_length_applies() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let mut m = text_message("hi", "m-1");
    m["contextId"] = json!("my-context");
    let task = rpc_result(
        &mut h,
        &mut c,
        "SendMessage",
        json!({"message": m, "configuration": {"returnImmediately": true, "historyLength": 0}}),
    )["task"]
        .clone();
    assert_eq!(task["contextId"], "my-context");
    assert!(
        task.get("history").is_none(),
        "historyLength 0 omits history"
    );
    let id = h.turn();
    let full = rpc_result(&mut h, &mut c, "GetTask", json!({"id": id}));
    assert_eq!(full["history"].as_array().unwrap().len(), 1);
    let none = rpc_result(
        &mut h,
        &mut c,
        "GetTask",
        json!({"id": id, "historyLength": "0"}),
    );
    assert!(none.get("history").is_none());
    rpc_error(
        &mut h,
        &mut c,
        "GetTask",
        json!({"id": "missing"}),
        -32001,
        Some("TASK_NOT_FOUND"),
    );
}

#[test]
fn streaming_send_frames_and_keep_alive() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let out = c.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            5,
            json!({"message": text_message("hi", "m-1")}),
        ),
    );
    let head_end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..head_end]).to_string();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let task_id = h.turn();
    complete(&mut h, &task_id, TaskState::Working, None);
    artifact(&mut h, &task_id, "a1", "hello", false);
    complete(&mut h, &task_id, TaskState::Completed, None);
    let mut all = out.clone();
    all.extend(c.poll(&mut h));
    let stream = one(&all);
    let events = stream.events();
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            assert_eq!(e["id"], 5);
            assert_eq!(e["jsonrpc"], "2.0");
            let result = e["result"].as_object().unwrap();
            assert_eq!(result.len(), 1, "exactly one member per frame: {e}");
            result.keys().next().unwrap().clone()
        })
        .collect();
    assert_eq!(
        kinds,
        ["task", "statusUpdate", "artifactUpdate", "statusUpdate"]
    );
    assert_eq!(
        events[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_SUBMITTED"
    );
    assert_eq!(events[2]["result"]["artifactUpdate"]["lastChunk"], true);
    assert_eq!(
        events[3]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(h.inst.subscription_count(), 0);

    // The same connection takes the next request.
    let next = one(&c.feed(&mut h, CARD_GET));
    assert_eq!(next.status, 200);
}

/// Every wake-up of a connection goes through one registry: a connection that waits on a
/// task wakes once per event through its one registration, one that only reads never
/// registers, and a closed one is forgotten.
#[test]
fn a_connection_registers_its_waker_once_and_is_forgotten_at_close() {
    let mut h = Harness::new();
    let mut reader = h.conn();
    assert_eq!(one(&reader.feed(&mut h, CARD_GET)).status, 200);
    assert_eq!(
        h.inst.registered_connections(),
        0,
        "a read waits on nothing"
    );

    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            5,
            json!({"message": text_message("hi", &fresh_id())}),
        ),
    );
    assert_eq!(h.inst.registered_connections(), 1);
    let task_id = h.turn();
    let before = c.wakes();
    complete(&mut h, &task_id, TaskState::Working, None);
    assert!(c.wakes() > before, "an event wakes the stream's connection");
    assert_eq!(reader.wakes(), 0, "and no other");
    c.poll(&mut h);
    // A second stream on another connection: two registrations, one per connection.
    let mut other = h.conn();
    other.feed(&mut h, &call("SubscribeToTask", 6, json!({"id": task_id})));
    assert_eq!(h.inst.registered_connections(), 2);
    c.conn.close(&mut h.inst);
    other.conn.close(&mut h.inst);
    assert_eq!(h.inst.registered_connections(), 0, "closed: forgotten");
    assert_eq!(h.inst.subscription_count(), 0);
}

#[test]
fn streams_end_at_input_required_and_http10_streams_close() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let mut out = c.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            1,
            json!({"message": text_message("hi", "m")}),
        ),
    );
    let t = h.turn();
    complete(&mut h, &t, TaskState::InputRequired, Some("?"));
    out.extend(c.poll(&mut h));
    assert_eq!(one(&out).events().len(), 2);
    assert!(!c.conn.is_finished());

    let mut c = h.conn();
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendStreamingMessage","params":{"message":text_message("hi","m2")}}).to_string();
    let req = format!("POST / HTTP/1.0\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let mut out = c.feed(&mut h, req.as_bytes());
    let t = h.turn();
    complete(&mut h, &t, TaskState::Rejected, None);
    out.extend(c.poll(&mut h));
    let text = String::from_utf8_lossy(&out);
    assert!(
        !text.contains("transfer-encoding"),
        "HTTP/1.0 has no chunked coding: {text}"
    );
    assert_eq!(one(&out).events().len(), 2);
    assert!(c.conn.is_finished(), "an HTTP/1.0 stream ends by closing");
}

#[test]
fn subscribe_cancel_and_many_watchers() {
    let mut h = Harness::new();
    let mut a = h.conn();
    let task_id = new_task(&mut h, &mut a, "work");
    complete(&mut h, &task_id, TaskState::Working, None);

    let mut s1 = h.conn();
    let mut s2 = h.conn();
    let mut o1 = s1.feed(&mut h, &call("SubscribeToTask", 1, json!({"id": task_id})));
    let mut o2 = s2.feed(&mut h, &call("SubscribeToTask", 2, json!({"id": task_id})));
    assert_eq!(h.inst.subscription_count(), 2);

    let canceled = rpc_result(&mut h, &mut a, "CancelTask", json!({"id": task_id}));
    assert_eq!(canceled["status"]["state"], "TASK_STATE_CANCELED");
    assert_eq!(
        h.take_effects(),
        vec![Effect::Cancel {
            task_id: task_id.clone()
        }]
    );
    o1.extend(s1.poll(&mut h));
    o2.extend(s2.poll(&mut h));
    for (out, id) in [(o1, 1), (o2, 2)] {
        let ev = one(&out).events();
        assert_eq!(ev.len(), 2, "snapshot then the cancel");
        assert_eq!(ev[0]["id"], id);
        assert_eq!(
            ev[0]["result"]["task"]["status"]["state"],
            "TASK_STATE_WORKING"
        );
        assert_eq!(
            ev[1]["result"]["statusUpdate"]["status"]["state"],
            "TASK_STATE_CANCELED"
        );
    }
    assert_eq!(h.inst.subscription_count(), 0);

    // Terminal now: cancel and subscribe are refused as plain JSON; late completions too.
    let j = rpc_error(
        &mut h,
        &mut a,
        "CancelTask",
        json!({"id": task_id}),
        -32002,
        Some("TASK_NOT_CANCELABLE"),
    );
    assert!(j["error"]["message"]
        .as_str()
        .unwrap()
        .contains("TASK_STATE_CANCELED"));
    let r = one(&a.feed(&mut h, &call("SubscribeToTask", 3, json!({"id": task_id}))));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_rpc_error(&r, -32004, Some("UNSUPPORTED_OPERATION"));
    rpc_error(
        &mut h,
        &mut a,
        "SubscribeToTask",
        json!({"id": "nope"}),
        -32001,
        None,
    );
    rpc_error(
        &mut h,
        &mut a,
        "CancelTask",
        json!({"id": "nope"}),
        -32001,
        None,
    );
    assert_eq!(
        h.inst.handle_completion(
            Completion::Status {
                task_id: task_id.clone(),
                state: TaskState::Completed,
                message: None
            },
            h.now
        ),
        Err(CompletionError::TaskTerminal(TaskState::Canceled))
    );
}

#[test]
fn list_tasks_filters_and_pages() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let mut ids = Vec::new();
    for i in 0..7 {
        h.advance(10);
        let mut m = text_message("x", &format!("m{i}"));
        if i % 2 == 0 {
            m["contextId"] = json!("even");
        }
        let task = rpc_result(
            &mut h,
            &mut c,
            "SendMessage",
            json!({"message": m, "configuration": {"returnImmediately": true}}),
        );
        let id = task["task"]["id"].as_str().unwrap().to_owned();
        h.turn();
        if i < 3 {
            complete(&mut h, &id, TaskState::Rejected, None);
        }
        ids.push(id);
    }
    artifact(&mut h, &ids[6], "a", "out", false);

    let all = rpc_result(&mut h, &mut c, "ListTasks", json!({}));
    assert_eq!(all["totalSize"], 7);
    assert_eq!(all["pageSize"], 50);
    assert_eq!(all["nextPageToken"], "");
    let listed: Vec<_> = all["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(listed, newest_first, "newest status first");
    for t in all["tasks"].as_array().unwrap() {
        assert!(t.get("artifacts").is_none(), "artifacts only when asked");
        assert!(
            t.get("history").is_none(),
            "history omitted when historyLength is unset"
        );
    }
    let with = rpc_result(
        &mut h,
        &mut c,
        "ListTasks",
        json!({"includeArtifacts": true, "historyLength": 1}),
    );
    assert_eq!(with["tasks"][0]["artifacts"][0]["artifactId"], "a");
    assert_eq!(with["tasks"][0]["history"].as_array().unwrap().len(), 1);

    // Paging visits each task once, in order.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = rpc_result(
            &mut h,
            &mut c,
            "ListTasks",
            json!({"pageSize": 3, "pageToken": token}),
        );
        assert_eq!(page["totalSize"], 7);
        assert_eq!(page["pageSize"], 3);
        seen.extend(
            page["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_owned()),
        );
        token = page["nextPageToken"].as_str().unwrap().to_owned();
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, newest_first);

    let even = rpc_result(&mut h, &mut c, "ListTasks", json!({"contextId": "even"}));
    assert_eq!(even["totalSize"], 4);
    let rejected = rpc_result(
        &mut h,
        &mut c,
        "ListTasks",
        json!({"status": "TASK_STATE_REJECTED"}),
    );
    assert_eq!(rejected["totalSize"], 3);
    let by_number = rpc_result(&mut h, &mut c, "ListTasks", json!({"status": 7}));
    assert_eq!(by_number["totalSize"], 3);
    // statusTimestampAfter is inclusive.
    let fourth = rpc_result(&mut h, &mut c, "GetTask", json!({"id": ids[3]}));
    let since = fourth["status"]["timestamp"].as_str().unwrap();
    let recent = rpc_result(
        &mut h,
        &mut c,
        "ListTasks",
        json!({"statusTimestampAfter": since}),
    );
    assert_eq!(
        recent["totalSize"], 4,
        "tasks 3..6 have status at or after {since}"
    );
    let empty = rpc_result(&mut h, &mut c, "ListTasks", json!({"contextId": "none"}));
    assert_eq!(
        empty,
        json!({"nextPageToken":"","pageSize":50,"tasks":[],"totalSize":0})
    );
}

// ---------------------------------------------------------------- input shapes

/// The request of the seed's curl example and a pipelined pair, fed split at every byte:
/// the answers never depend on how the bytes arrived.
#[test]
fn answers_do_not_depend_on_read_boundaries() {
    let mut req = call("GetTask", 1, json!({"id": "x"}));
    req.extend_from_slice(CARD_GET);
    let reference = {
        let mut h = Harness::new();
        let mut c = h.conn();
        c.feed(&mut h, &req)
    };
    assert_eq!(parse_all(&reference).len(), 2);
    for split in 1..req.len() {
        let mut h = Harness::new();
        let mut c = h.conn();
        let mut out = c.feed(&mut h, &req[..split]);
        out.extend(c.feed(&mut h, &req[split..]));
        assert_eq!(out, reference, "split at {split}");
    }
    // Byte by byte.
    let mut h = Harness::new();
    let mut c = h.conn();
    let mut out = Vec::new();
    for b in &req {
        out.extend(c.feed(&mut h, std::slice::from_ref(b)));
    }
    assert_eq!(out, reference);
}

#[test]
fn pipelined_requests_answer_in_order_behind_a_pending_one() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let mut bytes = call("GetTask", 1, json!({"id": "a"}));
    bytes.extend(call(
        "SendMessage",
        2,
        json!({"message": text_message("hi", "m")}),
    ));
    bytes.extend(call("GetTask", 3, json!({"id": "b"})));
    let out = c.feed(&mut h, &bytes);
    let first = parse_all(&out);
    assert_eq!(
        first.len(),
        1,
        "the third request waits behind the blocking send"
    );
    assert_eq!(first[0].json()["id"], 1);
    let t = h.turn();
    complete(&mut h, &t, TaskState::Rejected, Some("no"));
    let rest = parse_all(&c.poll(&mut h));
    let ids: Vec<_> = rest.iter().map(|r| r.json()["id"].clone()).collect();
    assert_eq!(ids, [json!(2), json!(3)]);
}

/// A driver that shares the instance behind a lock calls `serve` under it and `produce`
/// outside it: `serve` decides the answer and frames nothing costly (no card bytes, no task
/// serialized); `produce` frames it and says when a request read behind it waits.
#[test]
fn serve_decides_an_answer_and_produce_frames_it() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let task = new_task(&mut h, &mut c, "hello");
    let card_len = h.inst.card(0).expect("a card").body.len();
    let mut bytes = CARD_GET.to_vec();
    bytes.extend(call("GetTask", 7, json!({"id": task})));
    assert!(c.conn.receive(&bytes, h.now), "plaintext to serve");

    c.conn.serve(&mut h.inst, h.now);
    assert!(
        c.conn.pending_output().is_empty(),
        "nothing is framed under the instance"
    );
    assert!(
        !c.conn.wants_read(),
        "no read while an answer waits to be framed"
    );
    assert!(c.conn.produce(h.now), "a request waits behind the card");
    let card = one(&c.drain(&h));
    assert_eq!(card.status, 200);
    assert_eq!(card.body.len(), card_len);
    assert_eq!(
        card.header("etag"),
        Some(h.inst.card(0).unwrap().etag.as_str())
    );

    c.conn.serve(&mut h.inst, h.now);
    assert!(
        c.conn.pending_output().is_empty(),
        "the task is not serialized here"
    );
    assert!(!c.conn.produce(h.now), "nothing more to serve");
    let got = one(&c.drain(&h)).json();
    assert_eq!(got["id"], 7);
    assert_eq!(got["result"]["id"], task.as_str());
    assert!(c.conn.wants_read());
}

/// Requests and the end of input read in one go: every request is answered before the
/// connection closes, though each answer is framed after the one before it.
#[test]
fn every_request_read_before_the_end_is_answered() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let mut bytes = CARD_GET.to_vec();
    bytes.extend(call("GetTask", 2, json!({"id": "nope"})));
    bytes.extend_from_slice(CARD_GET);
    assert!(c.conn.receive(&bytes, h.now));
    c.conn.handle_eof(&mut h.inst, h.now);
    let out = parse_all(&c.drain(&h));
    let statuses: Vec<u16> = out.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200]);
    assert_eq!(out[1].json()["error"]["code"], -32001);
    assert!(c.conn.is_finished());
}

#[test]
fn output_backlog_stops_reading() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let one_req = CARD_GET;
    let many: Vec<u8> = one_req
        .iter()
        .copied()
        .cycle()
        .take(one_req.len() * 2000)
        .collect();
    c.conn.handle_input(&mut h.inst, &many, h.now);
    let backlog = c.conn.pending_output().len();
    assert!(
        backlog >= h.config.conn.max_output_bytes,
        "answers until the backlog bound"
    );
    assert!(
        backlog < h.config.conn.max_output_bytes + 4096,
        "and no further: {backlog}"
    );
    assert!(!c.conn.wants_read());
    // Writing the backlog lets the rest be answered.
    let mut total = 0;
    loop {
        let out = c.drain(&h);
        if out.is_empty() {
            break;
        }
        total += parse_all(&out).len();
        c.conn.poll(&mut h.inst, h.now);
    }
    assert_eq!(total, 2000);
    assert!(c.conn.wants_read());
}

// ---------------------------------------------------------------- deadlines

#[test]
fn slow_heads_and_bodies_get_408() {
    let mut h = Harness::new();
    let limits = h.config.conn;
    let mut c = h.conn();
    assert!(c.feed(&mut h, b"GET / HTTP/1.1\r\nHo").is_empty());
    let due = c.conn.poll_timeout().expect("a head deadline");
    assert_eq!(due, h.now.mono_ms + limits.header_timeout_ms);
    h.advance(limits.header_timeout_ms - 1);
    assert!(c.timeout(&mut h).is_empty(), "not yet");
    // Trickling more bytes does not extend the deadline (slowloris).
    c.feed(&mut h, b"s");
    h.advance(1);
    let r = one(&c.timeout(&mut h));
    assert_eq!(r.status, 408);
    assert!(c.conn.is_finished());

    let mut c = h.conn();
    c.feed(&mut h, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{");
    assert_eq!(
        c.conn.poll_timeout(),
        Some(h.now.mono_ms + limits.body_timeout_ms)
    );
    h.advance(limits.body_timeout_ms);
    assert_eq!(one(&c.timeout(&mut h)).status, 408);
    assert!(c.conn.is_finished());
}

#[test]
fn idle_connections_close_and_blocking_sends_time_out() {
    let mut h = Harness::new();
    let limits = h.config.conn;
    let mut c = h.conn();
    c.feed(&mut h, CARD_GET);
    assert_eq!(
        c.conn.poll_timeout(),
        Some(h.now.mono_ms + limits.idle_timeout_ms)
    );
    h.advance(limits.idle_timeout_ms);
    assert!(c.timeout(&mut h).is_empty());
    assert!(
        c.conn.is_finished(),
        "idle keep-alive connection closes silently"
    );

    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m")}),
        ),
    );
    let t = h.turn();
    complete(&mut h, &t, TaskState::Working, None);
    assert!(c.poll(&mut h).is_empty());
    h.advance(limits.request_timeout_ms);
    let task = one(&c.timeout(&mut h)).json()["result"]["task"].clone();
    assert_eq!(
        task["status"]["state"], "TASK_STATE_WORKING",
        "the task as it stands"
    );
    assert_eq!(h.inst.subscription_count(), 0);
}

#[test]
fn streams_send_keep_alives_and_a_stalled_reader_is_dropped() {
    let mut h = Harness::new();
    let limits = h.config.conn;
    let mut c = h.conn();
    let t = new_task(&mut h, &mut c, "x");
    c.feed(&mut h, &call("SubscribeToTask", 1, json!({"id": t})));
    h.advance(limits.sse_keepalive_ms);
    let ka = c.timeout(&mut h);
    assert!(
        String::from_utf8_lossy(&ka).contains(": keep-alive\n\n"),
        "{}",
        String::from_utf8_lossy(&ka)
    );

    // A reader that takes nothing for the write timeout is dropped, and its watch released.
    complete(&mut h, &t, TaskState::Working, None);
    c.conn.poll(&mut h.inst, h.now);
    assert!(!c.conn.pending_output().is_empty());
    h.advance(limits.write_timeout_ms);
    c.conn.handle_timeout(&mut h.inst, h.now);
    assert!(c.conn.is_finished());
    c.conn.close(&mut h.inst);
    assert_eq!(h.inst.subscription_count(), 0);
}

#[test]
fn a_stream_that_falls_behind_ends_with_an_error_not_unbounded_memory() {
    let mut h = Harness::with(|cfg| cfg.conn.stream_queue = 4);
    let mut c = h.conn();
    let t = new_task(&mut h, &mut c, "x");
    let mut out = c.feed(&mut h, &call("SubscribeToTask", 1, json!({"id": t})));
    for i in 0..20 {
        artifact(&mut h, &t, &format!("a{i}"), "chunk", false);
    }
    out.extend(c.poll(&mut h));
    let events = one(&out).events();
    assert_eq!(
        events.len(),
        1 + 4 + 1,
        "snapshot, the queued four, then the error"
    );
    assert_eq!(events.last().unwrap()["error"]["code"], -32603);
    assert_eq!(h.inst.subscription_count(), 0);
}

#[test]
fn closing_a_connection_releases_its_watch() {
    let mut h = Harness::new();
    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m")}),
        ),
    );
    assert_eq!(h.inst.subscription_count(), 1);
    c.conn.handle_eof(&mut h.inst, h.now);
    assert!(
        !c.conn.is_finished(),
        "the pending answer still goes out after a half-close"
    );
    let t = h.turn();
    complete(&mut h, &t, TaskState::Rejected, None);
    let r = one(&c.poll(&mut h));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.conn.is_finished());

    let mut c = h.conn();
    c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m")}),
        ),
    );
    h.take_effects();
    c.conn.close(&mut h.inst);
    assert_eq!(h.inst.subscription_count(), 0);
}

/// A message carries at most `max_message_parts` parts: 100,000 one-letter parts held
/// about 20 MiB per task.
#[test]
fn a_message_with_too_many_parts_is_refused_naming_the_bound() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let parts: Vec<Value> = (0..257).map(|_| json!({"text": "a"})).collect();
    let message = json!({"role": "ROLE_USER", "messageId": "many", "parts": parts});
    let e = rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({ "message": message }),
        -32602,
        None,
    );
    assert_eq!(
        e["error"]["data"][0]["fieldViolations"][0]["field"], "message.parts",
        "{e}"
    );
    let why = e["error"]["data"][0]["fieldViolations"][0]["description"].to_string();
    assert!(why.contains("holds 257 parts; at most 256"), "{why}");
    assert!(h.take_effects().is_empty(), "nothing was started");
}

/// A small ListTasks over large tasks builds a bounded answer: the page ends early, says
/// so in pageSize, and nextPageToken goes on from there, every task listed once.
#[test]
fn list_tasks_pages_are_bounded_in_bytes() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let big = "x".repeat(1 << 20);
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(new_task(&mut h, &mut c, &big));
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let r = one(&c.feed(
            &mut h,
            &call(
                "ListTasks",
                9,
                json!({"pageSize": 100, "historyLength": 10, "pageToken": token}),
            ),
        ));
        // The output bound (256 KiB), or one task when a task alone is larger.
        assert!(
            r.body.len() <= (1 << 20) + 64 * 1024,
            "a page of {} bytes",
            r.body.len()
        );
        let page = r.json()["result"].clone();
        let tasks = page["tasks"].as_array().unwrap();
        assert!(!tasks.is_empty());
        pages += 1;
        seen.extend(tasks.iter().map(|t| t["id"].as_str().unwrap().to_owned()));
        token = page["nextPageToken"].as_str().unwrap().to_owned();
        if token.is_empty() {
            assert_eq!(page["pageSize"], 100, "the last page was not cut short");
            break;
        }
        assert_eq!(page["pageSize"], tasks.len(), "a page cut short says so");
    }
    assert!(pages >= 3, "{pages} pages");
    ids.reverse();
    assert_eq!(seen, ids, "every task once, newest first");
}

/// Tasks smaller than a page but several to a page's bytes: the page is cut where its
/// bytes run out (its views were taken under the instance, and are serialized and cut
/// outside it), says so in pageSize, and the next page goes on from the last task shown.
#[test]
fn list_pages_of_mid_sized_tasks_are_cut_at_their_bytes() {
    for size in [100 << 10, 30 << 10] {
        let mut h = Harness::new();
        let mut c = h.conn();
        let text = "y".repeat(size);
        let mut ids = Vec::new();
        for _ in 0..24 {
            ids.push(new_task(&mut h, &mut c, &text));
        }
        let (mut seen, mut token, mut cut) = (Vec::new(), String::new(), 0);
        loop {
            let r = one(&c.feed(
                &mut h,
                &call(
                    "ListTasks",
                    9,
                    json!({"pageSize": 50, "historyLength": 1, "pageToken": token}),
                ),
            ));
            assert!(
                r.body.len() <= 256 * 1024 + 1024,
                "{size}: a page of {} bytes",
                r.body.len()
            );
            let page = r.json()["result"].clone();
            let tasks = page["tasks"].as_array().unwrap();
            assert!(tasks.len() > 1, "{size}: several tasks fit a page");
            seen.extend(tasks.iter().map(|t| t["id"].as_str().unwrap().to_owned()));
            token = page["nextPageToken"].as_str().unwrap().to_owned();
            if token.is_empty() {
                assert_eq!(page["pageSize"], 50, "{size}: the last page");
                break;
            }
            cut += 1;
            assert_eq!(
                page["pageSize"],
                tasks.len(),
                "{size}: a page cut short says so"
            );
        }
        assert!(cut >= 2, "{size}: {cut} pages cut short");
        ids.reverse();
        assert_eq!(seen, ids, "{size}: every task once, newest first");
    }
}

/// A message to a task that is working (not asking for input) would start a second turn
/// beside the first, or take a workflow's task from its run: it is refused with -32004, and
/// the task and its turn go on untouched.
#[test]
fn a_message_to_a_working_task_is_refused_and_changes_nothing() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let id = new_task(&mut h, &mut c, "first");
    h.inst
        .handle_completion(
            agentd_core::Completion::Status {
                task_id: id.clone(),
                state: TaskState::Working,
                message: None,
            },
            h.now,
        )
        .unwrap();
    let mut second = text_message("second", "m2");
    second["taskId"] = json!(id);
    let e = rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({ "message": second }),
        -32004,
        Some("UNSUPPORTED_OPERATION"),
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("TASK_STATE_WORKING"),
        "{e}"
    );
    assert!(h.take_effects().is_empty(), "no second turn");
    // The first turn's answer still lands.
    complete(&mut h, &id, TaskState::Completed, Some("done"));
    let t = rpc_result(&mut h, &mut c, "GetTask", json!({"id": id}));
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED");
    let texts: Vec<&str> = t["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["parts"][0]["text"].as_str())
        .collect();
    assert!(!texts.contains(&"second"), "{texts:?}");
}

/// A store full of unfinished tasks refuses a new one with a typed error naming the bound
/// (it was a bare -32603), and the caller may retry once tasks finish.
#[test]
fn a_full_store_refuses_a_new_task_naming_the_bound() {
    let mut h = Harness::with(|c| c.tasks.max_tasks = 2);
    let mut c = h.conn();
    new_task(&mut h, &mut c, "one");
    new_task(&mut h, &mut c, "two");
    let e = rpc_error(
        &mut h,
        &mut c,
        "SendMessage",
        json!({"message": text_message("three", "m3")}),
        -32603,
        Some("LIMIT_REACHED"),
    );
    assert_eq!(
        e["error"]["data"][0]["metadata"]["limit"], "limits.max_tasks",
        "{e}"
    );
    assert_eq!(e["error"]["data"][0]["metadata"]["max"], "2", "{e}");
    assert!(h.take_effects().is_empty());
}

/// Large read answers (past the connection's output bound) unread share one pool: while
/// one reader has not read its large answer, another large read is refused LIMIT_REACHED
/// naming `limits.large_answers_bytes`; once the first is read, it goes. Small answers, and
/// a first large one into an empty pool, always go. The slow reader's connection holds no
/// more of its answer than the output bound.
#[test]
fn large_read_answers_share_a_bounded_pool() {
    let mut h = Harness::with(|c| c.conn.large_answers_bytes = 1 << 20);
    let bound = h.inst.config().conn.max_output_bytes;
    let mut c = h.conn();
    let id = new_task(&mut h, &mut c, &"x".repeat(700_000));
    let get = call("GetTask", 2, json!({"id": id}));

    let mut slow = h.conn();
    slow.conn.handle_input(&mut h.inst, &get, h.now);
    let held = slow.conn.pending_output().len();
    assert!(
        held > bound / 2 && held <= bound + 64,
        "the first large answer is written up to the output bound ({bound}): {held}"
    );

    let mut other = h.conn();
    let r = one(&other.feed(&mut h, &get));
    let j = assert_rpc_error(&r, -32603, Some("LIMIT_REACHED"));
    assert_eq!(
        j["error"]["data"][0]["metadata"]["limit"],
        "limits.large_answers_bytes"
    );
    // Small answers are not held up.
    let small = one(&other.feed(
        &mut h,
        &call("ListTasks", 3, json!({"pageSize": 1, "historyLength": 0})),
    ));
    assert!(small.json()["result"]["tasks"].is_array());

    // The slow reader reads: the pool empties, and the other's large read goes.
    let whole = one(&slow.drain(&h));
    assert_eq!(whole.json()["result"]["id"], id.as_str());
    let r = one(&other.feed(&mut h, &get));
    assert_eq!(r.json()["result"]["id"], id.as_str());
    // A connection dropped unread gives its bytes back too.
    let mut dropped = h.conn();
    dropped.conn.handle_input(&mut h.inst, &get, h.now);
    drop(dropped);
    let r = one(&other.feed(&mut h, &get));
    assert_eq!(r.json()["result"]["id"], id.as_str());
}

/// A task larger than the output bound is written as the peer reads it: the connection
/// never holds much more than its bound, the bytes are exactly those of the answer built
/// whole, and a request pipelined behind it is answered after it (the waker says when).
#[test]
fn a_large_task_is_written_as_the_peer_reads_it() {
    let mut h = Harness::new();
    let bound = h.config.conn.max_output_bytes;
    let mut c = h.conn();
    // Every kind of escape, and multi-byte characters across slice edges.
    let big = "a\"b\\n\n\u{1}é漢".repeat(100_000);
    let id = new_task(&mut h, &mut c, &big);
    complete(&mut h, &id, TaskState::Completed, Some(&big[..12 * 400]));
    let get = call("GetTask", 2, json!({"id": id}));

    // The same answer from a connection whose bound is larger than it: built whole.
    let wide_bound = std::mem::replace(&mut h.config.conn.max_output_bytes, 64 << 20);
    let mut wide = h.conn();
    h.config.conn.max_output_bytes = wide_bound;
    let whole = one(&wide.feed(&mut h, &get));
    assert!(whole.body.len() > 4 * bound, "{}", whole.body.len());

    let mut reader = h.conn();
    let pipelined = [get.as_slice(), CARD_GET].concat();
    reader.conn.handle_input(&mut h.inst, &pipelined, h.now);
    let wakes = reader.wakes();
    let mut out = Vec::new();
    loop {
        let pending = reader.conn.pending_output();
        assert!(
            pending.len() <= bound + 64,
            "the connection holds {} bytes (bound {bound})",
            pending.len()
        );
        if pending.is_empty() {
            break;
        }
        // The peer reads a little at a time.
        let n = pending.len().min(40_000);
        out.extend_from_slice(&pending[..n]);
        reader.conn.consume_output(n, h.now);
    }
    assert!(
        reader.wakes() > wakes,
        "finishing the answer wakes the driver"
    );
    out.extend(reader.poll(&mut h));
    let answers = parse_all(&out);
    assert_eq!(answers.len(), 2, "the task, then the pipelined card");
    assert_eq!(
        answers[0].body, whole.body,
        "byte for byte the whole answer"
    );
    assert_eq!(
        answers[0].header("content-length"),
        Some(whole.body.len().to_string().as_str())
    );
    assert_eq!(
        answers[0].json()["result"]["history"][0]["parts"][0]["text"],
        big
    );
    assert!(answers[1].json()["name"].is_string(), "the card");
}

/// A subscription's first frame (the task) is written the same way, in chunks, and the
/// stream's next event waits for it: the frames arrive whole and in order.
#[test]
fn a_large_task_frame_streams_in_chunks_before_the_next_event() {
    let mut h = Harness::new();
    let bound = h.config.conn.max_output_bytes;
    let mut c = h.conn();
    let big = "x\"".repeat(600_000);
    let id = new_task(&mut h, &mut c, &big);
    complete(&mut h, &id, TaskState::Working, None);

    let mut s = h.conn();
    s.conn.handle_input(
        &mut h.inst,
        &call("SubscribeToTask", 3, json!({"id": id})),
        h.now,
    );
    let mut out = s.conn.pending_output().to_vec();
    assert!(out.len() <= bound + 64, "{} bytes held", out.len());
    s.conn.consume_output(out.len(), h.now);
    // The task finishes while its snapshot is still being written.
    complete(&mut h, &id, TaskState::Completed, Some("done"));
    out.extend(s.poll(&mut h));
    out.extend(s.drain(&h));
    out.extend(s.poll(&mut h));
    let r = one(&out);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let events = r.events();
    assert_eq!(events.len(), 2, "the snapshot, then the final status");
    assert_eq!(
        events[0]["result"]["task"]["history"][0]["parts"][0]["text"],
        big
    );
    assert_eq!(
        events[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_WORKING"
    );
    assert_eq!(
        events[1]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
}

/// A large GetTask with a request pipelined behind it, read slowly: while the answer is
/// still being written, the pipelined request's header timeout must not run (it sits
/// unparsed behind the answer), and no 408 lands inside the body.
#[test]
fn a_request_clock_does_not_run_while_a_large_answer_is_written() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let big = "x".repeat(1_500_000);
    let id = new_task(&mut h, &mut c, &big);
    let get = call("GetTask", 2, json!({"id": id}));
    let mut r = h.conn();
    let pipelined = [get.as_slice(), CARD_GET].concat();
    r.conn.handle_input(&mut h.inst, &pipelined, h.now);
    let mut out = Vec::new();
    let first = r.conn.pending_output().to_vec();
    out.extend_from_slice(&first);
    r.conn.consume_output(first.len(), h.now);
    // The peer reads slowly; 11 s later the connection's timer fires.
    h.advance(11_000);
    out.extend(r.timeout(&mut h));
    out.extend(r.poll(&mut h));
    let resp = first_head(&out);
    let head_end = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let cl: usize = resp.header("content-length").unwrap().parse().unwrap();
    let body = &out[head_end..(head_end + cl).min(out.len())];
    let parsed: Result<serde_json::Value, _> = serde_json::from_slice(body);
    assert!(
        parsed.is_ok(),
        "the task's body is corrupt: {:?} ... (408 inside it: {})",
        parsed.err(),
        body.windows(12).any(|w| w == b"HTTP/1.1 408")
    );
}

/// A task whose status message is large (which the store's weight does not count) is
/// written in slices like any large task, and counted in the large-answers pool.
#[test]
fn a_large_status_message_is_written_in_slices_and_counted_in_the_pool() {
    let mut h = Harness::with(|c| c.conn.large_answers_bytes = 1 << 20);
    let bound = h.config.conn.max_output_bytes;
    let mut c = h.conn();
    let id = new_task(&mut h, &mut c, "small");
    complete(
        &mut h,
        &id,
        TaskState::InputRequired,
        Some(&"y".repeat(3_000_000)),
    );
    let get = call("GetTask", 2, json!({"id": id}));
    let mut slow = h.conn();
    slow.conn.handle_input(&mut h.inst, &get, h.now);
    let held = slow.conn.pending_output().len();
    assert!(
        held <= bound + 64,
        "the connection holds {held} bytes (bound {bound})"
    );
    let mut other = h.conn();
    let second = one(&other.feed(&mut h, &get));
    assert_rpc_error(&second, -32603, Some("LIMIT_REACHED"));
    let whole = one(&slow.drain(&h));
    assert_eq!(
        whole.json()["result"]["status"]["message"]["parts"][0]["text"]
            .as_str()
            .map(str::len),
        Some(3_000_000)
    );
}
