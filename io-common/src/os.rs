//! What the drivers take from the operating system.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentd_core::ids::Entropy;
use agentd_core::{ListenerInfo, ListenerKind, Now};

/// The driver's clock: monotonic milliseconds since it was made, and wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            origin: Instant::now(),
        }
    }

    pub fn now(&self) -> Now {
        let mono_ms = self.origin.elapsed().as_millis() as u64;
        let epoch_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Now::new(mono_ms, epoch_ms)
    }

    /// The instant of a monotonic millisecond the core named.
    pub fn instant_at(&self, mono_ms: u64) -> Instant {
        self.origin + Duration::from_millis(mono_ms)
    }

    /// How long from `now` until `mono_ms`; zero if it has passed.
    pub fn until(&self, now: Now, mono_ms: u64) -> Duration {
        Duration::from_millis(mono_ms.saturating_sub(now.mono_ms))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Entropy from the kernel's `getrandom`.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn fill(&mut self, buf: &mut [u8]) {
        let mut filled = 0;
        while filled < buf.len() {
            match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty())
            {
                Ok(n) => filled += n,
                Err(rustix::io::Errno::INTR) => {}
                // getrandom on Linux fails only for bad arguments; there is no fallback that
                // keeps identifiers unguessable, so stop rather than mint predictable ones.
                Err(e) => panic!("getrandom failed: {e}"),
            }
        }
    }
}

/// [`OsEntropy`] drawn a block at a time: one `getrandom` per [`ENTROPY_BLOCK`] bytes (32
/// identifiers) rather than one per identifier. The instance mints two identifiers for a
/// new task under its lock, where the two system calls were a tenth of the hold. Each byte
/// is handed out once and wiped from the block as it is; what is left is wiped on drop,
/// and `Debug` shows none of it (the bytes become session ids and codes).
pub struct BufferedEntropy {
    block: [u8; ENTROPY_BLOCK],
    /// Bytes of `block` already handed out (all of it: none left).
    used: usize,
}

/// The bytes [`BufferedEntropy`] draws at a time.
pub const ENTROPY_BLOCK: usize = 512;

impl BufferedEntropy {
    /// An empty block: the first fill draws one.
    pub fn new() -> Self {
        BufferedEntropy {
            block: [0; ENTROPY_BLOCK],
            used: ENTROPY_BLOCK,
        }
    }
}

impl fmt::Debug for BufferedEntropy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferedEntropy")
            .field("left", &(ENTROPY_BLOCK - self.used))
            .finish_non_exhaustive()
    }
}

impl Drop for BufferedEntropy {
    fn drop(&mut self) {
        self.block.fill(0);
        // A store to memory about to be freed may be optimized away; this keeps it.
        std::hint::black_box(&mut self.block);
    }
}

impl Default for BufferedEntropy {
    fn default() -> Self {
        Self::new()
    }
}

impl Entropy for BufferedEntropy {
    fn fill(&mut self, buf: &mut [u8]) {
        let mut filled = 0;
        while filled < buf.len() {
            if self.used == ENTROPY_BLOCK {
                OsEntropy.fill(&mut self.block);
                self.used = 0;
            }
            let n = (buf.len() - filled).min(ENTROPY_BLOCK - self.used);
            let taken = &mut self.block[self.used..self.used + n];
            buf[filled..filled + n].copy_from_slice(taken);
            taken.fill(0);
            self.used += n;
            filled += n;
        }
    }
}

/// Where a listener listens: `tcp://host:port` (also `http://host:port`) or
/// `unix:///absolute/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(SocketAddr),
    /// TCP with TLS (the core's connection carries the TLS session).
    Https(SocketAddr),
    Unix(PathBuf),
}

