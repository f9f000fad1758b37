//! The tokens `agentd login` keeps: one per server origin, in the user's config directory
//! (`$XDG_CONFIG_HOME/agentd/credentials.json`, else `~/.config/agentd/credentials.json`).
//! The directory is made 0700 and the file is written 0600 through a temporary file and a
//! rename, so a reader never sees half a file and nobody else can read a token. A token
//! past its expiry is never offered.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::Failure;

/// The file's name under the config directory.
const FILE: &str = "agentd/credentials.json";

/// One kept sign-in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    pub access_token: String,
    /// Seconds since the epoch after which the server no longer takes it.
    pub expires_at: u64,
    pub scope: String,
}

/// The credentials file of this user, if a config directory can be named.
pub fn path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| Path::new(v).is_absolute())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })?;
    Some(base.join(FILE))
}

/// What a URL's sign-in is kept under: its scheme, host and port (a unix URL: its socket).
pub fn origin_of(url: &str) -> String {
    if url.starts_with("unix:") {
        return url.to_owned();
    }
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            format!("{}://{}", scheme.to_ascii_lowercase(), authority)
        }
        None => url.to_owned(),
    }
}

pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn read_all(file: &Path) -> Map<String, Value> {
    fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v.get("tokens").and_then(Value::as_object).cloned())
        .unwrap_or_default()
}

/// The unexpired sign-in kept for `url`'s origin.
pub fn lookup(url: &str) -> Option<Credential> {
    let tokens = read_all(&path()?);
    let c = tokens.get(&origin_of(url))?;
    let cred = Credential {
        access_token: c.get("access_token")?.as_str()?.to_owned(),
        expires_at: c.get("expires_at")?.as_u64()?,
        scope: c
            .get("scope")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    };
    (cred.expires_at > now_s() && !cred.access_token.is_empty()).then_some(cred)
}

/// Keeps `cred` for `url`'s origin (`None`: forgets it); returns the file written.
pub fn store(url: &str, cred: Option<&Credential>) -> Result<PathBuf, Failure> {
    let file = path()
        .ok_or_else(|| Failure::Usage("no config directory: set HOME or XDG_CONFIG_HOME".into()))?;
    let dir = file.parent().unwrap_or(Path::new("."));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Failure::Usage(format!("{}: {e}", dir.display())))?;
    // A directory made earlier by someone else's umask: tighten it too.
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    let mut tokens = read_all(&file);
    let origin = origin_of(url);
    match cred {
        Some(c) => {
            tokens.insert(
                origin,
                json!({"access_token": c.access_token, "expires_at": c.expires_at, "scope": c.scope}),
            );
        }
        None => {
            tokens.remove(&origin);
        }
    }
    let doc = json!({"version": 1, "tokens": tokens});
    let tmp = dir.join(format!(".credentials.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
        f.write_all(
            serde_json::to_string_pretty(&doc)
                .unwrap_or_default()
                .as_bytes(),
        )?;
        f.sync_all()?;
        fs::rename(&tmp, &file)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Failure::Usage(format!("{}: {e}", file.display()))
    })?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_drop_the_path_and_keep_the_port() {
        assert_eq!(
            origin_of("http://127.0.0.1:8420/t1?x"),
            "http://127.0.0.1:8420"
        );
        assert_eq!(origin_of("HTTPS://a.example/"), "https://a.example");
        assert_eq!(origin_of("unix:///run/a.sock"), "unix:///run/a.sock");
    }
}
