//! Sign-in: the OAuth 2.0 device authorization grant (RFC 8628) and the sessions it opens.
//!
//! A device asks for a code; the operator approves it with `auth.device.approve` (naming who
//! the device acts as) or denies it; the device polls the token endpoint and receives a
//! session token. Only each token's SHA-256 is kept (in memory, and in the durable store's
//! records, so with a file store a session survives a restart). Every session approved under one name is one principal, `user:<name>`, so what
//! it owns survives a re-login.

use crate::errors::RecordError;
use std::collections::HashMap;

use serde_json::{json, Value};

use crate::auth::{Principal, Role};
use crate::ids::{hex, Entropy};

/// The prefix of every session token (never accepted as a configured secret).
pub(crate) const TOKEN_PREFIX: &str = "agentd_at_";
/// Seconds a polling device waits between polls.
pub(crate) const POLL_INTERVAL_S: u64 = 5;
/// The user-code alphabet: no vowels, no look-alikes.
const USER_CODE_ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";
/// Pending codes held at once.
pub(crate) const MAX_PENDING: usize = 64;
/// Pending codes one source (an IPv4 address, an IPv6 /64, loopback) may hold.
pub(crate) const MAX_PENDING_PER_SOURCE: usize = 4;
/// Pending codes one network (an IPv4 address, an IPv6 /48) may hold.
pub(crate) const MAX_PENDING_PER_NETWORK: usize = 16;

/// Why a device got no code: an OAuth error code, and when a retry can succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AuthorizeRefusal {
    pub(crate) error: &'static str,
    /// Seconds until one of the codes in the way expires (a bound was reached).
    pub(crate) retry_after_s: Option<u32>,
}

/// The scope a device asks for and is approved with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Sign in with the `user` role.
    User,
    /// Sign in as the operator.
    Operator,
}

impl Scope {
    /// The scope as the OAuth `scope` parameter and the configuration spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::User => "user",
            Scope::Operator => "operator",
        }
    }

    /// The scope of an OAuth `scope` value; `None` for any other.
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "user" => Some(Scope::User),
            "operator" => Some(Scope::Operator),
            _ => None,
        }
    }
}

/// `a2a.device_grant`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceGrantConfig {
    /// Whether the device grant (the `/oauth2/*` endpoints and the sign-in ops) is served.
    pub enabled: bool,
    /// Scopes a device may be approved for.
    pub scopes: Vec<Scope>,
    /// How long an issued session token lives, in milliseconds.
    pub token_ttl_ms: u64,
    /// How long a device code waits for approval, in milliseconds.
    pub code_ttl_ms: u64,
    /// `a2a.device_grant.rate`: one bucket per device name (its principal), operators exempt.
    pub rate: Option<crate::limits::Rate>,
}

impl Default for DeviceGrantConfig {
    fn default() -> Self {
        DeviceGrantConfig {
            enabled: false,
            scopes: vec![Scope::User],
            token_ttl_ms: 8 * 3600 * 1000,
            code_ttl_ms: 10 * 60 * 1000,
            rate: None,
        }
    }
}

#[derive(Clone, Debug)]
enum Decision {
    Pending,
    Approved {
        principal: Principal,
        name: String,
        scope: Scope,
        approved_by: String,
    },
    Denied,
}

#[derive(Clone, Debug)]
struct PendingCode {
    device_digest: [u8; 32],
    user_code: String,
    client_id: String,
    scope: Scope,
    peer: Option<String>,
    /// Where the request came from (`None`: a unix-socket peer, one local source).
    source: Option<crate::limits::Source>,
    requested_at: u64,
    expires_at: u64,
    last_poll: Option<u64>,
    decision: Decision,
}

/// An open session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) sid: String,
    pub(crate) name: String,
    pub(crate) principal: Principal,
    pub(crate) client_id: String,
    pub(crate) scope: Scope,
    pub(crate) created_at: u64,
    pub(crate) expires_at: u64,
    pub(crate) approved_by: String,
}

impl Session {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "sid": self.sid,
            "kind": "device",
            "principal": self.principal.id,
            "role": self.principal.role.as_str(),
            "client_id": self.client_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "approved_by": self.approved_by,
            "name": self.name,
        })
    }
}

