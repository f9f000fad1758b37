//! Where a request goes: its route from the method and path, and its standing with CORS.

use super::*;

/// The JSON-RPC endpoint.
pub const RPC_PATH: &str = "/";
/// The public agent card.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// The Prometheus exposition (operator-only).
pub const METRICS_PATH: &str = "/metrics";
/// Liveness: the process serves (no credential).
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness: listening, the store writable, not draining (no credential).
pub const READYZ_PATH: &str = "/readyz";

pub(super) const RPC_ALLOW: &str = "POST, OPTIONS";
/// What `/metrics`, `/healthz` and `/readyz` answer.
pub(super) const PROBE_ALLOW: &str = "GET, HEAD";
pub(super) const CARD_ALLOW: &str = "GET, HEAD, OPTIONS";
/// `OPTIONS *`: what the server as a whole answers.
pub(super) const SERVER_ALLOW: &str = "GET, HEAD, POST, OPTIONS";

/// Where a request head sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Route {
    Card {
        head_only: bool,
    },
    /// A device-grant endpoint (only while the grant is enabled).
    OAuth(crate::oauth::Endpoint),
    /// `GET /metrics`: the operator's.
    Metrics {
        head_only: bool,
    },
    /// `GET /healthz` (`ready: false`) or `GET /readyz` (`ready: true`): anyone's.
    Health {
        ready: bool,
        head_only: bool,
    },
    Rpc,
    /// A file of the console the host compiled in (only while it hands the core some).
    Static {
        file: &'static crate::statics::StaticFile,
        head_only: bool,
    },
    Options {
        allow: &'static str,
    },
    Refuse {
        status: u16,
        allow: Option<&'static str>,
    },
}

/// A request's standing with CORS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Cors {
    /// No `Origin`: not a browser's cross-origin request.
    None,
    /// A listed origin: its responses name it, and expose the headers a page reads.
    Allowed {
        origin: String,
        preflight: bool,
        private_network: bool,
    },
    /// An unlisted origin: refused, and the answer varies with `Origin`.
    Refused,
}

impl Connection {
    /// The CORS headers of the request being answered.
    pub(super) fn cors_headers(&self, h: &mut Head<'_>) {
        match &self.cors {
            Cors::None => {}
            Cors::Refused => h.headers.push(("vary", Cow::Borrowed("Origin"))),
            Cors::Allowed {
                origin,
                preflight,
                private_network,
            } => {
                h.headers
                    .push(("access-control-allow-origin", Cow::Owned(origin.clone())));
                h.headers.push(("vary", Cow::Borrowed("Origin")));
                if *preflight {
                    h.headers.push((
                        "access-control-allow-methods",
                        Cow::Borrowed(crate::http::cors::ALLOW_METHODS),
                    ));
                    h.headers.push((
                        "access-control-allow-headers",
                        Cow::Borrowed(crate::http::cors::ALLOW_HEADERS),
                    ));
                    h.headers.push((
                        "access-control-max-age",
                        Cow::Borrowed(crate::http::cors::MAX_AGE),
                    ));
                    if *private_network {
                        h.headers.push((
                            "access-control-allow-private-network",
                            Cow::Borrowed("true"),
                        ));
                    }
                } else {
                    h.headers.push((
                        "access-control-expose-headers",
                        Cow::Borrowed(crate::http::cors::EXPOSE_HEADERS),
                    ));
                }
            }
        }
    }
}

pub(super) fn route(head: &RequestHead) -> Route {
    match head.path.as_str() {
        RPC_PATH => match head.method {
            Method::Post => {
                if is_json(head.header("content-type")) {
                    Route::Rpc
                } else {
                    Route::Refuse {
                        status: 415,
                        allow: None,
                    }
                }
            }
            Method::Options => Route::Options { allow: RPC_ALLOW },
            _ => Route::Refuse {
                status: 405,
                allow: Some(RPC_ALLOW),
            },
        },
        CARD_PATH => match head.method {
            Method::Get => Route::Card { head_only: false },
            Method::Head => Route::Card { head_only: true },
            Method::Options => Route::Options { allow: CARD_ALLOW },
            _ => Route::Refuse {
                status: 405,
                allow: Some(CARD_ALLOW),
            },
        },
        METRICS_PATH | HEALTHZ_PATH | READYZ_PATH => {
            let head_only = match head.method {
                Method::Get => false,
                Method::Head => true,
                _ => {
                    return Route::Refuse {
                        status: 405,
                        allow: Some(PROBE_ALLOW),
                    }
                }
            };
            match head.path.as_str() {
                METRICS_PATH => Route::Metrics { head_only },
                p => Route::Health {
                    ready: p == READYZ_PATH,
                    head_only,
                },
            }
        }
        "*" => match head.method {
            Method::Options => Route::Options {
                allow: SERVER_ALLOW,
            },
            _ => Route::Refuse {
                status: 400,
                allow: None,
            },
        },
        _ => Route::Refuse {
            status: 404,
            allow: None,
        },
    }
}

/// Where a request stands with CORS: the JSON-RPC route and its preflight are gated by the
/// listed origins; the card is public (its own `access-control-allow-origin: *`). While the
/// console is served, the listener's own origin (exactly as the card names it) is the
/// console's, so not a cross-origin caller: its calls are answered as if they had no
/// `Origin`. Only that literal origin: a page whose host name merely resolves here (DNS
/// rebinding) names another origin and stays refused.
pub(super) fn cors_standing(
    inst: &Instance,
    listener: usize,
    head: &RequestHead,
    route: &Route,
) -> Cors {
    let Some(origin) = head.header("origin") else {
        return Cors::None;
    };
    if head.path != RPC_PATH && !matches!(route, Route::OAuth(_)) {
        return Cors::None;
    }
    let config = inst.config();
    if !config.console.is_empty()
        && config
            .listeners
            .get(listener)
            .is_some_and(|l| origin.trim_ascii() == l.origin().as_bytes())
    {
        return Cors::None;
    }
    if !config.cors.admits(origin) {
        return Cors::Refused;
    }
    Cors::Allowed {
        origin: String::from_utf8_lossy(origin).trim().to_owned(),
        preflight: matches!(route, Route::Options { .. }),
        private_network: head
            .header("access-control-request-private-network")
            .is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"true")),
    }
}

/// `application/json`, any case, with or without parameters.
pub(super) fn is_json(content_type: Option<&[u8]>) -> bool {
    let Some(ct) = content_type else { return false };
    let media = ct.split(|b| *b == b';').next().unwrap_or_default();
    let media = media.trim_ascii();
    media.eq_ignore_ascii_case(b"application/json")
}

/// `If-None-Match`: `*`, or a list of entity tags compared weakly.
pub(super) fn etag_matches(header: &[u8], etag: &str) -> bool {
    let Ok(text) = std::str::from_utf8(header) else {
        return false;
    };
    text.split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
}
