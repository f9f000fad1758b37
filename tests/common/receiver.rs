//! An HTTP/1.1 receiver on loopback for what the daemon sends out (webhooks, OTLP exports):
//! it keeps every request (path, headers, JSON body) and answers the statuses of a script in
//! turn, then 200, each with `{}` and `Connection: close`. A thread per connection, so a
//! slow sender holds up nobody.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Hit {
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it is not JSON).
    pub body: Value,
}

impl Hit {
    /// A header's value, by name in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The receiver; it runs until the test process ends.
pub struct Receiver {
    pub port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Receiver {
    /// Starts one that answers the statuses of `script` in turn, then 200.
    pub fn start(script: Vec<u16>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let kept = hits.clone();
        let script = Arc::new(Mutex::new(script.into_iter()));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (kept, script) = (kept.clone(), script.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut r = BufReader::new(stream);
                    let mut line = String::new();
                    if r.read_line(&mut line).is_err() || line.is_empty() {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
                    let mut headers = Vec::new();
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.trim_end().split_once(':') {
                            headers.push((k.trim().to_owned(), v.trim().to_owned()));
                        }
                    }
                    let len = headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .and_then(|(_, v)| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    // The status is taken as the request is kept, so the script follows the
                    // order of arrival.
                    let status = {
                        let mut kept = kept.lock().unwrap();
                        kept.push(Hit {
                            path,
                            headers,
                            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                        });
                        script.lock().unwrap().next().unwrap_or(200)
                    };
                    let _ = write!(
                        r.into_inner(),
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
                    );
                });
            }
        });
        Receiver { port, hits }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, in order of arrival.
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// The requests once there are `n` of them, or all there are after `within`.
    pub fn wait_for(&self, n: usize, within: Duration) -> Vec<Hit> {
        let deadline = Instant::now() + within;
        loop {
            let hits = self.hits();
            if hits.len() >= n || Instant::now() > deadline {
                return hits;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
