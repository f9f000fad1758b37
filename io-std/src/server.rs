//! The blocking server: a thread per listener, a thread per connection (bounded).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::thread;
use std::time::Duration;

use agentd_core::auth::Peer;
use agentd_core::{Connection, Instance};

use agentd_io_common::lockstat::{self, TimedGuard};
use agentd_io_common::os::{
    answer_busy, out_of_descriptors, start_connection_bound, transient_accept_error,
    unix_peer_allowed, AcceptBackoff, BoundListener, Clock, LogThrottle, SpareFd,
};
use agentd_io_common::{
    log_accept_failed, log_refused, log_requests, request_log_keep, ConnGauge, ConnLoop, Next,
};

/// How the driver runs.
#[derive(Clone, Copy, Debug)]
pub struct DriverOptions {
    /// Connections served at once; past it a new connection is answered 503 and closed.
    /// [`serve`] lowers it to what the open-file limit allows
    /// ([`agentd_io_common::os::start_connection_bound`]).
    pub max_connections: usize,
    /// Bytes read from a socket at a time.
    pub read_buffer: usize,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            max_connections: 1024,
            read_buffer: 16 * 1024,
        }
    }
}

/// A running server; dropping it does not stop it, [`ServerHandle::shutdown`] does.
pub struct ServerHandle {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
    listeners: Vec<Arc<BoundListener>>,
    active: Arc<ConnGauge>,
}

impl ServerHandle {
    /// The open connections and their recent peak, for a host that gives memory back
    /// after a burst.
    pub fn connections(&self) -> Arc<ConnGauge> {
        self.active.clone()
    }

    /// Stops accepting, and removes unix socket files. Open connections end on their own
    /// deadlines.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        for l in &self.listeners {
            // Wake the accept call so it sees the flag.
            match &**l {
                BoundListener::Tcp(t) => {
                    if let Ok(addr) = t.local_addr() {
                        let _ = TcpStream::connect(addr);
                    }
                }
                BoundListener::Unix { path, .. } => {
                    let _ = UnixStream::connect(path);
                }
            }
        }
        for t in self.threads {
            let _ = t.join();
        }
        for l in &self.listeners {
            l.cleanup();
        }
    }

    /// Blocks until every accept thread ends (never, unless shut down from elsewhere).
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Serves `listeners` (their order is the instance's listener order) from `instance`.
/// Raises the open-file limit first and bounds the connections by it.
pub fn serve(
    instance: Arc<Mutex<Instance>>,
    listeners: Vec<BoundListener>,
    mut options: DriverOptions,
    clock: Clock,
) -> io::Result<ServerHandle> {
    options.max_connections = start_connection_bound(options.max_connections);
    let stop = Arc::new(AtomicBool::new(false));
    let active = Arc::new(ConnGauge::new());
    let shared = Arc::new(AcceptShared::default());
    let listeners: Vec<Arc<BoundListener>> = listeners.into_iter().map(Arc::new).collect();
    let mut threads = Vec::new();
    for (index, listener) in listeners.iter().enumerate() {
        let ctx = AcceptContext {
            instance: instance.clone(),
            stop: stop.clone(),
            active: active.clone(),
            shared: shared.clone(),
            options,
            clock,
            index,
        };
        let listener = listener.clone();
        threads.push(
            thread::Builder::new()
                .name(format!("agentd-accept-{index}"))
                .spawn(move || ctx.accept_loop(&listener))?,
        );
    }
    Ok(ServerHandle {
        stop,
        threads,
        listeners,
        active,
    })
}

#[derive(Clone)]
struct AcceptContext {
    instance: Arc<Mutex<Instance>>,
    stop: Arc<AtomicBool>,
    active: Arc<ConnGauge>,
    shared: Arc<AcceptShared>,
    options: DriverOptions,
    clock: Clock,
    index: usize,
}

/// What the accept loops of one server share: the spare descriptor and the throttles of
/// their repeated warnings.
#[derive(Debug)]
struct AcceptShared {
    spare: SpareFd,
    /// Connections answered 503 at the bound.
    refused: LogThrottle,
    /// `accept` calls that failed.
    accept_failed: LogThrottle,
}

impl Default for AcceptShared {
    fn default() -> Self {
        AcceptShared {
            spare: SpareFd::new(),
            refused: LogThrottle::new(LogThrottle::INTERVAL),
            accept_failed: LogThrottle::new(LogThrottle::INTERVAL),
        }
    }
}

/// The stream operations the connection loop needs from TCP and unix sockets alike.
trait Stream: Read + Write + Send + 'static {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()>;
}

