//! What `run` and `answer` do with a JSON Schema before they send: turn `k=v` words into
//! values of the types the schema names, and check the whole against the schema, so a bad
//! argument is a usage error naming it rather than a round trip to the server.

use serde_json::{Map, Value};

/// The schema of the object member `name`, when `schema` describes it.
pub fn member<'a>(schema: Option<&'a Value>, name: &str) -> Option<&'a Value> {
    schema?.get("properties")?.get(name)
}

/// The JSON types a schema admits (`type` as a word or a list); empty when it says none.
pub fn types(schema: Option<&Value>) -> Vec<String> {
    match schema.and_then(|s| s.get("type")) {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// `raw`, a word from the command line, as a value of a type `schema` admits: `integer`,
/// `number`, `boolean` (`true`/`false`, `yes`/`no`), `null`, `object` and `array` (JSON),
/// `string` (as written). A schema that names no type takes JSON when the word parses as
/// JSON, else the word as a string; an `enum` of strings takes the word as written.
pub fn coerce(raw: &str, schema: Option<&Value>) -> Result<Value, String> {
    let kinds = types(schema);
    if kinds.is_empty() {
        if let Some(choices) = schema.and_then(|s| s.get("enum")).and_then(Value::as_array) {
            if let Some(hit) = choices.iter().find(|c| enum_word(c) == raw) {
                return Ok(hit.clone());
            }
            let words: Vec<String> = choices.iter().map(enum_word).collect();
            return Err(format!("one of {}", words.join(", ")));
        }
        return Ok(serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned())));
    }
    // The most particular reading first: a word that is a number is a number when the
    // schema admits one, and a string only when nothing else fits.
    let order = [
        "null", "boolean", "integer", "number", "object", "array", "string",
    ];
    for kind in order.iter().filter(|k| kinds.iter().any(|t| t == *k)) {
        let v = match *kind {
            "null" => (raw == "null").then_some(Value::Null),
            "boolean" => match raw.to_ascii_lowercase().as_str() {
                "true" | "yes" | "y" => Some(Value::Bool(true)),
                "false" | "no" | "n" => Some(Value::Bool(false)),
                _ => None,
            },
            "integer" => raw
                .trim()
                .parse::<i64>()
                .ok()
                .map(Value::from)
                .or_else(|| raw.trim().parse::<u64>().ok().map(Value::from)),
            "number" => match raw.trim().parse::<i64>() {
                Ok(i) => Some(Value::from(i)),
                Err(_) => raw
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(Value::from),
            },
            "object" => serde_json::from_str::<Value>(raw)
                .ok()
                .filter(Value::is_object),
            "array" => serde_json::from_str::<Value>(raw)
                .ok()
                .filter(Value::is_array),
            _ => Some(Value::String(raw.to_owned())),
        };
        if let Some(v) = v {
            return Ok(v);
        }
    }
    Err(match kinds.as_slice() {
        [one] => a_type(one),
        many => many
            .iter()
            .map(|k| a_type(k))
            .collect::<Vec<_>>()
            .join(" or "),
    })
}

/// A type as the usage error names it.
fn a_type(kind: &str) -> String {
    match kind {
        "integer" => "an integer".into(),
        "number" => "a number".into(),
        "boolean" => "true or false".into(),
        "object" => "a JSON object".into(),
        "array" => "a JSON array".into(),
        "null" => "null".into(),
        other => format!("a {other}"),
    }
}

/// An enum choice as a person types it: a string bare, anything else as JSON.
pub fn enum_word(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `k=v` words into an object, each value coerced to its member's schema in `schema`.
/// `flag` names the option in the errors (`--arg`, `--field`).
pub fn pairs(
    words: &[&str],
    schema: Option<&Value>,
    flag: &str,
    into: &mut Map<String, Value>,
) -> Result<(), String> {
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            return Err(format!("{flag} takes NAME=VALUE, not {w:?}"));
        };
        if k.is_empty() {
            return Err(format!("{flag} {w:?} names no argument"));
        }
        let value = coerce(v, member(schema, k))
            .map_err(|want| format!("{flag} {k}={v}: {k} takes {want}"))?;
        into.insert(k.to_owned(), value);
    }
    Ok(())
}

