//! What a host declares it serves (`InstanceConfig::host`), in memory: the card lists only
//! the ops that are served and the skills the host gives, an op the host does not serve is
//! refused at once (never handed out to wait for an answer), and a served op reaches the
//! host typed, its arguments as fields.

mod support;

use agentd_core::a2a::card::AgentSkill;
use agentd_core::auth::{AuthConfig, Peer};
use agentd_core::ext::command::table::OpId;
use agentd_core::ext::COMMAND_URI;
use agentd_core::host::{OpSet, SettablePath};
use agentd_core::{Effect, HostCapabilities, Op};
use serde_json::{json, Value};
use support::*;

fn skill(id: &str) -> AgentSkill {
    AgentSkill {
        description: format!("The {id} skill"),
        examples: vec![format!("try {id}")],
        input_modes: Vec::new(),
        output_modes: Vec::new(),
        id: id.into(),
        name: id.to_uppercase(),
        tags: vec!["host".into()],
    }
}

/// A host that serves two ops (a read and an introspection read) and declares two skills.
fn partial() -> Harness {
    Harness::with(|c| {
        c.introspection_enabled = true;
        c.host = HostCapabilities::new(
            [OpId::WorkflowStatus, OpId::RunGet],
            vec![skill("triage"), skill("summarize")],
        );
    })
}

fn command(envelope: Value) -> Vec<u8> {
    let message = json!({"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],
                         "parts":[{"data":{"agentd": envelope}}]});
    call_ext(
        "SendMessage",
        1,
        json!({ "message": message }),
        &[COMMAND_URI],
    )
}

