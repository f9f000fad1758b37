//! The client subcommands' arguments, parsed by hand like the daemon's: flags may come
//! anywhere, as `--flag VALUE` or `--flag=VALUE`; `--` ends the flags.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::Failure;

/// Flags every client subcommand takes.
const COMMON_VALUES: &[&str] = &["--bearer", "--timeout", "--ca", "--cert", "--key"];
const COMMON_SWITCHES: &[&str] = &["--json", "--help", "-h"];

/// The words of one subcommand, sorted into positionals, valued flags and switches.
#[derive(Debug, Default)]
pub struct Parsed {
    pub positional: Vec<String>,
    values: HashMap<String, String>,
    /// Every valued flag in order, for the repeatable ones (`--arg`, `--field`).
    all_values: Vec<(String, String)>,
    switches: Vec<String>,
}

impl Parsed {
    /// Sorts `words` with the subcommand's own `values` and `switches` (the common ones are
    /// added). An unknown flag, or a valued flag without its value, is a usage error.
    pub fn new(words: &[String], values: &[&str], switches: &[&str]) -> Result<Parsed, Failure> {
        let mut p = Parsed::default();
        let mut it = words.iter();
        let mut flags_done = false;
        while let Some(w) = it.next() {
            if flags_done || !w.starts_with('-') || w == "-" {
                p.positional.push(w.clone());
                continue;
            }
            if w == "--" {
                flags_done = true;
                continue;
            }
            let (name, inline) = match w.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
                _ => (w.as_str(), None),
            };
            if values.contains(&name) || COMMON_VALUES.contains(&name) {
                let v = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| Failure::Usage(format!("{name} needs a value")))?,
                };
                p.all_values.push((name.to_owned(), v.clone()));
                p.values.insert(name.to_owned(), v);
            } else if (switches.contains(&name) || COMMON_SWITCHES.contains(&name))
                && inline.is_none()
            {
                p.switches.push(name.to_owned());
            } else {
                return Err(Failure::Usage(format!("unknown option {w:?}")));
            }
        }
        Ok(p)
    }

    pub fn value(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Every value a repeatable flag was given, in order.
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.all_values
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn switch(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }

    pub fn help(&self) -> bool {
        self.switch("--help") || self.switch("-h")
    }

    /// A flag's value as a number.
    pub fn number(&self, name: &str) -> Result<Option<u64>, Failure> {
        self.value(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| Failure::Usage(format!("{name} takes a whole number, not {v:?}")))
            })
            .transpose()
    }

    /// Exactly `names.len()` positionals, named in the error when missing or extra.
    pub fn exact(&self, names: &[&str]) -> Result<Vec<String>, Failure> {
        if self.positional.len() < names.len() {
            return Err(Failure::Usage(format!(
                "missing {}",
                names[self.positional.len()..].join(" ")
            )));
        }
        if self.positional.len() > names.len() {
            return Err(Failure::Usage(format!(
                "unexpected argument {:?}",
                self.positional[names.len()]
            )));
        }
        Ok(self.positional.clone())
    }

    /// What every subcommand takes: the connection and output options.
    pub fn common(&self, url: &str) -> Result<Common, Failure> {
        let bearer = match self.value("--bearer") {
            Some(t) => Some(t.to_owned()),
            None => std::env::var("AGENTD_TOKEN").ok().filter(|t| !t.is_empty()),
        }
        .or_else(|| super::credentials::lookup(url).map(|c| c.access_token));
        let timeout = self.number("--timeout")?.map(Duration::from_secs);
        if timeout == Some(Duration::ZERO) {
            return Err(Failure::Usage("--timeout must be at least 1 second".into()));
        }
        let cert = self.value("--cert").map(PathBuf::from);
        let key = self.value("--key").map(PathBuf::from);
        if cert.is_some() != key.is_some() {
            return Err(Failure::Usage(
                "--cert and --key go together (mutual TLS)".into(),
            ));
        }
        Ok(Common {
            url: url.to_owned(),
            bearer,
            json: self.switch("--json"),
            timeout,
            ca: self.value("--ca").map(PathBuf::from),
            client_cert: cert.zip(key),
        })
    }
}

/// The connection and output options of one call.
#[derive(Clone, Debug)]
pub struct Common {
    /// `http://127.0.0.1:PORT[/path]`, `https://host[:port][/path]` or `unix:///path`.
    pub url: String,
    /// `--bearer`, else `AGENTD_TOKEN`, else the unexpired token `agentd login` kept.
    pub bearer: Option<String>,
    pub json: bool,
    /// `--timeout SECS`: how long the whole call may take.
    pub timeout: Option<Duration>,
    /// `--ca FILE`: the CAs an https server is verified with, instead of the system's.
    pub ca: Option<PathBuf>,
    /// `--cert FILE --key FILE`: the client certificate for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags_anywhere_and_inline_values() {
        let p = Parsed::new(
            &words("--json http://x --history=3 T1 --bearer tok"),
            &["--history"],
            &[],
        )
        .unwrap();
        assert_eq!(p.positional, ["http://x", "T1"]);
        assert_eq!(p.value("--history"), Some("3"));
        assert_eq!(p.value("--bearer"), Some("tok"));
        assert!(p.switch("--json"));
        assert!(Parsed::new(&words("--nope"), &[], &[]).is_err());
        assert!(Parsed::new(&words("--bearer"), &[], &[]).is_err());
        assert!(Parsed::new(&words("--json=1"), &[], &[]).is_err());
        let p = Parsed::new(&words("u -- --json"), &[], &[]).unwrap();
        assert_eq!(p.positional, ["u", "--json"]);
        assert!(p.exact(&["URL"]).is_err());
        assert!(p.exact(&["URL", "TEXT", "MORE"]).is_err());
    }
}
