//! The request log's records, in memory on the fake clock: one record per answer (a stream's
//! start and end), with its route, JSON-RPC method, status, error, duration, principal and
//! task; limiter refusals flagged; nothing kept unless asked, and the queue bounded.

mod support;

use std::net::IpAddr;

use agentd_core::a2a::types::{Part, TaskState};
use agentd_core::auth::{AuthConfig, BearerRule, Peer, Principal, Role};
use agentd_core::limits::{Rate, Source};
use agentd_core::reqlog::{Keep, Limiter, Phase, RequestRecord, MAX_RECORDS};
use agentd_core::Completion;
use serde_json::json;
use support::*;

fn records(c: &mut Client) -> Vec<RequestRecord> {
    std::iter::from_fn(|| c.conn.poll_request_record()).collect()
}

fn only(c: &mut Client) -> RequestRecord {
    let mut all = records(c);
    assert_eq!(all.len(), 1, "expected one record: {all:#?}");
    all.pop().unwrap()
}

fn keeping(h: &Harness, keep: Keep) -> Client {
    let mut c = h.conn();
    c.conn.keep_records(keep);
    c
}

fn complete(h: &mut Harness, task_id: &str, state: TaskState) {
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: task_id.into(),
                state,
                message: Some(vec![Part::text("done")]),
            },
            h.now,
        )
        .expect("completion accepted");
}

fn with_token(mut req: Vec<u8>, token: &str) -> Vec<u8> {
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(
        at..at,
        format!("Authorization: Bearer {token}\r\n").into_bytes(),
    );
    req
}

fn secured() -> Harness {
    Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            bearers: vec![BearerRule {
                digest: AuthConfig::digest("alice-token"),
                principal: Principal::new("user:alice", Role::User, vec![])
                    .with_rate(Some(Rate::parse("2/60s").unwrap())),
            }],
            any: None,
            cert_rules: Vec::new(),
        };
    })
}

#[test]
fn the_card_get_is_recorded_with_its_route() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    assert_eq!(one(&c.feed(&mut h, CARD_GET)).status, 200);
    let r = only(&mut c);
    assert_eq!(r.phase, Phase::Answered);
    assert_eq!(r.route, "GET /.well-known/agent-card.json");
    assert!(r.method.is_empty(), "not a JSON-RPC call");
    assert_eq!(r.status, 200);
    assert_eq!(r.error, None);
    assert_eq!(r.duration_ms, 0);
    assert!(
        r.principal.is_empty(),
        "the card is public: nobody is resolved"
    );
    assert!(r.task_id.is_empty());
    assert_eq!(r.refusal, None);
    assert!(records(&mut c).is_empty(), "taken once");
}

#[test]
fn an_unknown_path_is_recorded_404() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    let out = c.feed(&mut h, b"GET /nope?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(one(&out).status, 404);
    let r = only(&mut c);
    assert_eq!(r.route, "GET /nope");
    assert_eq!(r.status, 404);
    assert!(r.method.is_empty() && r.principal.is_empty());
}

#[test]
fn get_task_of_an_unknown_task_records_its_method_code_and_task() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    let out = c.feed(&mut h, &call("GetTask", 1, json!({"id": "no-such-task"})));
    assert_rpc_error(&one(&out), -32001, Some("TASK_NOT_FOUND"));
    let r = only(&mut c);
    assert_eq!(r.route, "POST /");
    assert_eq!(r.method, "GetTask");
    assert_eq!(r.status, 200);
    assert_eq!(r.error_code(), Some(-32001));
    assert_eq!(r.error_reason(), Some("TASK_NOT_FOUND"));
    assert_eq!(r.task_id, "no-such-task");
    assert_eq!(r.principal, "operator", "a loopback caller is the operator");
}

