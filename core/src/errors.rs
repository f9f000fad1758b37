//! THE error table: every refusal agentd can answer, with its JSON-RPC code, `google.rpc`
//! reason and domain, and HTTP status, in one place. Handlers return [`RpcError`]; only this
//! module renders them.

use serde_json::{json, Value};

/// Domain of the A2A specification's own reasons.
pub(crate) const A2A_DOMAIN: &str = "a2a-protocol.org";
/// Domain of agentd's own reasons.
pub(crate) const AGENTD_DOMAIN: &str = "agentd.dev";

/// One row of the error table. Rows may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The body is not JSON (-32700).
    ParseError,
    /// JSON, but not a JSON-RPC request (-32600).
    InvalidRequest,
    /// No method of that name here (-32601).
    MethodNotFound,
    /// The params do not fit the method (-32602).
    InvalidParams,
    /// A fault of agentd's own (-32603); the message says no more than that.
    Internal,
    /// No task of that id the caller may see (A2A `TaskNotFoundError`).
    TaskNotFound,
    /// The task is in a state that cannot be canceled (A2A `TaskNotCancelableError`).
    TaskNotCancelable,
    /// Webhooks are off on this instance (A2A `PushNotificationNotSupportedError`).
    PushNotificationNotSupported,
    /// A2A `UnsupportedOperationError`: the operation is not offered here.
    UnsupportedOperation,
    /// A part's media type is not accepted (A2A `ContentTypeNotSupportedError`).
    ContentTypeNotSupported,
    /// The `A2A-Version` the client asked for is not served (A2A `VersionNotSupportedError`).
    VersionNotSupported,
    /// `agentd.events/SubscribeToEvents` on an instance that does not declare the events
    /// extension.
    ExtensionNotDeclared,
    /// That method, and `A2A-Extensions` does not name the events URI.
    MethodExtensionNotActivated,
    /// A DataPart under `agentd`, and the header does not name the command URI.
    ExtensionNotActivated,
    /// A command, and `message.extensions` does not list the command URI.
    ExtensionNotMarked,
    /// More than one part carries a command.
    CommandEnvelopeAmbiguous,
    /// A command message names a `taskId`.
    CommandTaskId,
    /// No op of that name is served here.
    UnknownOp,
    /// The arguments do not match the op's schema.
    InvalidCommandArgs,
    /// An introspection op while `a2a.introspection.enabled` is off.
    IntrospectionDisabled,
    /// The caller's role and grants do not reach the op.
    PermissionDenied,
    /// An op this instance's host does not serve yet.
    OpNotServed,
    /// No credential, or one that names nobody (HTTP 401).
    Unauthenticated,
    /// The instance drains: no new work (HTTP 200, with `Retry-After`).
    Draining,
    /// A rate or failure limit: HTTP 429 with `Retry-After`, and the same seconds as
    /// `retryAfterSeconds` in the metadata.
    RateLimited,
    /// A bound the caller reached that waiting or freeing something can clear (live
    /// subagents, say): metadata `limit` names the configuration key, `max` its value.
    LimitReached,
    /// The durable store cannot write (a full disk, an I/O error): changes are refused, reads
    /// go on, and the store heals by itself. `Retry-After` as for a drain.
    StoreUnavailable,
    /// A retried task op whose first send is still being started by the host: try again in
    /// a moment (`Retry-After: 1`) and get its task. Never run twice.
    InProgress,
}

/// What the table says about a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ErrorRow {
    pub(crate) code: i32,
    /// The spec's suggested message, used when a handler gives none.
    pub(crate) message: &'static str,
    /// `google.rpc.ErrorInfo.reason`, when the kind carries one.
    pub(crate) reason: Option<&'static str>,
    pub(crate) domain: &'static str,
    /// HTTP status of the response that carries it.
    pub(crate) http_status: u16,
}

impl ErrorKind {
    /// Every kind, in declaration order (`ALL[k as usize] == k`).
    pub const ALL: [ErrorKind; 28] = [
        ErrorKind::ParseError,
        ErrorKind::InvalidRequest,
        ErrorKind::MethodNotFound,
        ErrorKind::InvalidParams,
        ErrorKind::Internal,
        ErrorKind::TaskNotFound,
        ErrorKind::TaskNotCancelable,
        ErrorKind::PushNotificationNotSupported,
        ErrorKind::UnsupportedOperation,
        ErrorKind::ContentTypeNotSupported,
        ErrorKind::VersionNotSupported,
        ErrorKind::ExtensionNotDeclared,
        ErrorKind::MethodExtensionNotActivated,
        ErrorKind::ExtensionNotActivated,
        ErrorKind::ExtensionNotMarked,
        ErrorKind::CommandEnvelopeAmbiguous,
        ErrorKind::CommandTaskId,
        ErrorKind::UnknownOp,
        ErrorKind::InvalidCommandArgs,
        ErrorKind::IntrospectionDisabled,
        ErrorKind::PermissionDenied,
        ErrorKind::OpNotServed,
        ErrorKind::Unauthenticated,
        ErrorKind::Draining,
        ErrorKind::RateLimited,
        ErrorKind::LimitReached,
        ErrorKind::StoreUnavailable,
        ErrorKind::InProgress,
    ];

