//! The per-connection loop both drivers run, as decisions: what to do next for one
//! connection. Each driver does the I/O, the waiting and the locking its own way (async
//! tasks on smol, a blocking thread per connection on std); this decides when the core is
//! polled (under the shared lock), when output is written and what to wait for, so the two
//! drivers cannot drift apart on it.
//!
//! ```text
//! loop {
//!     match lp.next(&conn) {
//!         Next::Poll => { conn.serve(&mut instance.lock(), now);     // under the lock
//!                         lp.served(&mut conn, now) }                 // framing, TLS: not
//!         Next::Write => { write pending_output, consume_output; lp.written(&conn) }
//!         Next::Read { deadline } => bytes: lp.received(&mut conn, bytes, now);
//!                                    end of input: conn.handle_eof(..);
//!                                    deadline: conn.handle_timeout(..)
//!         Next::Wait { deadline } => the waker: nothing; deadline: conn.handle_timeout(..)
//!         Next::Close => break,
//!     }
//! }
//! conn.close(&mut instance.lock());
//! ```

use agentd_core::{Connection, Now};

/// What the driver does next for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Call `Connection::serve` under the lock, then [`ConnLoop::served`] outside it (and
    /// take the request records).
    Poll,
    /// Write `pending_output`, reporting each write with `consume_output`, until none is
    /// left; then call [`ConnLoop::written`]. Close if the peer is gone or does not read for
    /// the write timeout.
    Write,
    /// Wait for bytes, or until `deadline` (a monotonic millisecond), whichever comes first:
    /// give bytes to [`ConnLoop::received`]; an end of input to `handle_eof`; at the
    /// deadline call `handle_timeout`.
    Read { deadline: Option<u64> },
    /// Wait for the connection's waker, or until `deadline` (then `handle_timeout`).
    Wait { deadline: Option<u64> },
    /// The connection is done: close the socket, then call `Connection::close` under the
    /// lock.
    Close,
}

/// One connection's loop state: whether the core must be polled before anything else.
#[derive(Debug)]
pub struct ConnLoop {
    poll: bool,
}

impl Default for ConnLoop {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnLoop {
    /// A new connection: polled first.
    pub fn new() -> Self {
        ConnLoop { poll: true }
    }

    /// What to do next.
    pub fn next(&mut self, conn: &Connection) -> Next {
        if conn.is_finished() {
            return Next::Close;
        }
        if std::mem::take(&mut self.poll) {
            return Next::Poll;
        }
        if !conn.pending_output().is_empty() {
            return Next::Write;
        }
        // After the wait, whatever ends it (a wake-up, a deadline, the end of input), the
        // core is polled again; bytes say themselves whether it must be ([`received`]).
        //
        // [`received`]: ConnLoop::received
        self.poll = true;
        let deadline = conn.poll_timeout();
        if conn.wants_read() {
            Next::Read { deadline }
        } else {
            Next::Wait { deadline }
        }
    }

    /// All pending output was written: the core is polled again first if writing may have
    /// made room for more (a long replay, the next frames of a stream); a feed subscriber
    /// that took everything there was waits for its next wake-up instead.
    pub fn written(&mut self, conn: &Connection) {
        self.poll = conn.serve_after_write();
    }

    /// `Connection::serve` ran (under the lock): what it decided is framed and encrypted
    /// here, outside the lock. The core is served again first if a request waits behind
    /// the answer just framed.
    pub fn served(&mut self, conn: &mut Connection, now: Now) {
        self.poll = conn.produce(now);
    }

