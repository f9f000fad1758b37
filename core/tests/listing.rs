//! ListTasks over the store's indexes: every filter combination (the operator, two owners
//! and an anonymous caller × contextId × status × statusTimestampAfter), paged by 3, checked
//! against a simple model of the tasks: the tasks of each page, `totalSize`, `pageSize` and
//! the page tokens; and the `status` command's counts.

mod support;

use agentd_core::a2a::types::TaskState;
use agentd_core::auth::{Principal, Role};
use agentd_core::ext::COMMAND_URI;
use agentd_core::Effect;
use serde_json::{json, Value};
use support::*;

/// One task as the model knows it.
#[derive(Clone, Debug)]
struct Model {
    id: String,
    owner: String,
    /// The owner's name for the context.
    name: String,
    /// Its internal key.
    key: String,
    state: TaskState,
    /// Status time and the order of the change among all: the listing's order.
    at: (u64, u64),
}

fn callers() -> Vec<Principal> {
    vec![
        Principal::operator(),
        Principal::new("user:alice", Role::User, vec![]),
        Principal::new("agent:bob", Role::Agent, vec![]),
        Principal::new("anonymous", Role::Anonymous, vec![]),
    ]
}

/// What the model says `p` sees for a filter, newest first.
fn expect<'m>(
    model: &'m [Model],
    p: &Principal,
    context: &str,
    state: Option<TaskState>,
    since: Option<u64>,
) -> Vec<&'m Model> {
    let mut out: Vec<&Model> = model
        .iter()
        .filter(|t| p.is_operator() || (p.role != Role::Anonymous && t.owner == p.id))
        .filter(|t| {
            context.is_empty() || t.name == context || (p.is_operator() && t.key == context)
        })
        .filter(|t| state.is_none_or(|s| t.state == s))
        .filter(|t| since.is_none_or(|ms| t.at.0 >= ms))
        .collect();
    out.sort_by_key(|t| std::cmp::Reverse(t.at));
    out
}

/// Builds the tasks: four owners (an anonymous caller's tasks only the operator sees),
/// contexts shared by name between them, some changes in the same millisecond, every kind
/// of state.
fn build(h: &mut Harness) -> Vec<Model> {
    let owners = callers();
    let contexts = ["a", "b", "shared"];
    let mut model: Vec<Model> = Vec::new();
    let mut tick = 0u64;
    for i in 0..20usize {
        if i % 3 != 1 {
            h.advance(1);
        }
        let owner = &owners[i % owners.len()];
        let name = contexts[(i / 3) % 3];
        let mut c = h.conn_as(0, owner.clone());
        let mut m = text_message("hi", &fresh_id());
        m["contextId"] = json!(name);
        let out = c.feed(
            h,
            &call(
                "SendMessage",
                1,
                json!({"message": m, "configuration": {"returnImmediately": true}}),
            ),
        );
        let task = one(&out).json()["result"]["task"].clone();
        let id = task["id"].as_str().unwrap_or_else(|| panic!("{task}"));
        let key = match h.take_effects().as_slice() {
            [Effect::Turn { context_id, .. }] => context_id.clone(),
            other => panic!("expected one turn, got {other:?}"),
        };
        tick += 1;
        model.push(Model {
            id: id.to_owned(),
            owner: owner.id.clone(),
            name: name.to_owned(),
            key,
            state: TaskState::Submitted,
            at: (h.now.epoch_ms, tick),
        });
    }
    let changes = [
        (0, TaskState::Working),
        (1, TaskState::Completed),
        (2, TaskState::InputRequired),
        (4, TaskState::Failed),
        (5, TaskState::Working),
        (7, TaskState::Canceled),
        (0, TaskState::InputRequired),
        (8, TaskState::Rejected),
        (10, TaskState::AuthRequired),
        (11, TaskState::Working),
        (11, TaskState::Completed),
        (13, TaskState::Completed),
        (16, TaskState::Working),
    ];
    for (n, (i, state)) in changes.into_iter().enumerate() {
        if n % 2 == 0 {
            h.advance(1);
        }
        let id = model[i].id.clone();
        complete(h, &id, state, None);
        h.take_effects();
        tick += 1;
        model[i].state = state;
        model[i].at = (h.now.epoch_ms, tick);
    }
    // The model's states and times are the instance's.
    let mut op = h.conn_as(0, Principal::operator());
    for t in &model {
        let r = one(&op.feed(h, &call("GetTask", 1, json!({"id": t.id})))).json();
        assert_eq!(r["result"]["status"]["state"], json!(t.state), "{r}");
        assert_eq!(
            r["result"]["status"]["timestamp"],
            json!(rfc3339_ms(t.at.0))
        );
    }
    model
}

/// The status time a page token names (tokens are opaque to clients; the test knows them).
fn token_time(token: &str) -> u64 {
    let bytes: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).unwrap())
        .collect();
    let text = String::from_utf8(bytes).unwrap();
    text.split_once('.').unwrap().0.parse().unwrap()
}

