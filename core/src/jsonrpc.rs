//! JSON-RPC 2.0: the request envelope, ids, and the response documents.
//!
//! The envelope is read in one pass with a hand-written visitor, so the core can tell a body
//! that is not JSON (-32700) from JSON that is not a request (-32600) without parsing twice,
//! and refuses duplicate envelope members instead of letting the last one win.

use core::fmt;
use std::borrow::Cow;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::errors::{ErrorKind, RpcError};

/// A request id, kept as the exact JSON text the client sent so it is echoed byte for byte
/// (a string with its escapes, a number in its own notation) or `null`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(Box<str>);

impl RequestId {
    pub(crate) fn null() -> Self {
        RequestId("null".into())
    }

    /// The id's JSON text.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    /// Whether the id is JSON `null` (also what an unreadable request is answered under).
    pub fn is_null(&self) -> bool {
        &*self.0 == "null"
    }
}

/// A request that passed the envelope checks.
#[derive(Debug)]
pub struct Request<'a> {
    /// The id to answer under.
    pub id: RequestId,
    /// Borrowed from the body, or unescaped when the client wrote it with escapes.
    pub method: Cow<'a, str>,
    /// The `params` object's JSON text; `None` when absent.
    pub params: Option<&'a RawValue>,
}

/// A body that is not a request: the error to answer and the id to answer it with.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    /// The id to answer under: the request's, or `null` when it could not be read.
    pub id: RequestId,
    /// What to answer.
    pub error: RpcError,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request {}: {}", self.id.as_json(), self.error)
    }
}

impl std::error::Error for Refusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

enum Top<'a> {
    Object(Members<'a>),
    Batch,
    Other,
}

#[derive(Default)]
struct Members<'a> {
    jsonrpc: Option<&'a RawValue>,
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
}

/// A member name: borrowed from the body, or unescaped (`"jso\u006erpc"` is `jsonrpc`), since
/// JSON names with escapes are the same names.
struct Key<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(core::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Key<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'a>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'a>, E> {
                Ok(Key(Cow::Owned(v.into())))
            }
        }
        d.deserialize_str(V(core::marker::PhantomData))
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Top<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(core::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Top<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON-RPC request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'a>, A::Error> {
                let mut m = Members::default();
                while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
                    let slot = match &*key {
                        "jsonrpc" => &mut m.jsonrpc,
                        "id" => &mut m.id,
                        "method" => &mut m.method,
                        "params" => &mut m.params,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    if slot.is_some() {
                        return Err(de::Error::custom(format_args!("duplicate member `{key}`")));
                    }
                    *slot = Some(map.next_value::<&'de RawValue>()?);
                }
                Ok(Top::Object(m))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top<'a>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Top::Batch)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Top<'a>, E> {
                Ok(Top::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Top<'a>, E> {
                Ok(Top::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Top<'a>, E> {
                Ok(Top::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Top<'a>, E> {
                Ok(Top::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Top<'a>, E> {
                Ok(Top::Other)
            }
            fn visit_unit<E>(self) -> Result<Top<'a>, E> {
                Ok(Top::Other)
            }
        }
        d.deserialize_any(V(core::marker::PhantomData))
    }
}

fn invalid(id: RequestId, message: impl Into<String>) -> Refusal {
    Refusal {
        id,
        error: RpcError::new(ErrorKind::InvalidRequest, message),
    }
}

/// Reads the envelope of a request body.
pub fn parse_request(body: &[u8]) -> Result<Request<'_>, Refusal> {
    // JSON text is UTF-8 throughout. serde_json checks the strings it reads, but not the
    // ones it skips (a member the envelope ignores), so the whole body is checked first.
    let Ok(text) = core::str::from_utf8(body) else {
        return Err(Refusal {
            id: RequestId::null(),
            error: RpcError::new(ErrorKind::ParseError, "invalid JSON: the body is not UTF-8"),
        });
    };
    let top: Top<'_> = match serde_json::from_str(text) {
        Ok(top) => top,
        // Valid JSON, maybe, but deeper than anything a request needs.
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            return Err(invalid(RequestId::null(), "JSON nested too deeply"))
        }
        Err(e) if e.is_data() => return Err(invalid(RequestId::null(), e.to_string())),
        Err(e) => {
            return Err(Refusal {
                id: RequestId::null(),
                error: RpcError::new(ErrorKind::ParseError, format!("invalid JSON: {e}")),
            })
        }
    };
    let m = match top {
        Top::Object(m) => m,
        Top::Batch => {
            return Err(invalid(
                RequestId::null(),
                "batch requests are not supported",
            ))
        }
        Top::Other => {
            return Err(invalid(
                RequestId::null(),
                "a request must be a JSON object",
            ))
        }
    };
    let id = match m.id.map(RawValue::get) {
        None | Some("null") => {
            return Err(invalid(RequestId::null(), "A2A requests must carry an id"))
        }
        Some(text)
            if text.starts_with('"')
                || text.starts_with('-')
                || text.as_bytes()[0].is_ascii_digit() =>
        {
            RequestId(text.into())
        }
        Some(_) => {
            return Err(invalid(
                RequestId::null(),
                "id must be a string or a number",
            ))
        }
    };
    if m.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return Err(invalid(id, "jsonrpc must be exactly \"2.0\""));
    }
    let method = match m
        .method
        .map(|raw| serde_json::from_str::<Key<'_>>(raw.get()))
    {
        Some(Ok(Key(method))) if !method.is_empty() => method,
        _ => return Err(invalid(id, "method must be a non-empty string")),
    };
    let params = match m.params {
        // `null` params carry nothing: read as absent.
        Some(p) if p.get() == "null" => None,
        Some(p) if !p.get().starts_with('{') => {
            return Err(Refusal {
                id,
                error: RpcError::invalid_field("params", "params must be an object"),
            })
        }
        other => other,
    };
    Ok(Request { id, method, params })
}

