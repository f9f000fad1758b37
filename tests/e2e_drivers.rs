//! End-to-end tests of the `agentd` binary, every one run against both drivers (`smol` and
//! `std`): a real process, real sockets (TCP, and the unix socket for the key cases), raw
//! HTTP/1.1 bytes. Each test starts its own daemon, so they run in parallel and share
//! nothing.

mod common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Runs each listed `fn name(driver: &str)` as `smol_driver::name` and `std_driver::name`.
macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {
        mod smol_driver {
            $( #[test] fn $name() { super::$name("smol") } )*
        }
        mod std_driver {
            $( #[test] fn $name() { super::$name("std") } )*
        }
    };
}

both_drivers!(
    card_get_head_and_conditional,
    unix_socket_is_private_and_advertises_its_binding,
    send_message_is_rejected_with_a_status_message,
    streaming_send_frames_then_keep_alive,
    get_task_history_length,
    list_tasks_pages_visit_every_task_once,
    cancel_and_subscribe_refusals,
    pipelined_requests_answer_in_order,
    request_split_byte_by_byte,
    routing_refusals,
    framing_refusals_close_the_connection,
    size_limits,
    expect_continue,
    http10_clients,
    jsonrpc_refusals,
    request_ids_echo_byte_for_byte,
    slowloris_gets_408_while_others_are_served,
    idle_keep_alive_connections_close,
    abandoned_connections_do_not_starve_others,
    pipelined_request_behind_a_stream,
    half_closed_client_still_gets_its_answers,
    many_pipelined_requests_with_backpressure,
    connection_limit_answers_503,
    smol_threads_sets_the_executor_threads,
    reader_that_stops_reading_is_dropped,
    odd_but_valid_request_forms,
    unix_socket_path_takeover,
    http10_expect_continue_is_ignored,
    http10_keep_alive_send_message_says_keep_alive,
);

const UNKNOWN_TASK: &str = "00000000-0000-4000-8000-000000000000";

fn task_of(result: &Value) -> &Value {
    let t = &result["task"];
    assert!(
        t.is_object(),
        "expected a result of the form {{\"task\":…}}, got {result}"
    );
    t
}

fn state_of(task: &Value) -> &str {
    task["status"]["state"]
        .as_str()
        .unwrap_or_else(|| panic!("expected task.status.state to be a string: {task}"))
}

/// Creates a task with a unary SendMessage; returns the task.
fn new_task<S: std::io::Read + std::io::Write>(c: &mut Client<S>, message_id: &str) -> Value {
    let r = c.rpc_ok("SendMessage", text_message(message_id, "hello"));
    let t = task_of(&r).clone();
    assert_eq!(
        state_of(&t),
        "TASK_STATE_REJECTED",
        "expected a unary SendMessage to end REJECTED (no agent is configured): {t}"
    );
    t
}

fn histories(task: &Value) -> Vec<Value> {
    match task.get("history") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(other) => panic!("expected task.history to be an array or absent, got {other}"),
    }
}

fn assert_closes<S: Transport>(c: &mut Client<S>, resp: &Response, what: &str) {
    assert!(
        resp.says_close(),
        "expected `connection: close` on the {} answer to {what}, got headers {:?}",
        resp.status,
        resp.headers
    );
    c.expect_eof(&format!("after the {} answer to {what}", resp.status));
}

fn assert_stays_open<S: Transport>(c: &mut Client<S>, resp: &Response, what: &str) {
    assert!(
        !resp.says_close(),
        "expected the {} answer to {what} to keep the connection open, got headers {:?}",
        resp.status,
        resp.headers
    );
    let r = c.get_card();
    assert_eq!(
        r.status, 200,
        "expected the connection to still serve a request after the {} answer to {what}",
        resp.status
    );
}

// ---------------------------------------------------------------------------------------
// The card
// ---------------------------------------------------------------------------------------

fn card_get_head_and_conditional(driver: &str) {
    let d = Daemon::start(driver);
    let mut etags = Vec::new();
    for via in Via::ALL {
        let mut c = d.connect(via);
        let r = c.get_card();
        assert_json_200(&r, &format!("GET the card over {via:?}"));
        let etag = r
            .header("etag")
            .unwrap_or_else(|| panic!("expected an etag on the card over {via:?}: {:?}", r.headers))
            .to_owned();
        assert!(
            etag.starts_with('"') && etag.ends_with('"') && etag.len() > 2,
            "expected a strong quoted etag, got {etag}"
        );
        let card = r.json();
        assert_eq!(
            card["name"], "agentd",
            "expected the default card name: {card}"
        );
        assert_eq!(
            card["capabilities"]["streaming"], true,
            "expected capabilities.streaming true: {card}"
        );
        let expected = match via {
            Via::Tcp => json!({
                "protocolBinding": "JSONRPC",
                "protocolVersion": "1.0",
                "url": d.tcp_url(),
            }),
            Via::Unix => json!({
                "protocolBinding": "https://agentd.dev/a2a/binding/jsonrpc-unix",
                "protocolVersion": "1.0",
                "url": d.unix_url(),
            }),
        };
        assert_eq!(
            card["supportedInterfaces"][0], expected,
            "expected supportedInterfaces[0] over {via:?} to name this listener"
        );

        // HEAD: the same head, no body (the next response on the connection parses cleanly).
        c.send(&bare("HEAD", CARD, &[]));
        let h = c.read_head_response();
        assert_eq!(h.status, 200, "expected HEAD on the card to answer 200");
        assert_eq!(
            h.header("content-length"),
            Some(r.body.len().to_string().as_str()),
            "expected HEAD to announce the GET body's length"
        );
        assert_eq!(
            h.header("etag"),
            Some(etag.as_str()),
            "expected HEAD to carry the etag"
        );

        // Conditional GETs.
        for inm in [
            etag.clone(),
            format!("W/{etag}"),
            format!("\"nope\", {etag}"),
            "*".to_owned(),
        ] {
            let r304 = c.request(&get(CARD, &[&format!("If-None-Match: {inm}")]));
            assert_eq!(
                r304.status, 304,
                "expected If-None-Match: {inm} to answer 304 over {via:?}"
            );
            assert!(r304.body.is_empty(), "expected no body on a 304");
            assert_eq!(
                r304.header("etag"),
                Some(etag.as_str()),
                "expected the etag on a 304"
            );
        }
        c.send(&bare("HEAD", CARD, &[&format!("If-None-Match: {etag}")]));
        assert_eq!(
            c.read_head_response().status,
            304,
            "expected a conditional HEAD to answer 304"
        );
        let fresh = c.request(&get(CARD, &["If-None-Match: \"other\""]));
        assert_eq!(
            fresh.status, 200,
            "expected a non-matching If-None-Match to answer 200"
        );
        assert_eq!(fresh.body, r.body, "expected the same card body");

        // Preflights.
        let o = c.request(&bare("OPTIONS", CARD, &[]));
        assert_eq!(o.status, 204, "expected OPTIONS on the card to answer 204");
        assert_eq!(
            o.header("allow"),
            Some("GET, HEAD, OPTIONS"),
            "expected the card's allow"
        );
        let o = c.request(&bare("OPTIONS", "/", &[]));
        assert_eq!(o.status, 204, "expected OPTIONS / to answer 204");
        assert_eq!(
            o.header("allow"),
            Some("POST, OPTIONS"),
            "expected the RPC endpoint's allow"
        );
        assert!(o.body.is_empty(), "expected no body on a 204");

        let again = c.get_card();
        assert_eq!(again.status, 200, "expected the connection to stay usable");
        assert!(
            c.buffered().is_empty(),
            "expected no stray bytes after the card exchanges"
        );
        etags.push(etag);
    }
    assert_ne!(
        etags[0], etags[1],
        "expected the TCP and unix cards (different bodies) to have different etags"
    );
}

