//! THE registry: every URI agentd declares, with its kind, when it is declared and which
//! methods it applies to. The card, the route table, `agentd --extensions` and the schema
//! bundles are all derived from it.

use serde_json::{json, Value};

use crate::a2a::CoreMethod;

/// The command extension: typed ops in a DataPart of a message.
pub const COMMAND_URI: &str = "https://agentd.dev/a2a/ext/command";
/// The events extension: the instance's live event feed as a streaming method.
pub const EVENTS_URI: &str = "https://agentd.dev/a2a/ext/events";
/// The task-annotations extension: links and labels on tasks, in their metadata.
pub const TASK_ANNOTATIONS_URI: &str = "https://agentd.dev/a2a/ext/task-annotations";
/// Named by a unix listener's card interface; never activated.
pub const UNIX_BINDING_URI: &str = "https://agentd.dev/a2a/binding/jsonrpc-unix";

/// The method the events extension adds.
pub const EVENTS_METHOD: &str = "agentd.events/SubscribeToEvents";

/// A method the route table serves: a core method or an extension's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// One of A2A's eleven methods.
    Core(CoreMethod),
    /// The events extension's [`EVENTS_METHOD`].
    Events,
}

impl Route {
    /// Exact lookup over the core methods and every extension method (declared or not).
    pub fn from_name(name: &str) -> Option<Route> {
        if name == EVENTS_METHOD {
            return Some(Route::Events);
        }
        CoreMethod::from_name(name).map(Route::Core)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Route::Core(m) => m.name(),
            Route::Events => EVENTS_METHOD,
        }
    }
}

/// agentd's extensions, in registry order (the card's order and the echo's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ext {
    /// [`COMMAND_URI`].
    Command,
    /// [`EVENTS_URI`].
    Events,
    /// [`TASK_ANNOTATIONS_URI`].
    TaskAnnotations,
}

impl Ext {
    /// Every extension, in registry order.
    pub const ALL: [Ext; 3] = [Ext::Command, Ext::Events, Ext::TaskAnnotations];

    /// The URI the card declares and `A2A-Extensions` names.
    pub const fn uri(self) -> &'static str {
        match self {
            Ext::Command => COMMAND_URI,
            Ext::Events => EVENTS_URI,
            Ext::TaskAnnotations => TASK_ANNOTATIONS_URI,
        }
    }

    /// The last segment of the URI: what `--extension-schema` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Ext::Command => "command",
            Ext::Events => "events",
            Ext::TaskAnnotations => "task-annotations",
        }
    }

    /// A2A's kind of extension.
    pub(crate) const fn kind(self) -> &'static str {
        match self {
            Ext::Command | Ext::TaskAnnotations => "profile",
            Ext::Events => "method",
        }
    }

    /// The extension of a URI; `None` for one agentd does not know.
    pub fn from_uri(uri: &str) -> Option<Ext> {
        Ext::ALL.into_iter().find(|e| e.uri() == uri)
    }

    /// The extension of a [`Ext::name`], as `--extension-schema` takes it.
    pub fn from_name(name: &str) -> Option<Ext> {
        Ext::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Whether activation means something on this method.
    pub fn applies_to(self, route: Route) -> bool {
        use CoreMethod::*;
        matches!(
            (self, route),
            (
                Ext::Command,
                Route::Core(SendMessage | SendStreamingMessage)
            ) | (Ext::Events, Route::Events)
                | (
                    Ext::TaskAnnotations,
                    Route::Core(
                        SendMessage
                            | SendStreamingMessage
                            | GetTask
                            | ListTasks
                            | CancelTask
                            | SubscribeToTask
                    ) | Route::Events
                )
        )
    }

    /// The schema bundle's address.
    pub fn schema_url(self) -> String {
        format!("{}/schema.json", self.uri())
    }

    pub(crate) const fn description(self) -> &'static str {
        match self {
            Ext::Command => {
                "Structured operations sent as one DataPart {\"data\":{\"agentd\":{\"op\":…}}} in \
                 SendMessage or SendStreamingMessage; the ops this caller may run are on the \
                 extended card"
            }
            Ext::Events => "The instance-wide observation feed: agentd.events/SubscribeToEvents",
            Ext::TaskAnnotations => {
                "agentd's facts about a task (what it tracks, when it was created, every state \
                 it has been in), in Task.metadata under this URI"
            }
        }
    }
}

/// Which extensions an instance declares: command and task-annotations always, events while
/// `a2a.events.enabled`.
pub fn declared(ext: Ext, events_enabled: bool) -> bool {
    match ext {
        Ext::Events => events_enabled,
        Ext::Command | Ext::TaskAnnotations => true,
    }
}

/// `agentd --extensions`: the registry as data, extensions in registry order, then bindings.
pub fn registry_document() -> Value {
    let mut rows: Vec<Value> = Ext::ALL
        .into_iter()
        .map(|e| {
            json!({
                "kind": "extension",
                "name": e.name(),
                "extensionKind": e.kind(),
                "path": e.uri().trim_start_matches("https://agentd.dev/"),
                "required": false,
                "schema": e.schema_url(),
                "uri": e.uri(),
                "declared": match e { Ext::Events => "while a2a.events.enabled", _ => "always" },
                "appliesTo": applies_to_names(e),
            })
        })
        .collect();
    rows.push(json!({
        "kind": "binding",
        "name": "jsonrpc-unix",
        "path": UNIX_BINDING_URI.trim_start_matches("https://agentd.dev/"),
        "required": false,
        "schema": null,
        "uri": UNIX_BINDING_URI,
        "declared": "on the card of a unix:/// listener",
        "appliesTo": [],
    }));
    Value::Array(rows)
}

fn applies_to_names(e: Ext) -> Vec<&'static str> {
    CoreMethod::ALL
        .into_iter()
        .map(Route::Core)
        .chain([Route::Events])
        .filter(|r| e.applies_to(*r))
        .map(Route::name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_are_exact_and_unversioned() {
        for e in Ext::ALL {
            assert_eq!(Ext::from_uri(e.uri()), Some(e));
            assert_eq!(Ext::from_uri(&format!("{}/", e.uri())), None);
            assert_eq!(Ext::from_uri(&e.uri().to_uppercase()), None);
            assert!(e.uri().ends_with(e.name()));
            // A version never appears in an agentd identifier.
            assert!(!e.uri().split('/').any(|seg| seg.len() > 1
                && seg.starts_with('v')
                && seg[1..].bytes().all(|b| b.is_ascii_digit())));
        }
        assert_eq!(
            Route::from_name("agentd.events/SubscribeToEvents"),
            Some(Route::Events)
        );
        assert_eq!(Route::from_name("SubscribeToEvents"), None);
    }
}