    pub(crate) const fn row(self) -> ErrorRow {
        use ErrorKind::*;
        let (code, message, reason, domain) = match self {
            ParseError => (-32700, "Invalid JSON payload", None, A2A_DOMAIN),
            InvalidRequest => (-32600, "Request payload validation error", None, A2A_DOMAIN),
            MethodNotFound => (-32601, "Method not found", None, A2A_DOMAIN),
            InvalidParams => (-32602, "Invalid parameters", None, A2A_DOMAIN),
            Internal => (-32603, "Internal error", None, A2A_DOMAIN),
            TaskNotFound => (-32001, "Task not found", Some("TASK_NOT_FOUND"), A2A_DOMAIN),
            TaskNotCancelable => (
                -32002,
                "Task cannot be canceled",
                Some("TASK_NOT_CANCELABLE"),
                A2A_DOMAIN,
            ),
            PushNotificationNotSupported => (
                -32003,
                "Push notifications are not supported",
                Some("PUSH_NOTIFICATION_NOT_SUPPORTED"),
                A2A_DOMAIN,
            ),
            UnsupportedOperation => (
                -32004,
                "This operation is not supported",
                Some("UNSUPPORTED_OPERATION"),
                A2A_DOMAIN,
            ),
            ContentTypeNotSupported => (
                -32005,
                "Incompatible content types",
                Some("CONTENT_TYPE_NOT_SUPPORTED"),
                A2A_DOMAIN,
            ),
            VersionNotSupported => (
                -32009,
                "Protocol version not supported",
                Some("VERSION_NOT_SUPPORTED"),
                A2A_DOMAIN,
            ),
            ExtensionNotDeclared => (
                -32601,
                "Method not found",
                Some("EXTENSION_NOT_DECLARED"),
                AGENTD_DOMAIN,
            ),
            MethodExtensionNotActivated => (
                -32601,
                "Method not found",
                Some("EXTENSION_NOT_ACTIVATED"),
                AGENTD_DOMAIN,
            ),
            ExtensionNotActivated => (
                -32602,
                "Invalid parameters",
                Some("EXTENSION_NOT_ACTIVATED"),
                AGENTD_DOMAIN,
            ),
            ExtensionNotMarked => (
                -32602,
                "Invalid parameters",
                Some("EXTENSION_NOT_MARKED"),
                AGENTD_DOMAIN,
            ),
            CommandEnvelopeAmbiguous => (
                -32602,
                "Invalid parameters",
                Some("COMMAND_ENVELOPE_AMBIGUOUS"),
                AGENTD_DOMAIN,
            ),
            CommandTaskId => (
                -32602,
                "Invalid parameters",
                Some("COMMAND_TASK_ID"),
                AGENTD_DOMAIN,
            ),
            UnknownOp => (
                -32602,
                "Invalid parameters",
                Some("UNKNOWN_OP"),
                AGENTD_DOMAIN,
            ),
            InvalidCommandArgs => (
                -32602,
                "Invalid parameters",
                Some("INVALID_COMMAND_ARGS"),
                AGENTD_DOMAIN,
            ),
            IntrospectionDisabled => (
                -32004,
                "This operation is not supported",
                Some("INTROSPECTION_DISABLED"),
                AGENTD_DOMAIN,
            ),
            PermissionDenied => (
                -31403,
                "Permission denied",
                Some("PERMISSION_DENIED"),
                AGENTD_DOMAIN,
            ),
            OpNotServed => (
                -32004,
                "This operation is not supported",
                Some("OP_NOT_SERVED"),
                AGENTD_DOMAIN,
            ),
            Draining => (-32603, "Internal error", Some("DRAINING"), AGENTD_DOMAIN),
            LimitReached => (
                -32603,
                "Internal error",
                Some("LIMIT_REACHED"),
                AGENTD_DOMAIN,
            ),
            RateLimited => (
                -32603,
                "Internal error",
                Some("RATE_LIMITED"),
                AGENTD_DOMAIN,
            ),
            StoreUnavailable => (
                -32603,
                "Internal error",
                Some("STORE_UNAVAILABLE"),
                AGENTD_DOMAIN,
            ),
            InProgress => (-32603, "Internal error", Some("IN_PROGRESS"), AGENTD_DOMAIN),
            Unauthenticated => (
                -31401,
                "Unauthenticated",
                Some("UNAUTHENTICATED"),
                AGENTD_DOMAIN,
            ),
        };
        ErrorRow {
            code,
            message,
            reason,
            domain,
            // Only authorization answers at the HTTP layer too; every other refusal is a
            // JSON-RPC error at 200, which is what A2A clients parse.
            http_status: match self {
                PermissionDenied => 403,
                Unauthenticated => 401,
                RateLimited => 429,
                _ => 200,
            },
        }
    }
}