#[test]
fn duration_runs_from_the_head_to_the_answer() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    let req = call("ListTasks", 1, json!({}));
    let split = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(c.feed(&mut h, &req[..split]).is_empty());
    h.advance(250);
    assert_eq!(one(&c.feed(&mut h, &req[split..])).status, 200);
    let r = only(&mut c);
    assert_eq!(r.method, "ListTasks");
    assert_eq!(r.duration_ms, 250);
}

#[test]
fn a_send_that_creates_a_task_names_it_and_its_principal() {
    let mut h = secured();
    let mut c = keeping(&h, Keep::All);
    // At once: the task is read from the answer.
    let out = c.feed(
        &mut h,
        &with_token(
            call(
                "SendMessage",
                1,
                json!({"message": text_message("hi", "m-1"), "configuration": {"returnImmediately": true}}),
            ),
            "alice-token",
        ),
    );
    let task = one(&out).json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(h.turn(), task);
    let r = only(&mut c);
    assert_eq!(r.method, "SendMessage");
    assert_eq!(r.task_id, task.as_str());
    assert_eq!(r.principal, "user:alice");
    assert_eq!(r.status, 200);

    // Blocking: recorded once the task settles, with the time it took.
    let out = c.feed(
        &mut h,
        &with_token(
            call(
                "SendMessage",
                2,
                json!({"message": text_message("hi", "m-2")}),
            ),
            "op-token",
        ),
    );
    assert!(out.is_empty());
    assert!(records(&mut c).is_empty(), "nothing is answered yet");
    let task = h.turn();
    h.advance(1_500);
    complete(&mut h, &task, TaskState::Completed);
    assert_eq!(one(&c.poll(&mut h)).status, 200);
    let r = only(&mut c);
    assert_eq!(r.method, "SendMessage");
    assert_eq!(r.task_id, task.as_str());
    assert_eq!(r.principal, "operator");
    assert_eq!(r.duration_ms, 1_500);
    assert_eq!(r.phase, Phase::Answered);
}

#[test]
fn a_stream_is_recorded_when_it_starts_and_when_it_ends() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    c.feed(
        &mut h,
        &call(
            "SendStreamingMessage",
            5,
            json!({"message": text_message("hi", "m-1")}),
        ),
    );
    let task = h.turn();
    let start = only(&mut c);
    assert_eq!(start.phase, Phase::StreamStarted);
    assert_eq!(start.method, "SendStreamingMessage");
    assert_eq!(start.task_id, task.as_str());
    assert_eq!((start.status, start.duration_ms), (200, 0));
    h.advance(40);
    complete(&mut h, &task, TaskState::Completed);
    c.poll(&mut h);
    let end = only(&mut c);
    assert_eq!(end.phase, Phase::StreamEnded);
    assert_eq!(end.task_id, task.as_str());
    assert_eq!(end.duration_ms, 40);
}

#[test]
fn a_request_dropped_unanswered_is_recorded_abandoned() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("hi", "m-1")}),
        ),
    );
    let task = h.turn();
    h.advance(30);
    c.conn.consume_output(0, h.now);
    c.conn.close(&mut h.inst);
    let r = only(&mut c);
    assert_eq!(r.phase, Phase::Abandoned);
    assert_eq!(r.status, 0, "nothing was answered");
    assert_eq!(r.task_id, task.as_str());
    assert_eq!(r.duration_ms, 30);
}

#[test]
fn a_principal_rate_refusal_is_flagged() {
    let mut h = secured();
    let mut c = keeping(&h, Keep::All);
    let list = || with_token(call("ListTasks", 1, json!({})), "alice-token");
    for _ in 0..2 {
        assert_eq!(one(&c.feed(&mut h, &list())).status, 200);
    }
    assert_eq!(one(&c.feed(&mut h, &list())).status, 429);
    let all = records(&mut c);
    assert_eq!(all.len(), 3);
    assert!(all[..2].iter().all(|r| r.refusal.is_none()));
    let r = &all[2];
    assert_eq!(r.status, 429);
    assert_eq!(r.error_reason(), Some("RATE_LIMITED"));
    assert_eq!(r.principal, "user:alice");
    assert_eq!(r.method, "ListTasks");
    let refusal = r.refusal.expect("a limiter refused it");
    assert_eq!(refusal.limiter, Limiter::PrincipalRate);
    assert_eq!(refusal.retry_after_s, 30);
}

