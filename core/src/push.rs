//! Push notifications: the task push-config records, their validation (the webhook URL's
//! scheme and address, the authentication scheme, control characters), and the delivery the
//! instance asks of its host.
//!
//! The core checks what it can without I/O: a literal IP address or `localhost` in the URL.
//! A host name is resolved by the host at delivery, which repeats the address check on
//! what it resolved and connects only to an address that passed it.

use crate::errors::{RecordError, WebhookError};
use std::collections::HashMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Push configs one task may hold.
pub(crate) const MAX_CONFIGS_PER_TASK: usize = 16;
/// Bytes of a webhook URL, token or credentials.
pub(crate) const MAX_FIELD_BYTES: usize = 4096;

/// `a2a.push`: whether push notifications are served, and where webhooks may point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushPolicy {
    /// Whether the webhook methods are served at all; off answers `PushNotificationNotSupported`.
    pub enabled: bool,
    /// Private, loopback and link-local webhook targets are allowed.
    pub allow_private: bool,
}

/// `AuthenticationInfo`, as registered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Authentication {
    pub(crate) scheme: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) credentials: String,
}

/// `TaskPushNotificationConfig` on the wire (ProtoJSON, camelCase).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WireConfig {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) tenant: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) id: String,
    // ProtoJSON parsers accept the proto field name too (the A2A TCK sends it).
    #[serde(default, alias = "task_id")]
    pub(crate) task_id: String,
    #[serde(default)]
    pub(crate) url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) authentication: Option<Authentication>,
}

/// One registered webhook of a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PushConfig {
    pub(crate) id: String,
    pub(crate) task_id: String,
    pub(crate) url: String,
    pub(crate) token: Option<String>,
    pub(crate) authentication: Option<Authentication>,
}

impl PushConfig {
    /// The read-back: the scheme only, never the credentials (nor the token).
    pub(crate) fn to_wire(&self) -> WireConfig {
        WireConfig {
            tenant: String::new(),
            id: self.id.clone(),
            task_id: self.task_id.clone(),
            url: self.url.clone(),
            token: String::new(),
            authentication: self.authentication.as_ref().map(|a| Authentication {
                scheme: a.scheme.clone(),
                credentials: String::new(),
            }),
        }
    }
}

/// A webhook's URL, taken apart, its host normalized as a WHATWG URL parser (and so a
/// browser, or `getaddrinfo` for the IPv4 shorthands) reads it: `https://127.1`,
/// `https://0x7f000001`, `https://0177.0.0.1` and `https://127.0.0.1.` are all 127.0.0.1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WebhookUrl {
    pub(crate) tls: bool,
    /// The normalized host: an IPv4 address in dotted decimal, an IPv6 address without its
    /// brackets, or a lower-case ASCII name without a trailing dot.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Path and query, from the first `/`.
    pub(crate) path: String,
    /// The host is an IP address (or `localhost`): its address is known without resolving.
    pub(crate) literal: Option<IpAddr>,
}

impl WebhookUrl {
    /// The URL to dial, in the form the host's client parses without guessing: the
    /// normalized host (an IPv6 address in brackets) and an explicit port, e.g.
    /// `https://127.0.0.1:443/hook` for `https://127.1/hook`, `https://[2001:db8::1]:443/`
    /// for `https://[2001:db8::1]/`. Delivery dials this, never the URL as registered, so it
    /// reaches the address the registration check judged.
    pub(crate) fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let host = match self.literal {
            Some(IpAddr::V6(_)) => format!("[{}]", self.host),
            _ => self.host.clone(),
        };
        format!("{scheme}://{host}:{}{}", self.port, self.path)
    }
}

