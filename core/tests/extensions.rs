//! The extensions driven in memory: negotiation as an intersection over every method and
//! every subset of the registry, every command refusal of the overview's error table, ops
//! answered by the core and by a fake host, authorization, gates, task annotations.

mod support;

use agentd_core::a2a::types::{Part, TaskState};
use agentd_core::auth::{Principal, Role};
use agentd_core::ext::annotations::{Link, LinkKind};
use agentd_core::ext::command::{DeclaredCommand, RegisterError};
use agentd_core::ext::{Ext, COMMAND_URI, EVENTS_URI, TASK_ANNOTATIONS_URI};
use agentd_core::{CommandAnswer, Completion, CompletionError, Effect};
use serde_json::{json, Value};
use support::*;

const NOT_OURS: &str = "https://example.com/not-ours";

fn command_message(envelope: Value) -> Value {
    json!({"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],"parts":[{"data":{"agentd": envelope}}]})
}

fn send_command(h: &mut Harness, c: &mut Client, envelope: Value) -> Resp {
    one(&c.feed(
        h,
        &call_ext(
            "SendMessage",
            1,
            json!({"message": command_message(envelope)}),
            &[COMMAND_URI],
        ),
    ))
}

/// Asserts a refusal's code, reason, domain and first BadRequest field, and that nothing ran.
fn assert_refused(
    h: &mut Harness,
    r: &Resp,
    code: i64,
    reason: &str,
    field: Option<&str>,
) -> Value {
    assert!(
        r.header("a2a-extensions").is_none(),
        "a refused request echoes nothing"
    );
    let j = r.json();
    assert_eq!(j["error"]["code"], code, "{j}");
    let details = j["error"]["data"].as_array().expect("details");
    let info = details
        .iter()
        .find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
        .expect("ErrorInfo");
    assert_eq!(info["reason"], reason, "{j}");
    let domain = if reason == "CONTENT_TYPE_NOT_SUPPORTED" {
        "a2a-protocol.org"
    } else {
        "agentd.dev"
    };
    assert_eq!(info["domain"], domain, "{j}");
    if let Some(field) = field {
        let bad = details
            .iter()
            .find(|d| d["@type"] == "type.googleapis.com/google.rpc.BadRequest")
            .expect("BadRequest");
        assert_eq!(bad["fieldViolations"][0]["field"], field, "{j}");
    }
    assert_eq!(h.inst.task_count(), 0, "nothing refused creates a task");
    assert!(h.take_effects().is_empty(), "nothing refused runs");
    j
}

// ------------------------------------------------------------- negotiation matrix

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Success,
    Refused,
}

/// Every method against every subset of the registry plus a URI agentd does not implement,
/// with the events extension declared and not: the echo is exactly requested ∩ declared ∩
/// applicable on success, absent on refusal, and annotations appear exactly when echoed.
#[test]
fn negotiation_is_an_intersection() {
    let uris = [COMMAND_URI, EVENTS_URI, TASK_ANNOTATIONS_URI, NOT_OURS];
    let methods = [
        "SendMessage",
        "SendStreamingMessage",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "SubscribeToTask",
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
        "GetExtendedAgentCard",
        "agentd.events/SubscribeToEvents",
    ];
    let mut checked = 0;
    for events_enabled in [false, true] {
        for mask in 0u32..16 {
            let requested: Vec<&str> = (0..4)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| uris[i])
                .collect();
            let header = requested.join(", ");
            let lines: Vec<&str> = if requested.is_empty() {
                vec![]
            } else {
                vec![header.as_str()]
            };
            for method in methods {
                let mut h = Harness::with(|c| c.events_enabled = events_enabled);
                let mut c = h.conn();
                // A live task for the methods that need one.
                let task_id = {
                    let r = one(&c.feed(&mut h, &call("SendMessage", 1, json!({"message": text_message("x","m0"), "configuration":{"returnImmediately":true}}))));
                    h.take_effects();
                    r.json()["result"]["task"]["id"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                };
                let params = match method {
                    "SendMessage" | "SendStreamingMessage" => {
                        json!({"message": text_message("hi", "m1"), "configuration": {"returnImmediately": true}})
                    }
                    "GetTask" | "CancelTask" | "SubscribeToTask" => json!({"id": task_id}),
                    "agentd.events/SubscribeToEvents" => json!({"fromSeq": 0}),
                    m if m.contains("PushNotification") => {
                        json!({"taskId": task_id, "id": "c", "url": "https://x"})
                    }
                    _ => json!({}),
                };
                let out = c.feed(&mut h, &call_ext(method, 7, params, &lines));
                let r = first_head(&out);
                let ok = r.header("content-type") == Some("text/event-stream")
                    || r.json().get("result").is_some();
                let outcome = if ok {
                    Outcome::Success
                } else {
                    Outcome::Refused
                };
                let declared = |u: &str| u != NOT_OURS && (u != EVENTS_URI || events_enabled);
                let applies = |u: &str| match u {
                    COMMAND_URI => matches!(method, "SendMessage" | "SendStreamingMessage"),
                    EVENTS_URI => method == "agentd.events/SubscribeToEvents",
                    TASK_ANNOTATIONS_URI => matches!(
                        method,
                        "SendMessage"
                            | "SendStreamingMessage"
                            | "GetTask"
                            | "ListTasks"
                            | "CancelTask"
                            | "SubscribeToTask"
                            | "agentd.events/SubscribeToEvents"
                    ),
                    _ => false,
                };
                let expected: Vec<&str> = [COMMAND_URI, EVENTS_URI, TASK_ANNOTATIONS_URI]
                    .into_iter()
                    .filter(|u| requested.contains(u) && declared(u) && applies(u))
                    .collect();
                let what =
                    format!("{method} with [{header}], events {events_enabled}: {outcome:?}");
                match outcome {
                    Outcome::Success => {
                        let echo = r.header("a2a-extensions");
                        if expected.is_empty() {
                            assert_eq!(echo, None, "{what}: nothing activated means no header");
                        } else {
                            assert_eq!(echo, Some(expected.join(", ").as_str()), "{what}");
                        }
                        let body = String::from_utf8_lossy(&r.body);
                        assert_eq!(
                            body.contains(TASK_ANNOTATIONS_URI),
                            expected.contains(&TASK_ANNOTATIONS_URI),
                            "{what}: annotations exactly when activated"
                        );
                    }
                    Outcome::Refused => {
                        assert_eq!(
                            r.header("a2a-extensions"),
                            None,
                            "{what}: a refusal echoes nothing"
                        );
                        let code = r.json()["error"]["code"].as_i64().unwrap();
                        assert_ne!(code, -32008, "agentd never sends -32008");
                    }
                }
                // Which core methods succeed is fixed by the method, never by the header.
                let should_succeed = match method {
                    "GetExtendedAgentCard" => false,
                    m if m.contains("PushNotification") => false,
                    // A method is part of its extension: declared and activated, or refused.
                    "agentd.events/SubscribeToEvents" => {
                        events_enabled && requested.contains(&EVENTS_URI)
                    }
                    _ => true,
                };
                assert_eq!(
                    matches!(outcome, Outcome::Success),
                    should_succeed,
                    "{what}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 2 * 16 * 12);
}

#[test]
fn the_events_method_is_part_of_its_extension() {
    let mut h = Harness::new();
    let mut c = h.conn();
    // Not declared: NOT_DECLARED even when the header names the URI.
    let r = one(&c.feed(
        &mut h,
        &call_ext(
            "agentd.events/SubscribeToEvents",
            1,
            json!({"fromSeq":0}),
            &[EVENTS_URI],
        ),
    ));
    let j = assert_rpc_error(&r, -32601, Some("EXTENSION_NOT_DECLARED"));
    assert_eq!(j["error"]["data"][0]["metadata"]["extension"], EVENTS_URI);
    assert_eq!(
        j["error"]["data"][0]["metadata"]["method"],
        "agentd.events/SubscribeToEvents"
    );
    let mut h = Harness::with(|c| c.events_enabled = true);
    let mut c = h.conn();
    for lines in [
        vec![],
        vec![COMMAND_URI],
        vec!["https://agentd.dev/a2a/ext/events/"],
        vec!["HTTPS://AGENTD.DEV/A2A/EXT/EVENTS"],
    ] {
        let r = one(&c.feed(
            &mut h,
            &call_ext(
                "agentd.events/SubscribeToEvents",
                1,
                json!({"fromSeq":0}),
                &lines,
            ),
        ));
        assert_rpc_error(&r, -32601, Some("EXTENSION_NOT_ACTIVATED"));
    }
    // The card declares it only while enabled.
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    let uris: Vec<_> = card["capabilities"]["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["uri"].clone())
        .collect();
    assert_eq!(
        uris,
        [
            json!(COMMAND_URI),
            json!(EVENTS_URI),
            json!(TASK_ANNOTATIONS_URI)
        ]
    );
    let mut h = Harness::new();
    let mut c = h.conn();
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    let uris: Vec<_> = card["capabilities"]["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["uri"].clone())
        .collect();
    assert_eq!(uris, [json!(COMMAND_URI), json!(TASK_ANNOTATIONS_URI)]);
}

#[test]
fn header_lines_repeat_and_tokens_are_trimmed() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let line1 = format!("  {NOT_OURS} ,{COMMAND_URI}/");
    let line2 = format!("{TASK_ANNOTATIONS_URI} , ");
    let out = c.feed(
        &mut h,
        &call_ext("ListTasks", 1, json!({}), &[&line1, &line2, COMMAND_URI]),
    );
    let r = one(&out);
    assert_eq!(
        r.header("a2a-extensions"),
        Some(TASK_ANNOTATIONS_URI),
        "command does not apply to ListTasks"
    );
}

// ------------------------------------------------------------- the card

#[test]
fn the_public_card_declares_the_command_vocabulary() {
    let mut h = Harness::with(|c| {
        c.introspection_enabled = true;
        c.device_grant.enabled = true;
    });
    let mut c = h.conn();
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    let command = &card["capabilities"]["extensions"][0];
    assert_eq!(command["uri"], COMMAND_URI);
    assert!(
        command.get("required").is_none(),
        "required is false, so left out"
    );
    assert_eq!(command["params"]["dataPartKey"], "agentd");
    assert_eq!(
        command["params"]["schema"],
        "https://agentd.dev/a2a/ext/command/schema.json"
    );
    let ops: Vec<_> = command["params"]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ops.len(), 24, "{ops:?}");
    assert_eq!(&ops[..3], ["status", "config", "workflow.run"]);
    assert!(!ops
        .iter()
        .any(|o| o.starts_with("_instance.") || o == "ask_human"));
    assert_eq!(
        command["params"]["ops"][0],
        json!({"op": "status", "reply": "message"})
    );
    // The same on every instance, whatever it has switched on.
    let mut plain = Harness::new();
    let mut pc = plain.conn();
    let other = one(&pc.feed(&mut plain, CARD_GET)).json();
    assert_eq!(other["capabilities"]["extensions"][0], *command);
    assert_eq!(
        card["skills"].as_array().unwrap().len(),
        1,
        "command ops are never skills"
    );
}

// ------------------------------------------------------------- command refusals

#[test]
fn command_refusals_in_their_order() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let status = json!({"op":"status"});

    // 1. The header does not activate the command URI.
    let r = one(&c.feed(
        &mut h,
        &call_ext(
            "SendMessage",
            1,
            json!({"message": command_message(status.clone())}),
            &[TASK_ANNOTATIONS_URI],
        ),
    ));
    let j = assert_refused(
        &mut h,
        &r,
        -32602,
        "EXTENSION_NOT_ACTIVATED",
        Some("message.parts[0].data.agentd"),
    );
    assert_eq!(j["error"]["data"][0]["metadata"]["extension"], COMMAND_URI);
    // A look-alike URI does not activate it either.
    let r = one(&c.feed(
        &mut h,
        &call_ext(
            "SendMessage",
            1,
            json!({"message": command_message(status.clone())}),
            &["https://agentd.dev/a2a/ext/command/"],
        ),
    ));
    assert_refused(&mut h, &r, -32602, "EXTENSION_NOT_ACTIVATED", None);

    // 2. message.extensions does not list it.
    let mut m = command_message(status.clone());
    m["extensions"] = json!([]);
    let r = one(&c.feed(
        &mut h,
        &call_ext("SendMessage", 1, json!({"message": m}), &[COMMAND_URI]),
    ));
    assert_refused(
        &mut h,
        &r,
        -32602,
        "EXTENSION_NOT_MARKED",
        Some("message.extensions"),
    );

    // 3. Two command parts.
    let mut m = command_message(status.clone());
    m["parts"] = json!([{"data":{"agentd":{"op":"status"}}},{"text":"and"},{"data":{"agentd":{"op":"config"}}}]);
    let r = one(&c.feed(
        &mut h,
        &call_ext("SendMessage", 1, json!({"message": m}), &[COMMAND_URI]),
    ));
    assert_refused(
        &mut h,
        &r,
        -32602,
        "COMMAND_ENVELOPE_AMBIGUOUS",
        Some("message.parts"),
    );

    // 4. A taskId.
    let mut m = command_message(status.clone());
    m["taskId"] = json!("some-task");
    let r = one(&c.feed(
        &mut h,
        &call_ext("SendMessage", 1, json!({"message": m}), &[COMMAND_URI]),
    ));
    let j = assert_refused(
        &mut h,
        &r,
        -32602,
        "COMMAND_TASK_ID",
        Some("message.taskId"),
    );
    assert_eq!(j["error"]["data"][0]["metadata"]["op"], "status");

    // 5. acceptedOutputModes without JSON.
    let params = json!({"message": command_message(status.clone()), "configuration": {"acceptedOutputModes": ["text/plain"]}});
    let r = one(&c.feed(&mut h, &call_ext("SendMessage", 1, params, &[COMMAND_URI])));
    assert_refused(
        &mut h,
        &r,
        -32005,
        "CONTENT_TYPE_NOT_SUPPORTED",
        Some("configuration.acceptedOutputModes"),
    );
    let params = json!({"message": command_message(status.clone()), "configuration": {"acceptedOutputModes": ["Application/JSON; charset=utf-8"]}});
    let r = one(&c.feed(&mut h, &call_ext("SendMessage", 1, params, &[COMMAND_URI])));
    assert!(
        r.json().get("result").is_some(),
        "JSON in any case, with parameters, is accepted"
    );

    // 6-7. Unknown ops.
    for (envelope, field) in [
        (json!({}), "message.parts[0].data.agentd.op"),
        (json!({"op": ""}), "message.parts[0].data.agentd.op"),
        (json!({"op": 7}), "message.parts[0].data.agentd.op"),
        (json!({"op": "nope"}), "message.parts[0].data.agentd.op"),
        (
            json!({"op": "ask_human"}),
            "message.parts[0].data.agentd.op",
        ),
        (
            json!({"op": "_instance."}),
            "message.parts[0].data.agentd.op",
        ),
        (
            json!({"op": "_instance.nope"}),
            "message.parts[0].data.agentd.op",
        ),
        (json!({"op": "Status"}), "message.parts[0].data.agentd.op"),
    ] {
        let r = send_command(&mut h, &mut c, envelope);
        assert_refused(&mut h, &r, -32602, "UNKNOWN_OP", Some(field));
    }
    let r = send_command(&mut h, &mut c, json!({"op": "admin.lameduck"}));
    let j = assert_refused(&mut h, &r, -32602, "UNKNOWN_OP", None);
    assert!(
        j["error"]["message"]
            .as_str()
            .unwrap()
            .contains("admin.drain"),
        "removed ops carry a hint: {j}"
    );

    // 7. Arguments: an argument the op does not take is refused, never ignored.
    let r = send_command(&mut h, &mut c, json!({"op": "status", "verbose": true}));
    let j = assert_refused(
        &mut h,
        &r,
        -32602,
        "INVALID_COMMAND_ARGS",
        Some("message.parts[0].data.agentd.verbose"),
    );
    assert_eq!(j["error"]["data"][0]["metadata"]["op"], "status");
    let r = send_command(
        &mut h,
        &mut c,
        json!({"op": "workflow.run", "workflow": "", "inputs": 3, "x": 1}),
    );
    let j = assert_refused(&mut h, &r, -32602, "INVALID_COMMAND_ARGS", None);
    let bad = j["error"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["@type"] == "type.googleapis.com/google.rpc.BadRequest")
        .unwrap()
        .clone();
    let mut fields: Vec<String> = bad["fieldViolations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["field"].as_str().unwrap().to_owned())
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "message.parts[0].data.agentd.inputs",
            "message.parts[0].data.agentd.workflow",
            "message.parts[0].data.agentd.x"
        ],
        "one violation per offending field"
    );
    let r = send_command(&mut h, &mut c, json!({"op": "workflow.run"}));
    assert_refused(
        &mut h,
        &r,
        -32602,
        "INVALID_COMMAND_ARGS",
        Some("message.parts[0].data.agentd.workflow"),
    );
}

#[test]
fn a_data_part_without_the_agentd_key_is_an_ordinary_message() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let m = json!({"role":"ROLE_USER","messageId":"m","parts":[{"data":{"ticket":42}}]});
    let r = one(&c.feed(
        &mut h,
        &call(
            "SendMessage",
            1,
            json!({"message": m, "configuration":{"returnImmediately":true}}),
        ),
    ));
    assert!(r.json()["result"]["task"].is_object());
    assert!(matches!(h.take_effects().as_slice(), [Effect::Turn { .. }]));
}

// ------------------------------------------------------------- ops

#[test]
fn status_and_config_are_answered_by_the_core() {
    let mut h = Harness::with(|c| {
        c.name = "reviewer".into();
        c.config_document =
            json!({"agent": {"name": "reviewer"}, "a2a": {"bearer": "{{secret:A2A_BEARER}}"}});
    });
    let mut c = h.conn();
    // The overview's curl example: the echo names the command URI, the unknown URI is dropped.
    let header = format!("{COMMAND_URI}, {NOT_OURS}");
    let out = c.feed(
        &mut h,
        &call_ext(
            "SendMessage",
            1,
            json!({"message": command_message(json!({"op":"status"}))}),
            &[&header],
        ),
    );
    let text = String::from_utf8_lossy(&out).to_string();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\na2a-extensions: https://agentd.dev/a2a/ext/command\r\n"), "{text}");
    let r = one(&out);
    let message = &r.json()["result"]["message"];
    assert_eq!(message["role"], "ROLE_AGENT");
    assert_eq!(message["extensions"], json!([COMMAND_URI]));
    assert!(message["messageId"].as_str().unwrap().starts_with("msg-"));
    assert!(!message["contextId"].as_str().unwrap().is_empty());
    let doc = &message["parts"][0]["data"];
    assert_eq!(message["parts"][0]["mediaType"], "application/json");
    assert_eq!(doc["instance"], "reviewer");
    assert_eq!(doc["draining"], false);
    assert_eq!(doc["paused"], false);
    assert!(doc["uptime_ms"].is_u64());
    assert_eq!(h.inst.task_count(), 0, "a read creates no task");

    let r = send_command(&mut h, &mut c, json!({"op": "config"}));
    assert_eq!(
        r.json()["result"]["message"]["parts"][0]["data"]["config"]["a2a"]["bearer"],
        "{{secret:A2A_BEARER}}"
    );

    // Streaming: exactly one frame, the message, then the stream ends.
    let out = c.feed(
        &mut h,
        &call_ext(
            "SendStreamingMessage",
            2,
            json!({"message": command_message(json!({"op":"status"}))}),
            &[COMMAND_URI],
        ),
    );
    let r = one(&out);
    assert_eq!(r.header("a2a-extensions"), Some(COMMAND_URI));
    let events = r.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["result"]["message"]["role"], "ROLE_AGENT");
    assert_eq!(h.inst.subscription_count(), 0);
}

fn command_effect(h: &mut Harness) -> (u64, String, Option<String>, Value) {
    match h.take_effects().as_slice() {
        [Effect::Command {
            call,
            op,
            task_id,
            args,
            ..
        }] => (
            *call,
            op.name().to_owned(),
            task_id.clone(),
            Value::Object(args.clone()),
        ),
        other => panic!("expected one command effect, got {other:?}"),
    }
}

#[test]
fn task_ops_go_to_the_host_and_become_tasks() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let header = format!("{COMMAND_URI}, {TASK_ANNOTATIONS_URI}");
    let out = c.feed(
        &mut h,
        &call_ext("SendMessage", 1, json!({"message": command_message(json!({"op":"workflow.run","workflow":"triage","inputs":{"ticket":42}}))}), &[&header]),
    );
    assert!(out.is_empty(), "waits for the host");
    let (call, op, task_id, args) = command_effect(&mut h);
    assert_eq!(op, "workflow.run");
    assert_eq!(args, json!({"workflow":"triage","inputs":{"ticket":42}}));
    let task_id = task_id.expect("a task op gets its task id up front");
    assert_eq!(h.inst.task_count(), 0, "no task until the host starts it");
    h.inst
        .handle_completion(
            Completion::CommandStarted {
                call,
                link: Link {
                    kind: LinkKind::Run,
                    id: "triage-1".into(),
                },
            },
            h.now,
        )
        .unwrap();
    assert!(
        c.poll(&mut h).is_empty(),
        "a blocking command waits for its task to settle"
    );
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: task_id.clone(),
                state: TaskState::Completed,
                message: Some(vec![Part::text("done")]),
            },
            h.now,
        )
        .unwrap();
    let r = one(&c.poll(&mut h));
    assert_eq!(r.header("a2a-extensions"), Some(header.as_str()));
    let task = &r.json()["result"]["task"];
    assert_eq!(task["id"], task_id.as_str());
    let a = &task["metadata"][TASK_ANNOTATIONS_URI];
    assert_eq!(a["command"], "workflow.run");
    assert_eq!(a["link"], json!({"kind":"run","id":"triage-1"}));
    assert_eq!(a["principal"], "operator");
    let states: Vec<_> = a["statusHistory"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].clone())
        .collect();
    assert_eq!(
        states,
        [json!("TASK_STATE_SUBMITTED"), json!("TASK_STATE_COMPLETED")]
    );
    // The answer to a call is taken once.
    assert_eq!(
        h.inst.handle_completion(
            Completion::CommandStarted {
                call,
                link: Link {
                    kind: LinkKind::Run,
                    id: "x".into()
                }
            },
            h.now
        ),
        Err(CompletionError::UnknownCall)
    );

    // Streaming: the task frame, then its updates.
    let out = c.feed(
        &mut h,
        &call_ext(
            "SendStreamingMessage",
            2,
            json!({"message": command_message(json!({"op":"admin.drain"}))}),
            &[COMMAND_URI],
        ),
    );
    assert!(out.is_empty());
    let (call, _, task_id, _) = command_effect(&mut h);
    h.inst
        .handle_completion(
            Completion::CommandStarted {
                call,
                link: Link {
                    kind: LinkKind::Run,
                    id: "drain".into(),
                },
            },
            h.now,
        )
        .unwrap();
    // The host may finish before the connection looks: nothing is missed.
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: task_id.unwrap(),
                state: TaskState::Completed,
                message: None,
            },
            h.now,
        )
        .unwrap();
    let events = one(&c.poll(&mut h)).events();
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_SUBMITTED"
    );
    assert!(
        events[0]["result"]["task"].get("metadata").is_none(),
        "no annotations unless activated"
    );
    assert_eq!(
        events[1]["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    assert_eq!(h.inst.subscription_count(), 0);
    assert_eq!(h.inst.pending_calls(), 0);
}

#[test]
fn message_ops_and_refusals_from_the_host() {
    let mut h = Harness::new();
    let mut c = h.conn();
    assert!(send_command_raw(&mut h, &mut c, json!({"op":"workflow.status"})).is_empty());
    let (call, op, task_id, _) = command_effect(&mut h);
    assert_eq!((op.as_str(), task_id), ("workflow.status", None));
    assert_eq!(
        h.inst.handle_completion(
            Completion::CommandStarted {
                call,
                link: Link {
                    kind: LinkKind::Run,
                    id: "x".into()
                }
            },
            h.now
        ),
        Err(CompletionError::WrongReplyKind),
        "a message op has no task to start"
    );
    h.inst
        .handle_completion(
            Completion::CommandResult {
                call,
                answer: CommandAnswer::Document(json!({"runs": []})),
            },
            h.now,
        )
        .unwrap();
    let r = one(&c.poll(&mut h));
    assert_eq!(
        r.json()["result"]["message"]["parts"][0]["data"],
        json!({"runs": []})
    );
    assert_eq!(h.inst.task_count(), 0);

    assert!(send_command_raw(&mut h, &mut c, json!({"op":"admin.pause"})).is_empty());
    let (call, ..) = command_effect(&mut h);
    let refusal =
        agentd_core::errors::RpcError::new(agentd_core::errors::ErrorKind::OpNotServed, "not yet")
            .with_meta("op", "admin.pause");
    h.inst
        .handle_completion(
            Completion::CommandResult {
                call,
                answer: CommandAnswer::Refused(refusal),
            },
            h.now,
        )
        .unwrap();
    let r = one(&c.poll(&mut h));
    assert_rpc_error(&r, -32004, Some("OP_NOT_SERVED"));
    assert!(r.header("a2a-extensions").is_none());
    assert_eq!(h.inst.task_count(), 0, "a refused task op creates no task");

    // A host that never answers: the request times out; a client that leaves frees the call.
    assert!(send_command_raw(&mut h, &mut c, json!({"op":"admin.resume"})).is_empty());
    h.take_effects();
    h.advance(h.config.conn.request_timeout_ms);
    assert_rpc_error(&one(&c.timeout(&mut h)), -32603, None);
    assert_eq!(h.inst.pending_calls(), 0);
    let mut gone = h.conn();
    send_command_raw(&mut h, &mut gone, json!({"op":"admin.resume"}));
    assert_eq!(h.inst.pending_calls(), 1);
    gone.conn.close(&mut h.inst);
    assert_eq!(h.inst.pending_calls(), 0);
}

fn send_command_raw(h: &mut Harness, c: &mut Client, envelope: Value) -> Vec<u8> {
    c.feed(
        h,
        &call_ext(
            "SendMessage",
            1,
            json!({"message": command_message(envelope)}),
            &[COMMAND_URI],
        ),
    )
}

// ------------------------------------------------------------- who may, and when

#[test]
fn the_role_floor_and_grants() {
    let mut h = Harness::with(|c| c.introspection_enabled = true);
    let user = Principal::new("user:alice", Role::User, vec![]);
    let agent = Principal::new("peer-a", Role::Agent, vec!["subagent.kill".into()]);
    let everything = Principal::new("user:root", Role::User, vec!["*".into()]);
    let cases: &[(&Principal, &str, bool)] = &[
        (&user, "status", true),
        (&user, "workflow.run", true),
        (&user, "workflow.signal", false),
        (&user, "config", false),
        (&user, "admin.drain", false),
        (&agent, "workflow.status", true),
        (&agent, "subagent.send", false),
        (&agent, "subagent.kill", true),
        (&everything, "workflow.signal", true),
        (&everything, "config", false),
        (&everything, "admin.drain", false),
        (&everything, "debug.events", false),
        (&everything, "_instance.result", false),
    ];
    for (p, op, allowed) in cases {
        let mut c = h.conn_as(0, (*p).clone());
        let envelope = match *op {
            "workflow.run" => json!({"op": op, "workflow": "w"}),
            "workflow.signal" => json!({"op": op, "name": "go"}),
            "subagent.send" => json!({"op": op, "handle": "h", "message": "m"}),
            "subagent.kill" => json!({"op": op, "handle": "h"}),
            "_instance.result" => json!({"op": op, "handle": "h"}),
            _ => json!({"op": op}),
        };
        let out = send_command_raw(&mut h, &mut c, envelope);
        if *allowed {
            let effects = h.take_effects();
            if *op == "status" {
                assert!(
                    one(&out).json()["result"]["message"].is_object(),
                    "{} may run {op}",
                    p.id
                );
            } else {
                assert!(
                    out.is_empty(),
                    "{} may run {op}: {}",
                    p.id,
                    String::from_utf8_lossy(&out)
                );
                assert!(
                    matches!(effects.as_slice(), [Effect::Command { .. }]),
                    "{} may run {op}",
                    p.id
                );
            }
        } else {
            let r = one(&out);
            assert_eq!(r.status, 403, "{} may not run {op}", p.id);
            let j = r.json();
            assert_eq!(j["error"]["code"], -31403);
            assert_eq!(j["error"]["data"][0]["reason"], "PERMISSION_DENIED");
            assert_eq!(j["id"], 1, "the id is echoed");
            assert!(h.take_effects().is_empty());
        }
    }
}

#[test]
fn gates_close_ops() {
    let mut h = Harness::new();
    let mut c = h.conn();
    for op in [
        "conversation.get",
        "run.get",
        "subagent.get",
        "debug.events",
    ] {
        let envelope = match op {
            "conversation.get" => json!({"op": op, "id": "c"}),
            "run.get" => json!({"op": op, "run": "r"}),
            "subagent.get" => json!({"op": op, "handle": "h"}),
            _ => json!({"op": op}),
        };
        let r = send_command(&mut h, &mut c, envelope);
        assert_refused(&mut h, &r, -32004, "INTROSPECTION_DISABLED", None);
    }
    let r = send_command(&mut h, &mut c, json!({"op": "auth.device.pending"}));
    assert_refused(&mut h, &r, -32602, "UNKNOWN_OP", None);
    // Session ops: TCP listeners only.
    let mut u = h.conn_on(1);
    let r = send_command(&mut h, &mut u, json!({"op": "auth.sessions"}));
    assert_refused(&mut h, &r, -32602, "UNKNOWN_OP", None);
    // Served on TCP, by the core itself (it holds the sessions).
    let r = send_command(&mut h, &mut c, json!({"op": "auth.sessions"}));
    assert_eq!(
        r.json()["result"]["message"]["parts"][0]["data"],
        json!({"sessions": []})
    );
}

#[test]
fn workflow_declared_commands() {
    let mut h = Harness::new();
    let decl = |op: &str| DeclaredCommand {
        op: op.into(),
        workflow: "review".into(),
        schema: json!({"type":"object","required":["change"],"properties":{"change":{"type":"string"}},"additionalProperties":false}),
        roles: vec![Role::Agent],
    };
    for reserved in [
        "status",
        "admin.drain",
        "_instance.anything",
        "ask_human",
        "config.set",
    ] {
        assert!(
            matches!(
                h.inst.register_command(decl(reserved)),
                Err(RegisterError::Reserved(_))
            ),
            "{reserved}"
        );
    }
    h.inst.register_command(decl("review.change")).unwrap();
    assert!(matches!(
        h.inst.register_command(decl("review.change")),
        Err(RegisterError::Duplicate(_))
    ));

    let granted = Principal::new("peer-a", Role::Agent, vec!["review.change".into()]);
    let ungranted = Principal::new("peer-b", Role::Agent, vec![]);
    let wrong_role = Principal::new("user:x", Role::User, vec!["review.change".into()]);
    let mut c = h.conn_as(0, granted);
    let r = send_command(&mut h, &mut c, json!({"op": "review.change"}));
    assert_refused(
        &mut h,
        &r,
        -32602,
        "INVALID_COMMAND_ARGS",
        Some("message.parts[0].data.agentd.change"),
    );
    assert!(send_command_raw(
        &mut h,
        &mut c,
        json!({"op": "review.change", "change": "c-1"})
    )
    .is_empty());
    match h.take_effects().as_slice() {
        [Effect::Command {
            op: agentd_core::Op::Declared { op, workflow, .. },
            reply,
            ..
        }] => {
            assert_eq!(op, "review.change");
            assert_eq!(workflow, "review");
            assert_eq!(*reply, agentd_core::ext::command::table::ReplyKind::Task);
        }
        other => panic!("{other:?}"),
    }
    for p in [ungranted, wrong_role] {
        let mut c = h.conn_as(0, p);
        let r = send_command(
            &mut h,
            &mut c,
            json!({"op": "review.change", "change": "c-1"}),
        );
        assert_eq!(r.status, 403);
    }
    // An operator always may.
    let mut c = h.conn();
    assert!(send_command_raw(
        &mut h,
        &mut c,
        json!({"op": "review.change", "change": "c-2"})
    )
    .is_empty());
}

#[test]
fn annotations_follow_the_task_and_only_when_activated() {
    let mut h = Harness::new();
    let mut c = h.conn();
    let r = one(&c.feed(
        &mut h,
        &call_ext(
            "SendMessage",
            1,
            json!({"message": text_message("hi","m"), "configuration":{"returnImmediately":true}}),
            &[TASK_ANNOTATIONS_URI],
        ),
    ));
    let id = r.json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let turn = match h.take_effects().as_slice() {
        [Effect::Turn { task_id, .. }] => task_id.clone(),
        other => panic!("{other:?}"),
    };
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: turn.clone(),
                state: TaskState::Working,
                message: None,
            },
            h.now,
        )
        .unwrap();
    h.inst
        .handle_completion(
            Completion::Ask {
                task_id: turn.clone(),
                schema: Some(json!({"type":"boolean"})),
                channel: Some("@channel/deploys".into()),
                operator_only: false,
            },
            h.now,
        )
        .unwrap();
    h.inst
        .handle_completion(
            Completion::Status {
                task_id: turn,
                state: TaskState::InputRequired,
                message: Some(vec![Part::text("ok?")]),
            },
            h.now,
        )
        .unwrap();
    for (method, params, pointer) in [
        ("GetTask", json!({"id": id}), "/result/metadata"),
        ("ListTasks", json!({}), "/result/tasks/0/metadata"),
    ] {
        let r = one(&c.feed(
            &mut h,
            &call_ext(method, 2, params.clone(), &[TASK_ANNOTATIONS_URI]),
        ));
        let a = r.json().pointer(pointer).unwrap()[TASK_ANNOTATIONS_URI].clone();
        assert_eq!(a["link"], json!({"kind":"turn","id": id}));
        assert_eq!(a["askSchema"], json!({"type":"boolean"}));
        assert_eq!(a["askChannel"], "@channel/deploys");
        let states: Vec<_> = a["statusHistory"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["state"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            states,
            [
                "TASK_STATE_SUBMITTED",
                "TASK_STATE_WORKING",
                "TASK_STATE_INPUT_REQUIRED"
            ]
        );
        assert!(
            a.get("command").is_none(),
            "a turn was not started by a command"
        );
        let plain = one(&c.feed(&mut h, &call(method, 3, params)));
        assert!(
            !String::from_utf8_lossy(&plain.body).contains("metadata"),
            "{method} without activation"
        );
    }
    // Cancel and subscribe carry them too.
    let sub = one(&c.feed(
        &mut h,
        &call_ext("CancelTask", 4, json!({"id": id}), &[TASK_ANNOTATIONS_URI]),
    ))
    .json();
    assert!(sub["result"]["metadata"][TASK_ANNOTATIONS_URI].is_object());
    assert_eq!(
        Ext::from_uri(TASK_ANNOTATIONS_URI),
        Some(Ext::TaskAnnotations)
    );
}