fn unix_socket_is_private_and_advertises_its_binding(driver: &str) {
    let mut d = Daemon::start(driver);
    assert_eq!(
        d.listening,
        vec![
            format!("listening {}", d.tcp_url()),
            format!("listening {}", d.unix_url())
        ],
        "expected one `listening URL` line per listener, in config order"
    );
    let meta = std::fs::metadata(&d.unix).expect("the unix socket file exists");
    assert!(
        meta.file_type().is_socket(),
        "expected {} to be a socket",
        d.unix.display()
    );
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "expected the unix socket to be mode 0600, got {:o}",
        meta.permissions().mode() & 0o777
    );
    let mut c = d.connect_unix();
    let card = c.get_card().json();
    assert_eq!(
        card["supportedInterfaces"][0]["protocolBinding"],
        "https://agentd.dev/a2a/binding/jsonrpc-unix",
        "expected the unix card to name the unix binding URI"
    );
    assert_eq!(card["supportedInterfaces"][0]["url"], d.unix_url());
    assert_eq!(
        card["supportedInterfaces"].as_array().map(Vec::len),
        Some(1),
        "expected the unix card to name only its own interface"
    );
    // A clean stop takes its socket file with it.
    drop(c);
    d.signal("TERM");
    let status = d.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM: {status:?}");
    assert!(
        !d.unix.exists(),
        "the unix socket file {} outlived a clean stop",
        d.unix.display()
    );
}

// ---------------------------------------------------------------------------------------
// Messages and tasks
// ---------------------------------------------------------------------------------------

fn send_message_is_rejected_with_a_status_message(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        let mid = format!("m-{via:?}");
        let t = new_task(&mut c, &mid);
        let id = t["id"].as_str().expect("task.id is a string");
        assert!(!id.is_empty(), "expected a task id");
        assert!(
            t["contextId"].as_str().is_some_and(|s| !s.is_empty()),
            "expected a minted contextId: {t}"
        );
        let m = &t["status"]["message"];
        assert_eq!(
            m["role"], "ROLE_AGENT",
            "expected the status message to be the agent's: {t}"
        );
        assert_eq!(
            m["taskId"], id,
            "expected the status message to name its task: {t}"
        );
        assert!(
            m["parts"][0]["text"]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "expected the status message to explain the rejection in a text part: {t}"
        );
        assert!(
            t["status"]["timestamp"].as_str().is_some(),
            "expected a status timestamp: {t}"
        );
        let h = histories(&t);
        assert_eq!(
            h.len(),
            1,
            "expected the history to hold the user's message: {t}"
        );
        assert_eq!(h[0]["messageId"], mid.as_str());
        assert_eq!(h[0]["role"], "ROLE_USER");
        assert_eq!(
            h[0]["taskId"], id,
            "expected the stored message to name its task"
        );

        // returnImmediately: the task as submitted, before the runtime acts.
        let mut p = text_message(&format!("{mid}-now"), "hi");
        p["configuration"] = json!({"returnImmediately": true});
        let r = c.rpc_ok("SendMessage", p);
        let t2 = task_of(&r);
        assert_eq!(
            state_of(t2),
            "TASK_STATE_SUBMITTED",
            "expected returnImmediately to answer the SUBMITTED task: {t2}"
        );
        // It still ends REJECTED.
        let id2 = t2["id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let g = c.rpc_ok("GetTask", json!({"id": id2}));
            if state_of(&g) == "TASK_STATE_REJECTED" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "expected the task to reach REJECTED: {g}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn streaming_send_frames_then_keep_alive(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        let req = rpc_request(
            "\"s1\"",
            "SendStreamingMessage",
            &text_message(&common::fresh_id(), "stream please"),
        );
        let r = c.request(&req);
        assert_eq!(
            r.status, 200,
            "expected 200 for SendStreamingMessage over {via:?}: {r:?}"
        );
        assert_eq!(
            r.header("content-type"),
            Some("text/event-stream"),
            "expected an SSE stream"
        );
        assert_eq!(
            r.header("transfer-encoding"),
            Some("chunked"),
            "expected a chunked SSE stream on HTTP/1.1"
        );
        assert!(
            r.chunked,
            "expected the stream to end with the 0-length chunk"
        );
        assert!(
            !r.says_close(),
            "expected the stream's connection to stay open for the next request: {:?}",
            r.headers
        );
        let events = r.sse_events();
        assert_eq!(
            events.len(),
            2,
            "expected exactly two SSE events (task, statusUpdate), got {events:?}"
        );
        for e in &events {
            assert_eq!(e["jsonrpc"], "2.0");
            assert_eq!(
                e["id"], "s1",
                "expected every event to echo the request id: {e}"
            );
        }
        let task = &events[0]["result"]["task"];
        assert_eq!(
            state_of(task),
            "TASK_STATE_SUBMITTED",
            "expected the first event to be the SUBMITTED task: {}",
            events[0]
        );
        let task_id = task["id"].as_str().expect("task id").to_owned();
        let up = &events[1]["result"]["statusUpdate"];
        assert_eq!(
            up["taskId"],
            task_id.as_str(),
            "expected the update to name the task"
        );
        assert_eq!(
            up["contextId"], task["contextId"],
            "expected the update's contextId"
        );
        assert_eq!(
            up["status"]["state"], "TASK_STATE_REJECTED",
            "expected the second event to be the REJECTED status update: {}",
            events[1]
        );
        assert_eq!(up["status"]["message"]["role"], "ROLE_AGENT");
        // One event per chunk, then the terminating chunk.
        assert_eq!(
            r.chunk_sizes.len(),
            3,
            "expected one chunk per event plus the last chunk, got sizes {:?}",
            r.chunk_sizes
        );

        // Same connection: the next request is served.
        assert!(
            c.buffered().is_empty(),
            "expected nothing after the last chunk"
        );
        let g = c.rpc_ok("GetTask", json!({"id": task_id}));
        assert_eq!(
            state_of(&g),
            "TASK_STATE_REJECTED",
            "expected GetTask on the same keep-alive connection to see the REJECTED task"
        );

        // `Connection: close` on a stream: it ends and the connection closes.
        let close_req = post(
            &[RPC_HEADERS[0], RPC_HEADERS[1], "Connection: close"],
            &rpc_body(
                "2",
                "SendStreamingMessage",
                &text_message(&common::fresh_id(), "x"),
            ),
        );
        c.send(&close_req);
        let r = c.read_response();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.sse_events().len(),
            2,
            "expected two events on the closing stream"
        );
        assert_closes(&mut c, &r, "a streaming request with Connection: close");
    }
}

fn get_task_history_length(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        let t = new_task(&mut c, "h-1");
        let id = t["id"].as_str().unwrap();

        let full = c.rpc_ok("GetTask", json!({"id": id}));
        assert_eq!(
            full["id"], id,
            "expected GetTask to return the task itself: {full}"
        );
        assert_eq!(
            full["status"], t["status"],
            "expected the status SendMessage answered"
        );
        assert_eq!(full["contextId"], t["contextId"]);
        let h = histories(&full);
        assert_eq!(
            h.len(),
            1,
            "expected historyLength unset to return all history: {full}"
        );
        assert_eq!(h[0]["messageId"], "h-1");

        let none = c.rpc_ok("GetTask", json!({"id": id, "historyLength": 0}));
        assert!(
            histories(&none).is_empty(),
            "expected historyLength 0 to return no history: {none}"
        );
        assert_eq!(
            none["status"], t["status"],
            "expected the status regardless of history"
        );

        let one = c.rpc_ok("GetTask", json!({"id": id, "historyLength": 1}));
        assert_eq!(
            histories(&one).len(),
            1,
            "expected historyLength 1 to keep one: {one}"
        );
        let str_len = c.rpc_ok("GetTask", json!({"id": id, "historyLength": "0"}));
        assert!(
            histories(&str_len).is_empty(),
            "expected historyLength \"0\" (ProtoJSON int32 as string) to act as 0: {str_len}"
        );
    }
}

