//! Who is calling. Today every listener is a loopback listener with no credential configured,
//! whose local callers are the operator; credentials and sessions arrive with the identity
//! work. Roles and grants are already what the command extension authorizes against.

/// What a principal is, for authorization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Every method and op, on every object.
    Operator,
    /// A person: every core method on its own tasks, and the user op defaults.
    User,
    /// A peer agent: every core method on its own tasks, and the agent op defaults.
    Agent,
    /// Nobody: refused everywhere, whatever its grants say.
    Anonymous,
}

impl Role {
    /// The role's name, as configuration and the audit log spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::User => "user",
            Role::Agent => "agent",
            Role::Anonymous => "anonymous",
        }
    }
}

/// The identity a request resolved to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    /// `operator`, `user:<name>`, or an agent peer's name.
    pub id: String,
    /// What the principal may do before its grants are counted.
    pub role: Role,
    /// Op names or patterns (`*`, `workflow.*`, `workflow.run:<pattern>`) beyond the role's
    /// defaults.
    pub(crate) grants: Vec<String>,
    /// The rule's `quotas.rate`: requests allowed per period (§7.5). Operators are exempt
    /// whatever it says.
    pub rate: Option<crate::limits::Rate>,
}

impl Principal {
    /// The operator: every method and op, no grants needed, no rate.
    pub fn operator() -> Self {
        Principal {
            id: "operator".into(),
            role: Role::Operator,
            grants: Vec::new(),
            rate: None,
        }
    }

    /// A principal of `role` with `grants` beyond the role's defaults, under no rate.
    pub fn new(id: impl Into<String>, role: Role, grants: Vec<String>) -> Self {
        Principal {
            id: id.into(),
            role,
            grants,
            rate: None,
        }
    }

    /// The same principal under a request rate.
    pub fn with_rate(mut self, rate: Option<crate::limits::Rate>) -> Self {
        self.rate = rate;
        self
    }

    /// Whether the principal is the operator, who is exempt from ownership checks and rates.
    pub fn is_operator(&self) -> bool {
        self.role == Role::Operator
    }

    /// Whether this caller may see what `owner` owns: its own, or everything for an operator.
    pub fn may_see(&self, owner: &Principal) -> bool {
        self.is_operator() || (self.role != Role::Anonymous && self.id == owner.id)
    }

    /// Whether a grant names `op`: exactly, by `*`, or by a `family.*` pattern.
    pub fn granted(&self, op: &str) -> bool {
        self.grants.iter().any(|g| grant_matches(g, op))
    }
}

/// `*` matches every op; `family.*` every op under `family.`; a scoped
/// `workflow.run:<pattern>` grant counts as a grant of `workflow.run`; anything else only
/// itself.
pub(crate) fn grant_matches(grant: &str, op: &str) -> bool {
    if grant == "*" || grant == op {
        return true;
    }
    if let Some(family) = grant.strip_suffix(".*") {
        return op
            .strip_prefix(family)
            .is_some_and(|rest| rest.starts_with('.'));
    }
    if let Some((scoped, _pattern)) = grant.split_once(':') {
        return scoped == op;
    }
    false
}

/// A principal as the store keeps it (owners of tasks, sessions' principals).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct PrincipalDoc {
    id: String,
    role: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    grants: Vec<String>,
}

impl PrincipalDoc {
    pub(crate) fn from(p: &Principal) -> Self {
        PrincipalDoc {
            id: p.id.clone(),
            role: p.role.as_str().to_owned(),
            grants: p.grants.clone(),
        }
    }

    pub(crate) fn into_principal(self) -> Result<Principal, crate::errors::RecordError> {
        let role = match self.role.as_str() {
            "operator" => Role::Operator,
            "user" => Role::User,
            "agent" => Role::Agent,
            "anonymous" => Role::Anonymous,
            other => return Err(format!("unknown role {other:?}").into()),
        };
        Ok(Principal::new(self.id, role, self.grants))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants() {
        assert!(grant_matches("*", "status"));
        assert!(grant_matches("workflow.*", "workflow.run"));
        assert!(!grant_matches("workflow.*", "workflowx.run"));
        assert!(!grant_matches("workflow.*", "workflow"));
        assert!(grant_matches("workflow.run:deploy-*", "workflow.run"));
        assert!(!grant_matches("workflow.run", "workflow.runs"));
        let anon = Principal::new("x", Role::Anonymous, vec!["*".into()]);
        assert!(!anon.may_see(&anon));
    }
}

/// What the transport proved about a connection's peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A unix-socket peer the driver admitted (the daemon's own uid, or root): the kernel is
    /// the authenticator, so it is the operator.
    Unix {
        /// The peer's uid, from `SO_PEERCRED`.
        uid: u32,
    },
    /// A TCP peer.
    Tcp,
    /// An embedder that authenticated the caller itself.
    Fixed(Principal),
    /// A TLS peer whose client certificate the listener's CA verified.
    Cert(crate::tls::ClientIdentity),
}

