//! The device authorization grant's HTTP endpoints (RFC 8628, 6749, 7009, 8414), served on
//! the listener's origin while `a2a.device_grant.enabled`; otherwise they are 404.

use serde_json::json;

use crate::feed::FeedEvent;
use crate::instance::Instance;
use crate::limits::{retry_after_secs, Source};
use crate::sessions::{parse_form, Scope, TokenAnswer, POLL_INTERVAL_S};
use crate::time::Now;

pub(crate) const DEVICE_AUTHORIZATION_PATH: &str = "/oauth2/device_authorization";
pub(crate) const TOKEN_PATH: &str = "/oauth2/token";
pub(crate) const REVOKE_PATH: &str = "/oauth2/revoke";
pub(crate) const DEVICE_PAGE_PATH: &str = "/oauth2/device";
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-authorization-server";
/// The grant type a polling device names.
pub(crate) const DEVICE_GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:device_code";
/// The largest form accepted.
pub(crate) const MAX_FORM_BYTES: usize = 4096;

/// An endpoint, by path and method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    DeviceAuthorization,
    Token,
    Revoke,
    DevicePage,
    Metadata,
}

impl Endpoint {
    pub(crate) fn from_path(path: &str) -> Option<Endpoint> {
        Some(match path {
            DEVICE_AUTHORIZATION_PATH => Endpoint::DeviceAuthorization,
            TOKEN_PATH => Endpoint::Token,
            REVOKE_PATH => Endpoint::Revoke,
            DEVICE_PAGE_PATH => Endpoint::DevicePage,
            METADATA_PATH => Endpoint::Metadata,
            _ => return None,
        })
    }

    /// Whether the endpoint takes a form (POST) rather than being read (GET).
    pub(crate) fn takes_form(self) -> bool {
        matches!(
            self,
            Endpoint::DeviceAuthorization | Endpoint::Token | Endpoint::Revoke
        )
    }
}

/// An answer: status, content type, body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) body: Vec<u8>,
    /// A limit refused the request (HTTP 429): `Retry-After`, in seconds.
    pub(crate) retry_after_s: Option<u32>,
}

fn json_answer(status: u16, value: serde_json::Value) -> Answer {
    Answer {
        status,
        content_type: "application/json",
        body: serde_json::to_vec(&value).unwrap_or_default(),
        retry_after_s: None,
    }
}

fn error(code: &'static str) -> Answer {
    json_answer(400, json!({"error": code}))
}

/// A limit's refusal: 429 with `Retry-After` and the OAuth error `slow_down`, saying which
/// limit.
fn limited(retry_after_s: u32, why: &str) -> Answer {
    Answer {
        retry_after_s: Some(retry_after_s),
        ..json_answer(
            429,
            json!({"error": "slow_down", "error_description": format!("{why}; try again in {retry_after_s} s")}),
        )
    }
}