fn card_ops(params: &Value) -> Vec<String> {
    params["ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| o["op"].as_str().unwrap().to_owned())
        .collect()
}

/// The refusal's code, reason, field and `op` metadata, and that it ran nothing.
fn assert_refused_at_once(
    h: &mut Harness,
    r: &Resp,
    code: i64,
    reason: &str,
    field: Option<&str>,
    op: &str,
) {
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(j["id"], 1, "{j}");
    assert_eq!(j["error"]["code"], code, "{j}");
    let details = j["error"]["data"].as_array().expect("details");
    let info = details
        .iter()
        .find(|d| d["@type"] == "type.googleapis.com/google.rpc.ErrorInfo")
        .expect("ErrorInfo");
    assert_eq!(info["reason"], reason, "{j}");
    assert_eq!(info["domain"], "agentd.dev", "{j}");
    assert_eq!(info["metadata"]["op"], op, "{j}");
    let bad = details
        .iter()
        .find(|d| d["@type"] == "type.googleapis.com/google.rpc.BadRequest");
    match field {
        Some(field) => assert_eq!(
            bad.expect("BadRequest")["fieldViolations"][0]["field"],
            field
        ),
        None => assert!(bad.is_none(), "{j}"),
    }
    assert!(
        h.take_effects().is_empty(),
        "nothing was handed to the host"
    );
    assert_eq!(h.inst.pending_calls(), 0, "no call waits for the host");
    assert_eq!(h.inst.task_count(), 0, "no task");
}

#[test]
fn the_public_card_lists_only_served_ops_and_the_hosts_skills() {
    let mut h = partial();
    let mut c = h.conn();
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    let command = &card["capabilities"]["extensions"][0];
    assert_eq!(command["uri"], COMMAND_URI);
    // The ops the core answers itself, and the two the host declares, in table order.
    assert_eq!(
        card_ops(&command["params"]),
        [
            "status",
            "config",
            "workflow.status",
            "run.get",
            "auth.device.pending",
            "auth.device.approve",
            "auth.device.deny",
            "auth.sessions",
            "auth.sessions.revoke"
        ]
    );
    assert_eq!(
        command["params"]["ops"][2],
        json!({"op": "workflow.status", "reply": "message"})
    );
    // The skills are the host's, as given, and nothing else.
    assert_eq!(
        card["skills"],
        json!([
            {"description": "The triage skill", "examples": ["try triage"], "id": "triage",
             "name": "TRIAGE", "tags": ["host"]},
            {"description": "The summarize skill", "examples": ["try summarize"],
             "id": "summarize", "name": "SUMMARIZE", "tags": ["host"]},
        ])
    );
}

#[test]
fn a_host_that_declares_nothing_has_only_the_cores_ops_and_no_skills() {
    let mut h = Harness::with(|c| c.host = HostCapabilities::default());
    let mut c = h.conn();
    let card = one(&c.feed(&mut h, CARD_GET)).json();
    assert_eq!(
        card_ops(&card["capabilities"]["extensions"][0]["params"]),
        [
            "status",
            "config",
            "auth.device.pending",
            "auth.device.approve",
            "auth.device.deny",
            "auth.sessions",
            "auth.sessions.revoke"
        ]
    );
    assert_eq!(card["skills"], json!([]));
    // And InstanceConfig::new declares nothing: a host says what it serves.
    let config = agentd_core::InstanceConfig::new(Vec::new());
    assert_eq!(config.host, HostCapabilities::default());
    assert!(config.host.ops.is_empty() && config.host.skills.is_empty());
    // Every op it leaves out is refused on the spot, not after request_timeout_ms.
    let r = one(&c.feed(&mut h, &command(json!({"op": "workflow.status"}))));
    assert_refused_at_once(
        &mut h,
        &r,
        -32602,
        "UNKNOWN_OP",
        Some("message.parts[0].data.agentd.op"),
        "workflow.status",
    );
    // The core's own ops still answer.
    let r = one(&c.feed(&mut h, &command(json!({"op": "status"}))));
    assert!(r.json()["result"]["message"].is_object(), "{}", r.json());
}

#[test]
fn an_op_the_host_does_not_serve_is_refused_at_once() {
    let mut h = partial();
    let mut c = h.conn();
    // A listed op: UNKNOWN_OP, as the command extension answers an op no one serves here.
    let r = one(&c.feed(
        &mut h,
        &command(json!({"op": "workflow.run", "workflow": "triage"})),
    ));
    assert_refused_at_once(
        &mut h,
        &r,
        -32602,
        "UNKNOWN_OP",
        Some("message.parts[0].data.agentd.op"),
        "workflow.run",
    );
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("unknown command \"workflow.run\"") && message.contains("not serve"),
        "{message}"
    );
    // A task op and an introspection op the host leaves out: the same.
    for envelope in [
        json!({"op": "admin.drain"}),
        json!({"op": "subagent.get", "handle": "h"}),
    ] {
        let op = envelope["op"].as_str().unwrap().to_owned();
        let r = one(&c.feed(&mut h, &command(envelope)));
        assert_refused_at_once(
            &mut h,
            &r,
            -32602,
            "UNKNOWN_OP",
            Some("message.parts[0].data.agentd.op"),
            &op,
        );
    }
    // Streaming: the same refusal, as a JSON-RPC error, at once.
    let message = json!({"role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],
                         "parts":[{"data":{"agentd": {"op": "workflow.cancel", "run": "r"}}}]});
    let r = one(&c.feed(
        &mut h,
        &call_ext(
            "SendStreamingMessage",
            1,
            json!({ "message": message }),
            &[COMMAND_URI],
        ),
    ));
    let j = if r.events().is_empty() {
        r.json()
    } else {
        r.events()[0].clone()
    };
    assert_eq!(j["error"]["code"], -32602, "{j}");
    assert_eq!(j["error"]["data"][0]["reason"], "UNKNOWN_OP", "{j}");
    assert!(h.take_effects().is_empty());
    assert_eq!(h.inst.pending_calls(), 0);
    // A reserved report the host does not serve: OP_NOT_SERVED (-32004), as documented.
    let r = one(&c.feed(
        &mut h,
        &command(json!({"op": "_instance.result", "handle": "h"})),
    ));
    assert_refused_at_once(
        &mut h,
        &r,
        -32004,
        "OP_NOT_SERVED",
        None,
        "_instance.result",
    );
    // Arguments are still checked first, and the caller's role before whether it is served.
    let r = one(&c.feed(&mut h, &command(json!({"op": "workflow.run"}))));
    assert_refused_at_once(
        &mut h,
        &r,
        -32602,
        "INVALID_COMMAND_ARGS",
        Some("message.parts[0].data.agentd.workflow"),
        "workflow.run",
    );
    let mut alice = h.conn_as(
        0,
        agentd_core::auth::Principal::new("user:alice", agentd_core::auth::Role::User, vec![]),
    );
    let r = one(&alice.feed(&mut h, &command(json!({"op": "admin.drain"}))));
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["error"]["code"], -31403);
}