impl Endpoint {
    pub fn is_tls(&self) -> bool {
        matches!(self, Endpoint::Https(_))
    }
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!("{s}: a unix endpoint is unix:///absolute/path"));
            }
            if path.len() > MAX_UNIX_PATH {
                return Err(format!(
                    "{s}: a unix socket path is at most {MAX_UNIX_PATH} bytes (sun_path), not {}",
                    path.len()
                ));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let (addr, tls) = if let Some(a) = s.strip_prefix("https://") {
            (a, true)
        } else {
            let a = s
                .strip_prefix("tcp://")
                .or_else(|| s.strip_prefix("http://"))
                .ok_or_else(|| {
                    format!("{s}: expected tcp://host:port, https://host:port or unix:///path")
                })?;
            (a, false)
        };
        let addr = addr.strip_suffix('/').unwrap_or(addr);
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| format!("{s}: {addr} is not an ip:port address"))?;
        Ok(if tls {
            Endpoint::Https(addr)
        } else {
            Endpoint::Tcp(addr)
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
            Endpoint::Https(a) => write!(f, "https://{a}"),
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// A bound listening socket.
#[derive(Debug)]
pub enum BoundListener {
    Tcp(TcpListener),
    Unix {
        listener: UnixListener,
        path: PathBuf,
    },
}

/// The listen backlog a listener gets unless told otherwise (`limits.listen_backlog`): room
/// for a burst of connects that arrive faster than the accept loop takes them. The kernel
/// caps it at `net.core.somaxconn` (4096 by default since Linux 5.4). std's `bind` leaves
/// 128, which a burst of a few hundred connects overflows: the kernel then drops SYNs, and
/// each dropped client retries a second later.
pub const DEFAULT_LISTEN_BACKLOG: u32 = 4096;

/// The most a listen backlog may be: the kernel takes an `int` and caps it at somaxconn.
pub const MAX_LISTEN_BACKLOG: u32 = 65_535;

impl BoundListener {
    /// Binds `endpoint` with the [`DEFAULT_LISTEN_BACKLOG`].
    pub fn bind(endpoint: &Endpoint) -> io::Result<Self> {
        Self::bind_with_backlog(endpoint, DEFAULT_LISTEN_BACKLOG)
    }

    /// Binds `endpoint` and sets its listen backlog (at least 1, at most
    /// [`MAX_LISTEN_BACKLOG`]; the kernel lowers it to `net.core.somaxconn`). std binds with
    /// a backlog of 128 and has no way to name another: calling `listen` again on the
    /// listening socket is how Linux sets a new one (TCP and unix sockets alike), before
    /// any connection can have been queued.
    pub fn bind_with_backlog(endpoint: &Endpoint, backlog: u32) -> io::Result<Self> {
        let backlog = backlog.clamp(1, MAX_LISTEN_BACKLOG) as i32;
        match endpoint {
            Endpoint::Tcp(addr) | Endpoint::Https(addr) => {
                let l = TcpListener::bind(addr)?;
                rustix::net::listen(&l, backlog)?;
                Ok(BoundListener::Tcp(l))
            }
            Endpoint::Unix(path) => {
                let l = bind_unix_private(path)?;
                if let Err(e) = rustix::net::listen(&l, backlog) {
                    let _ = std::fs::remove_file(path);
                    return Err(e.into());
                }
                Ok(BoundListener::Unix {
                    listener: l,
                    path: path.clone(),
                })
            }
        }
    }

    /// What the core needs to know about it, for an `https://` listener.
    pub fn info_tls(&self, tls: bool) -> io::Result<ListenerInfo> {
        let mut info = self.info()?;
        if tls {
            info.url = info.url.replacen("http://", "https://", 1);
        }
        Ok(info)
    }

    /// What the core needs to know about it: the URL its card advertises.
    pub fn info(&self) -> io::Result<ListenerInfo> {
        Ok(match self {
            BoundListener::Tcp(l) => {
                let addr = l.local_addr()?;
                ListenerInfo {
                    kind: ListenerKind::Tcp,
                    url: format!("http://{addr}/"),
                    loopback: addr.ip().is_loopback(),
                }
            }
            BoundListener::Unix { path, .. } => ListenerInfo {
                kind: ListenerKind::Unix(path.display().to_string()),
                url: format!("unix://{}", path.display()),
                loopback: false,
            },
        })
    }

    /// Removes the socket file of a unix listener.
    pub fn cleanup(&self) {
        if let BoundListener::Unix { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The longest unix socket path: `sun_path` holds 108 bytes, the last a NUL.
pub const MAX_UNIX_PATH: usize = 107;

/// Binds a unix socket that is mode 0600 from the moment its path exists: it is bound
/// inside a fresh directory only its owner can enter, narrowed to 0600, then renamed into
/// place. (A process-wide umask would race with other threads creating files.)
fn bind_unix_private(path: &Path) -> io::Result<UnixListener> {
    if path.as_os_str().len() > MAX_UNIX_PATH {
        // It would bind (through the short staging path) but no client could connect.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a unix socket path is at most {MAX_UNIX_PATH} bytes (sun_path)",
                path.display()
            ),
        ));
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            // Never delete what is not ours to replace.
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is in use by a running server", path.display()),
            ));
        }
        // A socket left by a server that is gone.
        std::fs::remove_file(path)?;
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "socket path has no file name")
    })?;
    let mut suffix = [0u8; 8];
    OsEntropy.fill(&mut suffix);
    let staging = parent.join(format!(".agentd-bind-{}", agentd_core::ids::hex(&suffix)));
    std::fs::DirBuilder::new().mode_private().create(&staging)?;
    let result = (|| {
        // Bound under a short name, reached through the staging directory's descriptor
        // (`/proc/self/fd/N/s`), so the bind path stays short: a socket path may take all
        // 107 bytes `sun_path` allows, and the staging directory must not eat into them.
        let staged = staging.join("s");
        let dir = std::fs::File::open(&staging)?;
        let short = PathBuf::from(format!(
            "/proc/self/fd/{}/s",
            std::os::fd::AsRawFd::as_raw_fd(&dir)
        ));
        let listener = match UnixListener::bind(&short) {
            Ok(l) => l,
            // No /proc: the long way, which fits whenever the staging path does.
            Err(_) if !Path::new("/proc/self/fd").exists() => UnixListener::bind(&staged)?,
            Err(e) => return Err(e),
        };
        drop(dir);
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

trait DirBuilderPrivate {
    fn mode_private(&mut self) -> &mut Self;
}

impl DirBuilderPrivate for std::fs::DirBuilder {
    fn mode_private(&mut self) -> &mut Self {
        std::os::unix::fs::DirBuilderExt::mode(self, 0o700)
    }
}

/// Whether a unix-socket peer may be served: the daemon's own uid, or root. The answer
/// comes from the kernel (`SO_PEERCRED`), not from anything the peer says.
pub fn unix_peer_allowed(stream: impl AsFd) -> io::Result<(bool, u32)> {
    let cred = rustix::net::sockopt::socket_peercred(stream)?;
    let peer = cred.uid.as_raw();
    let me = rustix::process::getuid().as_raw();
    Ok((peer == me || peer == 0, peer))
}

/// Descriptors kept free beside the connections, at least: the daemon's own (stdio, the
/// listeners, the poller, the store's files, the signal pipes, the pipes of agents and exec
/// steps, push and delegation clients). About 20 are open at rest.
pub const FD_RESERVE_BASE: u64 = 64;

/// Beside [`FD_RESERVE_BASE`], this fraction (1/N) of the open-file limit is kept free too:
/// headroom that grows with the load, for the runtime's descriptors and for connections
/// accepted past the bound, each of which holds one while it is answered 503.
pub const FD_RESERVE_DIVISOR: u64 = 16;

/// The open-file limit (`RLIMIT_NOFILE`) of the process; `None` is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit the process started with.
    pub inherited: Option<u64>,
    /// The soft limit in force now.
    pub soft: Option<u64>,
    /// The hard limit: how far the soft one may be raised.
    pub hard: Option<u64>,
}

/// Raises the soft open-file limit to the hard one (a service manager often hands out 1024
/// beside a far higher hard limit) and says what is in force. Idempotent. If the kernel
/// refuses, the soft limit stays as it was. Processes started afterwards inherit the raised
/// limit.
pub fn raise_fd_limit() -> FdLimit {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    INHERITED_SOFT_NOFILE.get_or_init(|| before.current);
    let mut limit = FdLimit {
        inherited: before.current,
        soft: before.current,
        hard: before.maximum,
    };
    let raise = match (before.current, before.maximum) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(soft), Some(hard)) => soft < hard,
    };
    if raise {
        let to = Rlimit {
            current: before.maximum,
            maximum: before.maximum,
        };
        if setrlimit(Resource::Nofile, to).is_ok() {
            limit.soft = getrlimit(Resource::Nofile).current;
        }
    }
    limit
}

