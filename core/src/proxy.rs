//! Listeners behind a trusted TLS-terminating proxy (`behind_proxy`), and the proxies'
//! addresses (`a2a.proxy.trusted`).
//!
//! A request that reaches a listener behind a proxy came from someone else: the proxy's
//! own address says nothing of who asked. So such a listener is never loopback-trusted (the
//! daemon's configuration marks it so), and the address the limiters count a request
//! against is the client that `X-Forwarded-For` names, read only when the connection comes
//! from one of the configured proxies. The header is walked from its right end (the entry
//! the nearest proxy appended) leftwards while the hop that wrote the entry is a trusted
//! proxy; the first entry written by a hop that is not trusted is the client. A client can
//! put anything to the left of that in its own request: it is never read.

use std::net::IpAddr;

use crate::errors::ConfigError;
use crate::http::RequestHead;

/// An address prefix: `10.0.0.0/8`, `2001:db8::/32`, or one address (`192.0.2.7`, a /32
/// or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parses `ADDRESS` or `ADDRESS/PREFIX`. The address's bits past the prefix must be zero
    /// (`10.1.2.3/8` is refused: it reads as a mistake), and a prefix of 0 (every address)
    /// is refused: it would let anyone write the header.
    pub fn parse(text: &str) -> Result<IpNet, ConfigError> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or an ADDRESS/PREFIX range"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => {
                let n: u8 = p
                    .parse()
                    .ok()
                    .filter(|n| *n <= max)
                    .ok_or_else(|| format!("{text:?}: the prefix must be 1 to {max}"))?;
                if n == 0 {
                    return Err(format!(
                        "{text:?} trusts every address: anyone could then write X-Forwarded-For"
                    )
                    .into());
                }
                n
            }
        };
        let net = IpNet { addr, prefix };
        if net.masked(addr) != bits(addr) {
            return Err(
                format!("{text:?}: the address has bits set past the /{prefix} prefix").into(),
            );
        }
        Ok(net)
    }

    /// Whether `ip` is in the range (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.addr.is_ipv4() && self.masked(ip) == bits(self.addr)
    }

    fn masked(&self, ip: IpAddr) -> u128 {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let shift = width - u32::from(self.prefix);
        let mask = if shift >= 128 {
            0
        } else {
            (u128::MAX >> (128 - width)) >> shift << shift
        };
        bits(ip) & mask
    }
}

impl std::fmt::Display for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == max {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Which listeners are behind a TLS-terminating proxy, and the addresses of the proxies
/// whose `X-Forwarded-For` is read. The default: none, and the header is never read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyTrust {
    /// The indexes of the listeners behind a proxy.
    pub listeners: Vec<usize>,
    /// The proxies' addresses.
    pub trusted: Vec<IpNet>,
}

/// The most `X-Forwarded-For` entries walked for one request.
const MAX_HOPS: usize = 64;

impl ProxyTrust {
    /// Whether a listener is behind a proxy.
    pub fn behind(&self, listener: usize) -> bool {
        self.listeners.contains(&listener)
    }

    /// Whether `ip` is one of the configured proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// The address a request on `listener` from the TCP peer `peer` counts against: the peer
    /// itself, unless the listener is behind a proxy and the peer is a trusted one; then the
    /// client `X-Forwarded-For` names (every field of the header, in order, as one list).
    pub fn client(&self, listener: usize, peer: IpAddr, head: &RequestHead) -> IpAddr {
        if !self.behind(listener) || !self.trusts(peer) {
            return peer;
        }
        let mut entries: Vec<&[u8]> = Vec::new();
        for value in head.header_all("x-forwarded-for") {
            entries.extend(value.split(|b| *b == b','));
        }
        let mut client = peer;
        for entry in entries.iter().rev().take(MAX_HOPS) {
            if !self.trusts(client) {
                break;
            }
            match parse_hop(entry) {
                Some(ip) => client = ip,
                // Garbage a trusted proxy passed on: the nearest address known stands.
                None => break,
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1` or
/// `[2001:db8::1]:4711`.
fn parse_hop(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sock) = text.parse::<std::net::SocketAddr>() {
        return Some(sock.ip());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(xff: &[&str]) -> RequestHead {
        let mut text = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for v in xff {
            text.push_str(&format!("X-Forwarded-For: {v}\r\n"));
        }
        text.push_str("\r\n");
        let mut p = crate::http::RequestParser::new(crate::http::HttpLimits::DEFAULT);
        p.push(text.as_bytes());
        match p.next_event() {
            Ok(Some(crate::http::Event::Head(h))) => h,
            other => panic!("{other:?}"),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_parse_and_match() {
        let n = IpNet::parse("10.0.0.0/8").unwrap();
        assert!(n.contains(ip("10.200.1.1")) && !n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.0.0.1")), "IPv4-mapped");
        let one = IpNet::parse("192.0.2.7").unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        assert_eq!(one.to_string(), "192.0.2.7");
        let v6 = IpNet::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:1::5")) && !v6.contains(ip("2001:db9::1")));
        for bad in [
            "x",
            "10.0.0.0/33",
            "10.0.0.0/0",
            "10.1.2.3/8",
            "::/0",
            "1.2.3.4/x",
        ] {
            assert!(IpNet::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_header_is_read_only_from_trusted_proxies_on_proxied_listeners() {
        let trust = ProxyTrust {
            listeners: vec![0],
            trusted: vec![IpNet::parse("10.0.0.0/8").unwrap()],
        };
        let h = head(&["6.6.6.6, 203.0.113.9, 10.0.0.3"]);
        // From a trusted proxy: the first hop from the right that is not a proxy.
        assert_eq!(trust.client(0, ip("10.0.0.2"), &h), ip("203.0.113.9"));
        // From anyone else, or on a listener not behind the proxy: the peer.
        assert_eq!(trust.client(0, ip("198.51.100.1"), &h), ip("198.51.100.1"));
        assert_eq!(trust.client(1, ip("10.0.0.2"), &h), ip("10.0.0.2"));
        // Two header fields are one list; ports and brackets are read.
        let h = head(&["6.6.6.6", "[2001:db8::7]:4711"]);
        assert_eq!(trust.client(0, ip("10.0.0.2"), &h), ip("2001:db8::7"));
        // Garbage stops the walk at the nearest known hop.
        let h = head(&["203.0.113.9, nonsense"]);
        assert_eq!(trust.client(0, ip("10.0.0.2"), &h), ip("10.0.0.2"));
        // No header: the proxy itself.
        assert_eq!(trust.client(0, ip("10.0.0.2"), &head(&[])), ip("10.0.0.2"));
    }
}