/// Takes a webhook URL apart and normalizes its host ([`parse_host`]), without the policy:
/// `https://` or `http://`, no user info or fragment, a port of digits.
pub(crate) fn parse_url(url: &str) -> Result<WebhookUrl, WebhookError> {
    if url.len() > MAX_FIELD_BYTES {
        return Err(format!("longer than {MAX_FIELD_BYTES} bytes").into());
    }
    if url.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err("control characters or spaces".into());
    }
    let (rest, tls) = if let Some(r) = strip_prefix_ci(url, "https://") {
        (r, true)
    } else if let Some(r) = strip_prefix_ci(url, "http://") {
        (r, false)
    } else {
        return Err("the URL must be https:// (http:// only to a loopback address)".into());
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if path.contains('#') {
        return Err("a fragment is not sent anywhere; leave it out".into());
    }
    if authority.contains('@') {
        return Err("user info in the URL; use authentication instead".into());
    }
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    let (host, port) = split_host_port(authority, if tls { 443 } else { 80 })?;
    let (host, literal) = parse_host(host)?;
    Ok(WebhookUrl {
        tls,
        host,
        port,
        path,
        literal,
    })
}

/// Checks a webhook URL: `https://`, or `http://` to a loopback address; no user info or
/// fragment; a host that is (or normalizes to) a private, loopback or link-local address
/// only when `policy` allows private targets.
pub(crate) fn check_url(url: &str, policy: PushPolicy) -> Result<WebhookUrl, WebhookError> {
    let u = parse_url(url)?;
    if !u.tls && !u.literal.is_some_and(|ip| ip.is_loopback()) {
        return Err("plain http:// is only for a loopback address; use https://".into());
    }
    if let Some(ip) = u.literal {
        check_address(ip, policy)?;
    }
    Ok(u)
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}

/// The host (brackets kept around an IPv6 address) and the port of an authority.
fn split_host_port(authority: &str, default: u16) -> Result<(&str, u16), String> {
    let (host, port) = if authority.starts_with('[') {
        let close = authority
            .find(']')
            .ok_or("an unclosed [ in the host (an IPv6 address is written [addr])")?;
        let after = &authority[close + 1..];
        match after.strip_prefix(':') {
            Some(p) => (&authority[..=close], Some(p)),
            None if after.is_empty() => (authority, None),
            None => {
                return Err(format!(
                    "{after:?} after the IPv6 address {}; a port is written [addr]:port",
                    &authority[..=close]
                ))
            }
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        // An empty port is the scheme's default, as in a WHATWG URL.
        None | Some("") => default,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("bad port {p:?}: a number from 1 to 65535")),
        },
    };
    Ok((host, port))
}

/// Parses a URL's host as the WHATWG URL standard does for `http` and `https`: `[…]` is an
/// IPv6 address; otherwise the host is percent-decoded and lower-cased, and a host whose
/// last label is a number is an IPv4 address in any of the forms the IPv4 parser takes
/// (decimal, octal `0177`, hex `0x7f`, fewer than four parts, `127.0.0.1.`), or invalid. A
/// name loses one trailing dot, and `localhost` and `*.localhost` are loopback. Returns the
/// normalized host and its address when it has one.
///
/// Stricter than the standard where delivery could not follow: a name must be ASCII (a
/// Unicode name in its `xn--` form), of letters, digits, `-` and `_`, in labels of 1 to 63.
pub(crate) fn parse_host(host: &str) -> Result<(String, Option<IpAddr>), WebhookError> {
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or("an unclosed [ in the host (an IPv6 address is written [addr])")?;
        return match inner.parse::<std::net::Ipv6Addr>() {
            Ok(v6) => Ok((v6.to_string(), Some(IpAddr::V6(v6)))),
            Err(_) => Err(format!("[{inner}] is not an IPv6 address").into()),
        };
    }
    let decoded = percent_decode(host)?;
    if !decoded.is_ascii() {
        return Err(format!(
            "the host {decoded:?} is not ASCII: write an international name in its xn-- form"
        )
        .into());
    }
    let lower = decoded.to_ascii_lowercase();
    if lower.is_empty() {
        return Err("no host".into());
    }
    if let Some(bad) = lower
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!("the host {lower:?} has {bad:?}, which no host name has").into());
    }
    if ends_in_a_number(&lower) {
        let v4 = parse_ipv4(&lower).ok_or_else(|| {
            format!("the host {lower:?} ends in a number but is not an IPv4 address")
        })?;
        return Ok((v4.to_string(), Some(IpAddr::V4(v4))));
    }
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.len() > 253 || name.split('.').any(|l| l.is_empty() || l.len() > 63) {
        return Err(format!(
            "the host {lower:?} is not a host name (labels of 1 to 63 characters, 253 in all)"
        )
        .into());
    }
    let literal = (name == "localhost" || name.ends_with(".localhost"))
        .then_some(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    Ok((name.to_owned(), literal))
}