impl Stream for TcpStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, d)
    }
}

impl Stream for UnixStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, d)
    }
}

impl AcceptContext {
    fn accept_loop(&self, listener: &BoundListener) {
        let mut backoff = AcceptBackoff::new();
        loop {
            let accepted = accept(listener);
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let accepted = match accepted {
                Ok(a) => {
                    backoff.succeeded();
                    if let Some(failures) = self.shared.accept_failed.flush() {
                        log_accept_failed(failures, None);
                    }
                    a
                }
                Err(e) if transient_accept_error(&e) => continue,
                Err(e) => {
                    if let Some(failures) = self.shared.accept_failed.hit() {
                        log_accept_failed(failures, Some(&e));
                    }
                    // Out of descriptors, `accept` fails before it looks at the queue, where
                    // a client may be waiting: answer it 503 with the spare descriptor
                    // rather than leave it to time out. With none queued (or no spare),
                    // pause, longer each time, instead of spinning: `accept` would fail
                    // again at once.
                    if out_of_descriptors(&e) && self.shed(listener) {
                        backoff.succeeded();
                        continue;
                    }
                    thread::sleep(backoff.failed());
                    continue;
                }
            };
            self.admit(accepted);
        }
    }

    /// Out of descriptors: takes one queued connection with the spare descriptor, answers
    /// it 503 and closes it. False when nothing was taken.
    fn shed(&self, listener: &BoundListener) -> bool {
        let taken = self.shared.spare.free_for(|| {
            // This thread is the listener's only acceptor: non-blocking just for this call,
            // so an empty queue does not hold the spare.
            let _ = set_nonblocking(listener, true);
            let taken = accept(listener);
            let _ = set_nonblocking(listener, false);
            if let Ok(accepted) = &taken {
                let allowed = match accepted {
                    Accepted::Tcp(_) => true,
                    Accepted::Unix(s) => matches!(unix_peer_allowed(s), Ok((true, _))),
                };
                if allowed {
                    accepted.refuse_busy();
                }
            }
            taken.is_ok()
        });
        taken == Some(true)
    }

    fn admit(&self, accepted: Accepted) {
        // The kernel's word on who the peer is comes first: a refused uid gets no byte
        // of HTTP, not even the busy answer.
        let mut peer = Peer::Tcp;
        if let Accepted::Unix(s) = &accepted {
            match unix_peer_allowed(s) {
                Ok((true, uid)) => peer = Peer::Unix { uid },
                Ok((false, uid)) => {
                    tracing::warn!(
                        uid,
                        "unix socket peer refused: not this daemon's uid or root"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "unix socket peer credentials unreadable");
                    return;
                }
            }
        }
        if !self.active.try_open(self.options.max_connections) {
            accepted.refuse_busy();
            if let Some(refused) = self.shared.refused.hit() {
                log_refused(refused, self.options.max_connections);
            }
            return;
        }
        if let Some(refused) = self.shared.refused.flush() {
            log_refused(refused, self.options.max_connections);
        }
        let ctx = self.clone();
        let spawned = thread::Builder::new()
            .name(format!("agentd-conn-{}", self.index))
            .spawn(move || {
                let active = ctx.active.clone();
                match accepted {
                    Accepted::Tcp(s) => {
                        let _ = s.set_nodelay(true);
                        // The failure limiter keys on the socket's own peer address.
                        let source = s.peer_addr().ok().map(|a| a.ip());
                        ctx.serve(s, peer, source)
                    }
                    Accepted::Unix(s) => ctx.serve(s, peer, None),
                }
                active.closed();
            });
        if spawned.is_err() {
            self.active.closed();
            tracing::warn!("could not start a connection thread");
        }
    }

