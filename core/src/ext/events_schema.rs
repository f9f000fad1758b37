//! The JSON Schemas of the events extension (`https://agentd.dev/a2a/ext/events`): the
//! method's params, the three frames of its stream and the `data` of each event kind.
//!
//! These values are both what the feed validates against (params on the way in, every push in
//! debug builds) and what `agentd --extension-schema events` prints as the bundle published at
//! `https://agentd.dev/a2a/ext/events/schema.json`, so the two cannot drift.
//!
//! Conventions, from the spec: every object is closed (`additionalProperties: false`) and every
//! member listed is required unless optional; a "count" is an integer ≥ 0.

use serde_json::{json, Map, Value};

/// The one method the extension adds, namespaced under it so a method the A2A specification
/// defines later can never collide with it.
pub const METHOD: &str = "agentd.events/SubscribeToEvents";

/// The extension's URI.
pub const URI: &str = "https://agentd.dev/a2a/ext/events";

/// Where the bundle is published: `<uri>/schema.json`.
pub const SCHEMA_ID: &str = "https://agentd.dev/a2a/ext/events/schema.json";

/// The draft every agentd bundle is written in.
pub(crate) const DRAFT: &str = "https://json-schema.org/draft/2020-12/schema";

/// Kinds that were once pushed and must never reappear (a closed vocabulary only grows by a
/// deliberate change; these names are retired, not free).
pub const REMOVED_KINDS: &[&str] = &["message", "command", "pairing"];

/// Who receives an event of a kind: its widest audience. An operator receives every kind
/// (`audit` only while introspection is on); the variants say who else may.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Every subscriber (events addressed to all).
    All,
    /// The principal that owns the item, plus operators. An item with no owner is the
    /// operator's alone; a `*.removed` departure inherits the visibility of the item that left.
    Owner,
    /// Operators only.
    Operator,
}

impl Audience {
    /// Whether a non-operator's feed can carry this kind at all (the extended card's `kinds`).
    pub(crate) const fn reaches_non_operator(self) -> bool {
        matches!(self, Audience::All | Audience::Owner)
    }
}

/// One event kind: its name on the wire, who receives it, and the schema of its `data`.
pub struct KindSpec {
    /// The kind's name, as an event's `kind` member carries it.
    pub kind: &'static str,
    /// Whose feeds receive it.
    pub audience: Audience,
    /// Pushed only while `a2a.introspection.enabled` is on (and so listed on an operator's
    /// extended card only then).
    pub introspection_only: bool,
    /// One line, for the bundle and the docs.
    pub description: &'static str,
    /// The JSON Schema of the event's `data`.
    pub data: fn() -> Value,
}

impl std::fmt::Debug for KindSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindSpec")
            .field("kind", &self.kind)
            .field("audience", &self.audience)
            .field("introspection_only", &self.introspection_only)
            .finish_non_exhaustive()
    }
}