#[test]
fn every_filter_combination_pages_by_3_as_the_model_says() {
    let mut h = Harness::new();
    let model = build(&mut h);
    let alice_shared = model
        .iter()
        .find(|t| t.owner == "user:alice" && t.name == "shared")
        .map(|t| t.key.clone())
        .unwrap();
    assert_ne!(alice_shared, "shared", "a user's key is not its name");
    let contexts = ["", "a", "shared", "nope", alice_shared.as_str()];
    let mut states: Vec<Option<TaskState>> = vec![None];
    states.extend(
        [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::Completed,
            TaskState::InputRequired,
            TaskState::Rejected,
        ]
        .map(Some),
    );
    let mid = model[9].at.0;
    let times = [None, Some(mid), Some(mid + 1)];
    let mut checked = 0;
    for p in callers() {
        let mut c = h.conn_as(0, p.clone());
        for context in contexts {
            for &state in &states {
                for since in times {
                    let want = expect(&model, &p, context, state, since);
                    let mut params = json!({"pageSize": 3});
                    if !context.is_empty() {
                        params["contextId"] = json!(context);
                    }
                    if let Some(s) = state {
                        params["status"] = json!(s);
                    }
                    if let Some(ms) = since {
                        params["statusTimestampAfter"] = json!(rfc3339_ms(ms));
                    }
                    let what = format!("{} {params}", p.id);
                    let mut got: Vec<String> = Vec::new();
                    let mut pages = 0;
                    loop {
                        let r = one(&c.feed(&mut h, &call("ListTasks", 1, params.clone())));
                        let j = r.json();
                        let res = &j["result"];
                        assert_eq!(res["totalSize"], json!(want.len()), "{what}: {j}");
                        assert_eq!(res["pageSize"], json!(3), "{what}");
                        let tasks = res["tasks"].as_array().unwrap();
                        let ids: Vec<String> = tasks
                            .iter()
                            .map(|t| t["id"].as_str().unwrap().to_owned())
                            .collect();
                        let from = pages * 3;
                        let page: Vec<&str> = want
                            .iter()
                            .skip(from)
                            .take(3)
                            .map(|t| t.id.as_str())
                            .collect();
                        assert_eq!(ids, page, "{what}: page {pages}");
                        // The context each task shows is its owner's name for it.
                        for (t, m) in tasks.iter().zip(want.iter().skip(from)) {
                            assert_eq!(t["contextId"], json!(m.name), "{what}");
                        }
                        got.extend(ids);
                        pages += 1;
                        let token = res["nextPageToken"].as_str().unwrap().to_owned();
                        if got.len() < want.len() {
                            assert!(!token.is_empty(), "{what}: more to come");
                            assert_eq!(token_time(&token), want[got.len() - 1].at.0, "{what}");
                            params["pageToken"] = json!(token);
                        } else {
                            assert_eq!(token, "", "{what}: the last page");
                            break;
                        }
                    }
                    assert_eq!(got.len(), want.len(), "{what}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 4 * 5 * 6 * 3);
}

/// The `status` command's counts: the whole store for the operator, each owner its own (an
/// anonymous caller may not run it).
#[test]
fn status_counts_are_the_callers_tasks_by_state() {
    let mut h = Harness::new();
    let model = build(&mut h);
    for p in &callers() {
        let mut c = h.conn_as(0, p.clone());
        let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{
            "role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],
            "parts":[{"data":{"agentd":{"op":"status"}}}]}}});
        let r = one(&c.feed(&mut h, &rpc_ext(&body.to_string(), &[COMMAND_URI]))).json();
        if p.role == Role::Anonymous {
            assert_eq!(r["error"]["data"][0]["reason"], "PERMISSION_DENIED", "{r}");
            continue;
        }
        let counts = &r["result"]["message"]["parts"][0]["data"]["counts"];
        let mine = expect(&model, p, "", None, None);
        assert_eq!(counts["tasks"], json!(mine.len()), "{}: {r}", p.id);
        let mut by_state = serde_json::Map::new();
        for t in &mine {
            let n = by_state.entry(t.state.as_str()).or_insert(json!(0));
            *n = json!(n.as_u64().unwrap() + 1);
        }
        assert_eq!(counts["tasksByState"], Value::Object(by_state), "{}", p.id);
    }
}

/// RFC 3339 at millisecond precision, for the first day after `T0` (2026-01-01T00:00:00Z),
/// which is all this test's clock covers.
fn rfc3339_ms(epoch_ms: u64) -> String {
    let ms = epoch_ms - T0;
    assert!(
        ms < 86_400_000,
        "the test's clock stays within its first day"
    );
    format!(
        "2026-01-01T{:02}:{:02}:{:02}.{:03}Z",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}