/// The soft open-file limit the process started with, recorded by the first
/// [`raise_fd_limit`].
static INHERITED_SOFT_NOFILE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

/// The soft open-file limit the process started with, once [`raise_fd_limit`] ran (`None`
/// inside: unlimited). The programs the daemon starts get it back: the raised limit is
/// for the daemon's own connections, and a child using `select()` breaks past 1024.
pub fn inherited_soft_fd_limit() -> Option<Option<u64>> {
    INHERITED_SOFT_NOFILE.get().copied()
}

/// The descriptors kept free under an open-file limit of `fd_limit`:
/// [`FD_RESERVE_BASE`] plus 1/[`FD_RESERVE_DIVISOR`] of the limit, never more than half
/// of it. 1024 keeps 128; 128 keeps 64; 65536 keeps 4160.
pub fn fd_reserve(fd_limit: u64) -> u64 {
    (FD_RESERVE_BASE + fd_limit / FD_RESERVE_DIVISOR).min(fd_limit / 2)
}

/// The connections the daemon may hold at once: `max_connections`, lowered to what the
/// open-file limit `fd_limit` leaves after [`fd_reserve`] (`None`: unlimited, no lowering).
/// Past it a connection is answered 503, which needs a descriptor of its own for a moment:
/// at the bound there is one.
pub fn connection_bound(max_connections: usize, fd_limit: Option<u64>) -> usize {
    match fd_limit {
        None => max_connections,
        Some(limit) => {
            let room = limit - fd_reserve(limit);
            max_connections.min(usize::try_from(room).unwrap_or(usize::MAX))
        }
    }
}

