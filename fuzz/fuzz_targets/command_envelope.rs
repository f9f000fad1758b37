//! The command extension's checks (`agentd_core::ext::command::check`) against every op's
//! schema: a SendMessage message carrying a DataPart `{"agentd": <envelope>}`, under
//! various principals, switches, activation and marking.
//!
//! Input layout:
//!
//! * byte 0 — the caller and the instance: bits 0–2 the principal (operator, user, agent
//!   with grants, agent without, anonymous, a user granted `*`, an agent granted `auth.*`
//!   and `admin.*`, anonymous granted `*`); bits 3–5 the switches (introspection, device
//!   grant, TCP listener); bit 6 the header activates the command URI; bit 7
//!   `message.extensions` lists it;
//! * byte 1 — the message: bit 0 the envelope is the rest of the input read as JSON (else
//!   it is generated from the op's schema, below); bits 1–2 how many parts carry a command
//!   (0, 1, 2, 1 behind other parts); bit 3 the message names a taskId; bits 4–5 the
//!   accepted output modes (none, JSON, text only, JSON with parameters);
//! * byte 2 — the op (every built-in op, the declared ops, removed, reserved and unknown
//!   names), for generated envelopes;
//! * the rest — for generated envelopes, the choices of a generator that walks the op's
//!   envelope schema (which properties, which values, sometimes the wrong type or an extra
//!   member).
//!
//! Properties checked, for every input: no panic; no carrier means `Ok(None)`; the
//! refusals come in the documented order (activation, marking, one carrier) and every
//! refusal is a typed command error (never internal), renderable as JSON, with a matching
//! `op` in its metadata when it names one; an accepted command met every precondition, its
//! args are the envelope without `op`, they validate against the op's envelope schema (as
//! compiled here, independently of the core), the caller's role and grants reach the op,
//! its switch is on, and its reply kind is the table's; an envelope the op's schema
//! refuses is never accepted.

#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use agentd_core::a2a::types::{Message, Part, Role as MsgRole, SendMessageConfiguration};
use agentd_core::auth::{Principal, Role};
use agentd_core::errors::ErrorKind;
use agentd_core::ext::command::table::{self, Gate, OpId, OpSpec, ServedBy, REMOVED_OPS};
use agentd_core::ext::command::{check, may_command, Commands, DeclaredCommand, Switches};
use agentd_core::ext::negotiate::ExtSet;
use agentd_core::ext::{Ext, COMMAND_URI};
use agentd_core::host::OpSet;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};

/// Declared (workflow) ops registered in the instance's command set.
fn declared() -> Vec<DeclaredCommand> {
    vec![
        DeclaredCommand {
            op: "deploy".into(),
            workflow: "deploy-wf".into(),
            schema: json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "target": {"type": "string", "minLength": 1},
                    "dry_run": {"type": "boolean"},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["target"],
            }),
            roles: vec![Role::User, Role::Agent],
        },
        DeclaredCommand {
            op: "build".into(),
            workflow: "build-wf".into(),
            schema: json!({"type": "object"}),
            roles: vec![Role::Operator],
        },
    ]
}

struct Fixture {
    commands: Commands,
    declared: Vec<DeclaredCommand>,
    /// The built-in ops' envelope schemas, compiled here (the core keeps its own).
    builtin: HashMap<&'static str, (Value, jsonschema::Validator)>,
    declared_validators: HashMap<String, jsonschema::Validator>,
    /// The names byte 2 picks from.
    names: Vec<String>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let mut commands = Commands::new();
        for d in declared() {
            commands.register(d).expect("a valid declared op");
        }
        let builtin = table::OPS
            .iter()
            .map(|s| {
                let schema = table::envelope(s);
                let v = jsonschema::draft202012::new(&schema).expect("the table's schema");
                (s.op, (schema, v))
            })
            .collect();
        let declared_validators = declared()
            .into_iter()
            .map(|d| {
                let v = jsonschema::draft202012::new(&d.schema).expect("a valid schema");
                (d.op, v)
            })
            .collect();
        let mut names: Vec<String> = table::OPS.iter().map(|s| s.op.to_owned()).collect();
        names.extend(declared().into_iter().map(|d| d.op));
        names.extend(REMOVED_OPS.iter().map(|(op, _)| (*op).to_owned()));
        for n in [
            "_instance.nope",
            "ask_human",
            "",
            "nope",
            "STATUS",
            "status ",
        ] {
            names.push(n.into());
        }
        Fixture {
            commands,
            declared: declared(),
            builtin,
            declared_validators,
            names,
        }
    })
}

