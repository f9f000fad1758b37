//! The request limiters of §7.5: the failure limiter per source, and the per-principal rate.
//! Both are token buckets on the driver's monotonic clock (the core reads none), kept in maps
//! bounded by least-recently-seen eviction, so no caller can grow them without bound.

use crate::errors::ConfigError;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::net::IpAddr;

/// A `"<burst>/<per>s"` rate: `burst` requests at once, refilled evenly over `per_s` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Requests allowed at once (the bucket's size).
    pub burst: u32,
    /// Seconds over which a full burst refills.
    pub per_s: u32,
}

/// Largest burst a rate may name.
pub(crate) const MAX_BURST: u32 = 1_000_000;
/// Longest period a rate may name: a day.
pub(crate) const MAX_PER_S: u32 = 86_400;

impl Rate {
    /// Parses `"<burst>/<per>s"`, e.g. `"20/60s"`: both whole numbers greater than 0, the
    /// burst at most 1,000,000, the period at most 86,400 seconds (a day).
    pub fn parse(text: &str) -> Result<Rate, ConfigError> {
        let shape = || format!("{text:?} is not \"<burst>/<per>s\" (for example \"20/60s\")");
        let (burst, per) = text.split_once('/').ok_or_else(shape)?;
        let per = per.strip_suffix('s').ok_or_else(shape)?;
        let number = |s: &str| -> Option<u32> {
            if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let (burst, per_s) = (
            number(burst).ok_or_else(shape)?,
            number(per).ok_or_else(shape)?,
        );
        if burst == 0 || burst > MAX_BURST {
            return Err(format!("{text:?}: the burst must be 1 to {MAX_BURST}").into());
        }
        if per_s == 0 || per_s > MAX_PER_S {
            return Err(format!("{text:?}: the period must be 1 to {MAX_PER_S} seconds").into());
        }
        Ok(Rate { burst, per_s })
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}s", self.burst, self.per_s)
    }
}

/// One bucket, as the generic cell rate algorithm keeps it: the moment it would be full
/// again. Time is counted in milliseconds times the burst, so every step is exact.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    full_at: u128,
}

impl Bucket {
    /// Milliseconds until one token is available (0: one is available now).
    fn wait_ms(&self, rate: Rate, now_ms: u64) -> u64 {
        let burst = u128::from(rate.burst);
        let per_ms = u128::from(rate.per_s) * 1000;
        let now = u128::from(now_ms) * burst;
        let next = self.full_at.max(now) + per_ms;
        let over = next.saturating_sub(now + per_ms * burst);
        u64::try_from(over.div_ceil(burst)).unwrap_or(u64::MAX)
    }

    /// Takes a token if one is available; otherwise the milliseconds until one is.
    fn take(&mut self, rate: Rate, now_ms: u64) -> Result<(), u64> {
        match self.wait_ms(rate, now_ms) {
            0 => {
                let now = u128::from(now_ms) * u128::from(rate.burst);
                self.full_at = self.full_at.max(now) + u128::from(rate.per_s) * 1000;
                Ok(())
            }
            wait => Err(wait),
        }
    }
}

/// Whole seconds for `Retry-After`: rounded up, at least 1.
pub(crate) fn retry_after_secs(wait_ms: u64) -> u32 {
    u32::try_from(wait_ms.div_ceil(1000).max(1)).unwrap_or(u32::MAX)
}

/// Buckets by key, at most `cap` of them; the least recently seen goes first.
struct Lru<K> {
    map: HashMap<K, (Bucket, u64)>,
    order: BTreeMap<u64, K>,
    next: u64,
    cap: usize,
}

impl<K: Clone + Eq + Hash> Lru<K> {
    fn new(cap: usize) -> Self {
        Lru {
            map: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            cap: cap.max(1),
        }
    }

    /// The key's bucket, marked as seen now; a new, full one if it has none.
    fn touch(&mut self, key: &K) -> &mut Bucket {
        self.next += 1;
        let stamp = self.next;
        if let Some((_, seen)) = self.map.get_mut(key) {
            self.order.remove(seen);
            *seen = stamp;
        } else {
            while self.map.len() >= self.cap {
                let Some((_, oldest)) = self.order.pop_first() else {
                    break;
                };
                self.map.remove(&oldest);
            }
            self.map.insert(key.clone(), (Bucket::default(), stamp));
        }
        self.order.insert(stamp, key.clone());
        &mut self
            .map
            .entry(key.clone())
            .or_insert((Bucket::default(), stamp))
            .0
    }

