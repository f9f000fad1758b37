//! agentd-io-common: what both drivers need from the operating system and write to the log,
//! so that neither driver depends on the other.
//!
//! [`os`] holds the clock, the entropy source, listener binding (a unix socket created mode
//! 0600 with no window in which it is wider), the peer-uid check, and what bounds the
//! connections by the open-file limit (raising it, the reserve, the spare descriptor, the
//! accept back-off and the throttle of the warnings that would otherwise repeat per
//! connection). [`conn_loop`] is the per-connection loop both drivers run, as decisions.
//! [`log`] holds the log lines both drivers write. [`lockstat`] counts how long
//! the drivers hold the shared instance lock, for `bench/`, when asked to. [`gauge`] counts
//! the open connections and their recent peak.

#![forbid(unsafe_code)]

pub mod conn_loop;
pub mod gauge;
pub mod lockstat;
pub mod log;
pub mod os;

pub use conn_loop::{ConnLoop, Next};
pub use gauge::ConnGauge;
pub use log::{
    log_accept_failed, log_refused, log_request, log_requests, request_log_keep, REFUSAL_LOG_EVERY,
    REQUEST_LOG_TARGET,
};
pub use os::{BoundListener, BufferedEntropy, Clock, Endpoint, OsEntropy};
