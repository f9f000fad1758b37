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
//!
//! # The run loop
//!
//! A driver owns the sockets, the clock, the entropy and any threads. It keeps one
//! [`Instance`] (the daemon's state: tasks, sessions, limits, the event feed) and one
//! [`Connection`] per accepted socket, and hands every call the time as a [`Now`]. The core
//! never blocks: each call does a bounded slice of work and returns.
//!
//! For each connection:
//!
//! 1. [`Connection::new`] with what the transport proved about the peer ([`auth::Peer`]),
//!    the configuration's [`ConnLimits`] (`InstanceConfig::conn`) and a waker; a TCP
//!    driver then tells it the peer's address ([`Connection::set_source`]) for the failure
//!    limiter.
//! 2. While [`Connection::wants_read`], read and pass the bytes to
//!    [`Connection::handle_input`]; at end of stream, [`Connection::handle_eof`]. A driver
//!    that shares the instance behind a lock splits the call in three:
//!    [`Connection::receive`] outside the lock (TLS, and the HTTP parser reading the next
//!    request ahead), [`Connection::serve`] under it (the answers decided, a stream's
//!    events taken), then [`Connection::produce`] outside it again (the answers and stream
//!    frames written, a large one sliced, TLS), and `serve` again while `produce` returns
//!    true. `handle_input` and `poll` are
//!    the three together.
//! 3. Write [`Connection::pending_output`] and report what the socket took with
//!    [`Connection::consume_output`].
//! 4. Wake at [`Connection::poll_timeout`] and call [`Connection::handle_timeout`]; when the
//!    waker fires (a task the connection watches changed), call [`Connection::poll`].
//! 5. Once [`Connection::is_finished`], close the socket, then [`Connection::close`] to
//!    release what the connection held in the instance.
//!
//! For the instance, the host's side:
//!
//! - Drain [`Instance::poll_effect`] and do each [`Effect`] (a turn, a command, a webhook
//!   delivery, a cancel); report back with [`Instance::handle_completion`]. Both enums are
//!   `#[non_exhaustive]`: a host logs and skips an effect it does not know.
//! - With write-ahead on ([`Instance::set_write_ahead`]), drain [`Instance::poll_records`],
//!   make them durable (each body is JSON text to write as it is), then call
//!   [`Instance::records_durable`]: an answer that acknowledges
//!   a change leaves only after that. While [`Instance::records_awaited`] is false a host
//!   may let changes gather for a moment before draining them (fewer, fuller writes).
//!
//! # The public surface
//!
//! The re-exports below are the run loop. The public modules hold what a driver or an
//! embedder configures and reads: [`a2a`] (the wire types and the card's skills), [`auth`]
//! (peers, principals, credentials), [`tls`] (listener certificates and client-certificate
//! rules), [`sessions`] (the device grant), [`limits`], [`push`] (the webhook policy),
//! [`host`] (the typed ops a host serves), [`ext`] (the extension registry and the command
//! table), [`feed`] (the event feed), [`reqlog`] (request-log records), [`audit`] (audit
//! targets), [`errors`] (the error table), [`ids`] (entropy), [`jsonrpc`] and [`http`] (the
//! envelope and HTTP types the fuzz targets drive), and [`client`] (the sans-io A2A client
//! for outbound calls). [`conn`] (the connection), [`instance`] (the shared state), [`view`]
//! (what the host publishes for `status`), [`tasks`] (the task store and its listing
//! indexes) and [`rpc`] (what the daemon's runtime reaches into) are the rest.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

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
pub mod metrics;
mod oauth;
pub mod proxy;
pub mod push;
mod ready;
pub mod reqlog;
pub mod rpc;
pub mod sessions;
pub mod statics;
pub mod tasks;
mod time;
pub mod tls;
pub mod trace;
pub mod view;

pub use conn::Connection;
pub use host::{HostCapabilities, Op};
pub use instance::{
    CallId, CommandAnswer, Completion, CompletionError, ConnLimits, Effect, Instance,
    InstanceConfig, ListenerInfo, ListenerKind, Record, RecordBody, Records, Reloadable,
};
pub use time::Now;