/// What the token endpoint answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TokenAnswer {
    Issued {
        access_token: String,
        expires_in: u64,
        scope: Scope,
        session: Box<Session>,
    },
    /// An RFC 8628 / 6749 error code.
    Error(&'static str),
}

/// Why an approval was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ApproveError {
    UnknownCode,
    ScopeNotAllowed,
}

/// Pending codes and open sessions.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    pending: Vec<PendingCode>,
    /// Session token digest → session.
    by_token: HashMap<[u8; 32], Session>,
    /// Names approved before: a re-approval is the same principal.
    known_names: std::collections::HashSet<String>,
    /// Write-ahead: sessions (by sid) and names changed since the host last drained them.
    track: bool,
    dirty: std::collections::BTreeSet<String>,
    dirty_names: std::collections::BTreeSet<String>,
    changes: u64,
}

/// The record kinds of sessions and approved names in the durable store. Pending device
/// codes are not kept: they live minutes, and a device whose code is lost asks again.
pub(crate) const SESSION_KIND: &str = "session";
pub(crate) const SESSION_NAME_KIND: &str = "session.name";

impl Sessions {
    fn expire(&mut self, now_ms: u64) {
        self.pending.retain(|p| p.expires_at > now_ms);
        let mut gone = Vec::new();
        self.by_token.retain(|_, s| {
            let live = s.expires_at > now_ms;
            if !live {
                gone.push(s.sid.clone());
            }
            live
        });
        gone.iter().for_each(|sid| self.touch(sid));
    }

    pub(crate) fn set_tracking(&mut self, on: bool) {
        self.track = on;
        if !on {
            self.dirty.clear();
            self.dirty_names.clear();
        }
    }

    fn touch(&mut self, sid: &str) {
        if self.track {
            self.changes += 1;
            self.dirty.insert(sid.to_owned());
        }
    }

    /// Marks every session and approved name changed, for a drain of the whole state.
    pub(crate) fn mark_all_dirty(&mut self) {
        if self.track {
            self.dirty
                .extend(self.by_token.values().map(|s| s.sid.clone()));
            self.dirty_names.extend(self.known_names.iter().cloned());
        }
    }

    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Sessions and names changed since the last call, as `(kind, key, body or None)`.
    pub(crate) fn take_dirty(
        &mut self,
    ) -> Vec<(&'static str, String, Option<crate::instance::RecordBody>)> {
        let mut out = Vec::new();
        for sid in std::mem::take(&mut self.dirty) {
            let found = self.by_token.iter().find(|(_, s)| s.sid == sid);
            let body = found.and_then(|(digest, s)| {
                let doc = json!({
                    "tokenSha256": hex(digest), "sid": s.sid, "name": s.name,
                    "principal": crate::auth::PrincipalDoc::from(&s.principal),
                    "clientId": s.client_id, "scope": s.scope.as_str(),
                    "createdAt": s.created_at, "expiresAt": s.expires_at,
                    "approvedBy": s.approved_by,
                });
                serde_json::value::to_raw_value(&doc).ok()
            });
            out.push((SESSION_KIND, sid, body));
        }
        for name in std::mem::take(&mut self.dirty_names) {
            let approved = serde_json::value::to_raw_value(&true).ok();
            out.push((SESSION_NAME_KIND, name, approved));
        }
        out
    }