    /// Bytes read from the peer, given to the connection without the instance (a TLS
    /// handshake runs here, outside the lock). The core is polled next only if they brought
    /// something to answer.
    pub fn received(&mut self, conn: &mut Connection, bytes: &[u8], now: Now) {
        self.poll = conn.receive(bytes, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_core::auth::Peer;
    use agentd_core::ids::CounterEntropy;
    use agentd_core::{Instance, InstanceConfig, ListenerInfo, ListenerKind};

    fn setup() -> (Instance, Connection, Now) {
        let now = Now::new(0, 1_767_225_600_000);
        let config = InstanceConfig::new(vec![ListenerInfo {
            kind: ListenerKind::Tcp,
            url: "http://127.0.0.1:8420/".into(),
            loopback: true,
        }]);
        let inst = Instance::new(config.clone(), Box::new(CounterEntropy(1)), now);
        let waker = std::task::Waker::noop().clone();
        let mut conn = Connection::new(0, Peer::Tcp, config.conn, waker, now);
        conn.prepare(&inst);
        (inst, conn, now)
    }

    #[test]
    fn a_request_is_polled_once_answered_and_written_then_read_again() {
        let (mut inst, mut conn, now) = setup();
        let mut lp = ConnLoop::new();
        assert_eq!(
            lp.next(&conn),
            Next::Poll,
            "a new connection is polled first"
        );
        conn.poll(&mut inst, now);
        let Next::Read { .. } = lp.next(&conn) else {
            panic!("an idle connection reads")
        };
        lp.received(
            &mut conn,
            b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n",
            now,
        );
        assert_eq!(
            lp.next(&conn),
            Next::Poll,
            "a request is answered under the lock"
        );
        conn.poll(&mut inst, now);
        assert_eq!(lp.next(&conn), Next::Write);
        let n = conn.pending_output().len();
        conn.consume_output(n, now);
        lp.written(&conn);
        assert_eq!(lp.next(&conn), Next::Poll, "written: polled again first");
        conn.poll(&mut inst, now);
        assert!(matches!(lp.next(&conn), Next::Read { .. }));
    }

    /// A feed subscriber that took every event there was waits for the wake-up of the next
    /// one after writing, instead of taking the lock again to find nothing.
    #[test]
    fn a_caught_up_feed_waits_for_its_wake_up_after_writing() {
        let now = Now::new(0, 1_767_225_600_000);
        let mut config = InstanceConfig::new(vec![ListenerInfo {
            kind: ListenerKind::Tcp,
            url: "http://127.0.0.1:8420/".into(),
            loopback: true,
        }]);
        config.events_enabled = true;
        let mut inst = Instance::new(config.clone(), Box::new(CounterEntropy(1)), now);
        let waker = std::task::Waker::noop().clone();
        let mut conn = Connection::new(0, Peer::Tcp, config.conn, waker, now);
        conn.prepare(&inst);
        let mut lp = ConnLoop::new();
        assert_eq!(lp.next(&conn), Next::Poll);
        conn.poll(&mut inst, now);
        let body =
            r#"{"jsonrpc":"2.0","id":1,"method":"agentd.events/SubscribeToEvents","params":{}}"#;
        let req = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
             A2A-Extensions: https://agentd.dev/a2a/ext/events\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        lp.received(&mut conn, req.as_bytes(), now);
        assert_eq!(lp.next(&conn), Next::Poll);
        conn.serve(&mut inst, now);
        lp.served(&mut conn, now);
        assert_eq!(lp.next(&conn), Next::Write, "the hello");
        let n = conn.pending_output().len();
        conn.consume_output(n, now);
        lp.written(&conn);
        assert!(
            matches!(lp.next(&conn), Next::Wait { .. }),
            "nothing more on the ring: no poll until a wake-up"
        );
        assert_eq!(lp.next(&conn), Next::Poll, "after the wait, polled");
    }

    #[test]
    fn input_with_nothing_to_answer_needs_no_poll() {
        let (mut inst, mut conn, now) = setup();
        let mut lp = ConnLoop::new();
        assert_eq!(lp.next(&conn), Next::Poll);
        conn.poll(&mut inst, now);
        assert!(matches!(lp.next(&conn), Next::Read { .. }));
        lp.received(&mut conn, b"", now);
        assert!(
            matches!(lp.next(&conn), Next::Read { .. }),
            "no bytes: no poll, back to reading"
        );
        conn.handle_eof(&mut inst, now);
        assert_eq!(
            lp.next(&conn),
            Next::Close,
            "the peer left and nothing is owed"
        );
    }
}
