//! `agentd login URL` and `agentd logout URL`: sign in by the OAuth 2.0 device grant
//! (RFC 8628) and keep the session token for the server's origin; sign out by revoking it
//! (RFC 7009) and forgetting it. The endpoints come from the server's metadata
//! (`/.well-known/oauth-authorization-server`, RFC 8414).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::super::args::Parsed;
use super::super::client::Client;
use super::super::credentials::{self, Credential};
use super::super::output;
use super::super::Failure;

const METADATA_PATH: &str = "/.well-known/oauth-authorization-server";
const DEVICE_GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:device_code";
/// How much longer each poll waits after a `slow_down` (RFC 8628 section 3.5).
const SLOW_DOWN_STEP: Duration = Duration::from_secs(5);

const LOGIN_USAGE: &str = "\
Usage: agentd login URL [--client-id NAME] [--scope user|operator] [--json]

Signs in by the device grant: asks the server for a code, shows it, and waits while an
operator approves it (the auth.device.approve command). The session token is kept for the
URL's origin in $XDG_CONFIG_HOME/agentd/credentials.json (else ~/.config/agentd/), mode
0600; the client subcommands use it when neither --bearer nor $AGENTD_TOKEN is given.
--client-id names this device to the operator (default: agentd-cli).
";

const LOGOUT_USAGE: &str = "\
Usage: agentd logout URL [--json]

Revokes the session token kept for the URL's origin and forgets it.
";

pub fn login(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &["--client-id", "--scope"], &[])?;
    if super::help(&p, LOGIN_USAGE) {
        return Ok(());
    }
    let [url] = <[String; 1]>::try_from(p.exact(&["URL"])?).unwrap_or_default();
    let mut common = p.common(&url)?;
    // The OAuth endpoints take no bearer; an old token is not sent along.
    common.bearer = None;
    let json = common.json;
    let client_id = p.value("--client-id").unwrap_or("agentd-cli").to_owned();
    let mut client = Client::new(&common)?;

    let (device_path, token_path) = endpoints(&mut client)?;
    let mut form = format!("client_id={}", form_encode(&client_id));
    if let Some(scope) = p.value("--scope") {
        form.push_str(&format!("&scope={}", form_encode(scope)));
    }
    let (status, grant) = client.http_json(&device_path, Some(&form))?;
    if status != 200 {
        return Err(oauth_refusal(status, &grant));
    }
    let field = |name: &str| -> Result<String, Failure> {
        grant
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| Failure::BadAnswer(format!("the device authorization has no {name}")))
    };
    let device_code = field("device_code")?;
    let user_code = field("user_code")?;
    let verification = field("verification_uri")?;
    let expires_in = grant
        .get("expires_in")
        .and_then(Value::as_u64)
        .unwrap_or(600);
    let mut interval = Duration::from_secs(
        grant
            .get("interval")
            .and_then(Value::as_u64)
            .unwrap_or(5)
            .max(1),
    );
    if json {
        output::json_line(
            &json!({"user_code": user_code, "verification_uri": verification, "expires_in": expires_in}),
        );
    } else {
        eprintln!(
            "To sign in, have an operator of {} approve the code {user_code}\n  (auth.device.approve; instructions: {verification})",
            credentials::origin_of(&url)
        );
    }

    let poll = format!(
        "grant_type={}&device_code={}&client_id={}",
        form_encode(DEVICE_GRANT_TYPE),
        form_encode(&device_code),
        form_encode(&client_id)
    );
    let deadline = Instant::now()
        + common
            .timeout
            .unwrap_or(Duration::from_secs(expires_in + 5));
    let issued = output::with_progress(
        "waiting for approval",
        json,
        || -> Result<Value, Failure> {
            loop {
                if Instant::now() + interval > deadline {
                    return Err(Failure::Connect(
                        "timed out waiting for approval (see --timeout)".into(),
                    ));
                }
                std::thread::sleep(interval);
                let (status, answer) = client.http_json(&token_path, Some(&poll))?;
                if status == 200 {
                    return Ok(answer);
                }
                match answer.get("error").and_then(Value::as_str) {
                    Some("authorization_pending") => {}
                    Some("slow_down") => interval += SLOW_DOWN_STEP,
                    Some("access_denied") => {
                        return Err(Failure::Refused("the operator denied this sign-in".into()))
                    }
                    Some("expired_token") => {
                        return Err(Failure::Refused(
                            "the code expired before an operator approved it".into(),
                        ))
                    }
                    _ => return Err(oauth_refusal(status, &answer)),
                }
            }
        },
    )?;
    let token = issued
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Failure::BadAnswer("the token answer has no access_token".into()))?;
    let lifetime = issued
        .get("expires_in")
        .and_then(Value::as_u64)
        .unwrap_or(3600);
    let cred = Credential {
        access_token: token.to_owned(),
        expires_at: credentials::now_s() + lifetime,
        scope: issued
            .get("scope")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    };
    let file = credentials::store(&url, Some(&cred))?;
    let origin = credentials::origin_of(&url);
    if json {
        output::json_line(
            &json!({"signed_in": origin, "scope": cred.scope, "expires_at": cred.expires_at, "file": file}),
        );
    } else {
        output::line(&format!(
            "signed in to {origin} ({}), for {}; the token is kept in {}",
            if cred.scope.is_empty() {
                "no scope named"
            } else {
                &cred.scope
            },
            human_duration(lifetime),
            file.display()
        ));
    }
    Ok(())
}

