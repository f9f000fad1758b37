//! CORS for browser clients: `a2a.cors.origins` lists exact origins. A response to a listed
//! origin lets the page read the echo and the challenge; a request from any other origin is
//! refused (403, empty body) before its body is read. The card stays public to every origin.

use crate::errors::ConfigError;

/// Response headers a page may read.
pub(crate) const EXPOSE_HEADERS: &str = "a2a-extensions, retry-after, www-authenticate";
/// Request headers a page may send, named in the preflight.
pub(crate) const ALLOW_HEADERS: &str =
    "content-type, authorization, last-event-id, a2a-extensions, a2a-version";
/// Methods the JSON-RPC route's preflight allows (what `POST /` and `OPTIONS /` answer).
pub(crate) const ALLOW_METHODS: &str = "POST, OPTIONS";
/// Seconds a browser may cache a preflight.
pub(crate) const MAX_AGE: &str = "600";

/// An origin: scheme, lower-case host (brackets stripped), port (the default applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// `scheme://host[:port]` and nothing more; `null` and anything with a path, query,
    /// credentials or wildcard is not an origin.
    pub(crate) fn parse(text: &str) -> Option<Origin> {
        let (scheme, rest) = text.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        if rest.is_empty() || rest.contains(['/', '?', '#', '@', '*', ' ']) {
            return None;
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, after) = v6.split_once(']')?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().ok()?,
                None if after.is_empty() => default_port,
                None => return None,
            };
            (h.to_ascii_lowercase(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_ascii_lowercase(), p.parse().ok()?),
                None => (rest.to_ascii_lowercase(), default_port),
            }
        };
        if host.is_empty() {
            return None;
        }
        Some(Origin { scheme, host, port })
    }
}

/// The listed origins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CorsPolicy {
    origins: Vec<Origin>,
}

impl CorsPolicy {
    /// Parses `a2a.cors.origins`; `*`, paths and anything not an origin are refused.
    pub fn from_list<S: AsRef<str>>(list: &[S]) -> Result<CorsPolicy, ConfigError> {
        let origins = list
            .iter()
            .map(|s| {
                let s = s.as_ref();
                Origin::parse(s).ok_or_else(|| {
                    format!("a2a.cors.origins: {s:?} is not an exact origin (scheme://host[:port], no path, no *)")
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(CorsPolicy { origins })
    }

    /// Whether an `Origin` header names a listed origin.
    pub(crate) fn admits(&self, header: &[u8]) -> bool {
        let Ok(text) = core::str::from_utf8(header) else {
            return false;
        };
        Origin::parse(text.trim()).is_some_and(|o| self.origins.contains(&o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_compare_by_scheme_host_and_port() {
        let p = CorsPolicy::from_list(&[
            "https://ui.example.com",
            "http://localhost:3000",
            "http://[::1]:8080",
        ])
        .unwrap();
        for ok in [
            "https://ui.example.com",
            "https://UI.example.com:443",
            "http://localhost:3000",
            "http://[::1]:8080",
        ] {
            assert!(p.admits(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "null",
            "https://ui.example.com:8443",
            "http://ui.example.com",
            "http://localhost",
            "https://evil.com",
            "",
            "\u{ff}",
        ] {
            assert!(!p.admits(bad.as_bytes()), "{bad}");
        }
        for refused in [
            "*",
            "https://x.com/path",
            "x.com",
            "ftp://x.com",
            "https://*.x.com",
        ] {
            assert!(CorsPolicy::from_list(&[refused]).is_err(), "{refused}");
        }
    }
}
