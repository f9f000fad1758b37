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

impl BoundListener {
    pub fn bind(endpoint: &Endpoint) -> io::Result<Self> {
        match endpoint {
            Endpoint::Tcp(addr) | Endpoint::Https(addr) => {
                Ok(BoundListener::Tcp(TcpListener::bind(addr)?))
            }
            Endpoint::Unix(path) => Ok(BoundListener::Unix {
                listener: bind_unix_private(path)?,
                path: path.clone(),
            }),
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

/// Binds a unix socket that is mode 0600 from the moment its path exists: it is bound
/// inside a fresh directory only its owner can enter, narrowed to 0600, then renamed into
/// place. (A process-wide umask would race with other threads creating files.)
fn bind_unix_private(path: &Path) -> io::Result<UnixListener> {
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
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "socket path has no file name")
    })?;
    let mut suffix = [0u8; 8];
    OsEntropy.fill(&mut suffix);
    let staging = parent.join(format!(".agentd-bind-{}", agentd_core::ids::hex(&suffix)));
    std::fs::DirBuilder::new().mode_private().create(&staging)?;
    let result = (|| {
        let staged = staging.join(name);
        let listener = UnixListener::bind(&staged)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

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
}