    /// Puts back a session or an approved name read from the durable store. An expired
    /// session is dropped (and its removal recorded).
    pub(crate) fn restore(
        &mut self,
        kind: &str,
        key: &str,
        body: Value,
        now_ms: u64,
    ) -> Result<(), RecordError> {
        if kind == SESSION_NAME_KIND {
            self.known_names.insert(key.to_owned());
            return Ok(());
        }
        let s = |k: &str| {
            body.get(k)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("session field {k} missing"))
        };
        let n = |k: &str| {
            body.get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("session field {k} missing"))
        };
        let digest_hex = s("tokenSha256")?;
        let mut digest = [0u8; 32];
        if digest_hex.len() != 64 || !digest_hex.is_ascii() {
            return Err("session token digest is not 32 bytes".into());
        }
        for (i, d) in digest.iter_mut().enumerate() {
            *d =
                u8::from_str_radix(&digest_hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        let principal: crate::auth::PrincipalDoc =
            serde_json::from_value(body.get("principal").cloned().unwrap_or_default())
                .map_err(|e| e.to_string())?;
        let session = Session {
            sid: s("sid")?,
            name: s("name")?,
            principal: principal.into_principal()?,
            client_id: s("clientId")?,
            scope: Scope::parse(&s("scope")?).ok_or("unknown session scope")?,
            created_at: n("createdAt")?,
            expires_at: n("expiresAt")?,
            approved_by: s("approvedBy")?,
        };
        if session.expires_at <= now_ms {
            self.touch(&session.sid);
            return Ok(());
        }
        self.known_names.insert(session.name.clone());
        self.by_token.insert(digest, session);
        Ok(())
    }

    /// A device asks for a code. Returns `(device_code, user_code)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn authorize(
        &mut self,
        entropy: &mut dyn Entropy,
        client_id: &str,
        scope: Scope,
        peer: Option<String>,
        source: Option<crate::limits::Source>,
        config: &DeviceGrantConfig,
        now_ms: u64,
    ) -> Result<(String, String), AuthorizeRefusal> {
        self.expire(now_ms);
        self.make_room_for_code(source, now_ms)?;
        let mut raw = [0u8; 32];
        entropy.fill(&mut raw);
        let device_code = hex(&raw);
        let mut code = [0u8; 8];
        entropy.fill(&mut code);
        let letters: String = code
            .iter()
            .map(|b| char::from(USER_CODE_ALPHABET[usize::from(*b) % USER_CODE_ALPHABET.len()]))
            .collect();
        let user_code = format!("{}-{}", &letters[..4], &letters[4..]);
        self.pending.push(PendingCode {
            device_digest: crate::digest::sha256(device_code.as_bytes()),
            user_code: user_code.clone(),
            client_id: client_id.to_owned(),
            scope,
            peer,
            source,
            requested_at: now_ms,
            expires_at: now_ms + config.code_ttl_ms,
            last_poll: None,
            decision: Decision::Pending,
        });
        Ok((device_code, user_code))
    }

    /// Keeps the pending codes within their shares before one more from `source`: at most
    /// [`MAX_PENDING_PER_SOURCE`] per source and [`MAX_PENDING_PER_NETWORK`] per network,
    /// and [`MAX_PENDING`] in all. At the global cap, the oldest code of the network that
    /// holds the most beyond its fair share (the cap divided among the networks asking) is
    /// expired to make room, so a flood from a few networks displaces only itself and a new
    /// device from elsewhere still gets a code.
    fn make_room_for_code(
        &mut self,
        source: Option<crate::limits::Source>,
        now_ms: u64,
    ) -> Result<(), AuthorizeRefusal> {
        let network = |s: Option<crate::limits::Source>| s.map(crate::limits::Source::network);
        let waiting = |p: &&PendingCode| matches!(p.decision, Decision::Pending);
        // Seconds until the oldest of `codes` expires: when a retry can succeed.
        let refuse = |codes: Vec<&PendingCode>| AuthorizeRefusal {
            error: "slow_down",
            retry_after_s: codes
                .iter()
                .map(|p| p.expires_at)
                .min()
                .map(|at| crate::limits::retry_after_secs(at.saturating_sub(now_ms))),
        };
        let mine: Vec<&PendingCode> = self
            .pending
            .iter()
            .filter(waiting)
            .filter(|p| p.source == source)
            .collect();
        if mine.len() >= MAX_PENDING_PER_SOURCE {
            return Err(refuse(mine));
        }
        let ours: Vec<&PendingCode> = self
            .pending
            .iter()
            .filter(waiting)
            .filter(|p| network(p.source) == network(source))
            .collect();
        if ours.len() >= MAX_PENDING_PER_NETWORK {
            return Err(refuse(ours));
        }
        let all: Vec<&PendingCode> = self.pending.iter().filter(waiting).collect();
        if all.len() < MAX_PENDING {
            return Ok(());
        }
        let mut held: std::collections::BTreeMap<Option<crate::limits::Network>, usize> =
            std::collections::BTreeMap::new();
        for p in &all {
            *held.entry(network(p.source)).or_default() += 1;
        }
        let asking = held.len() + usize::from(!held.contains_key(&network(source)));
        let share = MAX_PENDING / asking;
        let Some((&over, _)) = held
            .iter()
            .filter(|(n, count)| **count > share + 1 && **n != network(source))
            .max_by_key(|(_, count)| **count)
        else {
            return Err(refuse(all));
        };
        if let Some(oldest) = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p.decision, Decision::Pending) && network(p.source) == over)
            .min_by_key(|(_, p)| p.requested_at)
            .map(|(i, _)| i)
        {
            self.pending.remove(oldest);
        }
        Ok(())
    }

    /// `auth.device.pending`: the codes waiting for a decision.
    pub(crate) fn pending(&mut self, now_ms: u64) -> Value {
        self.expire(now_ms);
        let items: Vec<Value> = self
            .pending
            .iter()
            .filter(|p| matches!(p.decision, Decision::Pending))
            .map(|p| {
                json!({
                    "user_code": p.user_code, "client_id": p.client_id, "scope": p.scope.as_str(),
                    "peer": p.peer, "requested_at": p.requested_at, "expires_at": p.expires_at,
                })
            })
            .collect();
        json!({"pending": items})
    }

    /// `auth.device.approve`: the device will act as `user:<name>` (or the operator).
    pub(crate) fn approve(
        &mut self,
        user_code: &str,
        name: &str,
        scope: Option<Scope>,
        approver: &Principal,
        config: &DeviceGrantConfig,
        now_ms: u64,
    ) -> Result<Value, ApproveError> {
        self.expire(now_ms);
        let existing = self.known_names.contains(name);
        let p = self
            .pending
            .iter_mut()
            .find(|p| {
                p.user_code.eq_ignore_ascii_case(user_code)
                    && matches!(p.decision, Decision::Pending)
            })
            .ok_or(ApproveError::UnknownCode)?;
        // An approver may narrow the scope asked for, never widen it.
        let scope = scope.unwrap_or(p.scope);
        if (scope == Scope::Operator && p.scope != Scope::Operator)
            || !config.scopes.contains(&scope)
        {
            return Err(ApproveError::ScopeNotAllowed);
        }
        let principal = match scope {
            Scope::Operator => Principal::operator(),
            Scope::User => Principal::new(format!("user:{name}"), Role::User, Vec::new()),
        };
        p.decision = Decision::Approved {
            principal: principal.clone(),
            name: name.to_owned(),
            scope,
            approved_by: approver.id.clone(),
        };
        let result = json!({"approved": {
            "user_code": p.user_code, "client_id": p.client_id, "scope": scope.as_str(),
            "peer": p.peer, "principal": principal.id, "existing": existing,
        }});
        if self.known_names.insert(name.to_owned()) && self.track {
            self.changes += 1;
            self.dirty_names.insert(name.to_owned());
        }
        Ok(result)
    }

    /// `auth.device.deny`: one code, or every pending one. Returns how many. A denied code
    /// stops counting against the pending bound at once; its device learns `access_denied`.
    pub(crate) fn deny(
        &mut self,
        user_code: Option<&str>,
        now_ms: u64,
    ) -> Vec<(String, String, Scope)> {
        self.expire(now_ms);
        let mut denied = Vec::new();
        for p in self.pending.iter_mut() {
            if matches!(p.decision, Decision::Pending)
                && user_code.is_none_or(|c| p.user_code.eq_ignore_ascii_case(c))
            {
                p.decision = Decision::Denied;
                denied.push((p.user_code.clone(), p.client_id.clone(), p.scope));
            }
        }
        denied
    }

    /// The token endpoint: a polling device learns its fate.
    pub(crate) fn exchange(
        &mut self,
        entropy: &mut dyn Entropy,
        device_code: &str,
        client_id: &str,
        config: &DeviceGrantConfig,
        now_ms: u64,
    ) -> TokenAnswer {
        let digest = crate::digest::sha256(device_code.as_bytes());
        let Some(at) = self
            .pending
            .iter()
            .position(|p| crate::auth::constant_time_eq(&p.device_digest, &digest))
        else {
            return TokenAnswer::Error("invalid_grant");
        };
        if self.pending[at].client_id != client_id {
            return TokenAnswer::Error("invalid_grant");
        }
        if self.pending[at].expires_at <= now_ms {
            self.pending.remove(at);
            return TokenAnswer::Error("expired_token");
        }
        let p = &mut self.pending[at];
        let too_soon = p
            .last_poll
            .is_some_and(|t| now_ms < t + POLL_INTERVAL_S * 1000);
        p.last_poll = Some(now_ms);
        match p.decision.clone() {
            Decision::Pending if too_soon => TokenAnswer::Error("slow_down"),
            Decision::Pending => TokenAnswer::Error("authorization_pending"),
            Decision::Denied => {
                self.pending.remove(at);
                TokenAnswer::Error("access_denied")
            }
            Decision::Approved {
                principal,
                name,
                scope,
                approved_by,
            } => {
                let client_id = p.client_id.clone();
                self.pending.remove(at);
                let mut raw = [0u8; 32];
                entropy.fill(&mut raw);
                let token = format!("{TOKEN_PREFIX}{}", hex(&raw));
                let mut sid_raw = [0u8; 8];
                entropy.fill(&mut sid_raw);
                let session = Session {
                    sid: format!("ds_{}", hex(&sid_raw)),
                    name,
                    principal,
                    client_id,
                    scope,
                    created_at: now_ms,
                    expires_at: now_ms + config.token_ttl_ms,
                    approved_by,
                };
                self.by_token
                    .insert(crate::digest::sha256(token.as_bytes()), session.clone());
                self.touch(&session.sid);
                TokenAnswer::Issued {
                    access_token: token,
                    expires_in: config.token_ttl_ms / 1000,
                    scope,
                    session: Box::new(session),
                }
            }
        }
    }

    /// The session a token opens, if it is live.
    pub(crate) fn session(&self, token: &[u8], now_ms: u64) -> Option<&Session> {
        let digest = crate::digest::sha256(token);
        self.by_token.get(&digest).filter(|s| s.expires_at > now_ms)
    }

    /// Whether a session is still open.
    pub(crate) fn is_live(&self, sid: &str, now_ms: u64) -> bool {
        self.by_token
            .values()
            .any(|s| s.sid == sid && s.expires_at > now_ms)
    }

    /// `auth.sessions`.
    pub(crate) fn list(&mut self, now_ms: u64) -> Value {
        self.expire(now_ms);
        let mut sessions: Vec<&Session> = self.by_token.values().collect();
        sessions.sort_by(|a, b| (a.created_at, &a.sid).cmp(&(b.created_at, &b.sid)));
        json!({"sessions": sessions.iter().map(|s| s.to_json()).collect::<Vec<_>>()})
    }

    /// Revokes by sid, by name, or all; returns the revoked sessions. Nothing the principal
    /// owns is deleted.
    pub(crate) fn revoke(
        &mut self,
        sid: Option<&str>,
        name: Option<&str>,
        all: bool,
    ) -> Vec<Session> {
        let mut gone = Vec::new();
        self.by_token.retain(|_, s| {
            let hit = all || sid.is_some_and(|x| x == s.sid) || name.is_some_and(|x| x == s.name);
            if hit {
                gone.push(s.clone());
            }
            !hit
        });
        gone.iter().for_each(|s| self.touch(&s.sid));
        gone
    }

    /// `POST /oauth2/revoke`: ends the presented token's session.
    pub(crate) fn revoke_token(&mut self, token: &str) -> Option<Session> {
        let gone = self
            .by_token
            .remove(&crate::digest::sha256(token.as_bytes()));
        if let Some(s) = &gone {
            self.touch(&s.sid);
        }
        gone
    }
}