/// The closed vocabulary of kinds, in the spec's order, with who receives each.
pub static KINDS: &[KindSpec] = &[
    KindSpec {
        kind: "task",
        audience: Audience::Owner,
        introspection_only: false,
        description: "An A2A Task was created or changed. Its history is cut to the newest few \
                      messages; its task-annotations metadata is kept only for a subscriber \
                      that activated that extension.",
        data: task_data,
    },
    KindSpec {
        kind: "task.removed",
        // The normative docs say owner + operators; an older code revision tagged it
        // operator-only. The docs win (spec §4.4 note).
        audience: Audience::Owner,
        introspection_only: false,
        description: "A task left the store (retention). Names only the task that left.",
        data: removed_data,
    },
    KindSpec {
        kind: "run",
        audience: Audience::Owner,
        introspection_only: false,
        description: "A workflow run was created or changed.",
        data: run_data,
    },
    KindSpec {
        kind: "run.removed",
        audience: Audience::Owner,
        introspection_only: false,
        description: "A workflow run left. Names only the run that left.",
        data: removed_data,
    },
    KindSpec {
        kind: "step",
        audience: Audience::Operator,
        introspection_only: false,
        description: "A workflow step started or finished.",
        data: step_data,
    },
    KindSpec {
        kind: "conversation",
        audience: Audience::Owner,
        introspection_only: false,
        description: "A conversation was created or changed.",
        data: conversation_data,
    },
    KindSpec {
        kind: "conversation.removed",
        audience: Audience::Owner,
        introspection_only: false,
        description: "A conversation left. Names only the conversation that left.",
        data: removed_data,
    },
    KindSpec {
        kind: "subagent",
        audience: Audience::Operator,
        introspection_only: false,
        description: "A subagent was created or changed.",
        data: subagent_data,
    },
    KindSpec {
        kind: "subagent.removed",
        audience: Audience::Operator,
        introspection_only: false,
        description: "A subagent left. Names only the subagent that left.",
        data: removed_data,
    },
    KindSpec {
        kind: "child",
        audience: Audience::Operator,
        introspection_only: false,
        description: "A child process was started or changed.",
        data: child_data,
    },
    KindSpec {
        kind: "child.removed",
        audience: Audience::Operator,
        introspection_only: false,
        description: "A child process left. Names only the child that left.",
        data: removed_data,
    },
    KindSpec {
        kind: "activity",
        audience: Audience::Owner,
        introspection_only: false,
        description: "What a turn is doing now: its phase, its tool and its token counts.",
        data: activity_data,
    },
    KindSpec {
        kind: "activity.removed",
        audience: Audience::Owner,
        introspection_only: false,
        description: "An activity ended. Names only the activity that left.",
        data: removed_data,
    },
    KindSpec {
        kind: "status",
        audience: Audience::Operator,
        introspection_only: false,
        description: "The instance's status changed.",
        data: status_data,
    },
    KindSpec {
        kind: "lifecycle",
        audience: Audience::All,
        introspection_only: false,
        description: "The instance started draining, paused or resumed.",
        data: lifecycle_data,
    },
    KindSpec {
        kind: "config",
        audience: Audience::All,
        introspection_only: false,
        description: "Configuration changed, by a reload or by admin.set.",
        data: config_data,
    },
    KindSpec {
        kind: "audit",
        audience: Audience::Operator,
        introspection_only: true,
        description: "An audited action, mirrored to the feed unless it is a successful read. \
                      Pushed only while a2a.introspection.enabled is on.",
        data: audit_data,
    },
    KindSpec {
        kind: "auth",
        audience: Audience::Operator,
        introspection_only: false,
        description: "A device sign-in, a session revocation or a launch.",
        data: auth_data,
    },
];

/// The kind of that name, if the vocabulary has it.
pub fn kind(name: &str) -> Option<&'static KindSpec> {
    KINDS.iter().find(|k| k.kind == name)
}

/// The kinds a subscriber's feed can carry (the extended card's `kinds`): an operator gets
/// every kind, `audit` only while introspection is on; anyone else gets the kinds whose
/// audience is every subscriber or the owner.
pub fn kinds_for(operator: bool, introspection: bool) -> impl Iterator<Item = &'static str> {
    KINDS
        .iter()
        .filter(move |k| {
            if operator {
                introspection || !k.introspection_only
            } else {
                k.audience.reaches_non_operator()
            }
        })
        .map(|k| k.kind)
}

// ---- building blocks ------------------------------------------------------------------------