fn principal(b: u8) -> Principal {
    match b & 7 {
        0 => Principal::operator(),
        1 => Principal::new("user:alice", Role::User, Vec::new()),
        2 => Principal::new(
            "agent:peer",
            Role::Agent,
            vec!["workflow.*".into(), "deploy".into(), "subagent.send".into()],
        ),
        3 => Principal::new("agent:bare", Role::Agent, Vec::new()),
        4 => Principal::new("anonymous", Role::Anonymous, Vec::new()),
        5 => Principal::new("user:star", Role::User, vec!["*".into()]),
        6 => Principal::new(
            "agent:admin",
            Role::Agent,
            vec!["auth.*".into(), "admin.*".into(), "build".into()],
        ),
        _ => Principal::new("anonymous", Role::Anonymous, vec!["*".into()]),
    }
}

/// The generator's choices: the input's bytes, then zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
}

/// Strings the generator picks from: values the ops take, and near misses.
const STRINGS: &[&str] = &[
    "",
    "w",
    "r1",
    "agent.approval",
    "a2a.introspection.enabled",
    "agent.nope",
    "auto",
    "ask",
    "deny",
    "never",
    "ABCD-EFGH",
    "alice",
    "operator",
    "runtime",
    "Bad Name",
    "a.b_c-9",
    "user",
    "x\u{0}y",
    "🦀",
];

/// A value for `schema`, guided by the input's bytes: usually of the schema's shape,
/// sometimes not.
fn gen(schema: &Value, b: &mut Bytes, depth: u32) -> Value {
    let c = b.byte();
    if depth > 4 || c & 0xf0 == 0xf0 {
        return any_value(b, depth);
    }
    if let Some(v) = schema.get("const") {
        return v.clone();
    }
    if let Some(Value::Array(options)) = schema.get("enum") {
        if !options.is_empty() {
            return options[usize::from(c) % options.len()].clone();
        }
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) if !ts.is_empty() => {
            ts[usize::from(c) % ts.len()].as_str().unwrap_or("null")
        }
        _ if schema.get("properties").is_some() || schema.get("oneOf").is_some() => "object",
        _ => return any_value(b, depth),
    };
    match ty {
        "object" => {
            let mut sources = vec![schema];
            for key in ["oneOf", "anyOf", "allOf"] {
                if let Some(Value::Array(alts)) = schema.get(key) {
                    sources.extend(alts.iter());
                }
            }
            let props: Vec<(&String, &Value)> = sources
                .into_iter()
                .filter_map(|s| s.get("properties").and_then(Value::as_object))
                .flat_map(|p| p.iter())
                .collect();
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut m = Map::new();
            for (name, sub) in props {
                let pick = b.byte();
                // Required members mostly present, optional ones half the time.
                let present = if required.contains(&name.as_str()) {
                    pick & 0x0f != 0
                } else {
                    pick & 1 == 1
                };
                if present && !m.contains_key(name.as_str()) {
                    m.insert(name.clone(), gen(sub, b, depth + 1));
                }
            }
            if b.byte() & 0x1f == 0x1f {
                m.insert("extra".into(), any_value(b, depth + 1));
            }
            Value::Object(m)
        }
        "array" => {
            let n = usize::from(b.byte() & 3);
            let items = schema.get("items").cloned().unwrap_or(Value::Bool(true));
            Value::Array((0..n).map(|_| gen(&items, b, depth + 1)).collect())
        }
        "string" => string_value(b),
        "integer" => json!(i64::from(b.byte() as i8)),
        "number" => json!(f64::from(b.byte() as i8) / 4.0),
        "boolean" => json!(c & 1 == 1),
        _ => Value::Null,
    }
}

fn string_value(b: &mut Bytes) -> Value {
    let c = b.byte();
    if c == 0xff {
        // A long string.
        return json!("a".repeat(usize::from(b.byte()) * 4));
    }
    json!(STRINGS[usize::from(c) % STRINGS.len()])
}

