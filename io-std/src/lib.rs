//! agentd-io-std: the blocking driver. A thread accepts on each listener; each connection
//! gets a thread that moves bytes between its socket and the core's [`Connection`], sleeps
//! on read timeouts taken from `poll_timeout`, and parks while it waits for a task. What it
//! shares with the async driver (the OS helpers, the log lines) is in `agentd-io-common`.

#![forbid(unsafe_code)]

mod server;

pub use server::{serve, DriverOptions, ServerHandle};

pub use agentd_core::Connection;