/// One field a `google.rpc.BadRequest` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field's path in the params, dotted.
    pub field: String,
    /// What is wrong with it.
    pub description: String,
}

/// A typed refusal. Rendered only by [`RpcError::to_json`].
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    /// The row of the error table: code, reason, domain and HTTP status.
    pub kind: ErrorKind,
    /// The human-readable `message` member.
    pub message: String,
    /// `ErrorInfo.metadata` (string values, as google.rpc requires).
    pub metadata: Vec<(&'static str, String)>,
    /// The fields a `google.rpc.BadRequest` detail names, for invalid params.
    pub violations: Vec<FieldViolation>,
}

impl RpcError {
    /// A refusal of `kind` with its own message and no metadata.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RpcError {
            kind,
            message: message.into(),
            metadata: Vec::new(),
            violations: Vec::new(),
        }
    }

    /// The kind with the table's default message.
    pub fn of(kind: ErrorKind) -> Self {
        Self::new(kind, kind.row().message)
    }

    /// Adds an `ErrorInfo.metadata` entry (a `taskId`, a `limit`): what a client can act on.
    pub fn with_meta(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.metadata.push((key, value.into()));
        self
    }

    /// An invalid-params refusal naming one field.
    pub(crate) fn invalid_field(field: impl Into<String>, description: impl Into<String>) -> Self {
        let field = field.into();
        let description = description.into();
        RpcError {
            kind: ErrorKind::InvalidParams,
            message: format!("invalid params: {field}: {description}"),
            metadata: Vec::new(),
            violations: vec![FieldViolation { field, description }],
        }
    }

    pub(crate) fn task_not_found(id: &str) -> Self {
        Self::new(ErrorKind::TaskNotFound, format!("task not found: {id}")).with_meta("taskId", id)
    }

    /// A rate or failure limit: try again in `secs` seconds (at least 1).
    pub(crate) fn rate_limited(message: impl Into<String>, secs: u32) -> Self {
        Self::new(ErrorKind::RateLimited, message)
            .with_meta("retryAfterSeconds", secs.max(1).to_string())
    }

    /// Seconds a client should wait before trying again, sent as `Retry-After`.
    pub(crate) fn retry_after(&self) -> Option<u32> {
        match self.kind {
            ErrorKind::Draining | ErrorKind::StoreUnavailable => Some(5),
            ErrorKind::InProgress => Some(1),
            ErrorKind::RateLimited => Some(
                self.metadata
                    .iter()
                    .find(|(k, _)| *k == "retryAfterSeconds")
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(1),
            ),
            _ => None,
        }
    }

    pub(crate) fn http_status(&self) -> u16 {
        self.kind.row().http_status
    }

    /// The JSON-RPC `code` of its kind.
    pub fn code(&self) -> i32 {
        self.kind.row().code
    }

    /// The JSON-RPC `error` member.
    pub fn to_json(&self) -> Value {
        let row = self.kind.row();
        let mut details = Vec::new();
        if let Some(reason) = row.reason {
            let mut info = json!({
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": row.domain,
            });
            if !self.metadata.is_empty() {
                let meta: serde_json::Map<String, Value> = self
                    .metadata
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Value::String(v.clone())))
                    .collect();
                info["metadata"] = Value::Object(meta);
            }
            details.push(info);
        }
        if !self.violations.is_empty() {
            let fv: Vec<Value> = self
                .violations
                .iter()
                .map(|v| json!({"field": v.field, "description": v.description}))
                .collect();
            details.push(json!({
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": fv,
            }));
        }
        let mut err = json!({"code": row.code, "message": self.message});
        if !details.is_empty() {
            err["data"] = Value::Array(details);
        }
        err
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let row = self.kind.row();
        match row.reason {
            Some(reason) => write!(f, "{} {reason}: {}", row.code, self.message),
            None => write!(f, "{}: {}", row.code, self.message),
        }
    }
}

impl std::error::Error for RpcError {}

