//! Repeated members in a command's DataPart. `serde_json::Value` keeps the last of a repeated
//! member, so `{"agentd": {"op": "status", "op": "config"}}` would run `config` while a
//! reader that takes the first (a proxy, a log, an audit) saw `status`. The JSON-RPC
//! envelope refuses its repeated members for the same reason (`crate::jsonrpc`); a command
//! is refused likewise, before the params are read into values, with `-32602` and a
//! `BadRequest` naming the member's path.

use core::fmt;
use std::collections::HashSet;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::DATA_PART_KEY;
use crate::errors::RpcError;

/// Refuses SendMessage / SendStreamingMessage `params` whose command DataPart repeats a
/// member: `agentd` itself, a member of the envelope (`op`, an argument), or a member of any
/// object inside it. Names the first repeat, as `message.parts[0].data.agentd.op`. Params
/// that are not JSON, or not of the shape a send has, are left to the params parser.
pub(crate) fn refuse_duplicate_members(params: &str) -> Result<(), RpcError> {
    let mut found = None;
    let mut de = serde_json::Deserializer::from_str(params);
    // Any error other than the repeat itself is the params parser's to answer.
    let _ = Seek {
        level: Level::Params,
        found: &mut found,
    }
    .deserialize(&mut de);
    match found {
        None => Ok(()),
        Some(Repeat { path, name }) => Err(RpcError::invalid_field(
            path,
            format!("duplicate member `{name}`: a command names each member once"),
        )),
    }
}

struct Repeat {
    path: String,
    name: String,
}

/// Where in a send's params the walk is, on the way to `message.parts[i].data.agentd`.
#[derive(Clone, Copy)]
enum Level {
    Params,
    Message,
    Parts,
    Part(usize),
    Data(usize),
}

/// Walks down to each part's `data`, skipping everything else unread.
struct Seek<'a> {
    level: Level,
    found: &'a mut Option<Repeat>,
}

fn stop<E: de::Error>() -> E {
    E::custom("a repeated member")
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let found = self.found;
        let mut envelope_seen = false;
        while let Some(key) = map.next_key::<String>()? {
            let next = match (self.level, key.as_str()) {
                (Level::Params, "message") => Level::Message,
                (Level::Message, "parts") => Level::Parts,
                (Level::Part(i), "data") => Level::Data(i),
                (Level::Data(i), DATA_PART_KEY) => {
                    let mut path = format!("message.parts[{i}].data.{DATA_PART_KEY}");
                    if envelope_seen {
                        *found = Some(Repeat { path, name: key });
                        return Err(stop());
                    }
                    envelope_seen = true;
                    map.next_value_seed(Unique {
                        path: &mut path,
                        found: &mut *found,
                    })?;
                    continue;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            map.next_value_seed(Seek {
                level: next,
                found: &mut *found,
            })?;
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let found = self.found;
        if let Level::Parts = self.level {
            let mut i = 0;
            while seq
                .next_element_seed(Seek {
                    level: Level::Part(i),
                    found: &mut *found,
                })?
                .is_some()
            {
                i += 1;
            }
        } else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
        }
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Checks a value and everything inside it for repeated members. `path` is where the value
/// sits; each level appends its segment and takes it off again.
struct Unique<'a> {
    path: &'a mut String,
    found: &'a mut Option<Repeat>,
}

impl<'de> DeserializeSeed<'de> for Unique<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unique<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Unique { path, found } = self;
        // A set, not a list: an object of many members costs linear time, not quadratic.
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let len = path.len();
            path.push('.');
            path.push_str(&key);
            if seen.contains(&key) {
                *found = Some(Repeat {
                    path: path.clone(),
                    name: key,
                });
                return Err(stop());
            }
            map.next_value_seed(Unique {
                path: &mut *path,
                found: &mut *found,
            })?;
            path.truncate(len);
            seen.insert(key);
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Unique { path, found } = self;
        let mut i = 0usize;
        loop {
            let len = path.len();
            path.push('[');
            path.push_str(&i.to_string());
            path.push(']');
            let more = seq
                .next_element_seed(Unique {
                    path: &mut *path,
                    found: &mut *found,
                })?
                .is_some();
            path.truncate(len);
            if !more {
                return Ok(());
            }
            i += 1;
        }
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(params: &str) -> Option<(i32, String, String)> {
        refuse_duplicate_members(params).err().map(|e| {
            let v = &e.violations[0];
            (e.code(), v.field.clone(), v.description.clone())
        })
    }

    fn send(data: &str) -> String {
        format!(
            r#"{{"message":{{"role":"ROLE_USER","messageId":"m","parts":[{{"text":"hi"}},{{"data":{data}}}]}}}}"#
        )
    }

    #[test]
    fn a_repeated_member_of_a_command_is_refused_by_its_path() {
        for (data, field) in [
            (
                r#"{"agentd":{"op":"status","op":"config"}}"#,
                "message.parts[1].data.agentd.op",
            ),
            (
                r#"{"agentd":{"op":"workflow.run","workflow":"a","workflow":"b"}}"#,
                "message.parts[1].data.agentd.workflow",
            ),
            (
                r#"{"agentd":{"op":"workflow.run","workflow":"a","inputs":{"x":[{"y":1,"y":2}]}}}"#,
                "message.parts[1].data.agentd.inputs.x[0].y",
            ),
            (
                r#"{"agentd":{"op":"status"},"agentd":{"op":"config"}}"#,
                "message.parts[1].data.agentd",
            ),
            // The same name however it is escaped (RFC 8259 §7).
            (
                r#"{"agentd":{"op":"status","\u006fp":"config"}}"#,
                "message.parts[1].data.agentd.op",
            ),
        ] {
            let (code, got, why) = refusal(&send(data)).unwrap_or_else(|| panic!("{data}"));
            assert_eq!((code, got.as_str()), (-32602, field), "{data}");
            assert!(why.starts_with("duplicate member"), "{why}");
        }
    }

    #[test]
    fn everything_else_is_left_alone() {
        for params in [
            send(r#"{"agentd":{"op":"status"}}"#),
            // Distinct members at different places, and repeats outside a command.
            send(r#"{"agentd":{"op":"workflow.run","inputs":{"op":1,"x":{"op":2}}}}"#),
            send(r#"{"other":1,"other":2}"#),
            r#"{"message":{"parts":[{"text":"a"}],"metadata":{"k":1,"k":2}}}"#.to_owned(),
            // Not JSON, not a send: the params parser answers.
            "{".to_owned(),
            "[1,2]".to_owned(),
            r#"{"message":{"parts":{"data":{"agentd":{"op":1,"op":2}}}}}"#.to_owned(),
        ] {
            assert!(refusal(&params).is_none(), "{params}");
        }
    }
}