/// `%XX` escapes decoded; anything that does not decode to UTF-8 is refused.
fn percent_decode(s: &str) -> Result<String, String> {
    if !s.contains('%') {
        return Ok(s.to_owned());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("the host {s:?} has a % that is no %XX escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the host {s:?} does not decode to UTF-8"))
}

/// WHATWG "ends in a number": the last label (after one trailing dot) is all digits, or
/// parses as an IPv4 number (`0x…`).
fn ends_in_a_number(host: &str) -> bool {
    let mut parts: Vec<&str> = host.split('.').collect();
    if parts.last() == Some(&"") {
        if parts.len() == 1 {
            return false;
        }
        parts.pop();
    }
    let last = parts.last().copied().unwrap_or("");
    (!last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())) || ipv4_number(last).is_some()
}

/// WHATWG IPv4 number: decimal, `0x`/`0X` hex or `0` octal; `None` when it is not one.
/// Values past `u32` come back as `u64::MAX`, which every caller refuses.
fn ipv4_number(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        return Some(0);
    }
    let mut n: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)?;
        n = n
            .checked_mul(u64::from(radix))
            .and_then(|n| n.checked_add(u64::from(d)))
            .unwrap_or(u64::MAX);
    }
    Some(n)
}

/// WHATWG IPv4 parser: one to four numbers, the last filling the bytes the others left.
fn parse_ipv4(host: &str) -> Option<std::net::Ipv4Addr> {
    let mut parts: Vec<&str> = host.split('.').collect();
    if parts.last() == Some(&"") && parts.len() > 1 {
        parts.pop();
    }
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let numbers = parts
        .iter()
        .map(|p| ipv4_number(p))
        .collect::<Option<Vec<u64>>>()?;
    let (last, init) = numbers.split_last()?;
    if init.iter().any(|n| *n > 255) || *last >= 256u64.pow(5 - numbers.len() as u32) {
        return None;
    }
    let mut addr = *last;
    for (i, n) in init.iter().enumerate() {
        addr += n << (8 * (3 - i));
    }
    u32::try_from(addr).ok().map(std::net::Ipv4Addr::from)
}

/// Whether an address is one a webhook may reach: public addresses always; private,
/// loopback, link-local, shared, unspecified and multicast ones only when allowed.
pub fn check_address(ip: IpAddr, policy: PushPolicy) -> Result<(), WebhookError> {
    if policy.allow_private || is_public(ip) {
        Ok(())
    } else {
        Err(format!(
            "{ip} is a private, loopback or link-local address (allowed only with a2a.push.allow_private)"
        ).into())
    }
}

/// Not private, loopback, link-local, shared (100.64/10), unspecified, multicast,
/// broadcast or documentation space; IPv4-mapped IPv6 is judged as the IPv4 it maps.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            // IPv4-compatible (`::a.b.c.d`, deprecated) and NAT64 (`64:ff9b::a.b.c.d`)
            // addresses carry an IPv4 address too: judged as it. `::` and `::1` are not.
            let embedded = s[..6] == [0; 6] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
            if embedded && s[6] != 0 {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return is_public(IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0x0db8))
        }
    }
}

