//! agentd-io-smol: the async driver. A small executor of its own (`executor.rs`, on
//! smol's task and reactor crates) runs an accept task per listener and a task per
//! connection; an `async-io` timer per connection (`deadline.rs`) carries the core's
//! deadlines, and a channel wakes a connection task when a task it watches changes.
//!
//! The operating-system helpers (clock, entropy, listener binding, the peer-uid check) are
//! shared with the blocking driver, [`agentd_io_common::os`].

#![forbid(unsafe_code)]

mod deadline;
mod executor;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::time::Duration;

use agentd_core::auth::Peer;
use agentd_core::{Connection, Instance};
use agentd_io_common::lockstat::{self, TimedGuard};
use agentd_io_common::os::{
    answer_busy, out_of_descriptors, start_connection_bound, transient_accept_error,
    unix_peer_allowed, AcceptBackoff, BoundListener, Clock, LogThrottle, SpareFd, BUSY_RESPONSE,
};
use agentd_io_common::{
    log_accept_failed, log_refused, log_requests, request_log_keep, ConnGauge, ConnLoop, Next,
};
use async_io::{Async, Timer};
use deadline::Deadline;
use executor::Executor;
use futures_lite::{future, AsyncWrite, AsyncWriteExt};

pub use agentd_io_common::os;

/// How the driver runs.
#[derive(Clone, Copy, Debug)]
pub struct DriverOptions {
    /// Connections served at once; past it a new connection is answered 503 and closed.
    /// [`serve`] lowers it to what the open-file limit allows
    /// ([`agentd_io_common::os::start_connection_bound`]).
    pub max_connections: usize,
    /// Bytes read from a socket at a time, into a buffer each executor thread shares among
    /// its connections (an idle connection holds none).
    pub read_buffer: usize,
    /// Threads running the executor.
    pub threads: usize,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            max_connections: 10_000,
            read_buffer: 16 * 1024,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// A running server.
pub struct ServerHandle {
    executor: Executor,
    stop: Arc<AtomicBool>,
    stop_tx: async_channel::Sender<()>,
    threads: Vec<std::thread::JoinHandle<()>>,
    listeners: Vec<Arc<BoundListener>>,
    active: Arc<ConnGauge>,
}

impl ServerHandle {
    /// The open connections and their recent peak, for a host that gives memory back
    /// after a burst.
    pub fn connections(&self) -> Arc<ConnGauge> {
        self.active.clone()
    }

    /// Runs a host's task on the executor threads beside the connections (the daemon's
    /// runtime runs here). The task must not block: what waits belongs on a thread of its
    /// own. It ends when it returns or when the executor stops.
    pub fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.executor.spawn(task).detach();
    }

    /// Stops the executor's threads and removes unix socket files. Tasks still open (the
    /// connections, the listeners) are not dropped: each holds the executor, so they end
    /// with the process, which is what the daemon does next.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stop_tx.close();
        for t in self.threads {
            let _ = t.join();
        }
        for l in &self.listeners {
            l.cleanup();
        }
    }

    /// Blocks until the executor threads end.
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
    let shared = Arc::new(Shared {
        spare: SpareFd::new(),
        refused: LogThrottle::new(LogThrottle::INTERVAL),
        accept_failed: LogThrottle::new(LogThrottle::INTERVAL),
    });
    let executor = Executor::new();
    let stop = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = async_channel::bounded::<()>(1);
    let active = Arc::new(ConnGauge::new());
    let listeners: Vec<Arc<BoundListener>> = listeners.into_iter().map(Arc::new).collect();
    for (index, listener) in listeners.iter().enumerate() {
        let ctx = Ctx {
            instance: instance.clone(),
            executor: executor.clone(),
            active: active.clone(),
            shared: shared.clone(),
            options,
            clock,
            index,
        };
        match &**listener {
            BoundListener::Tcp(l) => {
                let l = Async::new(l.try_clone()?)?;
                executor.spawn(ctx.accept_tcp(l)).detach();
            }
            BoundListener::Unix { listener: l, .. } => {
                let l = Async::new(l.try_clone()?)?;
                executor.spawn(ctx.accept_unix(l)).detach();
            }
        }
    }
    let mut threads = Vec::new();
    for i in 0..options.threads.max(1) {
        let ex = executor.clone();
        let rx = stop_rx.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("agentd-smol-{i}"))
                .spawn(move || {
                    let _ = smol::block_on(ex.run(rx.recv()));
                })?,
        );
    }
    Ok(ServerHandle {
        executor,
        stop,
        stop_tx,
        threads,
        listeners,
        active,
    })
}

#[derive(Clone)]
struct Ctx {
    instance: Arc<Mutex<Instance>>,
    executor: Executor,
    active: Arc<ConnGauge>,
    shared: Arc<Shared>,
    options: DriverOptions,
    clock: Clock,
    index: usize,
}

/// What the accept tasks of one server share: the spare descriptor and the throttles of
/// their repeated warnings.
struct Shared {
    spare: SpareFd,
    /// Connections answered 503 at the bound.
    refused: LogThrottle,
    /// `accept` calls that failed.
    accept_failed: LogThrottle,
}

