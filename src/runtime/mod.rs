//! The built-in runtime: the host that does the work the core hands out as effects.
//!
//! No conversation agent can be configured yet, so every turn ends honestly as a task in
//! `TASK_STATE_REJECTED` whose status message says why; nothing is invented. Likewise the
//! command ops whose work belongs to the runtime (workflows, subagents, operator controls,
//! sign-in) are refused with OP_NOT_SERVED, before any task exists. (`status` and `config`
//! are answered by the core itself.)

use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::thread;

use agentd_core::a2a::types::{Part, TaskState};
use agentd_core::errors::{ErrorKind, RpcError};
use agentd_core::{CommandAnswer, Completion, Effect, Instance};
use agentd_io_std::Clock;

pub mod peer;

/// The status message of a turn no agent can answer.
pub const NO_AGENT: &str =
    "no conversation agent is configured on this agentd instance, so it cannot answer conversation turns";

/// Runs the runtime on its own thread until the process ends.
pub fn spawn(
    instance: Arc<Mutex<Instance>>,
    clock: Clock,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name("agentd-runtime".into())
        .spawn(move || {
            let waker = Waker::from(Arc::new(Unpark(thread::current())));
            loop {
                {
                    let mut inst = instance.lock().unwrap_or_else(|p| p.into_inner());
                    while let Some(effect) = inst.poll_effect() {
                        if let Some(done) = handle(effect) {
                            if let Err(e) = inst.handle_completion(done, clock.now()) {
                                tracing::warn!(error = ?e, "completion refused");
                            }
                        }
                    }
                    // Registered under the lock: an effect queued after it unparks us.
                    inst.register_effect_waker(&waker);
                }
                thread::park();
            }
        })
}

/// What the runtime does for one effect.
fn handle(effect: Effect) -> Option<Completion> {
    match effect {
        Effect::Turn { task_id, .. } => Some(Completion::Status {
            task_id,
            state: TaskState::Rejected,
            message: Some(vec![Part::text(NO_AGENT)]),
        }),
        // Nothing runs, so nothing needs stopping.
        Effect::Cancel { .. } => None,
        Effect::Command { call, op, .. } => Some(Completion::CommandResult {
            call,
            answer: CommandAnswer::Refused(
                RpcError::new(
                    ErrorKind::OpNotServed,
                    format!(
                        "command \"{op}\" is not served yet: the runtime behind it is not built"
                    ),
                )
                .with_meta("op", op),
            ),
        }),
    }
}

struct Unpark(thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}