/// Reads an `application/x-www-form-urlencoded` body: a duplicated parameter is refused,
/// an empty value counts as absent.
pub(crate) fn parse_form(body: &[u8]) -> Result<HashMap<String, String>, &'static str> {
    let text = core::str::from_utf8(body).map_err(|_| "invalid_request")?;
    let mut out = HashMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k).ok_or("invalid_request")?;
        let v = percent_decode(v).ok_or("invalid_request")?;
        if out.contains_key(&k) {
            return Err("invalid_request");
        }
        if !v.is_empty() {
            out.insert(k, v);
        } else {
            out.insert(k, String::new());
        }
    }
    out.retain(|_, v| !v.is_empty());
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => bytes.push(b' '),
            b'%' => {
                let h = core::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                bytes.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            c => bytes.push(c),
        }
        i += 1;
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::CounterEntropy;

    #[test]
    fn the_device_flow() {
        let cfg = DeviceGrantConfig {
            enabled: true,
            ..Default::default()
        };
        let mut s = Sessions::default();
        let mut e = CounterEntropy(9);
        let (device, user) = s
            .authorize(&mut e, "laptop", Scope::User, None, None, &cfg, 0)
            .unwrap();
        assert_eq!(device.len(), 64);
        assert!(user.len() == 9 && user.as_bytes()[4] == b'-');
        assert_eq!(
            s.exchange(&mut e, &device, "laptop", &cfg, 1),
            TokenAnswer::Error("authorization_pending")
        );
        assert_eq!(
            s.exchange(&mut e, &device, "laptop", &cfg, 2),
            TokenAnswer::Error("slow_down")
        );
        assert_eq!(
            s.exchange(&mut e, &device, "other", &cfg, 9000),
            TokenAnswer::Error("invalid_grant")
        );
        assert_eq!(s.pending(3)["pending"].as_array().unwrap().len(), 1);
        let op = Principal::operator();
        assert_eq!(
            s.approve(&user, "alice", Some(Scope::Operator), &op, &cfg, 4),
            Err(ApproveError::ScopeNotAllowed)
        );
        let approved = s
            .approve(&user.to_lowercase(), "alice", None, &op, &cfg, 4)
            .unwrap();
        assert_eq!(approved["approved"]["principal"], "user:alice");
        assert_eq!(approved["approved"]["existing"], false);
        let TokenAnswer::Issued {
            access_token,
            session,
            ..
        } = s.exchange(&mut e, &device, "laptop", &cfg, 10_000)
        else {
            panic!()
        };
        assert!(access_token.starts_with(TOKEN_PREFIX));
        assert_eq!(
            s.session(access_token.as_bytes(), 10_001)
                .unwrap()
                .principal
                .id,
            "user:alice"
        );
        assert_eq!(
            s.exchange(&mut e, &device, "laptop", &cfg, 20_000),
            TokenAnswer::Error("invalid_grant"),
            "single use"
        );
        // A second device approved as the same name is the same principal.
        let (d2, u2) = s
            .authorize(&mut e, "phone", Scope::User, None, None, &cfg, 20_000)
            .unwrap();
        assert_eq!(
            s.approve(&u2, "alice", None, &op, &cfg, 20_001).unwrap()["approved"]["existing"],
            true
        );
        let TokenAnswer::Issued {
            access_token: t2, ..
        } = s.exchange(&mut e, &d2, "phone", &cfg, 20_002)
        else {
            panic!()
        };
        assert_eq!(
            s.session(t2.as_bytes(), 20_003).unwrap().principal,
            session.principal
        );
        // Revocation by sid ends exactly that one.
        assert_eq!(s.revoke(Some(&session.sid), None, false).len(), 1);
        assert!(s.session(access_token.as_bytes(), 20_004).is_none());
        assert!(s.session(t2.as_bytes(), 20_004).is_some());
        assert_eq!(s.revoke(None, Some("alice"), false).len(), 1);
        // Expiry.
        let (d3, _) = s
            .authorize(&mut e, "x", Scope::User, None, None, &cfg, 0)
            .unwrap();
        assert_eq!(
            s.exchange(&mut e, &d3, "x", &cfg, cfg.code_ttl_ms),
            TokenAnswer::Error("expired_token")
        );
        // Deny all.
        s.authorize(&mut e, "a", Scope::User, None, None, &cfg, 30_000)
            .unwrap();
        s.authorize(&mut e, "b", Scope::User, None, None, &cfg, 30_000)
            .unwrap();
        let (d4, u4) = s
            .authorize(&mut e, "c", Scope::User, None, None, &cfg, 30_000)
            .unwrap();
        assert_eq!(s.deny(Some(&u4), 30_001).len(), 1);
        assert_eq!(s.deny(None, 30_001).len(), 2);
        assert_eq!(
            s.exchange(&mut e, &d4, "c", &cfg, 30_002),
            TokenAnswer::Error("access_denied")
        );
    }

    #[test]
    fn forms() {
        let f = parse_form(b"grant_type=urn%3Aietf%3Aparams&client_id=a+b&empty=").unwrap();
        assert_eq!(f["grant_type"], "urn:ietf:params");
        assert_eq!(f["client_id"], "a b");
        assert!(!f.contains_key("empty"));
        assert_eq!(parse_form(b"a=1&a=2"), Err("invalid_request"));
        assert_eq!(parse_form(b"a=%zz"), Err("invalid_request"));
        assert_eq!(parse_form(b"a=%ff"), Err("invalid_request"));
    }
}