/// `{"id":…,"jsonrpc":"2.0","result":…}`.
pub fn write_result<T: Serialize + ?Sized>(out: &mut Vec<u8>, id: &RequestId, result: &T) {
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(id.as_json().as_bytes());
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":");
    if serde_json::to_writer(&mut *out, result).is_err() {
        // Our own types always serialize; this arm only keeps the document well-formed.
        out.extend_from_slice(b"null");
    }
    out.push(b'}');
}

/// `{"id":…,"jsonrpc":"2.0","result":…}` around a result already serialized.
pub fn write_result_raw(out: &mut Vec<u8>, id: &RequestId, result_json: &[u8]) {
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(id.as_json().as_bytes());
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":");
    out.extend_from_slice(result_json);
    out.push(b'}');
}

/// `{"error":…,"id":…,"jsonrpc":"2.0"}`.
pub fn write_error(out: &mut Vec<u8>, id: &RequestId, error: &RpcError) {
    out.extend_from_slice(b"{\"error\":");
    let _ = serde_json::to_writer(&mut *out, &error.to_json());
    out.extend_from_slice(b",\"id\":");
    out.extend_from_slice(id.as_json().as_bytes());
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\"}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(body: &str) -> (i32, String) {
        let r = parse_request(body.as_bytes()).expect_err(body);
        (r.error.code(), r.id.as_json().to_owned())
    }

    #[test]
    fn accepts_and_keeps_ids_exactly() {
        for id in [
            "1",
            "\"a\\u0041\"",
            "-7",
            "12345678901234567890123",
            "1.5e3",
            "\"\"",
        ] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"GetTask","params":{{"id":"x"}}}}"#
            );
            let r = parse_request(body.as_bytes()).unwrap();
            assert_eq!(r.id.as_json(), id);
            assert_eq!(r.method, "GetTask");
            assert_eq!(r.params.unwrap().get(), r#"{"id":"x"}"#);
        }
        let r = parse_request(
            br#"{"id":1,"jsonrpc":"2.0","method":"GetExtendedAgentCard","extra":[1,2]}"#,
        )
        .unwrap();
        assert!(r.params.is_none());
    }

    #[test]
    fn refusals_have_the_right_codes() {
        assert_eq!(refusal("{"), (-32700, "null".into()));
        assert_eq!(refusal("\u{0}"), (-32700, "null".into()));
        assert_eq!(refusal("[]"), (-32600, "null".into()));
        assert_eq!(refusal("[{\"jsonrpc\":\"2.0\"}]"), (-32600, "null".into()));
        assert_eq!(refusal("[1,"), (-32700, "null".into()));
        assert_eq!(refusal("42"), (-32600, "null".into()));
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","method":"GetTask"}"#),
            (-32600, "null".into())
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":null,"method":"GetTask"}"#),
            (-32600, "null".into())
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":{},"method":"GetTask"}"#),
            (-32600, "null".into())
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"1.0","id":3,"method":"GetTask"}"#),
            (-32600, "3".into())
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":3,"method":""}"#),
            (-32600, "3".into())
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":3,"method":7}"#),
            (-32600, "3".into())
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":3,"method":"GetTask","params":[1]}"#),
            (-32602, "3".into())
        );
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":3,"id":4,"method":"GetTask"}"#),
            (-32600, "null".into())
        );
        // U+00FF is fine JSON (this request only lacks a method); the byte 0xFF alone is
        // not UTF-8, so not JSON.
        assert_eq!(
            refusal("{\"jsonrpc\":\"2.0\",\"id\":\"\u{ff}\"}"),
            (-32600, "\"\u{ff}\"".into())
        );
        let r = parse_request(b"{\"jsonrpc\":\"2.0\",\"id\":\"\xff\"}").unwrap_err();
        assert_eq!(r.error.code(), -32700);
        // Also where the envelope skips a member without reading it.
        let r =
            parse_request(b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"GetTask\",\"x\":\"\xff\"}")
                .unwrap_err();
        assert_eq!((r.error.code(), r.id.as_json()), (-32700, "null"));
    }

    /// Found by the `jsonrpc_envelope` fuzz target: member names and the method were read
    /// as borrowed strings, so a name written with an escape (the same name, RFC 8259 §7)
    /// made a valid request -32600.
    #[test]
    fn escaped_member_names_and_methods_are_the_same_names() {
        let r = parse_request(
            br#"{"jso\u006erpc":"2.0","\u0069d":1,"method":"G\u0065tTask","p\u0061rams":{"id":"x"},"ext\u0061":[1]}"#,
        )
        .unwrap();
        assert_eq!((r.id.as_json(), &*r.method), ("1", "GetTask"));
        assert_eq!(r.params.unwrap().get(), r#"{"id":"x"}"#);
        // Still one member, however it is spelled.
        assert_eq!(
            refusal(r#"{"jsonrpc":"2.0","id":3,"\u0069d":4,"method":"GetTask"}"#),
            (-32600, "null".into())
        );
        let r = parse_request(br#"{"jsonrpc":"2.0","id":3,"method":"a\nb"}"#).unwrap();
        assert_eq!(&*r.method, "a\nb");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(refusal(&deep).0, -32600);
        // Deep params pass the envelope (a raw value is skipped without recursion) and are
        // refused when the method reads them.
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"a":{}1{}}}}}"#,
            "[".repeat(5000),
            "]".repeat(5000)
        );
        let params = parse_request(body.as_bytes()).map(|r| r.params.map(|p| p.get().len()));
        assert!(matches!(params, Ok(Some(_))));
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(&body);
        assert!(parsed.is_err());
    }

    #[test]
    fn documents_put_members_in_order() {
        let mut out = Vec::new();
        write_result(
            &mut out,
            &RequestId("\"x\"".into()),
            &serde_json::json!({"a":1}),
        );
        assert_eq!(out, br#"{"id":"x","jsonrpc":"2.0","result":{"a":1}}"#);
        let mut out = Vec::new();
        write_error(
            &mut out,
            &RequestId::null(),
            &RpcError::of(ErrorKind::ParseError),
        );
        assert_eq!(out, br#"{"error":{"code":-32700,"message":"Invalid JSON payload"},"id":null,"jsonrpc":"2.0"}"#);
    }
}
