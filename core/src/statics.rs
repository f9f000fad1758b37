//! Static files a host serves from its own bytes under one path prefix: the daemon's web
//! console at `/console/`. The host compiles the files in and hands the core a table of
//! them ([`crate::InstanceConfig::console`]); the core only looks a path up in the table and
//! answers it with the headers every static answer carries. It reads no file and knows no
//! file's contents, so the core stays free of the console and of any I/O.

/// Where the console is served; `/console` answers as `/console/`.
pub const CONSOLE_PREFIX: &str = "/console/";

/// What a static route answers: `GET` and `HEAD` only.
pub(crate) const STATIC_ALLOW: &str = "GET, HEAD";

/// The console's policy: its own script, style and API only, and no framing. `connect-src
/// 'self'`: the page calls only the daemon that served it.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// One file the host compiled in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StaticFile {
    /// Its full path, such as `/console/console.js` (`/console/` for the page itself).
    pub path: &'static str,
    /// Its `Content-Type`, charset included.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

impl core::fmt::Debug for StaticFile {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StaticFile")
            .field("path", &self.path)
            .field("content_type", &self.content_type)
            .field("len", &self.body.len())
            .finish()
    }
}

impl StaticFile {
    /// A strong entity tag of the bytes (FNV-1a, 64 bits): the same build answers the same
    /// tag, a changed file another.
    pub(crate) fn etag(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.body {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("\"{h:016x}\"")
    }
}

/// Whether `path` is under the console's prefix (`/console` itself included).
pub(crate) fn under_console(path: &str) -> bool {
    path == "/console" || path.starts_with(CONSOLE_PREFIX)
}

/// The file of `files` at `path`, `/console` read as `/console/`.
pub(crate) fn lookup(files: &'static [StaticFile], path: &str) -> Option<&'static StaticFile> {
    let path = if path == "/console" {
        CONSOLE_PREFIX
    } else {
        path
    };
    files.iter().find(|f| f.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    static FILES: [StaticFile; 2] = [
        StaticFile {
            path: "/console/",
            content_type: "text/html; charset=utf-8",
            body: b"<!doctype html>",
        },
        StaticFile {
            path: "/console/console.js",
            content_type: "text/javascript; charset=utf-8",
            body: b"1",
        },
    ];

    #[test]
    fn paths_are_looked_up_exactly_and_the_bare_prefix_is_the_index() {
        assert_eq!(
            lookup(&FILES, "/console").map(|f| f.path),
            Some("/console/")
        );
        assert_eq!(
            lookup(&FILES, "/console/").map(|f| f.path),
            Some("/console/")
        );
        assert_eq!(
            lookup(&FILES, "/console/console.js").map(|f| f.path),
            Some("/console/console.js")
        );
        for miss in [
            "/console/nope",
            "/console/console.js/",
            "/console/../x",
            "/consolex",
        ] {
            assert_eq!(lookup(&FILES, miss), None, "{miss}");
        }
        assert!(under_console("/console") && under_console("/console/x"));
        assert!(!under_console("/consolex") && !under_console("/"));
    }

    #[test]
    fn the_entity_tag_follows_the_bytes() {
        assert_eq!(FILES[0].etag(), FILES[0].etag());
        assert_ne!(FILES[0].etag(), FILES[1].etag());
        assert!(FILES[0].etag().starts_with('"') && FILES[0].etag().ends_with('"'));
    }
}
