//! The blocking server: a thread per listener, a thread per connection (bounded).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Wake, Waker};
use std::thread;
use std::time::Duration;

use agentd_core::auth::Peer;
use agentd_core::reqlog::{Keep, Phase, RequestRecord};
use agentd_core::{Connection, Instance};

use crate::os::{
    answer_busy, out_of_descriptors, start_connection_bound, transient_accept_error,
    unix_peer_allowed, AcceptBackoff, BoundListener, Clock, LogThrottle, SpareFd,
};

/// How the driver runs.
#[derive(Clone, Copy, Debug)]
pub struct DriverOptions {
    /// Connections served at once; past it a new connection is answered 503 and closed.
    /// [`serve`] lowers it to what the open-file limit allows
    /// ([`crate::os::start_connection_bound`]).
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
}

impl ServerHandle {
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
    let active = Arc::new(AtomicUsize::new(0));
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
    })
}

#[derive(Clone)]
struct AcceptContext {
    instance: Arc<Mutex<Instance>>,
    stop: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
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
        if self.active.fetch_add(1, Ordering::SeqCst) >= self.options.max_connections {
            self.active.fetch_sub(1, Ordering::SeqCst);
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
                active.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("could not start a connection thread");
        }
    }

    fn lock(&self) -> MutexGuard<'_, Instance> {
        // A panic while holding the lock cannot leave the instance half-changed in a way a
        // later request would misread more than a crash would; keep serving.
        self.instance.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn serve<S: Stream>(self, mut stream: S, peer: Peer, source: Option<std::net::IpAddr>) {
        let notify = Arc::new(ThreadNotify {
            thread: thread::current(),
            woken: AtomicBool::new(false),
        });
        let waker = Waker::from(notify.clone());
        let now = self.clock.now();
        let limits = self.lock().config().conn;
        let _ =
            stream.set_write_timeout(Some(Duration::from_millis(limits.write_timeout_ms.max(1))));
        let mut conn = Connection::new(self.index, peer, limits, waker, now);
        conn.keep_records(request_log_keep());
        if let Some(ip) = source {
            conn.set_source(ip);
        }
        let mut buf = vec![0u8; self.options.read_buffer];
        loop {
            {
                let now = self.clock.now();
                conn.poll(&mut self.lock(), now);
            }
            log_requests(&mut conn);
            if !conn.pending_output().is_empty() {
                if !flush(&mut stream, &mut conn, &self.clock) {
                    break;
                }
                // Writing may have made room for more (a long replay): poll again first.
                continue;
            }
            if conn.is_finished() {
                break;
            }
            let now = self.clock.now();
            let deadline = conn.poll_timeout();
            if conn.wants_read() {
                let wait = deadline.map(|d| self.clock.until(now, d).max(Duration::from_millis(1)));
                let _ = stream.set_read_timeout(wait);
                match stream.read(&mut buf) {
                    Ok(0) => conn.handle_eof(&mut self.lock(), self.clock.now()),
                    Ok(n) => conn.handle_input(&mut self.lock(), &buf[..n], self.clock.now()),
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
            } else {
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

/// The throttled warning of connections answered 503 at the bound (both drivers): one line
/// per [`LogThrottle::INTERVAL`] at most, `refused` counting the connections it stands for.
pub fn log_refused(refused: u64, max_connections: usize) {
    tracing::warn!(
        refused,
        max_connections,
        "connection limit reached; answering 503 (refused: connections since the last such line)"
    );
}

/// The throttled warning of failed `accept` calls (both drivers): `failures` counts the
/// calls it stands for; `error` is the last one's (none once accepting works again).
pub fn log_accept_failed(failures: u64, error: Option<&io::Error>) {
    match error {
        Some(e) if out_of_descriptors(e) => tracing::warn!(
            error = %e,
            failures,
            "accept failed: out of file descriptors; answering 503 with a spare one, else \
             pausing up to 1 s (failures: since the last such line)"
        ),
        Some(e) => tracing::warn!(
            error = %e,
            failures,
            "accept failed; pausing up to 1 s (failures: since the last such line)"
        ),
        None => tracing::warn!(
            failures,
            "accept failed; accepting again (failures: since the last such line)"
        ),
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

/// The target of the request log's lines.
pub const REQUEST_LOG_TARGET: &str = "agentd::request";

/// Which request records a new connection should keep, from the log level in force: every
/// request's at `debug`, only limiter refusals at `info`, none below. Both drivers ask once
/// per connection, so a connection costs nothing for a log that would discard its lines.
pub fn request_log_keep() -> Keep {
    if tracing::enabled!(target: REQUEST_LOG_TARGET, tracing::Level::DEBUG) {
        Keep::All
    } else if tracing::enabled!(target: REQUEST_LOG_TARGET, tracing::Level::INFO) {
        Keep::Refusals
    } else {
        Keep::Off
    }
}

/// Logs the records `conn` queued (and says how many it had to drop). Call it after each
/// call into the connection, outside the instance's lock.
pub fn log_requests(conn: &mut Connection) {
    while let Some(r) = conn.poll_request_record() {
        log_request(&r);
    }
    let dropped = conn.take_dropped_records();
    if dropped.refusals > 0 {
        tracing::info!(
            target: REQUEST_LOG_TARGET,
            records = dropped.records,
            refusals = dropped.refusals,
            "request records dropped: more answers in one burst than a connection queues"
        );
    } else if dropped.records > 0 {
        tracing::debug!(
            target: REQUEST_LOG_TARGET,
            records = dropped.records,
            "request records dropped: more answers in one burst than a connection queues"
        );
    }
}

/// How often one source's refusals by one limiter are logged at `info`; the refusals in
/// between are counted and the next line says how many (`suppressed`). A flood of refused
/// requests is the very thing a limiter meets, and it must not flood the log too.
pub const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// (source, limiter) → when its last line was logged, and refusals since not logged.
type RefusalKey = (
    Option<agentd_core::limits::Source>,
    agentd_core::reqlog::Limiter,
);
static REFUSALS_LOGGED: std::sync::Mutex<
    Option<std::collections::HashMap<RefusalKey, (std::time::Instant, u64)>>,
> = std::sync::Mutex::new(None);

/// Sources whose refusal lines are remembered; past it the oldest are forgotten.
const REFUSAL_LOG_SOURCES: usize = 4096;

/// Whether this refusal gets its `info` line, and how many were held back before it.
fn refusal_line_due(key: RefusalKey) -> Option<u64> {
    let now = std::time::Instant::now();
    let mut guard = REFUSALS_LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(Default::default);
    if map.len() >= REFUSAL_LOG_SOURCES && !map.contains_key(&key) {
        map.retain(|_, (at, _)| now.duration_since(*at) < REFUSAL_LOG_EVERY);
        if map.len() >= REFUSAL_LOG_SOURCES {
            map.clear();
        }
    }
    match map.get_mut(&key) {
        Some((at, held)) if now.duration_since(*at) < REFUSAL_LOG_EVERY => {
            *held += 1;
            None
        }
        Some((at, held)) => {
            *at = now;
            Some(std::mem::take(held))
        }
        None => {
            map.insert(key, (now, 0));
            Some(0)
        }
    }
}

/// One request's log line: a limiter's refusal at `info` (at most one line per source and
/// limiter each [`REFUSAL_LOG_EVERY`], with the count held back), every other request, and
/// a refusal held back, at `debug`. Fields: `method` (the JSON-RPC method), `route` (HTTP
/// method and path), `status`, `duration_ms`, `principal`, `task` (`-` where there is
/// none), the JSON-RPC `error` code and `reason` of a refusal, and `phase` for a stream's
/// start and end or an abandoned request; a refusal adds `limiter`, `source` and
/// `retry_after_s`.
pub fn log_request(r: &RequestRecord) {
    let method = r.method.get().unwrap_or("-");
    let route = r.route.get().unwrap_or("-");
    let principal = r.principal.get().unwrap_or("-");
    let task = r.task_id.get().unwrap_or("-");
    let phase = (r.phase != Phase::Answered).then(|| r.phase.as_str());
    if let Some(refusal) = &r.refusal {
        if let Some(suppressed) = refusal_line_due((refusal.source, refusal.limiter)) {
            tracing::info!(
                target: REQUEST_LOG_TARGET,
                limiter = refusal.limiter.as_str(),
                source = %OrDash(refusal.source),
                retry_after_s = refusal.retry_after_s,
                method,
                route,
                status = r.status,
                duration_ms = r.duration_ms,
                principal,
                task,
                suppressed,
                "request refused by a limiter"
            );
            return;
        }
    }
    tracing::debug!(
        target: REQUEST_LOG_TARGET,
        method,
        route,
        status = r.status,
        duration_ms = r.duration_ms,
        principal,
        task,
        error = r.error_code(),
        reason = r.error_reason(),
        phase,
        "request"
    );
}

/// A value, or `-` without one.
struct OrDash<T>(Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for OrDash<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}