fn list_tasks_pages_visit_every_task_once(driver: &str) {
    let d = Daemon::start(driver);
    let mut c = d.connect_tcp();
    let empty = c.rpc_ok("ListTasks", json!({}));
    assert_eq!(
        empty["totalSize"], 0,
        "expected no tasks on a fresh daemon: {empty}"
    );
    let mut created = BTreeSet::new();
    for i in 0..5 {
        let t = new_task(&mut c, &format!("l-{i}"));
        created.insert(t["id"].as_str().unwrap().to_owned());
    }
    let all = c.rpc_ok("ListTasks", json!({}));
    assert_eq!(all["totalSize"], 5, "expected totalSize 5: {all}");
    assert_eq!(all["tasks"].as_array().map(Vec::len), Some(5));
    assert!(
        all["nextPageToken"].as_str().is_none_or(str::is_empty),
        "expected no next page when everything fits: {all}"
    );

    let mut seen = Vec::new();
    let mut token = String::new();
    for page_no in 0.. {
        assert!(page_no < 10, "expected 5 pages of 1, still paging after 10");
        let mut params = json!({"pageSize": 1});
        if !token.is_empty() {
            params["pageToken"] = json!(token);
        }
        let page = c.rpc_ok("ListTasks", params);
        assert_eq!(page["pageSize"], 1, "expected pageSize 1 echoed: {page}");
        assert_eq!(
            page["totalSize"], 5,
            "expected totalSize 5 on every page: {page}"
        );
        let tasks = page["tasks"].as_array().expect("tasks is an array");
        assert_eq!(tasks.len(), 1, "expected exactly one task per page: {page}");
        seen.push(tasks[0]["id"].as_str().unwrap().to_owned());
        token = page["nextPageToken"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen.len(), 5, "expected 5 pages, visited {seen:?}");
    let seen_set: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(seen_set.len(), 5, "expected no task twice: {seen:?}");
    assert_eq!(
        seen_set, created,
        "expected the pages to visit exactly the created tasks"
    );
    let unpaged: Vec<_> = all["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        seen, unpaged,
        "expected paging to follow the order of one full listing"
    );
}

fn cancel_and_subscribe_refusals(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        for method in ["GetTask", "CancelTask", "SubscribeToTask"] {
            let e = c.rpc_err(method, json!({"id": UNKNOWN_TASK}), -32001);
            assert_eq!(
                e["data"][0]["reason"], "TASK_NOT_FOUND",
                "expected {method} on an unknown id to carry reason TASK_NOT_FOUND: {e}"
            );
        }
        let t = new_task(&mut c, "c-1");
        let id = t["id"].as_str().unwrap();
        let e = c.rpc_err("CancelTask", json!({"id": id}), -32002);
        assert_eq!(
            e["data"][0]["reason"], "TASK_NOT_CANCELABLE",
            "expected CancelTask on a REJECTED task to say TASK_NOT_CANCELABLE: {e}"
        );
        // Plain JSON, not a stream (`rpc` asserts application/json).
        let e = c.rpc_err("SubscribeToTask", json!({"id": id}), -32004);
        assert_eq!(e["data"][0]["reason"], "UNSUPPORTED_OPERATION");
        // A follow-up message on the terminal task.
        let mut p = text_message(&common::fresh_id(), "again");
        p["message"]["taskId"] = json!(id);
        c.rpc_err("SendMessage", p, -32004);
        let after = c.rpc_ok("GetTask", json!({"id": id}));
        assert_eq!(
            state_of(&after),
            "TASK_STATE_REJECTED",
            "expected the task unchanged"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Framing: pipelining, splits
// ---------------------------------------------------------------------------------------

fn pipelined_requests_answer_in_order(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        let mut bytes = rpc_request(
            "\"p1\"",
            "SendMessage",
            &text_message(&common::fresh_id(), "first"),
        );
        bytes.extend(rpc_request(
            "\"p2\"",
            "GetTask",
            &json!({"id": UNKNOWN_TASK}),
        ));
        bytes.extend(rpc_request("\"p3\"", "ListTasks", &json!({})));
        c.send(&bytes);
        let r1 = c.read_response().json();
        let r2 = c.read_response().json();
        let r3 = c.read_response().json();
        assert_eq!(
            [&r1["id"], &r2["id"], &r3["id"]],
            [&json!("p1"), &json!("p2"), &json!("p3")],
            "expected three answers in request order over {via:?}"
        );
        let t = task_of(&r1["result"]);
        assert_eq!(
            state_of(t),
            "TASK_STATE_REJECTED",
            "expected p1's task REJECTED: {r1}"
        );
        assert_eq!(
            r2["error"]["code"], -32001,
            "expected p2 to be task-not-found: {r2}"
        );
        let listed: Vec<_> = r3["result"]["tasks"]
            .as_array()
            .expect("p3 lists tasks")
            .iter()
            .map(|x| x["id"].clone())
            .collect();
        assert!(
            listed.contains(&t["id"]),
            "expected p3 (answered after p1) to list p1's task: {r3}"
        );
        assert!(c.buffered().is_empty(), "expected exactly three answers");
        // A pipelined mix of a card GET, a 404 and an RPC.
        let mut bytes = get(CARD, &[]);
        bytes.extend(get("/missing", &[]));
        bytes.extend(rpc_request("9", "ListTasks", &json!({"pageSize": 1})));
        c.send(&bytes);
        assert_eq!(c.read_response().status, 200, "expected the card first");
        assert_eq!(c.read_response().status, 404, "expected the 404 second");
        let r = c.read_response();
        assert_json_200(&r, "the pipelined ListTasks");
        assert_eq!(r.json()["id"], 9);
    }
}

fn request_split_byte_by_byte(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        c.send_byte_by_byte(&rpc_request(
            "\"b1\"",
            "SendMessage",
            &text_message(&common::fresh_id(), "bytes"),
        ));
        let r = c.read_response();
        assert_json_200(&r, "a SendMessage written one byte per write");
        let doc = r.json();
        assert_eq!(doc["id"], "b1");
        let t = task_of(&doc["result"]);
        assert_eq!(state_of(t), "TASK_STATE_REJECTED");

        // A chunked body, with an extension and a trailer, one byte per write.
        let body = rpc_body("\"b2\"", "GetTask", &json!({"id": t["id"]}));
        let (a, b) = body.split_at(body.len() / 2);
        let mut req = b"POST / HTTP/1.1\r\nHost: agentd.test\r\nContent-Type: application/json\r\n\
A2A-Version: 1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
        req.extend(format!("{:x};ext=1\r\n", a.len()).bytes());
        req.extend_from_slice(a);
        req.extend(format!("\r\n{:X}\r\n", b.len()).bytes());
        req.extend_from_slice(b);
        req.extend_from_slice(b"\r\n0\r\nX-Trailer: t\r\n\r\n");
        c.send_byte_by_byte(&req);
        let r = c.read_response();
        assert_json_200(&r, "a chunked GetTask written one byte per write");
        let doc = r.json();
        assert_eq!(doc["id"], "b2");
        assert_eq!(
            doc["result"]["id"], t["id"],
            "expected the chunked GetTask to find the task"
        );
        // Leading blank lines before a request line are ignored (RFC 9112 §2.2).
        let mut req = b"\r\n".to_vec();
        req.extend(get(CARD, &[]));
        c.send_byte_by_byte(&req);
        assert_eq!(
            c.read_response().status,
            200,
            "expected a card after a leading CRLF"
        );
    }
}

// ---------------------------------------------------------------------------------------
// HTTP refusals
// ---------------------------------------------------------------------------------------

fn routing_refusals(driver: &str) {
    let d = Daemon::start(driver);
    let mut c = d.connect_tcp();
    let r = c.request(&get("/nope", &[]));
    assert_eq!(r.status, 404, "expected GET /nope to answer 404");
    assert_stays_open(&mut c, &r, "GET /nope");

    let q = c.request(&get(&format!("{CARD}?x=1"), &[]));
    assert_eq!(
        q.status, 200,
        "expected the query string to be ignored when routing"
    );

    for (method, path, allow) in [
        ("PUT", "/", "POST, OPTIONS"),
        ("GET", "/", "POST, OPTIONS"),
        ("DELETE", CARD, "GET, HEAD, OPTIONS"),
        ("POST", CARD, "GET, HEAD, OPTIONS"),
    ] {
        let r = c.request(&bare(method, path, &[]));
        assert_eq!(r.status, 405, "expected {method} {path} to answer 405");
        assert_eq!(
            r.header("allow"),
            Some(allow),
            "expected allow on {method} {path}"
        );
        assert_stays_open(&mut c, &r, &format!("a bodiless {method} {path}"));
    }

    // Refused from the head with a body: the body is never read, so the connection closes.
    let body = rpc_body("1", "ListTasks", &json!({}));
    for (what, req, status) in [
        (
            "POST /nope with a body",
            {
                let mut r = post(&RPC_HEADERS, &body);
                r.splice(0..6, b"POST /nope".iter().copied());
                r
            },
            404,
        ),
        (
            "POST / with content-type text/plain",
            post(&["Content-Type: text/plain", "A2A-Version: 1.0"], &body),
            415,
        ),
        (
            "POST / without content-type",
            post(&["A2A-Version: 1.0"], &body),
            415,
        ),
        (
            "PUT / with a body",
            {
                let mut r = post(&RPC_HEADERS, &body);
                r.splice(0..4, b"PUT".iter().copied());
                r
            },
            405,
        ),
    ] {
        let mut c = d.connect_tcp();
        let r = c.request(&req);
        assert_eq!(
            r.status,
            status,
            "expected {what} to answer {status}: {:?}",
            r.body_text()
        );
        assert_closes(&mut c, &r, what);
    }

    // application/json in any case, with parameters, is JSON.
    let mut c = d.connect_tcp();
    for ct in ["application/json; charset=utf-8", "Application/JSON"] {
        let r = c.request(&post(
            &[&format!("Content-Type: {ct}"), "A2A-Version: 1.0"],
            &rpc_body("1", "ListTasks", &json!({})),
        ));
        assert_json_200(&r, &format!("content-type {ct}"));
        assert!(
            r.json().get("result").is_some(),
            "expected {ct} to be accepted"
        );
    }
    // Connection: close on a normal request; a request pipelined behind it is not answered.
    let mut bytes = get(CARD, &["Connection: close"]);
    bytes.extend(get(CARD, &[]));
    let r = c.request(&bytes);
    assert_eq!(r.status, 200);
    assert_closes(
        &mut c,
        &r,
        "GET with Connection: close (followed by a pipelined GET)",
    );
}

fn framing_refusals_close_the_connection(driver: &str) {
    let d = Daemon::start(driver);
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "Content-Length and Transfer-Encoding together",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            "Content-Length: abc",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            "Content-Length: -1",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            "Content-Length: +5",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: +5\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            "Content-Length: 5, 6",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 5, 6\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            "two different Content-Length headers",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\
Content-Length: 6\r\n\r\n"
                .to_vec(),
            400,
        ),
        (
            "an HTTP/1.1 request without Host",
            b"GET /.well-known/agent-card.json HTTP/1.1\r\nAccept: */*\r\n\r\n".to_vec(),
            400,
        ),
        (
            "an HTTP/1.1 request with two Host headers",
            b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a request line that is not HTTP",
            b"HELLO THERE\r\n\r\n".to_vec(),
            400,
        ),
        (
            "Transfer-Encoding: gzip",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n"
                .to_vec(),
            501,
        ),
        (
            "Expect: something-else",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nExpect: later\r\n\
Content-Length: 2\r\n\r\n"
                .to_vec(),
            417,
        ),
        (
            "a malformed chunk size",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Transfer-Encoding: chunked\r\n\r\nzz\r\n"
                .to_vec(),
            400,
        ),
    ];
    for (what, req, status) in cases {
        for via in Via::ALL {
            let mut c = d.connect(via);
            let r = c.request(&req);
            assert_eq!(
                r.status,
                status,
                "expected {what} to answer {status} over {via:?}, got {} {:?}",
                r.status,
                r.body_text()
            );
            assert_closes(&mut c, &r, &format!("{what} over {via:?}"));
        }
    }
    // A request smuggled behind CL+TE is never answered.
    let mut c = d.connect_tcp();
    let mut req = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n\
Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        .to_vec();
    req.extend(get(CARD, &[]));
    let r = c.request(&req);
    assert_eq!(r.status, 400, "expected CL+TE to answer 400");
    assert_closes(&mut c, &r, "CL+TE followed by a smuggled GET");
}

