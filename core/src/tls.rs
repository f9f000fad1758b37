//! TLS for `https://` listeners, inside the sans-io connection: rustls's `ServerConnection`
//! takes the bytes the driver read and gives back the bytes to write, so both drivers serve
//! TLS without knowing it. With a client CA the listener is mutual TLS: a client without a
//! certificate the CA vouches for cannot complete the handshake, and a verified certificate
//! names a principal through the `san`/`sub` rules.

use crate::errors::ConfigError;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use crate::time::Now;

use crate::auth::Principal;

/// A TLS listener's configuration.
#[derive(Clone, Debug)]
pub struct TlsListener {
    pub(crate) config: Arc<rustls::ServerConfig>,
    /// Client certificates are required and verified (mutual TLS).
    pub(crate) client_auth: bool,
    /// The time rustls reads, set from the drivers' `Now`.
    pub(crate) time: Arc<DriverTime>,
}

/// The wall-clock time rustls reads on a listener (a client certificate's validity, the
/// age of a session ticket): the latest `Now` a driver passed with bytes for one of its
/// connections. The core reads no clock; rustls, left to itself, would.
#[derive(Debug, Default)]
pub(crate) struct DriverTime(AtomicU64);

impl DriverTime {
    pub(crate) fn set(&self, now: Now) {
        self.0.fetch_max(now.epoch_ms, Ordering::Relaxed);
    }
}

impl rustls::time_provider::TimeProvider for DriverTime {
    fn current_time(&self) -> Option<UnixTime> {
        // Unset (no bytes passed yet): rustls fails the handshake rather than guess.
        let ms = self.0.load(Ordering::Relaxed);
        (ms > 0).then(|| UnixTime::since_unix_epoch(std::time::Duration::from_millis(ms)))
    }
}

/// Builds a listener's TLS configuration from PEM: the certificate chain, its key, and
/// optionally the CA that client certificates must chain to.
pub fn listener(
    cert_chain_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<TlsListener, ConfigError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("certificate: no certificate in the file".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let time = Arc::new(DriverTime::default());
    let builder = rustls::ServerConfig::builder_with_details(provider.clone(), time.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca_pem {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                roots
                    .add(cert.map_err(|e| format!("client CA: {e}"))?)
                    .map_err(|e| format!("client CA: {e}"))?;
            }
            if roots.is_empty() {
                return Err("client CA: no certificate in the file".into());
            }
            // No unauthenticated fallback: mutual TLS is mandatory on this listener.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| format!("client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsListener {
        config: Arc::new(config),
        client_auth: client_ca_pem.is_some(),
        time,
    })
}

/// What a verified client certificate says about its holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The subject's common name.
    pub cn: Option<String>,
    /// Subject alternative names: DNS names, URIs (SPIFFE ids arrive as URI SANs), emails.
    pub sans: Vec<String>,
}

impl ClientIdentity {
    /// Reads the names from a certificate's DER.
    pub(crate) fn from_der(der: &[u8]) -> Option<ClientIdentity> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .map(str::to_owned);
        let mut sans = Vec::new();
        if let Ok(Some(ext)) = cert.subject_alternative_name() {
            for name in &ext.value.general_names {
                match name {
                    GeneralName::DNSName(s) | GeneralName::URI(s) | GeneralName::RFC822Name(s) => {
                        sans.push((*s).to_owned())
                    }
                    _ => {}
                }
            }
        }
        Some(ClientIdentity { cn, sans })
    }
}

/// A certificate rule: first match wins, in the order written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertRule {
    /// What the client certificate must show.
    pub matcher: CertMatch,
    /// Who a matching caller is.
    pub principal: Principal,
}

/// How a [`CertRule`] matches a verified client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertMatch {
    /// A glob (`*` any run) over the SANs and the subject CN.
    San(String),
    /// The exact subject CN.
    Sub(String),
}

