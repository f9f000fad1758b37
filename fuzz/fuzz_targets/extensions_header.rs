//! The `A2A-Extensions` header: `agentd_core::ext::negotiate::{requested, activate}` and the
//! echo, on arbitrary header lines.
//!
//! Input layout:
//!
//! * byte 0 — the method called (low 4 bits: a core method, or the events method) and
//!   whether the instance declares the events extension (bit 7);
//! * byte 1 — how the rest becomes tokens: bit 0 clear, the rest is raw header lines split
//!   at `\n`; bit 0 set, each following byte picks a token from a list (agentd's URIs, their
//!   near misses, whitespace variants, a 600-byte token, empty ones), bit 7 of the byte
//!   ending the line, so the 32-token and 512-byte bounds are reached by short inputs.
//!
//! Properties checked, for every input:
//!
//! * no panic;
//! * `requested` is exactly the known URIs among the first 32 non-empty comma-separated
//!   tokens (spaces and tabs trimmed) of the UTF-8 lines; a token past the 32nd or over 512 bytes names
//!   nothing; a line that is not UTF-8 adds nothing and uses no token;
//! * the same tokens on one line or many give the same set;
//! * the activated set is a subset of requested ∩ declared ∩ applicable to the method;
//! * the echo is `None` exactly when nothing is activated, else the activated URIs in
//!   registry order, each once, joined by `", "`, and every one of them was requested.

#![no_main]

use agentd_core::a2a::CoreMethod;
use agentd_core::ext::negotiate::{activate, requested, ExtSet, MAX_TOKENS, MAX_TOKEN_BYTES};
use agentd_core::ext::registry::{declared, Route};
use agentd_core::ext::Ext;
use libfuzzer_sys::fuzz_target;

/// The tokens a structured input picks from.
fn token_list() -> Vec<String> {
    let mut t = Vec::new();
    for e in Ext::ALL {
        let u = e.uri();
        t.push(u.to_owned());
        t.push(format!(" {u} "));
        t.push(format!("\t{u}"));
        t.push(u.to_uppercase());
        t.push(format!("{u}/"));
        t.push(u[..u.len() - 1].to_owned());
        t.push(format!("{u}\u{a0}")); // not HTTP whitespace: a different token
    }
    t.push("https://example.com/x".into());
    t.push(String::new());
    t.push("  ".into());
    t.push(format!("{}{}", Ext::Command.uri(), " ".repeat(600)));
    t.push("x".repeat(MAX_TOKEN_BYTES + 1));
    t.push(agentd_core::ext::UNIX_BINDING_URI.into());
    t
}

fn route(b: u8) -> Route {
    let i = usize::from(b & 0x0f);
    CoreMethod::ALL
        .get(i)
        .map_or(Route::Events, |m| Route::Core(*m))
}

/// The reference reading of the lines: the first `MAX_TOKENS` non-empty trimmed tokens of
/// the UTF-8 lines, matched exactly.
fn model(lines: &[Vec<u8>]) -> ExtSet {
    let tokens: Vec<&str> = lines
        .iter()
        .filter_map(|l| std::str::from_utf8(l).ok())
        .flat_map(|l| l.split(','))
        .map(|t| t.trim_matches([' ', '\t']))
        .filter(|t| !t.is_empty())
        .take(MAX_TOKENS)
        .collect();
    Ext::ALL
        .into_iter()
        .filter(|e| {
            tokens
                .iter()
                .any(|t| t.len() <= MAX_TOKEN_BYTES && *t == e.uri())
        })
        .fold(ExtSet::EMPTY, ExtSet::with)
}

fn subset(a: ExtSet, b: ExtSet) -> bool {
    a.iter().all(|e| b.contains(e))
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let route = route(data[0]);
    let events_enabled = data[0] & 0x80 != 0;
    let rest = &data[2..];
    let lines: Vec<Vec<u8>> = if data[1] & 1 == 0 {
        rest.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect()
    } else {
        let list = token_list();
        let mut lines = vec![Vec::new()];
        for b in rest {
            let line = lines.last_mut().expect("a line");
            if !line.is_empty() {
                line.push(b',');
            }
            line.extend_from_slice(list[usize::from(b & 0x7f) % list.len()].as_bytes());
            if b & 0x80 != 0 {
                lines.push(Vec::new());
            }
        }
        lines
    };

    let req = requested(lines.iter().map(Vec::as_slice));
    assert_eq!(req, model(&lines), "requested set differs from the model");

    // One line or many: the same tokens, the same set.
    let utf8: Vec<&str> = lines
        .iter()
        .filter_map(|l| std::str::from_utf8(l).ok())
        .collect();
    let joined = utf8.join(",");
    assert_eq!(requested([joined.as_bytes()].into_iter()), req);

    let act = activate(req, route, events_enabled);
    assert!(subset(act, req), "activated something not requested");
    for e in act.iter() {
        assert!(declared(e, events_enabled), "{e:?} is not declared");
        assert!(e.applies_to(route), "{e:?} does not apply to {route:?}");
    }
    // Everything requested, declared and applicable is activated.
    for e in req.iter() {
        if declared(e, events_enabled) && e.applies_to(route) {
            assert!(act.contains(e));
        }
    }

    match act.echo() {
        None => assert!(act.is_empty()),
        Some(echo) => {
            assert!(!act.is_empty());
            assert!(echo.len() <= MAX_TOKENS * (MAX_TOKEN_BYTES + 2));
            let uris: Vec<&str> = echo.split(", ").collect();
            let want: Vec<&str> = act.iter().map(Ext::uri).collect();
            assert_eq!(
                uris, want,
                "echo is not the activated URIs in registry order"
            );
            for u in uris {
                let e = Ext::from_uri(u).expect("the echo names agentd's URIs");
                assert!(req.contains(e), "echoed {u}, which was not requested");
                // The echo, read back as a header, asks for what it echoes.
            }
            assert_eq!(requested([echo.as_bytes()].into_iter()), act);
        }
    }
});
