//! The JSON-RPC envelope reader (`agentd_core::jsonrpc::parse_request`) on arbitrary bytes,
//! and the documents written around the ids it keeps.
//!
//! Input: the whole input is the request body.
//!
//! Properties checked, for every input:
//!
//! * no panic;
//! * an accepted request: its id is a JSON string or number that occurs in the body exactly
//!   as sent, its method is a non-empty string, its params are absent or an object; an error
//!   document and a result document written for it are well-formed JSON with exactly
//!   `error`/`result`, `id` and `jsonrpc` members, and the id echoed byte for byte;
//! * a refusal: a typed error (-32700 parse error with a `null` id, -32600 invalid request,
//!   -32602 invalid params), its id `null` or a string/number from the body; its error
//!   document is well-formed JSON echoing the id byte for byte;
//! * against serde_json's own reading of the body (`Value`): a body serde_json reads is
//!   never a parse error; and where the envelope has no duplicate members, the envelope
//!   reader accepts exactly the requests the JSON-RPC and A2A rules admit, with the same id,
//!   method and params, and refuses the others with the same code and id.

#![no_main]

use std::collections::BTreeMap;

use agentd_core::errors::{ErrorKind, RpcError};
use agentd_core::jsonrpc::{parse_request, write_error, write_result, write_result_raw, RequestId};
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use serde_json::Value;

/// Reads a response document: its members as raw JSON text, each exactly as written.
fn members(doc: &[u8]) -> BTreeMap<String, Box<RawValue>> {
    serde_json::from_slice(doc).unwrap_or_else(|e| {
        panic!(
            "not a JSON object ({e}): {:?}",
            String::from_utf8_lossy(doc)
        )
    })
}

/// The error document for `id` is well-formed and echoes it byte for byte.
fn check_error_document(id: &RequestId, error: &RpcError) {
    let mut out = Vec::new();
    write_error(&mut out, id, error);
    let m = members(&out);
    assert_eq!(
        m.keys().map(String::as_str).collect::<Vec<_>>(),
        ["error", "id", "jsonrpc"]
    );
    assert_eq!(m["id"].get(), id.as_json(), "the id is not echoed exactly");
    assert_eq!(m["jsonrpc"].get(), "\"2.0\"");
    let e: Value = serde_json::from_str(m["error"].get()).expect("the error object");
    assert_eq!(e["code"].as_i64(), Some(i64::from(error.code())));
    assert!(e["message"].is_string());
}

fn check_id_text(id: &RequestId, body: &str) {
    let text = id.as_json();
    if id.is_null() {
        return;
    }
    assert!(
        body.contains(text),
        "the id {text:?} is not the body's own text"
    );
    // A string or a number: exactly one JSON value, and nothing else.
    let raw: Box<RawValue> = serde_json::from_str(text).expect("the id is JSON");
    assert_eq!(raw.get(), text);
    let first = text.as_bytes()[0];
    assert!(
        first == b'"' || first == b'-' || first.is_ascii_digit(),
        "id {text:?} is neither a string nor a number"
    );
}

/// What the envelope should be, read from serde_json's `Value` of the body: `Ok((id,
/// method, params present))` or `Err((code, id))`.
type Expected = Result<(Value, String, Option<Value>), (i32, Value)>;

fn expected(v: &Value) -> Expected {
    let invalid = |id: Value| Err((-32600, id));
    let Value::Object(m) = v else {
        return invalid(Value::Null);
    };
    let id = match m.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => return invalid(Value::Null),
    };
    if m.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return invalid(id);
    }
    let method = match m.get("method") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return invalid(id),
    };
    let params = match m.get("params") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(p.clone()),
        Some(_) => return Err((-32602, id)),
    };
    Ok((id, method, params))
}

fn json_of(id: &RequestId) -> Value {
    serde_json::from_str(id.as_json()).expect("an id serde_json reads")
}

fuzz_target!(|body: &[u8]| {
    let parsed = parse_request(body);
    let text = std::str::from_utf8(body).ok();
    let value: Option<Value> = text.and_then(|t| serde_json::from_str(t).ok());

    match &parsed {
        Ok(req) => {
            let text = text.expect("an accepted body is UTF-8");
            check_id_text(&req.id, text);
            assert!(!req.id.is_null());
            assert!(!req.method.is_empty());
            if let Some(p) = req.params {
                assert!(p.get().starts_with('{'), "params {:?}", p.get());
                assert!(text.contains(p.get()));
            }
            // Whatever the error, its document echoes the id.
            check_error_document(&req.id, &RpcError::of(ErrorKind::Internal));
            check_error_document(
                &req.id,
                &RpcError::new(ErrorKind::InvalidParams, req.method.to_string())
                    .with_meta("method", &*req.method),
            );
            let mut out = Vec::new();
            write_result(
                &mut out,
                &req.id,
                &serde_json::json!({"method": &*req.method}),
            );
            let m = members(&out);
            assert_eq!(m["id"].get(), req.id.as_json());
            let mut out = Vec::new();
            write_result_raw(
                &mut out,
                &req.id,
                req.params.map_or("{}", RawValue::get).as_bytes(),
            );
            let m = members(&out);
            assert_eq!(m["id"].get(), req.id.as_json());
            assert_eq!(m["result"].get(), req.params.map_or("{}", RawValue::get));
        }
        Err(refusal) => {
            let code = refusal.error.code();
            assert!(
                matches!(code, -32700 | -32600 | -32602),
                "unexpected code {code} for an envelope refusal"
            );
            if code == -32700 {
                assert!(refusal.id.is_null(), "a parse error carries a null id");
                assert!(
                    value.is_none(),
                    "serde_json reads a body the envelope calls not JSON: {}",
                    refusal.error.message
                );
            }
            if let Some(text) = text {
                check_id_text(&refusal.id, text);
            }
            check_error_document(&refusal.id, &refusal.error);
        }
    }

    // Differential: where serde_json reads the body, the envelope agrees with the rules.
    let Some(v) = value else { return };
    let duplicate = matches!(&parsed, Err(r) if r.error.message.starts_with("duplicate member"));
    if duplicate {
        return;
    }
    match (expected(&v), &parsed) {
        (Ok((id, method, params)), Ok(req)) => {
            assert_eq!(json_of(&req.id), id);
            assert_eq!(&*req.method, method.as_str());
            let got = req
                .params
                .map(|p| serde_json::from_str::<Value>(p.get()).expect("params read"));
            assert_eq!(got, params);
        }
        (Err((code, id)), Err(r)) => {
            assert_eq!(r.error.code(), code, "{}", r.error.message);
            assert_eq!(json_of(&r.id), id);
        }
        (want, got) => panic!("expected {want:?}, got {got:?}"),
    }
});