fn any_value(b: &mut Bytes, depth: u32) -> Value {
    match b.byte() % 7 {
        0 => Value::Null,
        1 => json!(b.byte() & 1 == 1),
        2 => json!(i64::from(b.byte() as i8)),
        3 => json!(f64::from(b.byte()) / 3.0),
        4 => string_value(b),
        5 if depth < 4 => {
            Value::Array((0..b.byte() & 3).map(|_| any_value(b, depth + 1)).collect())
        }
        6 if depth < 4 => {
            let mut m = Map::new();
            for _ in 0..b.byte() & 3 {
                let k = string_value(b).as_str().unwrap_or_default().to_owned();
                m.insert(k, any_value(b, depth + 1));
            }
            Value::Object(m)
        }
        _ => Value::Null,
    }
}

/// The envelope for op `name`: generated from its schema (or an open object).
fn generated_envelope(f: &Fixture, name: &str, b: &mut Bytes) -> Value {
    let schema = if let Some((schema, _)) = f.builtin.get(name) {
        schema.clone()
    } else if let Some(d) = f.declared.iter().find(|d| d.op == name) {
        d.schema.clone()
    } else {
        json!({"type": "object"})
    };
    let mut env = gen(&schema, b, 0);
    if let Value::Object(m) = &mut env {
        match b.byte() & 0x1f {
            0x1f => {} // no op at all
            0x1e => {
                m.insert("op".into(), json!(7));
            }
            _ => {
                m.insert("op".into(), json!(name));
            }
        }
    }
    env
}