#[test]
fn only_refusals_are_kept_at_refusals_and_the_failure_limiter_names_its_source() {
    let mut h = secured();
    let mut c = h.conn_peer(0, Peer::Tcp);
    c.conn.set_source("192.0.2.7".parse::<IpAddr>().unwrap());
    c.conn.keep_records(Keep::Refusals);
    let wrong = || with_token(call("ListTasks", 1, json!({})), "wrong");
    for _ in 0..20 {
        assert_eq!(one(&c.feed(&mut h, &wrong())).status, 401);
    }
    assert!(
        records(&mut c).is_empty(),
        "failed credentials are not refusals of a limiter"
    );
    h.advance(10);
    assert_eq!(one(&c.feed(&mut h, &wrong())).status, 429);
    let r = only(&mut c);
    assert_eq!(r.route, "POST /");
    assert_eq!(r.status, 429);
    assert!(r.method.is_empty(), "refused unread");
    assert!(r.principal.is_empty(), "refused before it was resolved");
    let refusal = r.refusal.expect("a limiter refused it");
    assert_eq!(refusal.limiter, Limiter::SourceFailures);
    assert_eq!(refusal.retry_after_s, 3);
    assert_eq!(refusal.source, Some(Source::V4([192, 0, 2, 7])));
    assert_eq!(refusal.source.unwrap().to_string(), "192.0.2.7");

    // A principal's rate is a refusal too, and names who.
    let mut c = keeping(&h, Keep::Refusals);
    let list = || with_token(call("ListTasks", 1, json!({})), "alice-token");
    for _ in 0..2 {
        assert_eq!(one(&c.feed(&mut h, &list())).status, 200);
    }
    assert_eq!(one(&c.feed(&mut h, &list())).status, 429);
    let r = only(&mut c);
    assert_eq!(r.refusal.unwrap().limiter, Limiter::PrincipalRate);
    assert_eq!(r.principal, "user:alice");
    assert_eq!(r.method, "ListTasks");
}

#[test]
fn nothing_is_kept_by_default() {
    let mut h = secured();
    let mut c = h.conn();
    let list = || with_token(call("ListTasks", 1, json!({})), "alice-token");
    for _ in 0..3 {
        c.feed(&mut h, &list());
    }
    c.feed(&mut h, CARD_GET);
    assert!(records(&mut c).is_empty());
    assert!(c.conn.take_dropped_records().is_empty());
}

#[test]
fn the_queue_is_bounded_and_counts_what_it_dropped() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    let burst: Vec<u8> = CARD_GET.repeat(MAX_RECORDS + 4);
    let out = c.feed(&mut h, &burst);
    assert_eq!(
        parse_all(&out).len(),
        MAX_RECORDS + 4,
        "every request is answered"
    );
    assert_eq!(records(&mut c).len(), MAX_RECORDS);
    let dropped = c.conn.take_dropped_records();
    assert_eq!((dropped.records, dropped.refusals), (4, 0));
    assert!(c.conn.take_dropped_records().is_empty(), "taken once");
    // Taken records make room again.
    c.feed(&mut h, CARD_GET);
    assert_eq!(records(&mut c).len(), 1);
}

#[test]
fn a_framing_error_is_recorded_without_a_route() {
    let mut h = Harness::new();
    let mut c = keeping(&h, Keep::All);
    let out = c.feed(
        &mut h,
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
    );
    assert_eq!(one(&out).status, 400);
    let r = only(&mut c);
    assert!(r.route.is_empty());
    assert_eq!(r.status, 400);
}