/// A bearer credential from the configuration, kept only as its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BearerRule {
    /// SHA-256 of the bearer token; a presented token is hashed and compared in constant time.
    pub digest: [u8; 32],
    /// Who a caller presenting the token is.
    pub principal: Principal,
}

/// How callers authenticate: the one source for the resolver, the card's security fields and
/// the extended-card gate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// `a2a.bearer`'s digest: the operator credential.
    pub operator_bearer: Option<[u8; 32]>,
    /// `bearer_ref` rules, in declared order.
    pub bearers: Vec<BearerRule>,
    /// The principal of an `any` rule: whoever presents nothing.
    pub any: Option<Principal>,
    /// Certificate rules, first match wins. With none, a verified certificate is the operator.
    pub cert_rules: Vec<crate::tls::CertRule>,
}

impl AuthConfig {
    /// A bearer mechanism is configured.
    pub(crate) fn has_bearer(&self) -> bool {
        self.operator_bearer.is_some() || !self.bearers.is_empty()
    }

    /// The operator credential and one rule, for tests and embedders: digests of the tokens.
    pub fn digest(token: &str) -> [u8; 32] {
        crate::digest::sha256(token.as_bytes())
    }
}

/// Why a request has no principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unauthenticated {
    /// Nothing was presented.
    Missing,
    /// A credential was presented and matched nothing.
    InvalidToken,
    /// A browser request (it carries `Origin`) on a listener whose only evidence would be
    /// the implicit loopback operator: admission is not trust.
    Browser,
    /// A verified certificate no rule gives a role (403).
    NoRole,
}

/// Who a request is, from the transport and its headers, in the fixed order of evidence:
/// the unix peer; a presented bearer (which never falls back to other evidence); an `any`
/// rule; the implicit operator of a loopback listener with nothing configured; else nobody.
#[cfg(test)]
pub(crate) fn resolve(
    config: &AuthConfig,
    peer: &Peer,
    loopback_listener: bool,
    authorization: Option<&[u8]>,
    has_origin: bool,
) -> Result<(Principal, Via), Unauthenticated> {
    resolve_with_sessions(
        config,
        None,
        peer,
        loopback_listener,
        authorization,
        has_origin,
    )
    .map(|(p, via, _)| (p, via))
}

/// Who a request is, in the order of evidence of `resolve` (the unix peer; a presented
/// bearer; an `any` rule; the implicit operator of a loopback listener with nothing
/// configured; else nobody), with the session store: a session token (`agentd_at_…`) is
/// decided by the store alone. Also returns the session id a session caller acts under.
pub(crate) fn resolve_with_sessions(
    config: &AuthConfig,
    sessions: Option<(&crate::sessions::Sessions, u64)>,
    peer: &Peer,
    loopback_listener: bool,
    authorization: Option<&[u8]>,
    has_origin: bool,
) -> Result<(Principal, Via, Option<String>), Unauthenticated> {
    if let (Peer::Tcp | Peer::Cert(_), Some(value), Some((store, now_ms))) =
        (peer, authorization, sessions)
    {
        if let Some(token) = bearer_token(value) {
            if token.starts_with(crate::sessions::TOKEN_PREFIX.as_bytes()) {
                return match store.session(token, now_ms) {
                    Some(s) => Ok((s.principal.clone(), Via::Session, Some(s.sid.clone()))),
                    None => Err(Unauthenticated::InvalidToken),
                };
            }
        }
    }
    resolve_plain(config, peer, loopback_listener, authorization, has_origin)
        .map(|(p, v)| (p, v, None))
}

fn resolve_plain(
    config: &AuthConfig,
    peer: &Peer,
    loopback_listener: bool,
    authorization: Option<&[u8]>,
    has_origin: bool,
) -> Result<(Principal, Via), Unauthenticated> {
    match peer {
        Peer::Unix { .. } => return Ok((Principal::operator(), Via::Unix)),
        Peer::Fixed(p) => return Ok((p.clone(), Via::Fixed)),
        Peer::Tcp | Peer::Cert(_) => {}
    }
    if let Some(value) = authorization {
        if config.has_bearer() {
            let token = bearer_token(value).ok_or(Unauthenticated::InvalidToken)?;
            let digest = crate::digest::sha256(token);
            // Every configured digest is compared, in constant time, whatever matches.
            let mut found: Option<Principal> = None;
            if let Some(op) = &config.operator_bearer {
                if constant_time_eq(op, &digest) {
                    found = Some(Principal::operator());
                }
            }
            for rule in &config.bearers {
                if constant_time_eq(&rule.digest, &digest) && found.is_none() {
                    found = Some(rule.principal.clone());
                }
            }
            return match found {
                Some(p) if p.role != Role::Anonymous => Ok((p, Via::Bearer)),
                _ => Err(Unauthenticated::InvalidToken),
            };
        }
        // A bearer on a listener with no bearer mechanism names nothing: go on.
    }
    if let Peer::Cert(id) = peer {
        if config.cert_rules.is_empty() {
            return Ok((Principal::operator(), Via::Cert));
        }
        return match config.cert_rules.iter().find(|r| r.matches(id)) {
            Some(r) if r.principal.role != Role::Anonymous => Ok((r.principal.clone(), Via::Cert)),
            _ => Err(Unauthenticated::NoRole),
        };
    }
    if let Some(p) = &config.any {
        if p.role == Role::Anonymous {
            return Err(Unauthenticated::Missing);
        }
        return Ok((p.clone(), Via::AnyRule));
    }
    if loopback_listener && !config.has_bearer() {
        if has_origin {
            return Err(Unauthenticated::Browser);
        }
        return Ok((Principal::operator(), Via::Implicit));
    }
    Err(Unauthenticated::Missing)
}