fn size_limits(driver: &str) {
    let d = Daemon::start_with(driver, "max_body_bytes = 4096\nmax_header_bytes = 2048");
    let body = rpc_body("1", "ListTasks", &json!({}));
    for via in Via::ALL {
        // A head over the limit.
        let mut c = d.connect(via);
        let big = format!("X-Big: {}", "a".repeat(3000));
        let r = c.request(&get(CARD, &[&big]));
        assert_eq!(
            r.status, 431,
            "expected a 3 KB head over a 2 KB limit to answer 431"
        );
        assert_closes(&mut c, &r, &format!("an oversized head over {via:?}"));

        // A head over the limit that never ends (no blank line yet).
        let mut c = d.connect(via);
        let mut head = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..100 {
            head.extend(format!("X-H{i}: {}\r\n", "b".repeat(40)).bytes());
        }
        let r = c.request(&head);
        assert_eq!(
            r.status, 431,
            "expected an unfinished head past the limit to answer 431"
        );
        assert_closes(
            &mut c,
            &r,
            &format!("an unfinished oversized head over {via:?}"),
        );

        // Too many header fields (64 by default).
        let mut c = d.connect(via);
        let many: Vec<String> = (0..70).map(|i| format!("X-{i}: 1")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let r = c.request(&get(CARD, &many));
        assert_eq!(r.status, 431, "expected 70 header fields to answer 431");
        assert_closes(&mut c, &r, &format!("too many header fields over {via:?}"));

        // A head just under the limit is fine.
        let mut c = d.connect(via);
        let ok = format!("X-Pad: {}", "a".repeat(1900));
        let r = c.request(&get(CARD, &[&ok]));
        assert_eq!(
            r.status, 200,
            "expected a 1.9 KB head under a 2 KB limit to be served"
        );

        // Content-Length over the limit: refused from the head, before any body byte.
        let mut c = d.connect(via);
        let r = c.request(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Content-Length: 4097\r\n\r\n",
        );
        assert_eq!(
            r.status, 413,
            "expected Content-Length 4097 over a 4096 limit to answer 413"
        );
        assert_closes(
            &mut c,
            &r,
            &format!("an oversized Content-Length over {via:?}"),
        );

        // A chunked body whose chunks grow past the limit.
        let mut c = d.connect(via);
        let mut req = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n\
A2A-Version: 1.0\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n"
            .to_vec();
        req.extend(std::iter::repeat_n(b' ', 0x800));
        req.extend_from_slice(b"\r\n801\r\n");
        let r = c.request(&req);
        assert_eq!(
            r.status, 413,
            "expected a chunked body past 4096 bytes to answer 413"
        );
        assert_closes(
            &mut c,
            &r,
            &format!("an oversized chunked body over {via:?}"),
        );

        // Exactly at the limit is served.
        let mut c = d.connect(via);
        let mut padded = body.clone();
        padded.resize(4096, b' ');
        let r = c.request(&post(&RPC_HEADERS, &padded));
        assert_json_200(&r, "a body of exactly max_body_bytes");
        assert!(
            r.json().get("result").is_some(),
            "expected the padded ListTasks to succeed"
        );
    }
}

fn expect_continue(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        let body = rpc_body(
            "\"e1\"",
            "SendMessage",
            &text_message(&common::fresh_id(), "continue?"),
        );
        let head = format!(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        c.send(head.as_bytes());
        let interim = c.read_response();
        assert_eq!(
            interim.status, 100,
            "expected `HTTP/1.1 100 Continue` before the body is sent over {via:?}"
        );
        assert!(
            c.buffered().is_empty(),
            "expected nothing after 100 Continue yet"
        );
        c.send(&body);
        let r = c.read_response();
        assert_json_200(&r, "the request after 100 Continue");
        let doc = r.json();
        assert_eq!(doc["id"], "e1");
        assert_eq!(state_of(task_of(&doc["result"])), "TASK_STATE_REJECTED");

        // Refused from its head: no 100, the refusal at once, then the close.
        let mut c = d.connect(via);
        c.send(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nExpect: 100-continue\r\n\
Content-Length: 10\r\n\r\n",
        );
        let r = c.read_response();
        assert_eq!(
            r.status, 415,
            "expected a 415 instead of 100 Continue for text/plain"
        );
        assert_closes(
            &mut c,
            &r,
            "an Expect: 100-continue request refused from its head",
        );
    }
}

fn http10_clients(driver: &str) {
    let d = Daemon::start(driver);
    // HTTP/1.0 needs no Host and closes by default.
    let mut c = d.connect_tcp();
    let r = c.request(b"GET /.well-known/agent-card.json HTTP/1.0\r\n\r\n");
    assert_eq!(
        r.status, 200,
        "expected an HTTP/1.0 GET without Host to be served"
    );
    assert_closes(&mut c, &r, "an HTTP/1.0 request without keep-alive");

    // HTTP/1.0 keep-alive is honoured and said.
    let mut c = d.connect_tcp();
    let r =
        c.request(b"GET /.well-known/agent-card.json HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("connection"),
        Some("keep-alive"),
        "expected an HTTP/1.0 keep-alive request to be answered with connection: keep-alive"
    );
    let r = c.request(b"GET /.well-known/agent-card.json HTTP/1.0\r\n\r\n");
    assert_eq!(
        r.status, 200,
        "expected the HTTP/1.0 keep-alive connection to serve again"
    );
    assert_closes(&mut c, &r, "the last HTTP/1.0 request");

    // An HTTP/1.0 stream has no chunked coding: it ends with the connection.
    let mut c = d.connect_tcp();
    let body = rpc_body("3", "SendStreamingMessage", &text_message("h10", "old"));
    let mut req = format!(
        "POST / HTTP/1.0\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Connection: keep-alive\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend(body);
    let r = c.request(&req);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        r.header("transfer-encoding"),
        None,
        "expected no chunked coding toward an HTTP/1.0 client"
    );
    let events = r.sse_events();
    assert_eq!(
        events.len(),
        2,
        "expected task + statusUpdate on the HTTP/1.0 stream: {events:?}"
    );
    assert_eq!(
        events[1]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_REJECTED"
    );
}

// ---------------------------------------------------------------------------------------
// JSON-RPC refusals
// ---------------------------------------------------------------------------------------

fn jsonrpc_refusals(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        // (what, body, expected code, expected id)
        let cases: Vec<(&str, &[u8], i64, Value)> = vec![
            ("a body that is not JSON", b"{\"jsonrpc\":\"2.0\",", -32700, Value::Null),
            ("an empty body", b"", -32700, Value::Null),
            (
                "a batch",
                b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ListTasks\"}]",
                -32600,
                Value::Null,
            ),
            ("a JSON string", b"\"hi\"", -32600, Value::Null),
            (
                "a request without id",
                b"{\"jsonrpc\":\"2.0\",\"method\":\"ListTasks\"}",
                -32600,
                Value::Null,
            ),
            (
                "a request with a null id",
                b"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ListTasks\"}",
                -32600,
                Value::Null,
            ),
            (
                "a request with an object id",
                b"{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ListTasks\"}",
                -32600,
                Value::Null,
            ),
            (
                "jsonrpc 1.0",
                b"{\"jsonrpc\":\"1.0\",\"id\":5,\"method\":\"ListTasks\"}",
                -32600,
                json!(5),
            ),
            (
                "no jsonrpc member",
                b"{\"id\":6,\"method\":\"ListTasks\"}",
                -32600,
                json!(6),
            ),
            (
                "a duplicate id member",
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"ListTasks\"}",
                -32600,
                Value::Null,
            ),
            (
                "a method that is not a string",
                b"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":3}",
                -32600,
                json!(8),
            ),
            (
                "an unknown method",
                b"{\"jsonrpc\":\"2.0\",\"id\":\"u\",\"method\":\"NoSuchMethod\"}",
                -32601,
                json!("u"),
            ),
            (
                "a v0.3 method name",
                b"{\"jsonrpc\":\"2.0\",\"id\":\"v\",\"method\":\"message/send\",\"params\":{}}",
                -32601,
                json!("v"),
            ),
            (
                "params that are an array",
                b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"GetTask\",\"params\":[\"x\"]}",
                -32602,
                json!(9),
            ),
            (
                "GetTask without an id",
                b"{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"GetTask\",\"params\":{}}",
                -32602,
                json!(10),
            ),
            (
                "GetTask with a negative historyLength",
                b"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"GetTask\",\"params\":{\"id\":\"x\",\"historyLength\":-1}}",
                -32602,
                json!(11),
            ),
            (
                "ListTasks with pageSize 0",
                b"{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"ListTasks\",\"params\":{\"pageSize\":0}}",
                -32602,
                json!(12),
            ),
            (
                "ListTasks with a forged pageToken",
                b"{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"ListTasks\",\"params\":{\"pageToken\":\"forged\"}}",
                -32602,
                json!(13),
            ),
            (
                "SendMessage without a message",
                b"{\"jsonrpc\":\"2.0\",\"id\":14,\"method\":\"SendMessage\",\"params\":{}}",
                -32602,
                json!(14),
            ),
            (
                "SendMessage from ROLE_AGENT",
                b"{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"SendMessage\",\"params\":{\"message\":{\"messageId\":\"m\",\"role\":\"ROLE_AGENT\",\"parts\":[{\"text\":\"x\"}]}}}",
                -32602,
                json!(15),
            ),
            (
                "SendMessage with no parts",
                b"{\"jsonrpc\":\"2.0\",\"id\":16,\"method\":\"SendMessage\",\"params\":{\"message\":{\"messageId\":\"m\",\"role\":\"ROLE_USER\",\"parts\":[]}}}",
                -32602,
                json!(16),
            ),
            (
                "SendMessage with a url part",
                b"{\"jsonrpc\":\"2.0\",\"id\":17,\"method\":\"SendMessage\",\"params\":{\"message\":{\"messageId\":\"m\",\"role\":\"ROLE_USER\",\"parts\":[{\"url\":\"https://example.com/x.png\",\"mediaType\":\"image/png\"}]}}}",
                -32005,
                json!(17),
            ),
            (
                "CreateTaskPushNotificationConfig",
                b"{\"jsonrpc\":\"2.0\",\"id\":18,\"method\":\"CreateTaskPushNotificationConfig\",\"params\":{}}",
                -32003,
                json!(18),
            ),
            (
                "GetExtendedAgentCard",
                b"{\"jsonrpc\":\"2.0\",\"id\":19,\"method\":\"GetExtendedAgentCard\"}",
                -32004,
                json!(19),
            ),
        ];
        for (what, body, code, id) in cases {
            let r = c.request(&post(&RPC_HEADERS, body));
            assert_json_200(&r, what);
            let doc = r.json();
            assert_eq!(
                doc["error"]["code"].as_i64(),
                Some(code),
                "expected {what} to be refused with {code} over {via:?}, got {doc}"
            );
            assert_eq!(
                doc["id"], id,
                "expected {what} to be answered with id {id}: {doc}"
            );
            assert!(
                doc.get("id").is_some(),
                "expected the id member present (null when unknown): {doc}"
            );
            assert!(
                doc["error"]["message"].is_string(),
                "expected an error message: {doc}"
            );
            assert!(
                doc.get("result").is_none(),
                "expected no result beside the error: {doc}"
            );
            assert!(
                !r.says_close(),
                "expected a JSON-RPC refusal to keep the connection: {what}"
            );
        }

        // A2A-Version missing or unsupported: -32009 with a google.rpc.ErrorInfo.
        let body = rpc_body("\"ver\"", "ListTasks", &json!({}));
        for (what, headers) in [
            ("no A2A-Version", vec!["Content-Type: application/json"]),
            (
                "A2A-Version: 0.3",
                vec!["Content-Type: application/json", "A2A-Version: 0.3"],
            ),
            (
                "A2A-Version: 1.1",
                vec!["Content-Type: application/json", "A2A-Version: 1.1"],
            ),
            (
                "an empty A2A-Version",
                vec!["Content-Type: application/json", "A2A-Version:"],
            ),
        ] {
            let r = c.request(&post(&headers, &body));
            assert_json_200(&r, what);
            let doc = r.json();
            assert_eq!(
                doc["error"]["code"], -32009,
                "expected {what} to be refused with -32009 over {via:?}: {doc}"
            );
            assert_eq!(
                doc["id"], "ver",
                "expected the id echoed on a version refusal"
            );
            let info = &doc["error"]["data"][0];
            assert_eq!(
                info["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
                "expected error.data[0] to be a google.rpc.ErrorInfo: {doc}"
            );
            assert_eq!(
                info["reason"], "VERSION_NOT_SUPPORTED",
                "expected the reason: {doc}"
            );
            assert_eq!(info["domain"], "a2a-protocol.org");
        }
        // Patch versions of 1.0 are served.
        let r = c.request(&post(
            &["Content-Type: application/json", "A2A-Version: 1.0.7"],
            &body,
        ));
        assert!(
            r.json().get("result").is_some(),
            "expected A2A-Version 1.0.7 to be served: {:?}",
            r.body_text()
        );
        // The connection served every refusal and is still fine.
        assert_eq!(c.get_card().status, 200);
    }
}

