//! Mutual TLS in memory: a rustls client and the core's connection exchange bytes with no
//! socket. Certificates are generated here (rcgen); no secret is checked in.

mod support;

use std::io::{Read, Write};
use std::sync::Arc;

use agentd_core::auth::{AuthConfig, Peer, Principal, Role};
use agentd_core::tls::{self, CertMatch, CertRule};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use support::*;

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf signed by `ca`: (certificate PEM, key PEM).
fn leaf(ca: &Ca, cn: &str, sans: &[&str]) -> (String, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.subject_alt_names = sans
        .iter()
        .map(|s| SanType::DnsName((*s).try_into().unwrap()))
        .collect();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

struct Pki {
    ca: Ca,
    server: (String, String),
}

fn pki() -> Pki {
    let ca = ca("agentd test CA");
    let server = leaf(&ca, "localhost", &["localhost"]);
    Pki { ca, server }
}

fn harness(p: &Pki, rules: Vec<CertRule>) -> Harness {
    let listener = tls::listener(
        p.server.0.as_bytes(),
        p.server.1.as_bytes(),
        Some(p.ca.pem.as_bytes()),
    )
    .unwrap();
    Harness::with(move |c| {
        c.tls.insert(0, listener);
        c.auth = AuthConfig {
            cert_rules: rules,
            ..AuthConfig::default()
        };
    })
}

fn client(p: &Pki, cert: Option<&(String, String)>) -> rustls::ClientConnection {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(p.ca.pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match cert {
        Some((pem, key)) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(pem.as_bytes())
                    .map(Result::unwrap)
                    .collect();
            builder
                .with_client_auth_cert(
                    chain,
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
        .unwrap()
}

/// Moves bytes both ways until neither side has more; returns the plaintext the client read.
fn pump(
    h: &mut Harness,
    c: &mut Client,
    tls: &mut rustls::ClientConnection,
) -> Result<Vec<u8>, String> {
    let mut plain = Vec::new();
    for _ in 0..64 {
        let mut to_server = Vec::new();
        while tls.wants_write() {
            tls.write_tls(&mut to_server).unwrap();
        }
        if !to_server.is_empty() {
            c.conn.handle_input(&mut h.inst, &to_server, h.now);
        }
        let from_server = c.drain(h);
        if from_server.is_empty() && to_server.is_empty() {
            break;
        }
        let mut rd = &from_server[..];
        while !rd.is_empty() {
            tls.read_tls(&mut rd).map_err(|e| e.to_string())?;
            tls.process_new_packets().map_err(|e| e.to_string())?;
            // Record by record: rustls holds at most 16 KiB of received plaintext.
            let mut buf = [0u8; 65536];
            loop {
                match tls.reader().read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => plain.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
    }
    Ok(plain)
}

fn request(
    h: &mut Harness,
    c: &mut Client,
    tls: &mut rustls::ClientConnection,
    bytes: &[u8],
) -> Resp {
    tls.writer().write_all(bytes).unwrap();
    let plain = pump(h, c, tls).expect("the session works");
    one(&plain)
}

#[test]
fn a_verified_certificate_is_served() {
    let p = pki();
    let mut h = harness(&p, vec![]);
    let cert = leaf(&p.ca, "laptop", &["laptop.example"]);
    let mut t = client(&p, Some(&cert));
    let mut c = h.conn_peer(0, Peer::Tcp);
    let card = request(
        &mut h,
        &mut c,
        &mut t,
        b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .json();
    assert_eq!(
        card["securitySchemes"]["mtls"],
        json!({"mtlsSecurityScheme": {}})
    );
    assert_eq!(
        card["securityRequirements"],
        json!([{"schemes": {"mtls": {"list": []}}}])
    );
    assert_eq!(card["capabilities"]["extendedAgentCard"], true);
    // With no certificate rules, a verified certificate is the operator.
    let r = request(&mut h, &mut c, &mut t, &call("ListTasks", 1, json!({})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = request(
        &mut h,
        &mut c,
        &mut t,
        &call("GetExtendedAgentCard", 2, json!({})),
    );
    assert!(
        r.json()["result"]["capabilities"].is_object(),
        "named through a declared scheme"
    );
}

#[test]
fn certificate_rules_name_principals() {
    let p = pki();
    let rules = vec![CertRule {
        matcher: CertMatch::San("*.agents.example".into()),
        principal: Principal::new("agent:peer-a", Role::Agent, vec![]),
    }];
    let mut h = harness(&p, rules);
    let peer = leaf(&p.ca, "peer-a", &["peer-a.agents.example"]);
    let mut t = client(&p, Some(&peer));
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = request(
        &mut h,
        &mut c,
        &mut t,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message("x","m"), "configuration":{"returnImmediately":true}}),
        ),
    );
    assert!(r.json()["result"]["task"].is_object());
    h.take_effects();
    let ops = request(
        &mut h,
        &mut c,
        &mut t,
        &call("GetExtendedAgentCard", 2, json!({})),
    )
    .json();
    let names: Vec<&str> = ops["result"]["capabilities"]["extensions"][0]["params"]["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["status", "workflow.run", "workflow.status"],
        "an agent's ops"
    );
    // A certificate the CA signed but no rule names: 403, not 401.
    let stranger = leaf(&p.ca, "stranger", &["stranger.example"]);
    let mut t = client(&p, Some(&stranger));
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = request(&mut h, &mut c, &mut t, &call("ListTasks", 3, json!({})));
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["error"]["code"], -31403);
    assert_eq!(r.json()["id"], serde_json::Value::Null);
}

#[test]
fn a_missing_or_foreign_certificate_cannot_complete_the_handshake() {
    let p = pki();
    let mut h = harness(&p, vec![]);
    // No certificate at all.
    let mut t = client(&p, None);
    let mut c = h.conn_peer(0, Peer::Tcp);
    t.writer()
        .write_all(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let got = pump(&mut h, &mut c, &mut t);
    assert!(
        got.is_err() || got.unwrap().is_empty(),
        "no answer without a certificate"
    );
    assert!(c.conn.is_finished(), "the connection closes");
    // A certificate from another CA.
    let other = ca("someone else's CA");
    let foreign = leaf(&other, "intruder", &["intruder.example"]);
    let mut t = client(&p, Some(&foreign));
    let mut c = h.conn_peer(0, Peer::Tcp);
    t.writer()
        .write_all(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let got = pump(&mut h, &mut c, &mut t);
    assert!(
        got.is_err() || got.unwrap().is_empty(),
        "no answer to a foreign certificate"
    );
    assert!(c.conn.is_finished());
    assert_eq!(h.inst.task_count(), 0);
}

/// A TLS session (a verified client certificate: the operator) whose first request created a
/// task holding `big` as its message; returns the session, the task's id and `big`.
fn large_task_over_tls(big: String) -> (Harness, Client, rustls::ClientConnection, String, String) {
    let p = pki();
    let mut h = harness(&p, vec![]);
    let cert = leaf(&p.ca, "laptop", &["laptop.example"]);
    let mut t = client(&p, Some(&cert));
    // The request itself is past rustls's default plaintext buffer.
    t.set_buffer_limit(None);
    let mut c = h.conn_peer(0, Peer::Tcp);
    let sent = request(
        &mut h,
        &mut c,
        &mut t,
        &call(
            "SendMessage",
            1,
            json!({"message": text_message(&big, &fresh_id()), "configuration": {"returnImmediately": true}}),
        ),
    );
    let id = sent.json()["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (h, c, t, id, big)
}

/// A large answer over TLS: written in slices as the TLS session takes them, and the
/// client decrypts the whole task.
#[test]
fn a_large_task_goes_out_whole_over_tls() {
    let (mut h, mut c, mut t, id, big) = large_task_over_tls("q\"".repeat(500_000));
    let bound = h.config.conn.max_output_bytes;
    let got = request(
        &mut h,
        &mut c,
        &mut t,
        &call("GetTask", 2, json!({"id": id})),
    );
    assert!(got.body.len() > 4 * bound, "{}", got.body.len());
    assert_eq!(got.json()["result"]["history"][0]["parts"][0]["text"], big);
}

/// The TLS handshake runs in `receive`, which takes no instance: a driver that shares the
/// instance behind a lock does the handshake outside it. Plaintext waits for `poll`.
#[test]
fn the_handshake_runs_without_the_instance() {
    let p = pki();
    let mut h = harness(&p, vec![]);
    let cert = leaf(&p.ca, "laptop", &["laptop.example"]);
    let mut t = client(&p, Some(&cert));
    let mut c = h.conn_peer(0, Peer::Tcp);
    c.conn.prepare(&h.inst);
    let mut flights = 0;
    while t.is_handshaking() {
        flights += 1;
        assert!(flights < 10, "the handshake does not finish");
        let mut to_server = Vec::new();
        while t.wants_write() {
            t.write_tls(&mut to_server).unwrap();
        }
        if !to_server.is_empty() {
            assert!(
                !c.conn.receive(&to_server, h.now),
                "a handshake flight needs no poll"
            );
        }
        let from_server = c.conn.pending_output().to_vec();
        c.conn.consume_output(from_server.len(), h.now);
        let mut rd = &from_server[..];
        while !rd.is_empty() {
            t.read_tls(&mut rd).unwrap();
            t.process_new_packets().unwrap();
        }
    }
    t.writer()
        .write_all(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut to_server = Vec::new();
    while t.wants_write() {
        t.write_tls(&mut to_server).unwrap();
    }
    assert!(c.conn.receive(&to_server, h.now), "a request needs a poll");
    // Only TLS's own records (a session ticket) may be waiting: no answer yet.
    let before_poll = c.conn.pending_output().len();
    c.conn.poll(&mut h.inst, h.now);
    assert!(
        c.conn.pending_output().len() > before_poll,
        "poll answers it"
    );
    let plain = pump(&mut h, &mut c, &mut t).expect("the session works");
    assert_eq!(one(&plain).status, 200);
}

/// A large answer to a `Connection: close` request over TLS: the session's close_notify
/// comes after the answer's last slice, not when the output first runs dry.
#[test]
fn close_notify_waits_for_the_whole_large_answer() {
    let (mut h, mut c, mut t, id, big) = large_task_over_tls("c\"".repeat(400_000));
    let get = String::from_utf8(call("GetTask", 2, json!({"id": id}))).unwrap();
    let get = get.replacen("\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1);
    t.writer().write_all(get.as_bytes()).unwrap();
    let mut to_server = Vec::new();
    while t.wants_write() {
        t.write_tls(&mut to_server).unwrap();
    }
    c.conn.handle_input(&mut h.inst, &to_server, h.now);
    // A slow peer: 5,000 bytes per write, so the session often takes all the plaintext
    // there is while more of the answer is still to come.
    let mut plain = Vec::new();
    let mut writes = 0;
    while !c.conn.is_finished() {
        writes += 1;
        assert!(
            writes < 10_000,
            "the answer never ends ({} bytes read)",
            plain.len()
        );
        let pending = c.conn.pending_output();
        assert!(
            !pending.is_empty(),
            "the connection stalled before finishing"
        );
        let n = pending.len().min(5_000);
        let mut rd = &pending[..n].to_vec()[..];
        c.conn.consume_output(n, h.now);
        while !rd.is_empty() {
            // Nothing is taken after the peer's close_notify.
            assert!(
                t.read_tls(&mut rd).unwrap() > 0,
                "bytes after close_notify, {} bytes into the answer",
                plain.len()
            );
            t.process_new_packets()
                .unwrap_or_else(|e| panic!("after {} bytes of the answer: {e}", plain.len()));
            let mut buf = [0u8; 65536];
            while let Ok(n) = t.reader().read(&mut buf) {
                if n == 0 {
                    break;
                }
                plain.extend_from_slice(&buf[..n]);
            }
        }
    }
    let r = one(&plain);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.json()["result"]["history"][0]["parts"][0]["text"], big);
}

/// Every answer of a TLS listener carries `Strict-Transport-Security`, a stream's head
/// too; `hsts_max_age_s` sets it, 0 sends none, and a plaintext listener never does.
#[test]
fn tls_answers_carry_hsts() {
    let p = pki();
    let cert = leaf(&p.ca, "laptop", &["laptop.example"]);
    let card = b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let mut h = harness(&p, vec![]);
    let mut t = client(&p, Some(&cert));
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = request(&mut h, &mut c, &mut t, card);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("strict-transport-security"),
        Some("max-age=31536000")
    );
    let r = request(&mut h, &mut c, &mut t, &call("ListTasks", 1, json!({})));
    assert_eq!(
        r.header("strict-transport-security"),
        Some("max-age=31536000")
    );
    let send = call(
        "SendStreamingMessage",
        2,
        json!({"message": text_message("x", &fresh_id())}),
    );
    t.writer().write_all(&send).unwrap();
    let plain = pump(&mut h, &mut c, &mut t).unwrap();
    let head = first_head(&plain);
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-type"),
        Some("text/event-stream"),
        "{}",
        String::from_utf8_lossy(&plain)
    );
    assert_eq!(
        head.header("strict-transport-security"),
        Some("max-age=31536000")
    );

    let listener = tls::listener(
        p.server.0.as_bytes(),
        p.server.1.as_bytes(),
        Some(p.ca.pem.as_bytes()),
    )
    .unwrap();
    let mut h = Harness::with(move |c| {
        c.tls.insert(0, listener);
        c.hsts_max_age_s = 0;
    });
    let mut t = client(&p, Some(&cert));
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = request(&mut h, &mut c, &mut t, card);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("strict-transport-security"), None);

    let mut h = Harness::new();
    let mut c = h.conn();
    let r = one(&c.feed(&mut h, card));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("strict-transport-security"), None, "plaintext");
}

/// rustls reads the time the driver passes in (`Now`), not the system clock: a client
/// certificate valid only in 2090 is refused at the harness's 2026 and accepted once the
/// driver's time is 2090, though the machine's clock says otherwise.
#[test]
fn certificate_validity_is_judged_at_the_drivers_time() {
    let p = pki();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "from the future");
    params.not_before = rcgen::date_time_ymd(2090, 1, 1);
    params.not_after = rcgen::date_time_ymd(2091, 1, 1);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &p.ca.issuer).unwrap();
    let future = (cert.pem(), key.serialize_pem());
    let card = b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: localhost\r\n\r\n";

    let mut h = harness(&p, vec![]);
    let mut t = client(&p, Some(&future));
    let mut c = h.conn_peer(0, Peer::Tcp);
    t.writer().write_all(card).unwrap();
    let got = pump(&mut h, &mut c, &mut t);
    assert!(
        got.is_err() || got.unwrap().is_empty(),
        "not yet valid at the driver's 2026"
    );

    let mut h = harness(&p, vec![]);
    h.now = agentd_core::Now::new(h.now.mono_ms, 3_799_958_400_000); // 2090-06-01
    let mut t = client(&p, Some(&future));
    let mut c = h.conn_peer(0, Peer::Tcp);
    let r = request(&mut h, &mut c, &mut t, card);
    assert_eq!(r.status, 200, "valid at the driver's 2090");
}
