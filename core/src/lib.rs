//! agentd-core: the sans-io A2A 1.0 protocol core of agentd.
//!
//! The core parses HTTP/1.1 and JSON-RPC bytes, runs the A2A task lifecycle and writes the
//! answers, without owning a socket, a clock, a thread or a source of randomness. A driver
//! feeds it bytes and time and writes out what it produces; a host runs the work it asks for.
//!
//! ```
//! use agentd_core::{Connection, Instance, InstanceConfig, ListenerInfo, ListenerKind, Now};
//! use agentd_core::auth::Peer;
//! use agentd_core::ids::CounterEntropy;
//!
//! let now = Now::new(0, 1_767_225_600_000);
//! let listener = ListenerInfo {
//!     kind: ListenerKind::Tcp,
//!     url: "http://127.0.0.1:8420/".into(),
//!     loopback: true,
//! };
//! let config = InstanceConfig::new(vec![listener]);
//! let mut instance = Instance::new(config.clone(), Box::new(CounterEntropy(1)), now);
//! let waker = std::task::Waker::noop().clone();
//! let mut conn = Connection::new(0, Peer::Tcp, config.conn, waker, now);
//!
//! conn.handle_input(&mut instance, b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n", now);
//! let answer = String::from_utf8_lossy(conn.pending_output()).into_owned();
//! assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"));
//! assert!(answer.contains("\"protocolBinding\":\"JSONRPC\""));
//! ```
//!
//! A whole embedder, neither of agentd's drivers, is `examples/embed/` in the repository
//! (<https://github.com/agentd-dev/agentd/tree/main/examples/embed>): under 100 lines of std
//! and this crate, its own non-blocking loop over a TCP socket serves the card, SendMessage
//! and SendStreamingMessage, and answers every turn ([`Effect::Turn`]) with an echo through
//! [`Instance::poll_effect`] and [`Instance::handle_completion`]. Its test runs it as a
//! process over real HTTP, so CI builds and runs it.

#![forbid(unsafe_code)]

pub mod a2a;
pub mod audit;
pub mod auth;
pub mod client;
pub mod conn;
mod digest;
pub mod errors;
pub mod ext;
pub mod feed;
pub mod host;
pub mod http;
pub mod ids;
pub mod instance;
pub mod jsonrpc;
pub mod limits;
mod oauth;
pub mod push;
pub mod reqlog;
pub mod rpc;
pub mod sessions;
pub mod tasks;
mod time;
pub mod tls;
pub mod view;

pub use conn::Connection;
pub use host::{HostCapabilities, Op};
pub use instance::{
    CallId, CommandAnswer, Completion, CompletionError, ConnLimits, Effect, Instance,
    InstanceConfig, ListenerInfo, ListenerKind, Record, Records, Reloadable,
};
pub use time::Now;