/// Checks and stores a config from the wire. `task_id` is the task it binds to (the
/// request's, or the task a send just created).
pub(crate) fn check_config(
    wire: WireConfig,
    task_id: &str,
    policy: PushPolicy,
    new_id: impl FnOnce() -> String,
) -> Result<PushConfig, (String, String)> {
    let field = |f: &str, why: String| (f.to_owned(), why);
    if wire.url.is_empty() {
        return Err(field(
            "url",
            "is required: the webhook's https:// URL".into(),
        ));
    }
    check_url(&wire.url, policy).map_err(|e| field("url", format!("push url refused: {e}")))?;
    if wire.token.len() > MAX_FIELD_BYTES || wire.token.bytes().any(|b| b.is_ascii_control()) {
        return Err(field(
            "token",
            "at most 4096 bytes, no control characters".into(),
        ));
    }
    if let Some(a) = &wire.authentication {
        let token_shaped = !a.scheme.is_empty()
            && a.scheme.len() <= 64
            && a.scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token_shaped {
            return Err(field(
                "authentication.scheme",
                "an HTTP authentication scheme (a token such as Bearer or Basic)".into(),
            ));
        }
        if a.credentials.len() > MAX_FIELD_BYTES
            || a.credentials.bytes().any(|b| b.is_ascii_control())
        {
            return Err(field(
                "authentication.credentials",
                "at most 4096 bytes, no control characters".into(),
            ));
        }
    }
    if wire.id.len() > 256 || wire.id.bytes().any(|b| b.is_ascii_control()) {
        return Err(field(
            "id",
            "at most 256 bytes, no control characters".into(),
        ));
    }
    Ok(PushConfig {
        id: if wire.id.is_empty() {
            new_id()
        } else {
            wire.id
        },
        task_id: task_id.to_owned(),
        url: wire.url,
        token: (!wire.token.is_empty()).then_some(wire.token),
        authentication: wire.authentication,
    })
}

/// The record kind of a task's push configs in the durable store: keyed by task id, the
/// body is the list of configs with their credentials (the store's files are the daemon's
/// alone), so deliveries go on after a restart.
pub(crate) const PUSH_KIND: &str = "push";

/// The configs of every task, by task id.
#[derive(Clone, Debug, Default)]
pub(crate) struct PushConfigs {
    by_task: HashMap<String, Vec<PushConfig>>,
    /// Write-ahead: the tasks whose configs changed since the host last drained them.
    track: bool,
    dirty: std::collections::BTreeSet<String>,
    changes: u64,
}

impl PushConfigs {
    pub(crate) fn set_tracking(&mut self, on: bool) {
        self.track = on;
        if !on {
            self.dirty.clear();
        }
    }

    fn touch(&mut self, task_id: &str) {
        if self.track {
            self.changes += 1;
            self.dirty.insert(task_id.to_owned());
        }
    }

