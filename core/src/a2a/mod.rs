//! A2A 1.0: the wire types (ProtoJSON) and the table of the eleven core methods.

pub mod card;
pub mod piecewise;
pub mod types;

/// The eleven core JSON-RPC methods of A2A 1.0, by their exact wire names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreMethod {
    /// Sends a message; answered with the task or a message.
    SendMessage,
    /// Sends a message; answered with a Server-Sent Events stream of the task's events.
    SendStreamingMessage,
    /// Reads a task.
    GetTask,
    /// Lists the tasks the caller may see, a page at a time.
    ListTasks,
    /// Asks a task to stop.
    CancelTask,
    /// Streams the events of a task that is still going.
    SubscribeToTask,
    /// Registers a webhook for a task's updates.
    CreateTaskPushNotificationConfig,
    /// Reads one webhook of a task.
    GetTaskPushNotificationConfig,
    /// Lists the webhooks of a task.
    ListTaskPushNotificationConfigs,
    /// Removes a webhook of a task.
    DeleteTaskPushNotificationConfig,
    /// The card as the authenticated caller may see it.
    GetExtendedAgentCard,
}

impl CoreMethod {
    /// Every core method, in the specification's order.
    pub const ALL: [CoreMethod; 11] = [
        CoreMethod::SendMessage,
        CoreMethod::SendStreamingMessage,
        CoreMethod::GetTask,
        CoreMethod::ListTasks,
        CoreMethod::CancelTask,
        CoreMethod::SubscribeToTask,
        CoreMethod::CreateTaskPushNotificationConfig,
        CoreMethod::GetTaskPushNotificationConfig,
        CoreMethod::ListTaskPushNotificationConfigs,
        CoreMethod::DeleteTaskPushNotificationConfig,
        CoreMethod::GetExtendedAgentCard,
    ];

    /// The exact wire name, as `method` carries it.
    pub const fn name(self) -> &'static str {
        match self {
            CoreMethod::SendMessage => "SendMessage",
            CoreMethod::SendStreamingMessage => "SendStreamingMessage",
            CoreMethod::GetTask => "GetTask",
            CoreMethod::ListTasks => "ListTasks",
            CoreMethod::CancelTask => "CancelTask",
            CoreMethod::SubscribeToTask => "SubscribeToTask",
            CoreMethod::CreateTaskPushNotificationConfig => "CreateTaskPushNotificationConfig",
            CoreMethod::GetTaskPushNotificationConfig => "GetTaskPushNotificationConfig",
            CoreMethod::ListTaskPushNotificationConfigs => "ListTaskPushNotificationConfigs",
            CoreMethod::DeleteTaskPushNotificationConfig => "DeleteTaskPushNotificationConfig",
            CoreMethod::GetExtendedAgentCard => "GetExtendedAgentCard",
        }
    }

    /// Exact, case-sensitive lookup; anything else is not a core method.
    pub fn from_name(name: &str) -> Option<CoreMethod> {
        CoreMethod::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// The protocol version this listener speaks, as `A2A-Version` and the card name it.
pub(crate) const PROTOCOL_VERSION: &str = "1.0";

/// Whether an `A2A-Version` value is one this listener serves: major 1, minor 0, any patch.
/// A missing or empty header means 0.3 under the specification, so it is not served.
pub(crate) fn version_supported(value: &[u8]) -> bool {
    let Ok(s) = core::str::from_utf8(value) else {
        return false;
    };
    let mut parts = s.trim().split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return false;
    };
    let patch_ok = match parts.next() {
        None => true,
        Some(p) => !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && parts.next().is_none(),
    };
    major == "1" && minor == "0" && patch_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_round_trip_exactly() {
        for m in CoreMethod::ALL {
            assert_eq!(CoreMethod::from_name(m.name()), Some(m));
        }
        for bad in [
            "sendMessage",
            "message/send",
            "tasks/get",
            "SendMessage ",
            "GetAgentCard",
            "",
        ] {
            assert_eq!(CoreMethod::from_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn versions() {
        for ok in ["1.0", " 1.0 ", "1.0.3"] {
            assert!(version_supported(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "", "1", "0.3", "1.1", "2.0", "1.0.", "1.0.x", "1.0.1.1", "v1.0", "01.0",
        ] {
            assert!(!version_supported(bad.as_bytes()), "{bad}");
        }
    }
}
