//! The built-in runtime: the host that does the work the core hands out as effects.
//!
//! One owner holds every runtime object (runs, gates, conversations, subagents) and reacts
//! to messages: the core has effects, a step's worker finished, an agent process spoke, a
//! signal arrived. It is a task on the smol driver's executor, or a thread of its own with
//! the std driver ([`start_task`], [`spawn`]). Work that blocks (a program, a peer call)
//! runs on a worker thread that reports back with a message, so the runtime never waits on
//! the outside world and the instance lock is held only while effects and completions are
//! applied.
//!
//! - Workflow runs ([`workflow`]): `workflow.run` or a declared command starts one; each
//!   step's start and end is a `step` feed event, a `run` event and a task status update;
//!   `human` steps gate the task in `input-required` until its owner answers.
//! - Conversation turns go to the configured agent process ([`agent`]); with none, a turn
//!   ends as a rejected task saying so.
//! - Operator controls: drain, pause, resume, cancel and the runtime-settable paths.

pub mod agent;
pub mod child;
pub mod exec;
pub mod logring;
pub mod peer;
pub mod push;
pub mod workflow;

mod engine;

pub use engine::{
    spawn, start_task, Approval, DrainHandle, Exit, Reload, ReloadHandle, RuntimeHandle,
    RuntimeLimits, RuntimeTask, Settings, CONVERSATION_AGENT, SERVED_OPS,
};

/// What this runtime serves, as the core's instance configuration declares it: every op of
/// [`SERVED_OPS`], and the `conversation` skill when a conversation agent answers turns
/// (without one every turn is rejected, so the card offers no conversation).
pub fn capabilities(converses: bool) -> agentd_core::HostCapabilities {
    let conversation = agentd_core::a2a::card::AgentSkill {
        description: "Converse with this agent: each message without a command is a turn \
                      answered by the configured conversation agent."
            .into(),
        examples: Vec::new(),
        input_modes: Vec::new(),
        output_modes: Vec::new(),
        id: "conversation".into(),
        name: "Conversation".into(),
        tags: vec!["conversation".into()],
    };
    agentd_core::HostCapabilities::new(
        SERVED_OPS,
        converses.then_some(conversation).into_iter().collect(),
    )
}

/// The status message of a turn no agent can answer.
pub const NO_AGENT: &str =
    "no conversation agent is configured on this agentd instance, so it cannot answer conversation turns";

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_core::ext::command::table::{OpId, OPS};

    #[test]
    fn the_daemon_serves_every_listed_op_so_its_card_keeps_the_whole_vocabulary() {
        let caps = capabilities(true);
        let params = agentd_core::ext::command::public_params(&caps);
        let ops: Vec<&str> = params["ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["op"].as_str().unwrap())
            .collect();
        let listed: Vec<&str> = OPS.iter().filter(|s| s.listed).map(|s| s.op).collect();
        assert_eq!(ops, listed);
        // Every host op but the instance-tier reports, which this runtime does not serve.
        let unserved: Vec<OpId> = agentd_core::host::OpSet::host_ops()
            .iter()
            .filter(|id| !caps.ops.contains(*id))
            .collect();
        assert_eq!(unserved, [OpId::InstanceResult, OpId::InstanceEmit]);
        let skills: Vec<&str> = caps.skills.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(skills, ["conversation"]);
        assert!(capabilities(false).skills.is_empty());
        assert_eq!(capabilities(false).ops, caps.ops);
    }
}