    /// Marks every task's configs changed, for a drain of the whole state.
    pub(crate) fn mark_all_dirty(&mut self) {
        if self.track {
            self.dirty.extend(self.by_task.keys().cloned());
        }
    }

    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Tasks whose configs changed since the last call: the list as it stands, or `None`.
    pub(crate) fn take_dirty(&mut self) -> Vec<(String, Option<crate::instance::RecordBody>)> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|task| {
                let body = self
                    .by_task
                    .get(&task)
                    .and_then(|l| serde_json::value::to_raw_value(l).ok());
                (task, body)
            })
            .collect()
    }

    /// Puts back a task's configs read from the durable store.
    pub(crate) fn restore(&mut self, task_id: &str, body: Value) -> Result<(), RecordError> {
        let list: Vec<PushConfig> =
            serde_json::from_value(body).map_err(|e| format!("push record {task_id}: {e}"))?;
        if list.iter().any(|c| c.task_id != task_id) {
            return Err(format!("push record {task_id} holds another task's config").into());
        }
        self.by_task.insert(task_id.to_owned(), list);
        Ok(())
    }

    /// Stores a config (replacing one of the same id); refuses past the per-task bound.
    pub(crate) fn put(&mut self, c: PushConfig) -> Result<(), WebhookError> {
        let task_id = c.task_id.clone();
        let list = self.by_task.entry(c.task_id.clone()).or_default();
        if let Some(old) = list.iter_mut().find(|o| o.id == c.id) {
            *old = c;
            self.touch(&task_id);
            return Ok(());
        }
        if list.len() >= MAX_CONFIGS_PER_TASK {
            return Err(format!("a task holds at most {MAX_CONFIGS_PER_TASK} push configs").into());
        }
        list.push(c);
        self.touch(&task_id);
        Ok(())
    }

    pub(crate) fn get(&self, task_id: &str, id: &str) -> Option<&PushConfig> {
        self.by_task.get(task_id)?.iter().find(|c| c.id == id)
    }

    pub(crate) fn list(&self, task_id: &str) -> &[PushConfig] {
        self.by_task.get(task_id).map_or(&[], Vec::as_slice)
    }

    /// Removes a config; removing one that is not there is not an error (idempotent).
    pub(crate) fn delete(&mut self, task_id: &str, id: &str) -> bool {
        let Some(list) = self.by_task.get_mut(task_id) else {
            return false;
        };
        let before = list.len();
        list.retain(|c| c.id != id);
        let removed = list.len() != before;
        if list.is_empty() {
            self.by_task.remove(task_id);
        }
        if removed {
            self.touch(task_id);
        }
        removed
    }

    /// Drops the configs of tasks `keep` says are gone (after a restore).
    pub(crate) fn retain_tasks(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.by_task.keys().filter(|t| !keep(t)).cloned().collect();
        for t in gone {
            self.forget_task(&t);
        }
    }

    /// A task left the store: so do its configs.
    pub(crate) fn forget_task(&mut self, task_id: &str) {
        if self.by_task.remove(task_id).is_some() {
            self.touch(task_id);
        }
    }
}

/// The headers of one delivery: `Authorization` from the registered authentication, and the
/// a2a-python courtesy header for the token.
pub(crate) fn delivery_headers(c: &PushConfig) -> Vec<(String, String)> {
    let mut h = vec![("content-type".to_owned(), "application/a2a+json".to_owned())];
    if let Some(a) = &c.authentication {
        let value = if a.credentials.is_empty() {
            a.scheme.clone()
        } else {
            format!("{} {}", a.scheme, a.credentials)
        };
        h.push(("authorization".to_owned(), value));
    }
    if let Some(t) = &c.token {
        h.push(("x-a2a-notification-token".to_owned(), t.clone()));
    }
    h
}