    /// The shared instance (a poisoned lock is taken over), its hold counted when
    /// `AGENTD_LOCK_STATS` asks for it ([`agentd_io_common::lockstat`]).
    fn lock(&self) -> TimedGuard<'_, Instance> {
        lockstat::lock(&self.instance)
    }

    fn serve<S: Stream>(self, mut stream: S, peer: Peer, source: Option<std::net::IpAddr>) {
        let notify = Arc::new(ThreadNotify {
            thread: thread::current(),
            woken: AtomicBool::new(false),
        });
        let waker = Waker::from(notify.clone());
        let now = self.clock.now();
        let (limits, mut conn) = {
            let inst = self.lock();
            let limits = inst.config().conn;
            let mut conn = Connection::new(self.index, peer, limits, waker, now);
            // Its TLS configuration now, so the handshake runs outside the lock.
            conn.prepare(&inst);
            (limits, conn)
        };
        let _ =
            stream.set_write_timeout(Some(Duration::from_millis(limits.write_timeout_ms.max(1))));
        conn.keep_records(request_log_keep());
        if let Some(ip) = source {
            conn.set_source(ip);
        }
        let mut buf = vec![0u8; self.options.read_buffer];
        let mut lp = ConnLoop::new();
        loop {
            match lp.next(&conn) {
                Next::Close => break,
                Next::Poll => {
                    conn.serve(&mut self.lock(), self.clock.now());
                    lp.served(&mut conn, self.clock.now());
                    log_requests(&mut conn);
                }
                Next::Write => {
                    if !flush(&mut stream, &mut conn, &self.clock) {
                        break;
                    }
                    lp.written(&conn);
                }
                Next::Read { deadline } => {
                    let now = self.clock.now();
                    let wait =
                        deadline.map(|d| self.clock.until(now, d).max(Duration::from_millis(1)));
                    let _ = stream.set_read_timeout(wait);
                    match stream.read(&mut buf) {
                        Ok(0) => conn.handle_eof(&mut self.lock(), self.clock.now()),
                        // TLS runs here, outside the lock.
                        Ok(n) => lp.received(&mut conn, &buf[..n], self.clock.now()),
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) =>
                        {
                            conn.handle_timeout(&mut self.lock(), self.clock.now())
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                    log_requests(&mut conn);
                }
                Next::Wait { deadline } => {
                    let now = self.clock.now();
                    if !notify.woken.swap(false, Ordering::SeqCst) {
                        match deadline {
                            Some(d) => thread::park_timeout(self.clock.until(now, d)),
                            None => thread::park(),
                        }
                        notify.woken.store(false, Ordering::SeqCst);
                    }
                    let now = self.clock.now();
                    if deadline.is_some_and(|d| now.mono_ms >= d) {
                        conn.handle_timeout(&mut self.lock(), now);
                        log_requests(&mut conn);
                    }
                }
            }
        }
        conn.close(&mut self.lock());
        log_requests(&mut conn);
    }
}

/// A connection just accepted.
enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Accepted {
    /// Best effort, never blocking the accept loop: the server is at its connection limit.
    fn refuse_busy(&self) {
        match self {
            Accepted::Tcp(s) => answer_busy(s),
            Accepted::Unix(s) => answer_busy(s),
        }
    }
}

fn accept(listener: &BoundListener) -> io::Result<Accepted> {
    match listener {
        BoundListener::Tcp(l) => l.accept().map(|(s, _)| Accepted::Tcp(s)),
        BoundListener::Unix { listener: l, .. } => l.accept().map(|(s, _)| Accepted::Unix(s)),
    }
}

fn set_nonblocking(listener: &BoundListener, on: bool) -> io::Result<()> {
    match listener {
        BoundListener::Tcp(l) => l.set_nonblocking(on),
        BoundListener::Unix { listener: l, .. } => l.set_nonblocking(on),
    }
}

/// Writes all pending output. False when the peer is gone or stopped reading.
fn flush<S: Stream>(stream: &mut S, conn: &mut Connection, clock: &Clock) -> bool {
    while !conn.pending_output().is_empty() {
        match stream.write(conn.pending_output()) {
            Ok(0) => return false,
            Ok(n) => conn.consume_output(n, clock.now()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Wakes a connection thread parked waiting for its task.
struct ThreadNotify {
    thread: thread::Thread,
    woken: AtomicBool,
}

impl Wake for ThreadNotify {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}