#[test]
fn a_served_op_reaches_the_host_typed() {
    let mut h = Harness::with(|c| c.introspection_enabled = true);
    // A connection per call: each waits for the host, which this test never answers.
    let typed = |h: &mut Harness, envelope: Value| -> Op {
        let mut c = h.conn();
        assert!(
            c.feed(h, &command(envelope)).is_empty(),
            "waits for the host"
        );
        match h.take_effects().as_slice() {
            [Effect::Command { op, .. }] => op.clone(),
            other => panic!("expected one command effect, got {other:?}"),
        }
    };
    assert_eq!(
        typed(&mut h, json!({"op": "workflow.status"})),
        Op::WorkflowStatus { run: None }
    );
    // Integral doubles (as protobuf-Struct clients send numbers) arrive as counts.
    assert_eq!(
        typed(
            &mut h,
            json!({"op": "conversation.get", "id": "c-1", "limit": 20.0})
        ),
        Op::ConversationGet {
            id: "c-1".into(),
            limit: Some(20)
        }
    );
    assert_eq!(
        typed(
            &mut h,
            json!({"op": "workflow.signal", "name": "go", "payload": {"n": 1}})
        ),
        Op::WorkflowSignal {
            name: "go".into(),
            payload: Some(json!({"n": 1})),
            run: None
        }
    );
    let op = typed(
        &mut h,
        json!({"op": "admin.set", "path": "agent.approval", "value": "ask"}),
    );
    assert_eq!(
        op,
        Op::AdminSet {
            path: SettablePath::AgentApproval,
            value: json!("ask")
        }
    );
    assert_eq!(op.name(), "admin.set");
    assert_eq!(op.id(), Some(OpId::AdminSet));
    let Op::WorkflowRun { workflow, inputs } = typed(
        &mut h,
        json!({"op": "workflow.run", "workflow": "triage", "inputs": {"ticket": 42}}),
    ) else {
        panic!("not workflow.run")
    };
    assert_eq!(workflow, "triage");
    assert_eq!(inputs.map(Value::Object), Some(json!({"ticket": 42})));
}

#[test]
fn the_extended_card_lists_only_served_ops() {
    let mut h = Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            ..AuthConfig::default()
        };
        // Everything but the op admin.set and the workflow.run that starts workflows.
        c.host.ops = OpSet::host_ops()
            .without(OpId::AdminSet)
            .without(OpId::WorkflowRun);
        c.host.skills = vec![skill("triage")];
    });
    h.inst.set_workflows(vec![agentd_core::view::WorkflowEntry {
        name: "deploy".into(),
        doc: json!({"name": "deploy"}),
        roles: vec![agentd_core::auth::Role::User],
    }]);
    let mut c = h.conn_peer(0, Peer::Tcp);
    let mut req = call("GetExtendedAgentCard", 1, json!({}));
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(
        at..at,
        b"Authorization: Bearer op-token\r\n".iter().copied(),
    );
    let r = one(&c.feed(&mut h, &req));
    assert_eq!(r.status, 200);
    let card = r.json()["result"].clone();
    let params = &card["capabilities"]["extensions"][0]["params"];
    let ops = card_ops(params);
    assert!(ops.contains(&"admin.drain".to_owned()), "{ops:?}");
    assert!(!ops.contains(&"admin.set".to_owned()), "{ops:?}");
    assert!(!ops.contains(&"workflow.run".to_owned()), "{ops:?}");
    assert!(
        params.get("settable").is_none(),
        "admin.set is not served, so nothing is settable"
    );
    // The host's skills; no workflow skill, since nothing served starts one.
    let skills: Vec<&str> = card["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(skills, ["triage"]);
}