fn request_ids_echo_byte_for_byte(driver: &str) {
    let d = Daemon::start(driver);
    let mut c = d.connect_tcp();
    for id in [
        r#""plain""#,
        r#""a\u0041\/b\n""#,
        r#""ünï""#,
        r#""""#,
        "0",
        "-7",
        "1.50",
        "1e3",
        "-0.0",
        "123456789012345678901234567890",
    ] {
        for (method, params) in [
            ("ListTasks", json!({"pageSize": 1})),
            ("GetTask", json!({"id": UNKNOWN_TASK})),
            ("NoSuchMethod", json!({})),
        ] {
            let r = c.request(&rpc_request(id, method, &params));
            assert_json_200(&r, method);
            let raw = r.body_text();
            let needle = format!("\"id\":{id},");
            assert!(
                raw.contains(&needle),
                "expected the id {id} echoed byte for byte ({needle}) in the answer to {method}, got {raw}"
            );
        }
        // And on a stream's every event.
        let r = c.request(&rpc_request(
            id,
            "SendStreamingMessage",
            &text_message(&common::fresh_id(), "x"),
        ));
        let raw = r.body_text();
        assert_eq!(
            raw.matches(&format!("\"id\":{id},")).count(),
            2,
            "expected the id {id} echoed byte for byte on both SSE events, got {raw}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Timeouts and abuse
// ---------------------------------------------------------------------------------------

fn slowloris_gets_408_while_others_are_served(driver: &str) {
    let d = Daemon::start_with(driver, "header_timeout_ms = 500\nbody_timeout_ms = 500");
    let start = Instant::now();
    // Half a head on each transport, and a head with half a body.
    let mut slow: Vec<(String, Client<Box<dyn Transport>>)> = Vec::new();
    for via in Via::ALL {
        let mut c = d.connect(via);
        c.send(b"POST / HTTP/1.1\r\nHost: agentd.test\r\nContent-Ty");
        slow.push((format!("half a head over {via:?}"), c));
        let mut c = d.connect(via);
        c.send(
            b"POST / HTTP/1.1\r\nHost: agentd.test\r\nContent-Type: application/json\r\n\
A2A-Version: 1.0\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"",
        );
        slow.push((format!("a head with 10 of 100 body bytes over {via:?}"), c));
    }
    // Meanwhile another client is served promptly, repeatedly.
    let mut other = d.connect_tcp();
    while start.elapsed() < Duration::from_millis(700) {
        let t = Instant::now();
        let r = other.get_card();
        assert_eq!(
            r.status, 200,
            "expected the other client to be served during slowloris"
        );
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "expected the other client to be answered promptly, took {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And a write still goes through. Not timed: its answer waits for the file store's
    // fsync, which on a loaded machine can take longer than any bound that would mean
    // something here; the card loop above is the promptness check.
    let r = other.rpc_ok("SendMessage", text_message("slow-other", "still here?"));
    assert_eq!(state_of(task_of(&r)), "TASK_STATE_REJECTED");

    for (what, mut c) in slow {
        let r = c.read_response();
        let elapsed = start.elapsed();
        assert_eq!(
            r.status,
            408,
            "expected 408 for {what}, got {} {:?}",
            r.status,
            r.body_text()
        );
        assert!(
            elapsed >= Duration::from_millis(450),
            "expected the 408 for {what} not before the 500 ms timeout, got it after {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_millis(2500),
            "expected the 408 for {what} within a couple of seconds, took {elapsed:?}"
        );
        assert_closes(&mut c, &r, &what);
    }
    // A head dribbled slower than the timeout as a whole is cut off too, even though each
    // byte arrives well within it.
    let mut c = d.connect_tcp();
    let t = Instant::now();
    let head = b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: agentd.test\r\nX-Slow: ";
    for b in head.iter().chain(std::iter::repeat(&b'z')) {
        if c.stream.write_all(std::slice::from_ref(b)).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
        if t.elapsed() > Duration::from_millis(800) {
            break;
        }
    }
    let r = c.read_response();
    assert_eq!(
        r.status, 408,
        "expected a head dribbled past header_timeout_ms to get 408"
    );
    let elapsed = t.elapsed();
    assert!(
        elapsed < Duration::from_millis(2500),
        "expected the 408 promptly, took {elapsed:?}"
    );
}

fn idle_keep_alive_connections_close(driver: &str) {
    let d = Daemon::start_with(driver, "idle_timeout_ms = 300");
    for via in Via::ALL {
        // After a request.
        let mut used = d.connect(via);
        let r = used.get_card();
        assert_eq!(r.status, 200);
        assert!(!r.says_close(), "expected a keep-alive answer");
        // Before any request.
        let mut fresh = d.connect(via);
        let t = Instant::now();
        for (what, c) in [
            ("after a request", &mut used),
            ("before any request", &mut fresh),
        ] {
            let left = Duration::from_secs(3).saturating_sub(t.elapsed());
            c.try_expect_eof(left).unwrap_or_else(|e| {
                panic!("expected an idle connection ({what}, {via:?}) to be closed: {e}")
            });
        }
        let elapsed = t.elapsed();
        assert!(
            elapsed >= Duration::from_millis(200),
            "expected idle connections to live about idle_timeout_ms (300 ms), closed after {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_millis(2000),
            "expected idle connections closed soon after 300 ms, took {elapsed:?}"
        );
    }
    // A connection in use is not idle: requests spaced under the timeout keep it open.
    let mut c = d.connect_tcp();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(
            c.get_card().status,
            200,
            "expected requests spaced 150 ms apart to keep a 300 ms idle connection open"
        );
    }
}

fn abandoned_connections_do_not_starve_others(driver: &str) {
    let mut d = Daemon::start(driver);
    let mut abandoned = Vec::with_capacity(200);
    for i in 0..200 {
        let s = std::net::TcpStream::connect(d.tcp)
            .unwrap_or_else(|e| panic!("expected to open abandoned connection {i}: {e}"));
        abandoned.push(s);
    }
    let mut abandoned_unix = Vec::with_capacity(20);
    for _ in 0..20 {
        abandoned_unix.push(std::os::unix::net::UnixStream::connect(&d.unix).unwrap());
    }
    for via in Via::ALL {
        let t = Instant::now();
        let mut c = d.connect(via);
        assert_eq!(
            c.get_card().status,
            200,
            "expected a client to be served beside 220 silent connections over {via:?}"
        );
        let r = c.rpc_ok("SendMessage", text_message(&common::fresh_id(), "anyone?"));
        assert_eq!(state_of(task_of(&r)), "TASK_STATE_REJECTED");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "expected a prompt answer beside 220 silent connections, took {:?}",
            t.elapsed()
        );
    }
    drop(abandoned);
    drop(abandoned_unix);
    std::thread::sleep(Duration::from_millis(100));
    let mut c = d.connect_tcp();
    assert_eq!(
        c.get_card().status,
        200,
        "expected service after the abandoned connections went"
    );
    d.assert_alive();
}

// ---------------------------------------------------------------------------------------
// More framing and lifecycle
// ---------------------------------------------------------------------------------------

fn pipelined_request_behind_a_stream(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        let mut bytes = rpc_request(
            "\"st\"",
            "SendStreamingMessage",
            &text_message(&common::fresh_id(), "stream"),
        );
        bytes.extend(rpc_request("\"after\"", "ListTasks", &json!({})));
        bytes.extend(get(CARD, &[]));
        c.send(&bytes);
        let r = c.read_response();
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        let events = r.sse_events();
        assert_eq!(
            events.len(),
            2,
            "expected the stream's two events first: {events:?}"
        );
        let task_id = events[0]["result"]["task"]["id"].clone();
        let r = c.read_response();
        assert_json_200(&r, "the ListTasks pipelined behind a stream");
        let doc = r.json();
        assert_eq!(
            doc["id"], "after",
            "expected the pipelined request answered after the stream"
        );
        let listed: Vec<_> = doc["result"]["tasks"]
            .as_array()
            .expect("a task list")
            .iter()
            .map(|t| t["id"].clone())
            .collect();
        assert!(
            listed.contains(&task_id),
            "expected the pipelined ListTasks to see the streamed task {task_id}: {listed:?}"
        );
        assert_eq!(c.read_response().status, 200, "expected the card third");
        assert!(c.buffered().is_empty());
    }
}

fn half_closed_client_still_gets_its_answers(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        // A blocking send, then EOF: the answer still comes, then the close.
        let mut c = d.connect(via);
        c.send(&rpc_request(
            "1",
            "SendMessage",
            &text_message(&common::fresh_id(), "bye"),
        ));
        c.shutdown_write();
        let r = c.read_response();
        assert_json_200(
            &r,
            &format!("a SendMessage followed by a half-close over {via:?}"),
        );
        assert_eq!(
            state_of(task_of(&r.json()["result"])),
            "TASK_STATE_REJECTED"
        );
        c.expect_eof(&format!(
            "after answering a half-closed client over {via:?}"
        ));

        // A stream, then EOF.
        let mut c = d.connect(via);
        c.send(&rpc_request(
            "2",
            "SendStreamingMessage",
            &text_message(&common::fresh_id(), "bye"),
        ));
        c.shutdown_write();
        let r = c.read_response();
        assert_eq!(
            r.sse_events().len(),
            2,
            "expected the whole stream to a half-closed client"
        );
        c.expect_eof(&format!(
            "after streaming to a half-closed client over {via:?}"
        ));

        // Two pipelined requests, then EOF: both answered.
        let mut c = d.connect(via);
        let mut bytes = get(CARD, &[]);
        bytes.extend(rpc_request("3", "ListTasks", &json!({})));
        c.send(&bytes);
        c.shutdown_write();
        assert_eq!(c.read_response().status, 200);
        assert_eq!(
            c.read_response().json()["id"],
            3,
            "expected the second pipelined answer"
        );
        c.expect_eof(&format!(
            "after the pipelined answers to a half-closed client over {via:?}"
        ));

        // A half-sent request, then EOF: no answer needed, but the connection closes.
        let mut c = d.connect(via);
        c.send(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHo");
        c.shutdown_write();
        match c.try_read_response(false) {
            Err(_) => {}
            Ok(r) => {
                assert_eq!(
                    r.status, 400,
                    "expected at most a 400 for a truncated head: {r:?}"
                );
                assert!(r.says_close());
            }
        }
    }
}

fn many_pipelined_requests_with_backpressure(driver: &str) {
    let d = Daemon::start(driver);
    for via in Via::ALL {
        let mut c = d.connect(via);
        let card_len = c.get_card().body.len();
        const N: usize = 1500;
        let mut bytes = Vec::new();
        for i in 0..N {
            if i % 3 == 2 {
                bytes.extend(rpc_request(
                    &i.to_string(),
                    "ListTasks",
                    &json!({"pageSize": 1}),
                ));
            } else {
                bytes.extend(get(CARD, &[]));
            }
        }
        // Write from another thread: the daemon stops reading while its output is backed up,
        // so writing everything before reading could deadlock.
        let mut writer = c.clone_stream();
        let w = std::thread::spawn(move || writer.write_all(&bytes));
        for i in 0..N {
            let r = c.read_response();
            assert_eq!(
                r.status, 200,
                "expected answer {i} of {N} to be 200 over {via:?}"
            );
            if i % 3 == 2 {
                assert_eq!(
                    r.json()["id"],
                    i,
                    "expected answer {i} to be the ListTasks with id {i} (in order)"
                );
            } else {
                assert_eq!(r.body.len(), card_len, "expected answer {i} to be the card");
            }
        }
        w.join()
            .unwrap()
            .expect("expected all pipelined requests to be written");
    }
}

/// How many of the daemon's threads are its smol executor's (`agentd-smol-N`), once that
/// many have their names: a thread is named as it starts, which may be after the daemon
/// says it listens.
fn smol_executor_threads(d: &Daemon, want: usize) -> usize {
    let count = || {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", d.pid())).expect("/proc/<pid>/task");
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("agentd-smol-"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = count();
        if n == want || Instant::now() > deadline {
            // Settled: none more start later.
            std::thread::sleep(Duration::from_millis(50));
            return count();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `limits.smol_threads` sets how many executor threads the smol driver runs (one per CPU
/// when unset); the std driver, a thread per connection, says it does not use it.
fn smol_threads_sets_the_executor_threads(driver: &str) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let warning = "limits.smol_threads is the smol driver's";
    // The daemon inherits this process's CPU affinity, so it counts the same CPUs.
    let d = Daemon::start(driver);
    let want = if driver == "smol" { cpus } else { 0 };
    assert_eq!(
        smol_executor_threads(&d, want),
        want,
        "unset: one per CPU ({cpus})"
    );
    assert!(
        !d.stderr().contains(warning),
        "no warning when unset: {}",
        d.stderr()
    );
    drop(d);
    for n in [1, 3] {
        let d = Daemon::start_with(driver, &format!("smol_threads = {n}"));
        let want = if driver == "smol" { n } else { 0 };
        assert_eq!(smol_executor_threads(&d, want), want, "smol_threads = {n}");
        // Served all the same, more than one connection at once.
        let mut clients: Vec<_> = (0..4).map(|_| d.connect_tcp()).collect();
        for c in &mut clients {
            c.send(&get(CARD, &[]));
        }
        for c in &mut clients {
            assert_eq!(c.read_response().status, 200, "smol_threads = {n}");
        }
        let said = d.stderr().contains(warning);
        assert_eq!(
            said,
            driver == "std",
            "the std driver's warning: {}",
            d.stderr()
        );
    }
}

fn connection_limit_answers_503(driver: &str) {
    let d = Daemon::start_with(driver, "max_connections = 3");
    let held: Vec<_> = (0..3).map(|_| d.connect_tcp()).collect();
    // Let the daemon accept them.
    std::thread::sleep(Duration::from_millis(100));
    let mut extra = d.connect_tcp();
    let r = extra.try_read_response(false).unwrap_or_else(|e| {
        panic!("expected a 503 for a 4th connection beyond max_connections 3: {e}")
    });
    assert_eq!(r.status, 503, "expected 503 beyond max_connections: {r:?}");
    assert_eq!(
        r.header("retry-after"),
        Some("1"),
        "expected retry-after on the 503"
    );
    assert_closes(&mut extra, &r, "the 503 beyond max_connections");
    // Freeing a slot lets a new client in.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut c = d.connect_tcp();
        c.send(&get(CARD, &[]));
        let r = c.read_response();
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "expected 200 or (until slots free) 503");
        assert!(
            Instant::now() < deadline,
            "expected a slot to free once connections closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn reader_that_stops_reading_is_dropped(driver: &str) {
    let d = Daemon::start_with(driver, "write_timeout_ms = 300");
    let c = d.connect_tcp();
    let mut writer = c.clone_stream();
    writer
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Ask for far more than the socket buffers hold, and never read.
    let req = get(CARD, &[]);
    let t = Instant::now();
    let w = std::thread::spawn(move || {
        let mut written = 0usize;
        loop {
            match writer.write_all(&req) {
                Ok(()) => written += 1,
                Err(e) => return (written, e),
            }
            if written > 2_000_000 {
                return (written, std::io::Error::other("never refused"));
            }
        }
    });
    let (written, err) = w.join().unwrap();
    let elapsed = t.elapsed();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "expected the daemon to drop a connection that stopped reading (write_timeout_ms 300); \
         after {written} requests the writer saw {err} ({:?}) after {elapsed:?}",
        err.kind()
    );
    assert!(
        elapsed < Duration::from_secs(8),
        "expected the drop soon, took {elapsed:?}"
    );
    // Others are still served.
    assert_eq!(d.connect_tcp().get_card().status, 200);
    drop(c);
}

fn odd_but_valid_request_forms(driver: &str) {
    let d = Daemon::start(driver);
    let mut c = d.connect_tcp();
    let r = c.request(
        b"GET http://agentd.test/.well-known/agent-card.json HTTP/1.1\r\nHost: agentd.test\r\n\r\n",
    );
    assert_eq!(
        r.status, 200,
        "expected an absolute-form target to reach the card"
    );
    let r = c.request(b"GET /.well-known/agent-card.json HTTP/1.1\r\nhOsT: x\r\nX-Empty:\r\n\r\n");
    assert_eq!(
        r.status, 200,
        "expected header names to be case-insensitive, empty values fine"
    );
    let body = rpc_body("5", "ListTasks", &json!({}));
    let mut req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\na2a-version: 1.0\r\n\
Content-Length: {n}, {n}\r\n\r\n",
        n = body.len()
    )
    .into_bytes();
    req.extend(&body);
    let r = c.request(&req);
    assert_json_200(&r, "Content-Length: N, N (identical values)");
    // Whitespace before the colon is a smuggling vector: refused.
    let mut c = d.connect_tcp();
    let r = c.request(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost : x\r\n\r\n");
    assert_eq!(
        r.status, 400,
        "expected `Host : x` (space before colon) to answer 400"
    );
    assert_closes(&mut c, &r, "a header with whitespace before the colon");
}

fn unix_socket_path_takeover(driver: &str) {
    // A stale socket left by a dead server is replaced.
    let d = Daemon::try_launch(driver, "", |dir| {
        let l = std::os::unix::net::UnixListener::bind(dir.join("a.sock")).unwrap();
        drop(l);
    })
    .unwrap_or_else(|e| {
        let _ = std::fs::remove_dir_all(&e.dir);
        panic!("expected a stale socket file to be replaced: {}", e.message)
    });
    assert_eq!(d.connect_unix().get_card().status, 200);
    // A socket a live server holds is not taken over.
    let taken = Daemon::try_launch(driver, "", |dir| {
        std::os::unix::fs::symlink(&d.unix, dir.join("a.sock")).unwrap();
    });
    match taken {
        Ok(_) => panic!("expected agentd to refuse a unix path that a running server serves"),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&e.dir);
        }
    }
    assert_eq!(
        d.connect_unix().get_card().status,
        200,
        "expected the first daemon unharmed"
    );
    // A regular file at the path is not a socket: it must not be deleted.
    let res = Daemon::try_launch(driver, "", |dir| {
        std::fs::write(dir.join("a.sock"), b"precious").unwrap();
    });
    match res {
        Ok(d2) => {
            let kind = std::fs::symlink_metadata(&d2.unix).map(|m| m.file_type());
            let is_socket = kind.as_ref().is_ok_and(|k| k.is_socket());
            drop(d2);
            panic!(
                "expected agentd to refuse to start on a unix path holding a regular file \
                 (and leave the file alone); it deleted the file and bound its socket there \
                 (the path is now a socket: {is_socket})"
            );
        }
        Err(e) => {
            let content = std::fs::read(e.dir.join("a.sock")).ok();
            let _ = std::fs::remove_dir_all(&e.dir);
            assert_eq!(
                content.as_deref(),
                Some(&b"precious"[..]),
                "expected the regular file at the unix path left intact: {}",
                e.message
            );
        }
    }
}

/// RFC 9110 §10.1.1: a server MUST ignore `Expect: 100-continue` in an HTTP/1.0 request;
/// §15.2: no 1xx response to an HTTP/1.0 client.
fn http10_expect_continue_is_ignored(driver: &str) {
    let d = Daemon::start(driver);
    let body = rpc_body("4", "SendMessage", &text_message("h10-ec", "hi"));
    let mut c = d.connect_tcp();
    let head = format!(
        "POST / HTTP/1.0\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.send(head.as_bytes());
    std::thread::sleep(Duration::from_millis(200));
    c.send(&body);
    let r = c.read_response();
    assert_ne!(
        r.status, 100,
        "expected no `HTTP/1.1 100 Continue` to an HTTP/1.0 request (RFC 9110 §10.1.1, §15.2); \
         request head: {head:?}"
    );
    assert_json_200(&r, "an HTTP/1.0 SendMessage with Expect: 100-continue");
}

/// An HTTP/1.0 client that asked for keep-alive learns the connection persists only from
/// `connection: keep-alive` on the answer; the card says it, a blocking SendMessage must too
/// (or close the connection).
fn http10_keep_alive_send_message_says_keep_alive(driver: &str) {
    let d = Daemon::start(driver);
    let body = rpc_body("4", "SendMessage", &text_message("h10-ka", "hi"));
    let mut c = d.connect_tcp();
    let mut req = format!(
        "POST / HTTP/1.0\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Connection: keep-alive\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend(&body);
    let r = c.request(&req);
    assert_json_200(&r, "an HTTP/1.0 keep-alive SendMessage");
    assert_eq!(
        state_of(task_of(&r.json()["result"])),
        "TASK_STATE_REJECTED"
    );
    let open = c.try_expect_eof(Duration::from_millis(300)).is_err();
    assert!(
        !open || r.header("connection") == Some("keep-alive"),
        "expected the answer to an HTTP/1.0 `Connection: keep-alive` SendMessage to say \
         `connection: keep-alive` since the connection stays open (the card answer does), \
         got headers {:?}; request: {:?}",
        r.headers,
        String::from_utf8_lossy(&req)
    );
    // A non-blocking call on the same kind of connection does say it.
    let mut c = d.connect_tcp();
    let mut req = format!(
        "POST / HTTP/1.0\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
Connection: keep-alive\r\nContent-Length: {}\r\n\r\n",
        rpc_body("5", "ListTasks", &json!({})).len()
    )
    .into_bytes();
    req.extend(rpc_body("5", "ListTasks", &json!({})));
    let r = c.request(&req);
    assert_eq!(
        r.header("connection"),
        Some("keep-alive"),
        "expected ListTasks to say keep-alive"
    );
}