/// Answers one request to an endpoint.
pub(crate) fn answer(
    inst: &mut Instance,
    endpoint: Endpoint,
    listener: usize,
    source: Option<Source>,
    form_type: bool,
    body: &[u8],
    now: Now,
) -> Answer {
    let origin = inst
        .config()
        .listeners
        .get(listener)
        .map(|l| l.origin().to_owned())
        .unwrap_or_default();
    let grant = inst.config().device_grant.clone();
    let form = if endpoint.takes_form() {
        if !form_type {
            return error("invalid_request");
        }
        match parse_form(body) {
            Ok(f) => f,
            Err(code) => return error(code),
        }
    } else {
        Default::default()
    };
    match endpoint {
        Endpoint::Metadata => json_answer(
            200,
            json!({
                "issuer": origin,
                "device_authorization_endpoint": format!("{origin}{DEVICE_AUTHORIZATION_PATH}"),
                "token_endpoint": format!("{origin}{TOKEN_PATH}"),
                "revocation_endpoint": format!("{origin}{REVOKE_PATH}"),
                "grant_types_supported": [DEVICE_GRANT_TYPE],
                "response_types_supported": [],
                "token_endpoint_auth_methods_supported": ["none"],
                "scopes_supported": grant.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            }),
        ),
        Endpoint::DevicePage => Answer {
            status: 200,
            content_type: "text/plain; charset=utf-8",
            body: b"To sign this device in, give its user code to the operator of this agentd \
instance, who approves it with the auth.device.approve command (user_code, and the name the \
device acts as). The device then receives its token.\n"
                .to_vec(),
            retry_after_s: None,
        },
        Endpoint::DeviceAuthorization => {
            let Some(client_id) = form.get("client_id") else {
                return error("invalid_request");
            };
            let valid = !client_id.is_empty()
                && client_id.len() <= 64
                && client_id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !valid {
                return error("invalid_request");
            }
            let scope = match form.get("scope").map(String::as_str) {
                None => Scope::User,
                Some(s) => match Scope::parse(s).filter(|s| grant.scopes.contains(s)) {
                    Some(s) => s,
                    None => return error("invalid_scope"),
                },
            };
            if let Some(src) = source {
                if let Err(wait) = inst.limits.device_authorization.take(src, now.mono_ms) {
                    return limited(
                        retry_after_secs(wait),
                        "too many device authorization requests from this address",
                    );
                }
            }
            let (sessions, entropy) = (&mut inst.sessions, inst.entropy.as_mut());
            let asked = sessions.authorize(
                entropy,
                client_id,
                scope,
                None,
                source,
                &grant,
                now.epoch_ms,
            );
            match asked {
                Ok((device_code, user_code)) => {
                    let pushed = inst.push_feed(
                        FeedEvent::Other {
                            kind: "auth",
                            data: json!({"event": "pending", "client_id": client_id, "scope": scope.as_str(), "user_code": user_code}),
                            owner: None,
                        },
                        now,
                    );
                    debug_assert!(pushed.is_ok(), "auth events match their schema: {pushed:?}");
                    json_answer(
                        200,
                        json!({
                            "device_code": device_code,
                            "user_code": user_code,
                            "verification_uri": format!("{origin}{DEVICE_PAGE_PATH}"),
                            "expires_in": grant.code_ttl_ms / 1000,
                            "interval": POLL_INTERVAL_S,
                        }),
                    )
                }
                Err(refusal) => match refusal.retry_after_s {
                    Some(secs) => limited(
                        secs,
                        "too many device codes are waiting for approval from this address or network",
                    ),
                    None => error(refusal.error),
                },
            }
        }
        Endpoint::Token => {
            let (Some(grant_type), Some(device_code), Some(client_id)) = (
                form.get("grant_type"),
                form.get("device_code"),
                form.get("client_id"),
            ) else {
                return error("invalid_request");
            };
            if grant_type != DEVICE_GRANT_TYPE {
                return error("unsupported_grant_type");
            }
            if let Some(src) = source {
                if let Err(wait) = inst.limits.token.take(src, now.mono_ms) {
                    return limited(
                        retry_after_secs(wait),
                        "too many token requests from this address",
                    );
                }
            }
            let (sessions, entropy) = (&mut inst.sessions, inst.entropy.as_mut());
            match sessions.exchange(entropy, device_code, client_id, &grant, now.epoch_ms) {
                TokenAnswer::Issued {
                    access_token,
                    expires_in,
                    scope,
                    ..
                } => json_answer(
                    200,
                    json!({"access_token": access_token, "token_type": "Bearer", "expires_in": expires_in, "scope": scope.as_str()}),
                ),
                TokenAnswer::Error(code) => error(code),
            }
        }
        Endpoint::Revoke => {
            if let Some(token) = form.get("token") {
                if let Some(gone) = inst.sessions.revoke_token(token) {
                    inst.sessions_revoked(vec![gone], now);
                }
            }
            // RFC 7009: the answer does not say whether the token was valid.
            Answer {
                status: 200,
                content_type: "application/json",
                body: Vec::new(),
                retry_after_s: None,
            }
        }
    }
}