/// How a principal was established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A unix-socket peer the driver admitted.
    Unix,
    /// A configured bearer token.
    Bearer,
    /// A device-grant session token.
    Session,
    /// A verified client certificate.
    Cert,
    /// The `any` rule, which admits a caller without a credential.
    AnyRule,
    /// The implicit operator of a loopback listener with nothing configured.
    Implicit,
    /// An embedder's own authentication ([`Peer::Fixed`]).
    Fixed,
}

impl Via {
    /// Named through a scheme the card declares: what the extended card requires.
    pub(crate) fn declared_scheme(self) -> bool {
        matches!(self, Via::Bearer | Via::Session | Via::Cert | Via::Fixed)
    }
}

/// Whether an `Authorization` value is a session token (`Bearer agentd_at_…`), which only
/// the session store decides.
pub(crate) fn is_session_bearer(value: &[u8]) -> bool {
    bearer_token(value).is_some_and(|t| t.starts_with(crate::sessions::TOKEN_PREFIX.as_bytes()))
}

fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let text = value.trim_ascii();
    let (scheme, token) = text.split_at(text.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Compares two digests without an early exit, so timing says nothing about where they differ.
pub(crate) fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= x ^ y;
    }
    diff == 0
}

#[cfg(test)]
mod resolve_tests {
    use super::*;

    fn config() -> AuthConfig {
        AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-secret")),
            bearers: vec![BearerRule {
                digest: AuthConfig::digest("peer-secret"),
                principal: Principal::new(
                    "agent:peer-a",
                    Role::Agent,
                    vec!["workflow.signal".into()],
                ),
            }],
            any: None,
            cert_rules: Vec::new(),
        }
    }

    #[test]
    fn evidence_in_order() {
        let c = config();
        let r = |auth: Option<&str>, loopback: bool, origin: bool| {
            resolve(&c, &Peer::Tcp, loopback, auth.map(str::as_bytes), origin)
        };
        assert_eq!(
            r(Some("Bearer op-secret"), true, false).unwrap().0,
            Principal::operator()
        );
        assert_eq!(
            r(Some("bearer  peer-secret "), false, false).unwrap().0.id,
            "agent:peer-a"
        );
        assert_eq!(
            r(Some("Bearer nope"), true, false),
            Err(Unauthenticated::InvalidToken)
        );
        assert_eq!(
            r(Some("Basic b3A="), true, false),
            Err(Unauthenticated::InvalidToken)
        );
        assert_eq!(
            r(None, true, false),
            Err(Unauthenticated::Missing),
            "a bearer mechanism ends the implicit operator"
        );
        let open = AuthConfig::default();
        assert_eq!(
            resolve(&open, &Peer::Tcp, true, None, false).unwrap(),
            (Principal::operator(), Via::Implicit)
        );
        assert_eq!(
            resolve(&open, &Peer::Tcp, true, Some(b"Bearer x"), false)
                .unwrap()
                .1,
            Via::Implicit,
            "ignored where no bearer is configured"
        );
        assert_eq!(
            resolve(&open, &Peer::Tcp, true, None, true),
            Err(Unauthenticated::Browser)
        );
        assert_eq!(
            resolve(&open, &Peer::Tcp, false, None, false),
            Err(Unauthenticated::Missing)
        );
        assert_eq!(
            resolve(
                &c,
                &Peer::Unix { uid: 0 },
                false,
                Some(b"Bearer nope"),
                true
            )
            .unwrap()
            .1,
            Via::Unix
        );
        let any = AuthConfig {
            any: Some(Principal::new("user:guest", Role::User, vec![])),
            ..config()
        };
        assert_eq!(
            resolve(&any, &Peer::Tcp, false, None, false).unwrap().1,
            Via::AnyRule
        );
        assert_eq!(
            resolve(&any, &Peer::Tcp, false, Some(b"Bearer nope"), false),
            Err(Unauthenticated::InvalidToken),
            "a failed bearer never falls back"
        );
    }

    #[test]
    fn constant_time_compare() {
        let a = AuthConfig::digest("a");
        assert!(constant_time_eq(&a, &a));
        assert!(!constant_time_eq(&a, &AuthConfig::digest("b")));
    }
}