/// The JSON of a config list page.
pub(crate) fn list_page(configs: &[PushConfig], next: &str) -> Value {
    serde_json::json!({
        "configs": configs.iter().map(PushConfig::to_wire).collect::<Vec<_>>(),
        "nextPageToken": next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: PushPolicy = PushPolicy {
        enabled: true,
        allow_private: true,
    };
    const STRICT: PushPolicy = PushPolicy {
        enabled: true,
        allow_private: false,
    };

    #[test]
    fn urls_are_https_or_loopback_http_and_private_targets_need_the_switch() {
        let u = check_url("https://hooks.example.com/a2a?x=1", STRICT).unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.path.as_str()),
            (true, "hooks.example.com", 443, "/a2a?x=1")
        );
        assert!(check_url("http://hooks.example.com/", OPEN)
            .unwrap_err()
            .0
            .contains("loopback"));
        assert!(check_url("http://127.0.0.1:9/", STRICT)
            .unwrap_err()
            .0
            .contains("allow_private"));
        assert!(check_url("http://127.0.0.1:9/", OPEN).is_ok());
        assert!(check_url("http://[::1]:9/x", OPEN).is_ok());
        for bad in [
            "https://10.0.0.1/",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://[fe80::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://localhost/",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://[fd00::1]/",
        ] {
            assert!(
                check_url(bad, STRICT)
                    .unwrap_err()
                    .0
                    .contains("allow_private"),
                "{bad}"
            );
        }
        assert!(check_url("https://8.8.8.8/", STRICT).is_ok());
        assert!(check_url("ftp://x/", OPEN).is_err());
        assert!(check_url("https://user:pw@x.example/", OPEN)
            .unwrap_err()
            .0
            .contains("user info"));
        assert!(check_url("https://x.example/\r\nHost: y", OPEN).is_err());
    }

    /// Issue 15, item 10: the host is read as a WHATWG URL parser (and delivery's resolver)
    /// reads it, so every spelling of a private address is refused at registration, and
    /// delivery dials the normalized form.
    #[test]
    fn hosts_are_normalized_before_the_address_policy() {
        for (url, host) in [
            ("https://0/", "0.0.0.0"),
            ("https://127.1/", "127.0.0.1"),
            ("https://0x7f000001/", "127.0.0.1"),
            ("https://0X7F.1/", "127.0.0.1"),
            ("https://0177.0.0.1/", "127.0.0.1"),
            ("https://2130706433/", "127.0.0.1"),
            ("https://127.0.0.1./", "127.0.0.1"),
            ("https://%31%32%37.0.0.1/", "127.0.0.1"),
            ("https://10.0.0.1.:8443/x", "10.0.0.1"),
            ("https://169.254.43518/", "169.254.169.254"),
            ("https://0xa9.0xfe.0xa9.0xfe/", "169.254.169.254"),
            ("https://localhost./", "localhost"),
            ("https://LOCALHOST/", "localhost"),
            ("https://a.localhost/", "a.localhost"),
            ("https://[::ffff:a9fe:a9fe]/", "::ffff:169.254.169.254"),
            ("https://[fe80::a9fe]/", "fe80::a9fe"),
            ("https://[::127.0.0.1]/", "::7f00:1"),
            ("https://[64:ff9b::a00:1]/", "64:ff9b::a00:1"),
        ] {
            let err = check_url(url, STRICT).unwrap_err();
            assert!(err.0.contains("allow_private"), "{url}: {err}");
            let u = check_url(url, OPEN).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(u.host, host, "{url}");
            assert!(u.literal.is_some(), "{url}");
        }
        // Delivery dials the normalized form, IPv6 in brackets, the port explicit.
        let dial = |url: &str| check_url(url, OPEN).unwrap().endpoint();
        assert_eq!(
            dial("https://127.1/hook?x=1"),
            "https://127.0.0.1:443/hook?x=1"
        );
        assert_eq!(dial("http://0x7f000001:9"), "http://127.0.0.1:9/");
        assert_eq!(
            dial("https://[2001:DB8::A9FE]/h"),
            "https://[2001:db8::a9fe]:443/h"
        );
        assert_eq!(
            dial("https://Hooks.Example.COM./h"),
            "https://hooks.example.com:443/h"
        );
        // Public addresses in any spelling pass the strict policy.
        for url in [
            "https://8.8.8.8/",
            "https://0x08080808/",
            "https://134744072/",
            "https://[2001:4860::8888]/",
        ] {
            assert!(check_url(url, STRICT).is_ok(), "{url}");
        }
        // Plain http is for loopback, however it is written.
        assert!(check_url("http://127.1:9/", OPEN).is_ok());
        assert!(check_url("http://0x7f000001:9/", OPEN).is_ok());
        assert!(check_url("http://0/", OPEN)
            .unwrap_err()
            .0
            .contains("loopback"));
        // What no resolver reads as an address or a name is refused by what it is.
        for (url, says) in [
            ("https://1.2.3.4.5/", "not an IPv4 address"),
            ("https://256.0.0.1/", "not an IPv4 address"),
            ("https://1.2.3.256/", "not an IPv4 address"),
            ("https://08.0.0.1/", "not an IPv4 address"),
            ("https://example.123/", "not an IPv4 address"),
            ("https://example.0x/", "not an IPv4 address"),
            ("https://[::1/", "unclosed ["),
            ("https://[::1]x/", "after the IPv6 address"),
            ("https://[hooks.example.com]/", "is not an IPv6 address"),
            ("https://[fe80::1%25eth0]/", "is not an IPv6 address"),
            ("https://hooks.example.com:http/", "bad port"),
            ("https://hooks.example.com:+443/", "bad port"),
            ("https://hooks.example.com:0/", "bad port"),
            ("https://hooks.example.com:65536/", "bad port"),
            ("https://b\u{fc}cher.example/", "xn--"),
            ("https://%ff/", "UTF-8"),
            ("https://%zz/", "%XX"),
            ("https://a..example/", "not a host name"),
            ("https://a\\b.example/", "no host name has"),
            ("https://:443/", "no host"),
        ] {
            let err = check_url(url, OPEN).unwrap_err();
            assert!(err.0.contains(says), "{url}: {err}");
        }
        // An empty port is the default one, as a browser reads it.
        assert_eq!(
            check_url("https://hooks.example.com:/", STRICT)
                .unwrap()
                .port,
            443
        );
    }

    /// Issue 15, item 10: a config without a URL says the URL is required.
    #[test]
    fn a_config_without_a_url_says_it_is_required() {
        let (field, why) =
            check_config(WireConfig::default(), "t1", STRICT, String::new).unwrap_err();
        assert_eq!(field, "url");
        assert!(why.starts_with("is required"), "{why}");
    }

    #[test]
    fn configs_check_scheme_and_credentials_and_read_back_without_secrets() {
        let wire = WireConfig {
            url: "https://hooks.example.com/".into(),
            token: "tok".into(),
            authentication: Some(Authentication {
                scheme: "Bearer".into(),
                credentials: "s3cret".into(),
            }),
            ..Default::default()
        };
        let c = check_config(wire.clone(), "t1", STRICT, || "c1".into()).unwrap();
        assert_eq!(c.id, "c1");
        let back = serde_json::to_value(c.to_wire()).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"id": "c1", "taskId": "t1", "url": "https://hooks.example.com/", "authentication": {"scheme": "Bearer"}})
        );
        assert_eq!(
            delivery_headers(&c)[1..],
            [
                ("authorization".into(), "Bearer s3cret".into()),
                ("x-a2a-notification-token".into(), "tok".into())
            ]
        );
        let mut bad = wire.clone();
        bad.authentication.as_mut().unwrap().scheme = "Bear er".into();
        assert_eq!(
            check_config(bad, "t1", STRICT, String::new).unwrap_err().0,
            "authentication.scheme"
        );
        let mut bad = wire;
        bad.authentication.as_mut().unwrap().credentials = "a\nb".into();
        assert_eq!(
            check_config(bad, "t1", STRICT, String::new).unwrap_err().0,
            "authentication.credentials"
        );
    }

    #[test]
    fn the_store_bounds_replaces_and_deletes_idempotently() {
        let mut s = PushConfigs::default();
        let c = |id: &str| PushConfig {
            id: id.into(),
            task_id: "t".into(),
            url: "u".into(),
            token: None,
            authentication: None,
        };
        for i in 0..MAX_CONFIGS_PER_TASK {
            s.put(c(&i.to_string())).unwrap();
        }
        assert!(s.put(c("extra")).is_err());
        s.put(c("0")).unwrap();
        assert_eq!(s.list("t").len(), MAX_CONFIGS_PER_TASK);
        assert!(s.delete("t", "0"));
        assert!(!s.delete("t", "0"));
        assert!(s.get("t", "0").is_none());
    }
}