pub fn logout(words: &[String]) -> Result<(), Failure> {
    let p = Parsed::new(words, &[], &[])?;
    if super::help(&p, LOGOUT_USAGE) {
        return Ok(());
    }
    let [url] = <[String; 1]>::try_from(p.exact(&["URL"])?).unwrap_or_default();
    let origin = credentials::origin_of(&url);
    let Some(cred) = credentials::lookup(&url) else {
        // Forget an expired one too; there is nothing to revoke.
        credentials::store(&url, None)?;
        if p.switch("--json") {
            output::json_line(&json!({"signed_out": origin, "revoked": false}));
        } else {
            output::line(&format!("not signed in to {origin}"));
        }
        return Ok(());
    };
    let mut common = p.common(&url)?;
    common.bearer = None;
    let mut client = Client::new(&common)?;
    // Forgotten here whatever the server answers; a revocation that did not reach it is
    // said (exit 3), since the token then lives until it expires.
    let revoked = endpoints_revoke(&mut client).and_then(|path| {
        let form = format!("token={}", form_encode(&cred.access_token));
        let (status, answer) = client.http_json(&path, Some(&form))?;
        if status == 200 {
            Ok(())
        } else {
            Err(oauth_refusal(status, &answer))
        }
    });
    credentials::store(&url, None)?;
    revoked?;
    if common.json {
        output::json_line(&json!({"signed_out": origin, "revoked": true}));
    } else {
        output::line(&format!(
            "signed out of {origin}: the token is revoked and forgotten"
        ));
    }
    Ok(())
}

/// The server's metadata document; a server without one offers no device grant.
fn metadata(client: &mut Client) -> Result<Value, Failure> {
    let (status, meta) = client.http_json(METADATA_PATH, None)?;
    match status {
        200 if meta.is_object() => Ok(meta),
        404 => Err(Failure::Refused(
            "the server offers no sign-in by device grant (no OAuth metadata; an agentd \
             operator enables it with [a2a.device_grant] enabled = true)"
                .into(),
        )),
        other => Err(Failure::BadAnswer(format!(
            "the OAuth metadata answered HTTP {other}"
        ))),
    }
}

/// The device authorization and token endpoints' paths.
fn endpoints(client: &mut Client) -> Result<(String, String), Failure> {
    let meta = metadata(client)?;
    Ok((
        endpoint_path(&meta, "device_authorization_endpoint")?,
        endpoint_path(&meta, "token_endpoint")?,
    ))
}

fn endpoints_revoke(client: &mut Client) -> Result<String, Failure> {
    let meta = metadata(client)?;
    endpoint_path(&meta, "revocation_endpoint")
}

/// The path of an endpoint URL the metadata names. The request goes to the connection the
/// user named (which may be a unix socket or reach the server past a proxy), so only the
/// path is taken from the server's idea of its own origin.
fn endpoint_path(meta: &Value, name: &str) -> Result<String, Failure> {
    let url = meta
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| Failure::BadAnswer(format!("the OAuth metadata names no {name}")))?;
    let path = match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => url,
    };
    if !path.starts_with('/') {
        return Err(Failure::BadAnswer(format!("{name} {url:?} is not a URL")));
    }
    Ok(path.to_owned())
}

/// An OAuth error answer as a failure: refused with its error code and description.
fn oauth_refusal(status: u16, answer: &Value) -> Failure {
    match answer.get("error").and_then(Value::as_str) {
        Some(code) => {
            let why = answer
                .get("error_description")
                .and_then(Value::as_str)
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            Failure::Refused(format!("HTTP {status} {code}{why}"))
        }
        None => Failure::BadAnswer(format!("HTTP {status} without an OAuth error")),
    }
}

/// `application/x-www-form-urlencoded`: everything but the unreserved characters escaped.
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn human_duration(secs: u64) -> String {
    match secs {
        s if s >= 3600 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_escape_all_but_the_unreserved() {
        assert_eq!(
            form_encode("urn:ietf:params a&b=c~"),
            "urn%3Aietf%3Aparams%20a%26b%3Dc~"
        );
    }

    #[test]
    fn endpoint_paths_come_from_the_metadata_urls() {
        let meta = json!({"token_endpoint": "https://a.example:8443/oauth2/token", "x": "nope"});
        assert_eq!(
            endpoint_path(&meta, "token_endpoint").unwrap(),
            "/oauth2/token"
        );
        assert!(endpoint_path(&meta, "x").is_err());
        assert!(endpoint_path(&meta, "revocation_endpoint").is_err());
    }
}