/// What a driver does as it starts: raises the open-file limit ([`raise_fd_limit`]) and
/// returns the connection bound it allows ([`connection_bound`]), logging one line when
/// the limit was raised and one warning when `limits.max_connections` had to be lowered.
pub fn start_connection_bound(max_connections: usize) -> usize {
    let limit = raise_fd_limit();
    if limit.soft != limit.inherited {
        tracing::info!(
            from = %OrUnlimited(limit.inherited),
            to = %OrUnlimited(limit.soft),
            "open-file limit (RLIMIT_NOFILE) raised to its hard limit"
        );
    }
    let bound = connection_bound(max_connections, limit.soft);
    if bound < max_connections {
        let fd_limit = limit.soft.unwrap_or(u64::MAX);
        tracing::warn!(
            configured = max_connections,
            lowered_to = bound,
            fd_limit,
            reserved = fd_reserve(fd_limit),
            "limits.max_connections lowered to what the open-file limit (RLIMIT_NOFILE) \
             allows; past it connections are answered 503 (raise the hard limit, e.g. \
             systemd's LimitNOFILE=, to serve more)"
        );
    }
    bound
}

/// A limit for a log line: the number, or `unlimited`.
struct OrUnlimited(Option<u64>);

impl fmt::Display for OrUnlimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => n.fmt(f),
            None => f.write_str("unlimited"),
        }
    }
}

/// Whether an error says the process (`EMFILE`) or the system (`ENFILE`) is out of file
/// descriptors.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    let raw = e.raw_os_error();
    raw == Some(rustix::io::Errno::MFILE.raw_os_error())
        || raw == Some(rustix::io::Errno::NFILE.raw_os_error())
}

/// Whether an `accept` error concerns one connection (aborted before it was taken, an
/// interrupted call, a spurious wake-up), not the listener: accept again at once.
pub fn transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::WouldBlock
    )
}