fn count() -> Value {
    json!({"type": "integer", "minimum": 0})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn string_or_null() -> Value {
    json!({"type": ["string", "null"]})
}

fn strings() -> Value {
    json!({"type": "array", "items": {"type": "string"}})
}

fn count_or_null() -> Value {
    json!({"type": ["integer", "null"], "minimum": 0})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

/// An object of any members (the spec's "obj").
fn object() -> Value {
    json!({"type": "object"})
}

/// Any JSON value (the spec's "any"): the `true` schema.
fn any() -> Value {
    Value::Bool(true)
}

/// A closed object of `members`, in the spec's order. Every member is required except those
/// named in `optional`. `required` keeps the spec's member order (the properties map itself is
/// unordered), so the published bundle reads in the order the spec lists the members.
fn closed(members: Vec<(&str, Value)>, optional: &[&str]) -> Value {
    let required: Vec<&str> = members
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !optional.contains(name))
        .collect();
    let properties: Map<String, Value> = members
        .into_iter()
        .map(|(name, schema)| (name.to_owned(), schema))
        .collect();
    let mut s = json!({
        "type": "object",
        "additionalProperties": false,
        "properties": properties,
    });
    // An empty `required` says nothing; leave it out.
    if !required.is_empty() {
        s["required"] = json!(required);
    }
    s
}

// ---- the method's params --------------------------------------------------------------------

/// `params` of `agentd.events/SubscribeToEvents`: `{fromSeq?}`, closed. Absent or null params
/// and an absent `fromSeq` mean "from the start"; the method handles those before validating,
/// so the schema describes only the object form. Anything else (the old cursor name `after`,
/// `limit`, a negative or fractional cursor) is refused with -32602.
///
/// Why the handler still checks after validating: JSON Schema counts `2.0` as an integer and
/// has no u64 ceiling, yet the method refuses both `2.0` and out-of-u64 cursors. Read `fromSeq`
/// with `Value::as_u64` and refuse `params.fromSeq` when that fails.
pub fn params() -> Value {
    let s = closed(
        vec![(
            "fromSeq",
            described(
                count(),
                "Resume after this seq: the last seq read, or goodbye's seq. Absent: from the \
                 start.",
            ),
        )],
        &["fromSeq"],
    );
    described(
        s,
        "The params of agentd.events/SubscribeToEvents. It takes only fromSeq.",
    )
}

// ---- frames ---------------------------------------------------------------------------------

/// The `hello` frame's member, sent first.
pub fn hello() -> Value {
    let s =
        closed(
            vec![
            ("seq", described(count(), "The newest seq in the feed.")),
            ("resume", described(count(), "The cursor the subscriber asked for (fromSeq).")),
            (
                "resync",
                described(
                    boolean(),
                    "True when the cursor cannot be honoured (events past it left the ring, or \
                     the daemon restarted): the replay starts from the ring start, and the \
                     client re-reads its state rather than apply the replay on top.",
                ),
            ),
            ("introspection", described(boolean(), "Whether a2a.introspection.enabled is on.")),
            ("version", described(string(), "The agentd build, not a protocol version.")),
        ],
            &[],
        );
    described(s, "The first frame of the stream.")
}

/// The `event` frame's member: replayed past the cursor, then live. `data` is bound to the
/// kind's schema.
pub fn event() -> Value {
    let kinds: Vec<&str> = KINDS.iter().map(|k| k.kind).collect();
    let mut s = closed(
        vec![
            (
                "seq",
                described(
                    count(),
                    "The event's place in the feed: increasing, with gaps for a non-operator.",
                ),
            ),
            (
                "ts",
                described(count(), "When it was pushed, in epoch milliseconds."),
            ),
            ("kind", json!({"enum": kinds})),
            // Every kind's document is an object; the allOf below narrows it per kind.
            (
                "data",
                described(json!({"type": "object"}), "The kind's document."),
            ),
        ],
        &[],
    );
    // One if/then per kind rather than a oneOf over kinds: a bad event then fails against the
    // one data schema of its own kind, not against eighteen alternatives. `kind` is required
    // and enumerated above, so the `if` never matches vacuously on a valid event.
    s["allOf"] = KINDS
        .iter()
        .map(|k| {
            json!({
                "if": {"properties": {"kind": {"const": k.kind}}},
                "then": {"properties": {"data": {"$ref": kind_ref(k.kind)}}},
            })
        })
        .collect();
    described(s, "One event, replayed past the cursor and then live.")
}

/// The `goodbye` frame's member, sent last.
pub fn goodbye() -> Value {
    let s = closed(
        vec![
            ("seq", described(count(), "The cursor to resume from.")),
            (
                "reason",
                described(
                    json!({"enum": ["deadline", "revoked"]}),
                    "deadline: the listener's stream deadline passed. revoked: the caller's \
                     session was revoked; nothing past the revocation is sent.",
                ),
            ),
        ],
        &[],
    );
    described(s, "The last frame of the stream.")
}

/// One frame: `{"hello": …}`, `{"event": …}` or `{"goodbye": …}`, the `result` of each SSE
/// event's JSON-RPC response.
pub(crate) fn frame() -> Value {
    let wrap = |name: &str| {
        closed(
            vec![(name, json!({"$ref": format!("#/$defs/{name}")}))],
            &[],
        )
    };
    json!({
        "description": "The result of one JSON-RPC response on the stream: exactly one frame.",
        "oneOf": [wrap("hello"), wrap("event"), wrap("goodbye")],
    })
}

// ---- each kind's data -----------------------------------------------------------------------

/// `{task: Task}`: the A2A Task. The schema pins only what the feed relies on (`id`,
/// `contextId`, `status.state`); the rest of the Task is the core protocol's to define, so the
/// Task and its status are left open.
fn task_data() -> Value {
    let task = json!({
        "type": "object",
        "required": ["id", "contextId", "status"],
        "properties": {
            "id": string(),
            "contextId": string(),
            "status": {
                "type": "object",
                "required": ["state"],
                "properties": {"state": {"type": "string", "pattern": "^TASK_STATE_"}},
            },
            "history": {
                "type": "array",
                "items": {"type": "object"},
                "description": "Cut to the newest messages: at most 4, at most 32 KiB.",
            },
            "artifacts": {"type": "array", "items": {"type": "object"}},
            "metadata": {
                "type": "object",
                "description": "Keeps the task-annotations object only for a subscriber that \
                                activated that extension.",
            },
        },
    });
    closed(vec![("task", task)], &[])
}

/// A departure names only what left: the owner already holds the rest, and others must not
/// learn it.
fn removed_data() -> Value {
    closed(vec![("id", string())], &[])
}

fn run_data() -> Value {
    closed(
        vec![
            ("id", string()),
            ("workflow", string()),
            ("status", string()),
            ("start", string()),
            (
                "steps",
                described(
                    json!({"type": "object", "additionalProperties": count()}),
                    "Step id to count.",
                ),
            ),
            ("tokens", count()),
            ("created", count()),
            ("updated", count()),
            ("finished", count_or_null()),
            ("output", any()),
            ("error", string_or_null()),
            ("task", string_or_null()),
            ("principal", string_or_null()),
        ],
        &[],
    )
}

fn step_data() -> Value {
    let start = closed(
        vec![
            ("run", string()),
            ("step", string()),
            ("kind", string()),
            ("phase", json!({"const": "start"})),
            ("attempt", count()),
        ],
        &[],
    );
    let done = closed(
        vec![
            ("run", string()),
            ("step", string()),
            ("phase", json!({"const": "done"})),
            ("status", string()),
            ("attempt", count()),
            ("tokens", count()),
            ("err", string_or_null()),
        ],
        &[],
    );
    json!({"oneOf": [start, done]})
}

fn conversation_data() -> Value {
    closed(
        vec![
            ("id", described(string(), "The runtime key.")),
            (
                "contextId",
                described(string(), "The owner's name for the conversation."),
            ),
            ("kind", string()),
            ("version", count()),
            ("messages", count()),
            ("est_tokens", count()),
            ("turns", count()),
            ("principal", string_or_null()),
            ("skills", strings()),
            ("plan", string_or_null()),
            ("updated", count()),
        ],
        &[],
    )
}

fn subagent_data() -> Value {
    closed(
        vec![
            ("handle", string()),
            ("mode", string()),
            ("status", string()),
            ("tokens", count()),
            ("error", string_or_null()),
            ("updated", count()),
        ],
        &[],
    )
}

fn child_data() -> Value {
    closed(
        vec![
            ("node", count()),
            // A pid is the one integer the spec does not bound below by zero.
            ("pid", json!({"type": "integer"})),
            ("kind", string()),
            ("age_ms", count()),
            ("tokens", count()),
            ("cancelled", boolean()),
        ],
        &[],
    )
}

fn activity_data() -> Value {
    closed(
        vec![
            ("id", string()),
            ("task", string_or_null()),
            ("ctx", string_or_null()),
            ("phase", string()),
            ("tool", string_or_null()),
            ("round", count()),
            ("tokens_in", count()),
            ("tokens_out", count()),
            ("started_ms", count()),
            ("updated_ms", count()),
        ],
        &[],
    )
}

fn status_data() -> Value {
    closed(
        vec![
            ("instance", string()),
            ("model", string()),
            ("version", string()),
            ("draining", boolean()),
            ("inbox_pending", count()),
            ("counters", object()),
            ("budget", object()),
            (
                "store",
                closed(vec![("kind", string()), ("degraded", boolean())], &[]),
            ),
            ("values", object()),
            ("skill_prefix", string()),
        ],
        &[],
    )
}

fn lifecycle_data() -> Value {
    json!({"oneOf": [
        closed(vec![("draining", json!({"const": true})), ("reason", string())], &[]),
        closed(vec![("paused", json!({"const": true})), ("reason", string())], &[]),
        closed(vec![("paused", json!({"const": false}))], &[]),
    ]})
}

fn config_data() -> Value {
    closed(
        vec![
            ("paths", strings()),
            ("source", json!({"enum": ["reload", "admin.set"]})),
        ],
        &[],
    )
}

fn audit_data() -> Value {
    closed(
        vec![
            ("ts", count()),
            ("principal", string_or_null()),
            ("role", string_or_null()),
            ("action", string()),
            ("target", any()),
            ("outcome", string()),
            // Carried by every audit event of a session caller, and only by those.
            ("sid", string()),
        ],
        &["sid"],
    )
}

fn auth_data() -> Value {
    let mut s = closed(
        vec![
            (
                "event",
                json!({"enum": ["pending", "approved", "denied", "revoked", "launch"]}),
            ),
            ("client_id", string()),
            ("scope", json!({"enum": ["user", "operator"]})),
            ("user_code", string()),
            ("peer", string()),
            ("sid", string()),
            ("name", string()),
        ],
        &["user_code", "peer", "sid", "name"],
    );
    let when = |events: &[&str]| json!({"properties": {"event": {"enum": events}}});
    s["allOf"] = json!([
        // A device sign-in names its user code at every step.
        {"if": when(&["pending", "approved", "denied"]), "then": {"required": ["user_code"]}},
        // A revocation names the session it ended.
        {"if": when(&["revoked"]), "then": {"required": ["sid"]}},
        // A launch mints an operator session: it names it, and a user-scope launch is refused.
        {"if": when(&["launch"]),
         "then": {"required": ["sid"], "properties": {"scope": {"const": "operator"}}}},
    ]);
    s
}

// ---- the bundle -----------------------------------------------------------------------------

fn kind_ref(kind: &str) -> String {
    format!("#/$defs/kinds/$defs/{kind}")
}

fn described(schema: Value, description: &str) -> Value {
    // Indexing a boolean schema would panic, so a boolean takes its object form first.
    let mut map = match schema {
        Value::Object(map) => map,
        Value::Bool(true) => Map::new(),
        Value::Bool(false) => json!({"not": {}}).as_object().cloned().unwrap_or_default(),
        other => panic!("not a JSON Schema: {other}"),
    };
    map.insert("description".into(), json!(description));
    Value::Object(map)
}

/// Every kind's `data` schema, keyed by kind, each described.
pub(crate) fn kinds() -> Value {
    let defs: Map<String, Value> = KINDS
        .iter()
        .map(|k| (k.kind.to_owned(), described((k.data)(), k.description)))
        .collect();
    json!({
        "description": "The data of each event kind.",
        "$defs": defs,
    })
}

/// The whole bundle published at `https://agentd.dev/a2a/ext/events/schema.json`. The root
/// validates one frame; `$defs` also holds the params, each frame's member and each kind's
/// `data` (under `$defs/kinds/$defs/<kind>`).
pub fn bundle() -> Value {
    json!({
        "$schema": DRAFT,
        "$id": SCHEMA_ID,
        "title": "agentd events",
        "description": format!(
            "The events extension ({URI}): the params of {METHOD}, each frame of its \
             text/event-stream answer and the data of each event kind. The root validates \
             one frame."
        ),
        "$ref": "#/$defs/frame",
        "$defs": {
            "params": params(),
            "frame": frame(),
            "hello": hello(),
            "event": event(),
            "goodbye": goodbye(),
            "kinds": kinds(),
        },
    })
}