const ACCEPTED_MODES: [&[&str]; 4] = [
    &[],
    &["application/json"],
    &["text/plain"],
    &["text/plain", "Application/JSON; charset=utf-8"],
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let f = fixture();
    let who = principal(data[0]);
    let switches = Switches {
        introspection: data[0] & 0x08 != 0,
        device_grant: data[0] & 0x10 != 0,
        tcp_listener: data[0] & 0x20 != 0,
        // A host that serves every op, or one that leaves some out (a listed op, an
        // introspection op and a reserved report).
        host_ops: if data[1] & 0x40 == 0 {
            OpSet::host_ops()
        } else {
            OpSet::host_ops()
                .without(OpId::WorkflowRun)
                .without(OpId::RunGet)
                .without(OpId::InstanceResult)
        },
    };
    let activated = if data[0] & 0x40 != 0 {
        ExtSet::EMPTY.with(Ext::Command)
    } else {
        ExtSet::EMPTY.with(Ext::TaskAnnotations)
    };
    let marked = data[0] & 0x80 != 0;
    let carriers = usize::from((data[1] >> 1) & 3);
    let task_id = data[1] & 0x08 != 0;
    let modes = ACCEPTED_MODES[usize::from((data[1] >> 4) & 3)];

    let envelope = if data[1] & 1 == 1 {
        match serde_json::from_slice::<Value>(&data[2..]) {
            Ok(v) => v,
            Err(_) => return,
        }
    } else {
        let name = &f.names[usize::from(data[2]) % f.names.len()];
        generated_envelope(f, name, &mut Bytes(&data[3..]))
    };

    // The message: a text part, then the carriers (the last variant behind other parts).
    let mut parts = Vec::new();
    if carriers == 3 {
        parts.push(Part::text("hello"));
        parts.push(Part::data(json!({"other": 1})));
        parts.push(Part::data(json!(["agentd"])));
    }
    let n_carriers = if carriers == 3 { 1 } else { carriers };
    for i in 0..n_carriers {
        let mut data = Map::new();
        data.insert(
            agentd_core::ext::command::DATA_PART_KEY.into(),
            envelope.clone(),
        );
        if i == 1 {
            data.insert("note".into(), json!("second"));
        }
        parts.push(Part::data(Value::Object(data)));
    }
    let message = Message {
        message_id: "m1".into(),
        role: MsgRole::User,
        task_id: if task_id { "t1".into() } else { String::new() },
        extensions: if marked {
            vec![COMMAND_URI.into()]
        } else {
            vec!["https://example.com/x".into()]
        },
        parts,
        ..Message::default()
    };
    let config = SendMessageConfiguration {
        accepted_output_modes: modes.iter().map(|m| (*m).to_owned()).collect(),
        ..SendMessageConfiguration::default()
    };

    let result = check(&message, &config, activated, &who, &f.commands, switches);

    if n_carriers == 0 {
        assert!(matches!(result, Ok(None)), "no carrier, yet {result:?}");
        return;
    }
    let op = match &envelope {
        Value::Object(m) => m.get("op").and_then(Value::as_str).unwrap_or(""),
        _ => "",
    };
    // What the op's own schema says of this envelope.
    let schema_ok = if let Some((_, v)) = f.builtin.get(op) {
        Some(v.is_valid(&envelope))
    } else if let Some(v) = f.declared_validators.get(op) {
        let mut args = envelope.as_object().cloned().unwrap_or_default();
        args.remove("op");
        Some(v.is_valid(&Value::Object(args)))
    } else {
        None
    };

    match result {
        Ok(None) => panic!("a message with a carrier read as an ordinary message"),
        Err(e) => {
            use ErrorKind::*;
            assert!(
                matches!(
                    e.kind,
                    ExtensionNotActivated
                        | ExtensionNotMarked
                        | CommandEnvelopeAmbiguous
                        | CommandTaskId
                        | UnknownOp
                        | InvalidCommandArgs
                        | IntrospectionDisabled
                        | OpNotServed
                        | PermissionDenied
                        | ContentTypeNotSupported
                ),
                "unexpected refusal kind {:?}: {}",
                e.kind,
                e.message
            );
            let rendered = serde_json::to_string(&e.to_json()).expect("a refusal renders");
            assert!(rendered.contains(&e.code().to_string()));
            if let Some((_, v)) = e.metadata.iter().find(|(k, _)| *k == "op") {
                assert_eq!(v, op, "the refusal names another op");
            }
            // The documented order of the first refusals.
            if !activated.contains(Ext::Command) {
                assert_eq!(e.kind, ExtensionNotActivated);
            } else if !marked {
                assert_eq!(e.kind, ExtensionNotMarked);
            } else if n_carriers > 1 {
                assert_eq!(e.kind, CommandEnvelopeAmbiguous);
            }
            if e.kind == InvalidCommandArgs {
                assert!(
                    !e.violations.is_empty(),
                    "INVALID_COMMAND_ARGS names no field"
                );
            }
        }
        Ok(Some(c)) => {
            assert!(activated.contains(Ext::Command) && marked && n_carriers == 1);
            assert!(!task_id, "a command with a taskId was accepted");
            assert!(
                modes.is_empty()
                    || modes
                        .iter()
                        .any(|m| m.to_ascii_lowercase().starts_with("application/json")),
                "accepted while JSON is not an accepted output mode"
            );
            assert_ne!(who.role, Role::Anonymous, "an anonymous caller ran {op}");
            assert_eq!(c.op, op);
            let mut args = envelope.as_object().cloned().expect("an object envelope");
            args.remove("op");
            // Integral doubles (`42.0`, as protobuf-Struct clients send them) reach the host
            // as integers; nothing else changes.
            for v in args.values_mut() {
                agentd_core::ext::command::integral_doubles_to_integers(v);
            }
            assert_eq!(c.args, args, "args are not the envelope without op");
            assert_eq!(
                schema_ok,
                Some(true),
                "accepted args the op's schema refuses"
            );
            match c.builtin {
                Some(spec) => {
                    let spec: &OpSpec = spec;
                    assert_eq!(spec.op, op);
                    assert_eq!(c.reply, spec.reply);
                    assert!(c.workflow.is_none());
                    assert!(may_command(&who, spec), "{} may not run {op}", who.id);
                    if op.starts_with(table::RESERVED_PREFIX) {
                        assert!(who.is_operator());
                    }
                    if spec.served_by == ServedBy::Host {
                        assert!(switches.host_ops.contains(spec.id), "{op} is not served");
                    }
                    match spec.gate {
                        Gate::Always => {}
                        Gate::Introspection => assert!(switches.introspection),
                        Gate::DeviceGrant => assert!(switches.device_grant),
                        Gate::TcpListener => assert!(switches.tcp_listener),
                    }
                    if op == "auth.device.approve" {
                        if let Some(name) = c.args.get("as").and_then(Value::as_str) {
                            assert!(!table::RESERVED_PRINCIPAL_NAMES.contains(&name));
                            assert!(!name.is_empty() && name.len() <= 64);
                        }
                    }
                }
                None => {
                    let d = f
                        .declared
                        .iter()
                        .find(|d| d.op == op)
                        .expect("a declared op");
                    assert_eq!(c.workflow.as_deref(), Some(d.workflow.as_str()));
                    assert!(
                        who.is_operator() || (d.roles.contains(&who.role) && who.granted(op)),
                        "{} may not run the declared {op}",
                        who.id
                    );
                }
            }
        }
    }
});