/// The answer to a connection past the connection bound.
pub const BUSY_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Writes [`BUSY_RESPONSE`] to a socket just accepted, without blocking and without
/// `SIGPIPE`: best effort (a fresh socket's send buffer takes it whole).
pub fn answer_busy(socket: impl AsFd) {
    let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
    let _ = rustix::net::send(socket, BUSY_RESPONSE, flags);
}

/// A descriptor held in reserve: out of descriptors, `accept` fails and leaves the
/// connection in the listener's queue, where its client would wait for nothing until it
/// times out. Freeing the spare lets the driver take that connection, answer it 503 and
/// close it ([`SpareFd::free_for`]).
#[derive(Debug)]
pub struct SpareFd {
    fd: std::sync::Mutex<Option<std::fs::File>>,
}

impl SpareFd {
    pub fn new() -> Self {
        SpareFd {
            fd: std::sync::Mutex::new(Self::open()),
        }
    }

    fn open() -> Option<std::fs::File> {
        std::fs::File::open("/dev/null").ok()
    }

    /// Runs `f` with the spare descriptor closed, then opens it again. `None` (and `f` not
    /// run) when there is no spare: it could not be opened again last time, nor now.
    pub fn free_for<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let mut fd = self.fd.lock().unwrap_or_else(|p| p.into_inner());
        if fd.is_none() {
            *fd = Self::open();
        }
        drop(fd.take()?);
        let r = f();
        *fd = Self::open();
        Some(r)
    }
}

impl Default for SpareFd {
    fn default() -> Self {
        Self::new()
    }
}

/// The pause of an accept loop after an `accept` that failed: 10 ms, doubling to 1 s while
/// it keeps failing, back to 10 ms after one succeeds.
#[derive(Debug)]
pub struct AcceptBackoff {
    next: Duration,
}

impl AcceptBackoff {
    pub const FIRST: Duration = Duration::from_millis(10);
    pub const MAX: Duration = Duration::from_secs(1);

    pub fn new() -> Self {
        AcceptBackoff { next: Self::FIRST }
    }

    /// How long to pause after this failure.
    pub fn failed(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        d
    }

    pub fn succeeded(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self::new()
    }
}

/// A warning that may recur many times a second (each connection refused at the bound,
/// each failed `accept`): at most one line per interval, each saying how many occurrences
/// it stands for. Shared by the threads or tasks that log it.
#[derive(Debug)]
pub struct LogThrottle {
    interval: Duration,
    /// Occurrences not yet reported.
    pending: std::sync::atomic::AtomicU64,
    /// When the last line was due.
    last_line: std::sync::Mutex<Option<Instant>>,
}

impl LogThrottle {
    /// The interval of the drivers' throttled warnings.
    pub const INTERVAL: Duration = Duration::from_secs(10);

    pub const fn new(interval: Duration) -> Self {
        LogThrottle {
            interval,
            pending: std::sync::atomic::AtomicU64::new(0),
            last_line: std::sync::Mutex::new(None),
        }
    }

    /// Counts one occurrence. `Some(n)` when a line is due now: it stands for `n`
    /// occurrences, this one and those unreported since the last line.
    pub fn hit(&self) -> Option<u64> {
        self.hit_at(Instant::now())
    }