    /// The key's bucket marked as seen now, if it has one; never adds a key.
    fn seen(&mut self, key: &K) -> Option<&Bucket> {
        if !self.map.contains_key(key) {
            return None;
        }
        Some(&*self.touch(key))
    }

    fn get(&self, key: &K) -> Option<&Bucket> {
        self.map.get(key).map(|(b, _)| b)
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Who a failure is counted against: an IPv4 address, or an IPv6 /64 (an IPv4-mapped IPv6
/// address is its IPv4 address). `X-Forwarded-For` never reaches it: only the transport's
/// peer address does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 address other than loopback.
    V4([u8; 4]),
    /// The /64 prefix of an IPv6 address.
    V6Prefix([u8; 8]),
    /// Any address of 127.0.0.0/8: one machine, whichever of its 16 million loopback
    /// addresses it picks, as an IPv6 /64 is one source however its host part rotates.
    Loopback,
}

impl Source {
    /// The source `addr` counts against.
    pub fn of(addr: IpAddr) -> Source {
        let v4 = |a: std::net::Ipv4Addr| {
            if a.is_loopback() {
                Source::Loopback
            } else {
                Source::V4(a.octets())
            }
        };
        match addr {
            IpAddr::V4(a) => v4(a),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(a) => v4(a),
                None => {
                    let o = v6.octets();
                    Source::V6Prefix([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
                }
            },
        }
    }

    /// The network the source belongs to, for the device grant's pending-code shares: an
    /// IPv4 address is its own network, an IPv6 /64 belongs to its /48.
    pub(crate) fn network(self) -> Network {
        match self {
            Source::V4(a) => Network::V4(a),
            Source::V6Prefix(p) => Network::V6([p[0], p[1], p[2], p[3], p[4], p[5]]),
            Source::Loopback => Network::Loopback,
        }
    }
}

/// A network of sources: an IPv4 address, an IPv6 /48, or loopback.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Network {
    V4([u8; 4]),
    V6([u8; 6]),
    Loopback,
}

/// Requests to the device-authorization endpoint per source: a burst of 5, then one per
/// 12 s (RFC 8628 §5.2 leaves the rate to the server).
pub(crate) const DEVICE_AUTHORIZATION_RATE: Rate = Rate {
    burst: 5,
    per_s: 60,
};
/// Requests to the token endpoint per source: a bucket of its own, burst 30, one a second,
/// so polling devices never spend the authorization bucket.
pub(crate) const TOKEN_RATE: Rate = Rate {
    burst: 30,
    per_s: 30,
};

/// A rate per source, for the OAuth endpoints, kept like the failure limiter's.
pub(crate) struct SourceRate {
    buckets: Lru<Source>,
    rate: Rate,
}

impl SourceRate {
    pub(crate) fn new(rate: Rate) -> Self {
        SourceRate {
            buckets: Lru::new(MAX_SOURCES),
            rate,
        }
    }

    /// Takes a token for `source`, or says in how many milliseconds one is available.
    pub(crate) fn take(&mut self, source: Source, now_ms: u64) -> Result<(), u64> {
        let rate = self.rate;
        self.buckets.touch(&source).take(rate, now_ms)
    }
}

/// Failures a source may accumulate before its credentials are refused unread.
pub(crate) const FAILURE_BURST: u32 = 20;
/// One failure is forgiven every this many milliseconds.
pub(crate) const FAILURE_FORGIVE_MS: u64 = 3_000;
/// Sources remembered at once.
pub(crate) const MAX_SOURCES: usize = 4096;
/// Principal buckets remembered at once.
pub(crate) const MAX_PRINCIPAL_BUCKETS: usize = 4096;

/// The failure bucket as a rate: 20 at once, one back every 3 s.
pub(crate) const FAILURE_RATE: Rate = Rate {
    burst: FAILURE_BURST,
    per_s: (FAILURE_BURST as u64 * FAILURE_FORGIVE_MS / 1000) as u32,
};

/// Failed credentials per source (§7.5 "Failure limiter").
pub struct FailureLimiter {
    sources: Lru<Source>,
}

impl Default for FailureLimiter {
    fn default() -> Self {
        Self::with_capacity(MAX_SOURCES)
    }
}

impl FailureLimiter {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        FailureLimiter {
            sources: Lru::new(cap),
        }
    }

    /// Milliseconds until `source` may present a credential again; `None` while it may. A
    /// remembered source counts as seen now, so one that keeps trying is not the first
    /// evicted.
    pub(crate) fn refusal(&mut self, source: Source, now_ms: u64) -> Option<u64> {
        let wait = self.sources.seen(&source)?.wait_ms(FAILURE_RATE, now_ms);
        (wait > 0).then_some(wait)
    }

    /// Counts one failure against `source`. A source already at the limit stays there: the
    /// bucket never holds more than its burst of debt.
    pub(crate) fn count(&mut self, source: Source, now_ms: u64) {
        let _ = self.sources.touch(&source).take(FAILURE_RATE, now_ms);
    }

    /// Sources remembered now.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether no source is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `source` is remembered (it was seen and not evicted).
    pub fn remembers(&self, source: Source) -> bool {
        self.sources.get(&source).is_some()
    }
}

/// Per-principal request rates (§7.5 "Per-principal rate"), one bucket per (principal id,
/// rate), so a reload that changes a rule's rate starts it on a fresh bucket.
pub(crate) struct PrincipalRates {
    buckets: Lru<(String, Rate)>,
}

impl Default for PrincipalRates {
    fn default() -> Self {
        PrincipalRates {
            buckets: Lru::new(MAX_PRINCIPAL_BUCKETS),
        }
    }
}

impl PrincipalRates {
    /// Takes one request's token; otherwise the milliseconds until one is available.
    pub(crate) fn take(&mut self, principal: &str, rate: Rate, now_ms: u64) -> Result<(), u64> {
        self.buckets
            .touch(&(principal.to_owned(), rate))
            .take(rate, now_ms)
    }
}

/// The instance's limiters.
pub struct Limits {
    /// Failed credentials per source.
    pub failures: FailureLimiter,
    pub(crate) rates: PrincipalRates,
    /// `POST /oauth2/device_authorization` per source.
    pub(crate) device_authorization: SourceRate,
    /// `POST /oauth2/token` per source.
    pub(crate) token: SourceRate,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            failures: FailureLimiter::default(),
            rates: PrincipalRates::default(),
            device_authorization: SourceRate::new(DEVICE_AUTHORIZATION_RATE),
            token: SourceRate::new(TOKEN_RATE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(
            Rate::parse("20/60s"),
            Ok(Rate {
                burst: 20,
                per_s: 60
            })
        );
        assert_eq!(Rate::parse("2/60s").unwrap().to_string(), "2/60s");
        for bad in [
            "",
            "20",
            "20/60",
            "20/s",
            "/60s",
            "0/60s",
            "20/0s",
            "-1/60s",
            "20/60m",
            " 20/60s",
            "20/60s ",
            "1/86401s",
            "1000001/1s",
            "+2/60s",
            "9999999999/1s",
        ] {
            assert!(Rate::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bucket_refills_evenly() {
        let rate = Rate::parse("2/60s").unwrap();
        let mut b = Bucket::default();
        assert_eq!(b.take(rate, 1000), Ok(()));
        assert_eq!(b.take(rate, 1000), Ok(()));
        assert_eq!(b.take(rate, 1000), Err(30_000));
        assert_eq!(b.take(rate, 30_999), Err(1));
        assert_eq!(b.take(rate, 31_000), Ok(()));
        assert_eq!(b.take(rate, 31_000), Err(30_000));
        // Idle for long: never more than the burst.
        assert_eq!(b.take(rate, 10_000_000), Ok(()));
        assert_eq!(b.take(rate, 10_000_000), Ok(()));
        assert!(b.take(rate, 10_000_000).is_err());
        // Uneven division stays exact: 3 per 10 s is one every 3333.3 ms.
        let rate = Rate::parse("3/10s").unwrap();
        let mut b = Bucket::default();
        for _ in 0..3 {
            assert_eq!(b.take(rate, 0), Ok(()));
        }
        assert_eq!(b.take(rate, 0), Err(3334));
        assert_eq!(b.take(rate, 3334), Ok(()));
        assert_eq!(retry_after_secs(3334), 4);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(0), 1);
    }

    #[test]
    fn ipv6_sources_are_slash_64s() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(Source::of(mapped), Source::V4([192, 0, 2, 7]));
    }

    #[test]
    fn the_least_recently_seen_source_goes_first() {
        let mut f = FailureLimiter::with_capacity(2);
        let (a, b, c) = (Source::V4([1; 4]), Source::V4([2; 4]), Source::V4([3; 4]));
        f.count(a, 0);
        f.count(b, 0);
        f.count(a, 0);
        f.count(c, 0);
        assert!(f.remembers(a) && f.remembers(c) && !f.remembers(b));
        assert_eq!(f.len(), 2);
    }
}