/// Where `instance` breaks `schema`: each problem as (the JSON pointer of the value, why).
/// A schema that does not compile finds nothing: the server has the last word.
pub fn problems(schema: &Value, instance: &Value) -> Vec<(String, String)> {
    let Ok(v) = jsonschema::draft202012::new(schema) else {
        return Vec::new();
    };
    v.iter_errors(instance)
        .take(8)
        .map(|e| (e.instance_path().to_string(), e.to_string()))
        .collect()
}

/// A JSON value for people: members as `key: value` lines, nested ones indented, arrays as
/// `- item` lines, strings bare.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    render_into(v, 0, &mut out);
    while out.ends_with('\n') {
        out.pop();
    }
    out
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) if m.is_empty() => Some("{}".into()),
        Value::Array(a) if a.is_empty() => Some("[]".into()),
        Value::Object(_) | Value::Array(_) => None,
        other => Some(other.to_string()),
    }
}

fn render_into(v: &Value, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                match scalar(x) {
                    Some(s) => out.push_str(&format!("{pad}{k}: {}\n", s.replace('\n', " "))),
                    None => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        render_into(x, depth + 1, out);
                    }
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for x in a {
                match scalar(x) {
                    Some(s) => out.push_str(&format!("{pad}- {}\n", s.replace('\n', " "))),
                    None => {
                        out.push_str(&format!("{pad}-\n"));
                        render_into(x, depth + 1, out);
                    }
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other).unwrap_or_default())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn words_become_the_types_the_schema_names() {
        let s = json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
            "s": {"type": "string"}, "o": {"type": "object"}, "a": {"type": "array"},
            "e": {"enum": ["red", "blue"]}, "u": {}, "ns": {"type": ["integer", "string"]}}});
        let mut m = Map::new();
        pairs(
            &[
                "n=42",
                "x=1.5",
                "b=yes",
                "s=007",
                "o={\"k\":1}",
                "a=[1]",
                "e=blue",
                "u=[2]",
                "ns=abc",
            ],
            Some(&s),
            "--arg",
            &mut m,
        )
        .unwrap();
        assert_eq!(
            Value::Object(m),
            json!({"n": 42, "x": 1.5, "b": true, "s": "007", "o": {"k": 1}, "a": [1],
                   "e": "blue", "u": [2], "ns": "abc"})
        );
        let mut m = Map::new();
        let e = pairs(&["n=4.5"], Some(&s), "--arg", &mut m).unwrap_err();
        assert!(e.contains("n takes an integer"), "{e}");
        let e = pairs(&["e=green"], Some(&s), "--arg", &mut m).unwrap_err();
        assert!(e.contains("one of red, blue"), "{e}");
        assert!(pairs(&["novalue"], Some(&s), "--arg", &mut m).is_err());
        assert!(pairs(&["o=[1]"], Some(&s), "--arg", &mut m).is_err());
    }

    #[test]
    fn problems_point_at_the_value() {
        let s = json!({"type": "object", "required": ["tag"], "additionalProperties": false,
                       "properties": {"tag": {"type": "string"}}});
        assert!(problems(&s, &json!({"tag": "v1"})).is_empty());
        let p = problems(&s, &json!({"tag": 1}));
        assert_eq!(p[0].0, "/tag");
        assert!(!problems(&s, &json!({})).is_empty());
    }

    #[test]
    fn render_for_people() {
        let v = json!({"a": 1, "b": {"c": "x"}, "d": [1, {"e": true}]});
        assert_eq!(render(&v), "a: 1\nb:\n  c: x\nd:\n  - 1\n  -\n    e: true");
    }
}