    /// Counts nothing: `Some(n)` when `n` occurrences went unreported and a line is due.
    /// Call it when the condition clears (a connection admitted, an `accept` that
    /// succeeded), so the end of a burst is reported too. Cheap when nothing is pending.
    pub fn flush(&self) -> Option<u64> {
        if self.pending.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return None;
        }
        self.due_at(Instant::now())
    }

    fn hit_at(&self, now: Instant) -> Option<u64> {
        self.pending
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.due_at(now)
    }

    fn due_at(&self, now: Instant) -> Option<u64> {
        let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.saturating_duration_since(t) < self.interval) {
            return None;
        }
        let n = self.pending.swap(0, std::sync::atomic::Ordering::Relaxed);
        if n == 0 {
            return None;
        }
        *last = Some(now);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    /// Identifiers drawn across many blocks, in sizes that straddle a block's end and one
    /// larger than a block, never repeat, and the block keeps no byte it handed out.
    #[test]
    fn buffered_entropy_hands_out_each_byte_once() {
        let mut e = BufferedEntropy::new();
        let mut first = [0u8; 16];
        e.fill(&mut first);
        // One block drawn, the rest kept for the next identifiers.
        assert_eq!(e.used, 16);
        assert!(e.block[16..].iter().any(|&b| b != 0));
        let mut seen = std::collections::HashSet::from([first]);
        for i in 0..2000 {
            let mut id = [0u8; 16];
            e.fill(&mut id[..if i % 7 == 0 { 13 } else { 16 }]);
            assert!(seen.insert(id), "a repeated identifier after {i}");
            assert!(
                e.block[..e.used].iter().all(|&b| b == 0),
                "a used byte kept"
            );
        }
        let mut big = vec![0u8; ENTROPY_BLOCK * 3 + 5];
        e.fill(&mut big);
        // 2,069 random bytes are all zero with probability 2^-16552.
        assert!(big.iter().any(|&b| b != 0));
        let mut none = [0u8; 0];
        e.fill(&mut none);
        // What is left of the block is not shown.
        let shown = format!("{e:?}");
        assert!(
            !shown.contains("block") && shown.contains("left"),
            "{shown}"
        );
    }

    #[test]
    fn the_reserve_and_the_bound() {
        assert_eq!(fd_reserve(1024), 128);
        assert_eq!(fd_reserve(128), 64);
        assert_eq!(fd_reserve(20), 10);
        assert_eq!(fd_reserve(65536), 4160);
        assert_eq!(connection_bound(10_000, Some(1024)), 896);
        assert_eq!(connection_bound(10_000, Some(128)), 64);
        assert_eq!(connection_bound(500, Some(1024)), 500);
        assert_eq!(connection_bound(10_000, Some(1 << 20)), 10_000);
        assert_eq!(connection_bound(10_000, None), 10_000);
        assert_eq!(connection_bound(0, Some(1024)), 0);
        assert_eq!(connection_bound(10, Some(1)), 1);
        assert_eq!(connection_bound(10, Some(0)), 0);
    }

    #[test]
    fn the_fd_limit_is_raised_to_the_hard_one() {
        let limit = raise_fd_limit();
        assert_eq!(limit.soft, limit.hard, "{limit:?}");
        assert_eq!(raise_fd_limit().inherited, limit.soft, "idempotent");
    }

    #[test]
    fn a_throttled_warning_says_what_it_stands_for() {
        let t = LogThrottle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        assert_eq!(t.flush(), None);
        assert_eq!(
            t.hit_at(at(0)),
            Some(1),
            "the first occurrence is said at once"
        );
        for ms in 1..500 {
            assert_eq!(t.hit_at(at(ms)), None);
        }
        assert_eq!(t.due_at(at(9_999)), None);
        assert_eq!(
            t.due_at(at(10_000)),
            Some(499),
            "the burst, once the interval passed"
        );
        assert_eq!(t.due_at(at(30_000)), None, "nothing pending");
        assert_eq!(t.hit_at(at(30_001)), Some(1));
        assert_eq!(t.hit_at(at(30_002)), None);
        assert_eq!(t.hit_at(at(40_001)), Some(2));
    }

    #[test]
    fn backoff_doubles_to_a_second() {
        let mut b = AcceptBackoff::new();
        let waits: Vec<u64> = (0..9).map(|_| b.failed().as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(), AcceptBackoff::FIRST);
    }

    #[test]
    fn the_spare_descriptor_is_freed_and_taken_again() {
        let spare = SpareFd::new();
        assert_eq!(spare.free_for(|| 7), Some(7));
        assert_eq!(spare.free_for(|| 8), Some(8));
    }

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            "tcp://127.0.0.1:8420".parse::<Endpoint>(),
            Ok(Endpoint::Tcp("127.0.0.1:8420".parse().unwrap()))
        );
        assert_eq!(
            "http://[::1]:1/".parse::<Endpoint>(),
            Ok(Endpoint::Tcp("[::1]:1".parse().unwrap()))
        );
        assert_eq!(
            "unix:///run/a.sock".parse::<Endpoint>(),
            Ok(Endpoint::Unix("/run/a.sock".into()))
        );
        assert_eq!(
            "https://1.2.3.4:5".parse::<Endpoint>(),
            Ok(Endpoint::Https("1.2.3.4:5".parse().unwrap()))
        );
        for bad in [
            "unix://rel.sock",
            "127.0.0.1:1",
            "tcp://localhost:1",
            "ftp://1.2.3.4:5",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }

    /// `sun_path` holds 107 bytes and a NUL: a socket path of 107 bytes binds (the private
    /// staging directory it is bound in adds nothing to the bind path), and one of 108 is
    /// refused with an error, never cut.
    #[test]
    fn a_unix_socket_path_of_107_bytes_binds() {
        let dir = std::env::temp_dir().join(format!("agentd-os-long-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.display().to_string().len() + 1;
        assert!(
            base < 100,
            "temp dir too long for this test: {}",
            dir.display()
        );
        let path = dir.join("s".repeat(107 - base));
        assert_eq!(path.as_os_str().len(), 107);
        let l = BoundListener::bind(&Endpoint::Unix(path.clone())).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        UnixStream::connect(&path).unwrap();
        l.cleanup();
        let too_long = dir.join("s".repeat(108 - base));
        assert!(BoundListener::bind(&Endpoint::Unix(too_long.clone())).is_err());
        assert!(!too_long.exists());
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unix_socket_is_private_and_replaces_a_stale_one() {
        let dir = std::env::temp_dir().join(format!("agentd-os-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.sock");
        let l = BoundListener::bind(&Endpoint::Unix(path.clone())).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // A live socket is not stolen.
        assert!(BoundListener::bind(&Endpoint::Unix(path.clone())).is_err());
        drop(l);
        // A stale one is replaced.
        let l = BoundListener::bind(&Endpoint::Unix(path.clone())).unwrap();
        let s = UnixStream::connect(&path).unwrap();
        let (ok, uid) = unix_peer_allowed(&s).unwrap();
        assert!(ok);
        assert_eq!(uid, rustix::process::getuid().as_raw());
        l.cleanup();
        assert!(!path.exists());
        // A file that is not a socket is never replaced.
        std::fs::write(&path, b"precious").unwrap();
        let err = BoundListener::bind(&Endpoint::Unix(path.clone())).unwrap_err();
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        std::fs::remove_file(&path).unwrap();
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(leftovers.is_empty(), "staging directory left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    /// A burst of connects that nobody accepts yet is queued whole, up to the backlog asked
    /// for: with std's 128 the 130th connect would wait for a SYN retransmit (1 s) and time
    /// out here. Unix sockets too (a full queue answers a non-blocking connect EAGAIN).
    #[test]
    fn the_listen_backlog_queues_a_burst() {
        const BURST: usize = 300;
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        if somaxconn < BURST {
            eprintln!("net.core.somaxconn {somaxconn} < {BURST}: skipped");
            return;
        }
        let ep: Endpoint = "tcp://127.0.0.1:0".parse().unwrap();
        let l = BoundListener::bind_with_backlog(&ep, 512).unwrap();
        let BoundListener::Tcp(tcp) = &l else {
            unreachable!()
        };
        let addr = tcp.local_addr().unwrap();
        let held: Vec<_> = (0..BURST)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("connect {i} of {BURST} unaccepted: {e}"))
            })
            .collect();
        drop(held);

        let dir = std::env::temp_dir().join(format!("agentd-os-backlog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("b.sock");
        let l = BoundListener::bind_with_backlog(&Endpoint::Unix(path.clone()), 512).unwrap();
        let addr = rustix::net::SocketAddrUnix::new(&path).unwrap();
        let mut held = Vec::with_capacity(BURST);
        for i in 0..BURST {
            let s = rustix::net::socket_with(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::STREAM,
                rustix::net::SocketFlags::NONBLOCK,
                None,
            )
            .unwrap();
            rustix::net::connect(&s, &addr)
                .unwrap_or_else(|e| panic!("unix connect {i} of {BURST} unaccepted: {e}"));
            held.push(s);
        }
        drop(held);
        l.cleanup();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