impl CertRule {
    pub(crate) fn matches(&self, id: &ClientIdentity) -> bool {
        match &self.matcher {
            CertMatch::Sub(cn) => id.cn.as_deref() == Some(cn.as_str()),
            CertMatch::San(glob) => id
                .sans
                .iter()
                .chain(id.cn.iter())
                .any(|n| glob_match(glob, n)),
        }
    }
}

/// `*` matches any run of characters; everything else matches itself.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            pi += 1;
            mark = ti;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

/// The TLS side of one connection.
pub(crate) struct TlsLayer {
    conn: rustls::ServerConnection,
    out: Vec<u8>,
    out_pos: usize,
    time: Arc<DriverTime>,
}

impl TlsLayer {
    pub(crate) fn new(listener: &TlsListener) -> Option<TlsLayer> {
        Some(TlsLayer {
            conn: rustls::ServerConnection::new(listener.config.clone()).ok()?,
            out: Vec::new(),
            out_pos: 0,
            time: listener.time.clone(),
        })
    }

    /// Takes received bytes; appends the plaintext they carry to `plain`. `Err`: the
    /// session failed (its alert is queued to send) and the connection must close. `Ok(true)`:
    /// the peer closed the session.
    pub(crate) fn receive(
        &mut self,
        mut bytes: &[u8],
        plain: &mut Vec<u8>,
        now: Now,
    ) -> Result<bool, ()> {
        // What rustls does with these bytes (a handshake, a client certificate checked)
        // happens at the time the driver gave.
        self.time.set(now);
        let mut closed = false;
        while !bytes.is_empty() {
            match self.conn.read_tls(&mut bytes) {
                Ok(0) => break,
                Ok(_) => {
                    if self.conn.process_new_packets().is_err() {
                        self.flush();
                        return Err(());
                    }
                    // Taken out record by record: rustls holds at most 16 KiB of received
                    // plaintext, and a read of more (a large body in one burst) must not
                    // be taken for a broken session.
                    closed |= self.take_plain(plain)?;
                }
                Err(_) => return Err(()),
            }
        }
        closed |= self.take_plain(plain)?;
        self.flush();
        Ok(closed)
    }

    /// Moves the session's decrypted bytes into `plain`; true when the peer closed.
    fn take_plain(&mut self, plain: &mut Vec<u8>) -> Result<bool, ()> {
        let mut buf = [0u8; 8192];
        loop {
            match self.conn.reader().read(&mut buf) {
                Ok(0) => return Ok(true),
                Ok(n) => plain.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(_) => return Err(()),
            }
        }
    }

    /// Encrypts as much of `plain` as the session takes; returns how much it took.
    pub(crate) fn send(&mut self, plain: &[u8]) -> usize {
        if self.conn.is_handshaking() || plain.is_empty() {
            return 0;
        }
        let n = self.conn.writer().write(plain).unwrap_or(0);
        self.flush();
        n
    }

    pub(crate) fn close_notify(&mut self) {
        self.conn.send_close_notify();
        self.flush();
    }

    fn flush(&mut self) {
        while self.conn.wants_write() {
            if self.conn.write_tls(&mut self.out).is_err() {
                break;
            }
        }
    }

    pub(crate) fn pending(&self) -> &[u8] {
        &self.out[self.out_pos..]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.out_pos = (self.out_pos + n).min(self.out.len());
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
    }

    pub(crate) fn handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// The verified client certificate's names, once the handshake is done.
    pub(crate) fn client_identity(&self) -> Option<ClientIdentity> {
        let certs = self.conn.peer_certificates()?;
        ClientIdentity::from_der(certs.first()?.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*.agents.example", "a.agents.example"));
        assert!(glob_match(
            "spiffe://example.org/*",
            "spiffe://example.org/ns/a"
        ));
        assert!(!glob_match("*.agents.example", "agents.example.evil"));
        assert!(glob_match("peer-a", "peer-a"));
        assert!(!glob_match("peer-a", "peer-ab"));
        assert!(glob_match("*", ""));
    }
}
