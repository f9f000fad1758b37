//! agentd's extensions: the one registry of URIs, header negotiation and the echo, the
//! command extension and task annotations.

pub mod annotations;
pub mod bundle;
pub mod command;
pub mod events_schema;
pub mod examples;
pub mod negotiate;
pub mod registry;

pub use negotiate::ExtSet;
pub use registry::{Ext, COMMAND_URI, EVENTS_URI, TASK_ANNOTATIONS_URI, UNIX_BINDING_URI};