/// Declares a public error type that carries why, in words a log line or a refusal can
/// quote: what the core's parsers and checks return instead of a bare `String`.
macro_rules! reason_error {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct $name(pub String);

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::error::Error for $name {}

        impl From<String> for $name {
            fn from(why: String) -> Self {
                $name(why)
            }
        }

        impl From<&str> for $name {
            fn from(why: &str) -> Self {
                $name(why.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(e: $name) -> String {
                e.0
            }
        }
    )*};
}

reason_error! {
    /// A durable record the core cannot take back (a task, a push config, a session):
    /// malformed, of an unknown version or kind.
    RecordError;
    /// A webhook URL or address refused: not https, a host delivery would not reach, an
    /// address the push policy forbids.
    WebhookError;
    /// A configuration value refused when the instance is built: a CORS origin, a rate,
    /// a TLS certificate or key.
    ConfigError;
    /// A `Last-Event-ID` that names no event of the task's stream.
    EventIdError;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_kind_at_its_own_index() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        // A kind added after the last one must be added to ALL too.
        assert_eq!(ErrorKind::InProgress as usize + 1, ErrorKind::ALL.len());
    }

    #[test]
    fn codes_match_the_a2a_table() {
        let expect = [
            (ErrorKind::ParseError, -32700),
            (ErrorKind::InvalidRequest, -32600),
            (ErrorKind::MethodNotFound, -32601),
            (ErrorKind::InvalidParams, -32602),
            (ErrorKind::Internal, -32603),
            (ErrorKind::TaskNotFound, -32001),
            (ErrorKind::TaskNotCancelable, -32002),
            (ErrorKind::PushNotificationNotSupported, -32003),
            (ErrorKind::UnsupportedOperation, -32004),
            (ErrorKind::ContentTypeNotSupported, -32005),
            (ErrorKind::VersionNotSupported, -32009),
            (ErrorKind::ExtensionNotDeclared, -32601),
            (ErrorKind::MethodExtensionNotActivated, -32601),
            (ErrorKind::ExtensionNotActivated, -32602),
            (ErrorKind::ExtensionNotMarked, -32602),
            (ErrorKind::CommandEnvelopeAmbiguous, -32602),
            (ErrorKind::CommandTaskId, -32602),
            (ErrorKind::UnknownOp, -32602),
            (ErrorKind::InvalidCommandArgs, -32602),
            (ErrorKind::IntrospectionDisabled, -32004),
            (ErrorKind::PermissionDenied, -31403),
        ];
        assert_eq!(ErrorKind::PermissionDenied.row().http_status, 403);
        assert_eq!(ErrorKind::RateLimited.row().http_status, 429);
        assert_eq!(ErrorKind::RateLimited.row().code, -32603);
        assert_eq!(ErrorKind::RateLimited.row().reason, Some("RATE_LIMITED"));
        assert_eq!(ErrorKind::ContentTypeNotSupported.row().domain, A2A_DOMAIN);
        assert_eq!(ErrorKind::UnknownOp.row().domain, AGENTD_DOMAIN);
        for (kind, code) in expect {
            assert_eq!(kind.row().code, code, "{kind:?}");
        }
    }

    #[test]
    fn rate_limited_carries_its_seconds_twice() {
        let e = RpcError::rate_limited("slow down", 7);
        assert_eq!(e.retry_after(), Some(7));
        assert_eq!(e.http_status(), 429);
        let j = e.to_json();
        assert_eq!(j["code"], -32603);
        assert_eq!(j["data"][0]["reason"], "RATE_LIMITED");
        assert_eq!(j["data"][0]["domain"], AGENTD_DOMAIN);
        assert_eq!(j["data"][0]["metadata"]["retryAfterSeconds"], "7");
        assert_eq!(RpcError::rate_limited("x", 0).retry_after(), Some(1));
    }

    #[test]
    fn details_are_an_array_of_typed_objects() {
        let e = RpcError::of(ErrorKind::VersionNotSupported).with_meta("supportedVersions", "1.0");
        let j = e.to_json();
        assert_eq!(j["code"], -32009);
        assert_eq!(
            j["data"][0],
            json!({"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"VERSION_NOT_SUPPORTED","domain":"a2a-protocol.org","metadata":{"supportedVersions":"1.0"}})
        );
        let p = RpcError::invalid_field("message.role", "must be ROLE_USER").to_json();
        assert_eq!(
            p["data"][0]["@type"],
            "type.googleapis.com/google.rpc.BadRequest"
        );
        assert_eq!(p["data"][0]["fieldViolations"][0]["field"], "message.role");
        assert!(RpcError::of(ErrorKind::ParseError)
            .to_json()
            .get("data")
            .is_none());
    }
}