impl Ctx {
    /// The shared instance (a poisoned lock is taken over), its hold counted when
    /// `AGENTD_LOCK_STATS` asks for it ([`agentd_io_common::lockstat`]).
    fn lock(&self) -> TimedGuard<'_, Instance> {
        lockstat::lock(&self.instance)
    }

    /// Sleeps on `timer` until the monotonic millisecond `deadline`; without one, forever.
    async fn sleep_until(&self, timer: &mut Deadline, deadline: Option<u64>) {
        timer
            .sleep_until(deadline.map(|d| self.clock.instant_at(d)))
            .await
    }

    /// Takes a connection slot, or answers 503 when none is free.
    async fn admit<S: AsyncWrite + Unpin>(&self, stream: &mut S) -> bool {
        if !self.active.try_open(self.options.max_connections) {
            if let Some(refused) = self.shared.refused.hit() {
                log_refused(refused, self.options.max_connections);
            }
            let _ = future::or(stream.write_all(BUSY_RESPONSE), async {
                Timer::after(Duration::from_millis(100)).await;
                Ok(())
            })
            .await;
            return false;
        }
        if let Some(refused) = self.shared.refused.flush() {
            log_refused(refused, self.options.max_connections);
        }
        true
    }

    /// An `accept` that failed: logs it (throttled). Out of descriptors, `accept` fails
    /// before it looks at the queue, where a client may be waiting: `shed` takes it off
    /// without blocking and answers it 503 with the spare descriptor (true when it did).
    /// With none queued (or no spare), pauses, longer each time, instead of spinning:
    /// `accept` would fail again at once.
    async fn accept_failed(
        &self,
        e: &io::Error,
        backoff: &mut AcceptBackoff,
        shed: impl FnOnce() -> bool,
    ) {
        if let Some(failures) = self.shared.accept_failed.hit() {
            log_accept_failed(failures, Some(e));
        }
        if out_of_descriptors(e) && self.shared.spare.free_for(shed) == Some(true) {
            backoff.succeeded();
            return;
        }
        Timer::after(backoff.failed()).await;
    }

    /// An `accept` that succeeded: the next failure pauses briefly again, and failures not
    /// yet reported are.
    fn accepted(&self, backoff: &mut AcceptBackoff) {
        backoff.succeeded();
        if let Some(failures) = self.shared.accept_failed.flush() {
            log_accept_failed(failures, None);
        }
    }

    async fn accept_tcp(self, listener: Async<std::net::TcpListener>) {
        let mut backoff = AcceptBackoff::new();
        loop {
            let (mut stream, source) = match listener.accept().await {
                Ok((s, addr)) => {
                    self.accepted(&mut backoff);
                    (s, addr.ip())
                }
                Err(e) if transient_accept_error(&e) => continue,
                Err(e) => {
                    // The listener is non-blocking: an empty queue does not hold the spare.
                    let shed = || match listener.get_ref().accept() {
                        Ok((s, _)) => {
                            answer_busy(&s);
                            true
                        }
                        Err(_) => false,
                    };
                    self.accept_failed(&e, &mut backoff, shed).await;
                    continue;
                }
            };
            let _ = stream.get_ref().set_nodelay(true);
            let ctx = self.clone();
            self.executor
                .spawn(async move {
                    if ctx.admit(&mut stream).await {
                        ctx.clone().serve(stream, Peer::Tcp, Some(source)).await;
                        ctx.active.closed();
                    }
                })
                .detach();
        }
    }

    async fn accept_unix(self, listener: Async<std::os::unix::net::UnixListener>) {
        let mut backoff = AcceptBackoff::new();
        loop {
            let mut stream = match listener.accept().await {
                Ok((s, _)) => {
                    self.accepted(&mut backoff);
                    s
                }
                Err(e) if transient_accept_error(&e) => continue,
                Err(e) => {
                    let shed = || match listener.get_ref().accept() {
                        Ok((s, _)) => {
                            // A refused uid gets no byte of HTTP, not even this answer.
                            if matches!(unix_peer_allowed(&s), Ok((true, _))) {
                                answer_busy(&s);
                            }
                            true
                        }
                        Err(_) => false,
                    };
                    self.accept_failed(&e, &mut backoff, shed).await;
                    continue;
                }
            };
            // The kernel's word on who the peer is, before any byte is read.
            let uid = match unix_peer_allowed(stream.get_ref()) {
                Ok((true, uid)) => uid,
                Ok((false, uid)) => {
                    tracing::warn!(
                        uid,
                        "unix socket peer refused: not this daemon's uid or root"
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "unix socket peer credentials unreadable");
                    continue;
                }
            };
            let ctx = self.clone();
            self.executor
                .spawn(async move {
                    if ctx.admit(&mut stream).await {
                        ctx.clone().serve(stream, Peer::Unix { uid }, None).await;
                        ctx.active.closed();
                    }
                })
                .detach();
        }
    }

    async fn serve<S: AsyncWrite + Unpin + ReadyRead>(
        self,
        mut stream: S,
        peer: Peer,
        source: Option<std::net::IpAddr>,
    ) {
        let (wake_tx, wake_rx) = async_channel::bounded::<()>(1);
        let waker = Waker::from(Arc::new(ChannelWake(wake_tx)));
        let (limits, mut conn) = {
            let inst = self.lock();
            let limits = inst.config().conn;
            let mut conn = Connection::new(self.index, peer, limits, waker, self.clock.now());
            // Its TLS configuration now, so the handshake runs outside the lock.
            conn.prepare(&inst);
            (limits, conn)
        };
        conn.keep_records(request_log_keep());
        // The failure limiter keys on the socket's own peer address; unix peers have none.
        if let Some(ip) = source {
            conn.set_source(ip);
        }
        let read_buffer = self.options.read_buffer;
        let write_timeout = Duration::from_millis(limits.write_timeout_ms.max(1));
        let mut lp = ConnLoop::new();
        // One timer for all the connection's waits: its deadlines mostly move later.
        let mut timer = Deadline::new();
        'conn: loop {
            match lp.next(&conn) {
                Next::Close => break,
                Next::Poll => {
                    conn.serve(&mut self.lock(), self.clock.now());
                    lp.served(&mut conn, self.clock.now());
                    log_requests(&mut conn);
                }
                Next::Write => {
                    while !conn.pending_output().is_empty() {
                        let written = future::or(
                            async { Some(stream.write(conn.pending_output()).await) },
                            async {
                                Timer::after(write_timeout).await;
                                None
                            },
                        )
                        .await;
                        match written {
                            Some(Ok(n)) if n > 0 => conn.consume_output(n, self.clock.now()),
                            // Gone, or not reading for the whole write timeout.
                            _ => break 'conn,
                        }
                    }
                    lp.written(&conn);
                }
                Next::Read { deadline } => {
                    // Wait for bytes without holding a buffer: 10,000 idle connections cost
                    // no read buffers. Once readable, read into this thread's buffer and hand
                    // the bytes to the core before the next await, so the buffer is never
                    // shared across a suspension.
                    let ready = future::or(async { Some(stream.ready_to_read().await) }, async {
                        self.sleep_until(&mut timer, deadline).await;
                        None
                    })
                    .await;
                    let now = self.clock.now();
                    match ready {
                        None => {
                            conn.handle_timeout(&mut self.lock(), now);
                            log_requests(&mut conn);
                        }
                        Some(Err(_)) => break,
                        Some(Ok(())) => {
                            let read = READ_BUFFER.with(|cell| {
                                let mut buf = cell.borrow_mut();
                                if buf.len() < read_buffer {
                                    buf.resize(read_buffer, 0);
                                }
                                match stream.try_read(&mut buf[..read_buffer]) {
                                    Ok(0) => Ok(false),
                                    Ok(n) => {
                                        // TLS runs here, outside the lock.
                                        lp.received(&mut conn, &buf[..n], now);
                                        Ok(true)
                                    }
                                    Err(e) => Err(e),
                                }
                            });
                            match read {
                                Ok(true) => {}
                                Ok(false) => {
                                    conn.handle_eof(&mut self.lock(), now);
                                    log_requests(&mut conn);
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                                    ) => {}
                                Err(_) => break,
                            }
                        }
                    }
                }
                Next::Wait { deadline } => {
                    let woken = future::or(async { wake_rx.recv().await.is_ok() }, async {
                        self.sleep_until(&mut timer, deadline).await;
                        false
                    })
                    .await;
                    if !woken {
                        conn.handle_timeout(&mut self.lock(), self.clock.now());
                        log_requests(&mut conn);
                    }
                }
            }
        }
        let _ = stream.close().await;
        conn.close(&mut self.lock());
        log_requests(&mut conn);
    }
}

thread_local! {
    /// The read buffer of the connections this executor thread runs.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A socket the driver can wait on without a buffer, then read without blocking.
trait ReadyRead {
    /// Resolves when a read would not block (bytes, EOF or an error are there).
    fn ready_to_read(&self) -> impl std::future::Future<Output = io::Result<()>>;
    /// A non-blocking read; `WouldBlock` after a spurious wake-up.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
}

impl ReadyRead for Async<std::net::TcpStream> {
    fn ready_to_read(&self) -> impl std::future::Future<Output = io::Result<()>> {
        self.readable()
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(&mut self.get_ref(), buf)
    }
}

impl ReadyRead for Async<std::os::unix::net::UnixStream> {
    fn ready_to_read(&self) -> impl std::future::Future<Output = io::Result<()>> {
        self.readable()
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(&mut self.get_ref(), buf)
    }
}

/// Wakes a connection task: a full channel already holds a wake-up, which is enough.
struct ChannelWake(async_channel::Sender<()>);

impl Wake for ChannelWake {
    fn wake(self: Arc<Self>) {
        let _ = self.0.try_send(());
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.0.try_send(());
    }
}
