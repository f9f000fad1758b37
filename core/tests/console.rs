//! Static files a host hands the core (`InstanceConfig::console`), in memory: none by
//! default (404), the host's bytes with their type and the strict headers, 304 by entity
//! tag, HEAD, 405 for other methods, 404 for paths not in the table; and CORS: the
//! listener's own origin calls same-origin only while the console is on, every other origin
//! stands as before.

mod support;

use agentd_core::auth::{AuthConfig, Peer};
use agentd_core::statics::StaticFile;
use serde_json::json;
use support::*;

static FILES: [StaticFile; 2] = [
    StaticFile {
        path: "/console/",
        content_type: "text/html; charset=utf-8",
        body: b"<!doctype html><p>hi</p>",
    },
    StaticFile {
        path: "/console/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: b"console.log(1)",
    },
];

fn harness(console: bool) -> Harness {
    Harness::with(|c| {
        c.auth = AuthConfig {
            operator_bearer: Some(AuthConfig::digest("op-token")),
            ..AuthConfig::default()
        };
        if console {
            c.console = &FILES;
        }
    })
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").into_bytes()
}

#[test]
fn no_table_no_console() {
    let mut h = harness(false);
    for path in ["/console", "/console/", "/console/app.js"] {
        let mut c = h.conn_peer(0, Peer::Tcp);
        assert_eq!(one(&c.feed(&mut h, &get(path, ""))).status, 404, "{path}");
    }
}

#[test]
fn the_hosts_files_are_served_with_strict_headers() {
    let mut h = harness(true);
    for (path, file) in [
        ("/console", &FILES[0]),
        ("/console/", &FILES[0]),
        ("/console/app.js", &FILES[1]),
    ] {
        let mut c = h.conn_peer(0, Peer::Tcp);
        let r = one(&c.feed(&mut h, &get(path, "")));
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body, file.body, "{path}");
        assert_eq!(r.header("content-type"), Some(file.content_type));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.header("cache-control"), Some("no-cache"));
        assert_eq!(
            r.header("content-security-policy"),
            Some(agentd_core::statics::CONSOLE_CSP)
        );
        let etag = r.header("etag").unwrap().to_owned();
        let again = one(&c.feed(&mut h, &get(path, &format!("If-None-Match: {etag}\r\n"))));
        assert_eq!(again.status, 304, "{path}");
        let other = one(&c.feed(&mut h, &get(path, "If-None-Match: \"x\"\r\n")));
        assert_eq!(other.status, 200, "{path}");
    }
    let mut c = h.conn_peer(0, Peer::Tcp);
    let head = first_head(&c.feed(&mut h, b"HEAD /console/app.js HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        Some(FILES[1].body.len().to_string().as_str())
    );
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = one(&c.feed(
        &mut h,
        b"DELETE /console/app.js HTTP/1.1\r\nHost: x\r\n\r\n",
    ));
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    for path in ["/console/nope", "/console/app.js/", "/consolex"] {
        let mut c = h.conn_peer(0, Peer::Tcp);
        assert_eq!(one(&c.feed(&mut h, &get(path, ""))).status, 404, "{path}");
    }
}

#[test]
fn only_the_listeners_own_origin_is_the_consoles() {
    let list = |origin: &str| {
        format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n\
             Authorization: Bearer op-token\r\nOrigin: {origin}\r\nContent-Length: {len}\r\n\r\n{body}",
            len = call_body().len(),
            body = call_body(),
        )
        .into_bytes()
    };
    for (console, own_status) in [(false, 403), (true, 200)] {
        let mut h = harness(console);
        // The harness's TCP listener is http://127.0.0.1:8420/.
        let mut c = h.conn_peer(0, Peer::Tcp);
        let r = one(&c.feed(&mut h, &list("http://127.0.0.1:8420")));
        assert_eq!(r.status, own_status, "console {console}");
        assert!(r.header("access-control-allow-origin").is_none());
        for other in [
            "http://localhost:8420",
            "http://127.0.0.1:8421",
            "https://127.0.0.1:8420",
            "null",
        ] {
            let mut c = h.conn_peer(0, Peer::Tcp);
            let r = one(&c.feed(&mut h, &list(other)));
            assert_eq!(r.status, 403, "console {console}, {other}");
            assert!(r.header("access-control-allow-origin").is_none());
        }
    }
}

fn call_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}).to_string()
}
