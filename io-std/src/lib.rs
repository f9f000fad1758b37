//! agentd-io-std: the blocking driver. A thread accepts on each listener; each connection
//! gets a thread that moves bytes between its socket and the core's [`Connection`], sleeps
//! on read timeouts taken from `poll_timeout`, and parks while it waits for a task.
//!
//! The [`os`] module holds what both drivers need from the operating system: the clock, the
//! entropy source, listener binding (a unix socket created mode 0600 with no window in which
//! it is wider), the peer-uid check, and what bounds the connections by the open-file limit
//! (raising it, the reserve, the spare descriptor, the accept back-off and the throttle of
//! the warnings that would otherwise repeat per connection).

#![forbid(unsafe_code)]

pub mod os;
mod server;

pub use os::{BoundListener, Clock, Endpoint, OsEntropy};
pub use server::{
    log_accept_failed, log_refused, log_request, log_requests, request_log_keep, serve,
    DriverOptions, ServerHandle, REQUEST_LOG_TARGET,
};

pub use agentd_core::Connection;
