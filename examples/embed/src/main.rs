//! A minimal embedder of agentd-core on std alone: its own loop over a TCP socket (no agentd
//! driver) serves the card and (streaming) SendMessage, echoing each turn. See README.md.

use agentd_core::a2a::types::{Part, TaskState};
use agentd_core::{auth::Peer, ids::Entropy, Completion, Connection, Effect, Instance, Now};
use agentd_core::{InstanceConfig, ListenerInfo, ListenerKind};
use std::io::{ErrorKind::WouldBlock, Read, Result, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant, UNIX_EPOCH};

/// The core draws task ids and tokens from entropy its host supplies: here, the OS's.
struct Urandom(std::fs::File);
impl Entropy for Urandom {
    fn fill(&mut self, buf: &mut [u8]) {
        self.0.read_exact(buf).expect("reading /dev/urandom");
    }
}

/// The core reads no clock: every call is handed the time, monotonic and wall-clock.
fn now(origin: Instant) -> Now {
    let epoch = UNIX_EPOCH.elapsed().unwrap_or_default().as_millis();
    Now::new(origin.elapsed().as_millis() as u64, epoch as u64)
}

/// The host's side: a turn is answered with the echo of its text, which completes its task.
fn echo(task_id: String, parts: &[Part]) -> Completion {
    let echo = format!("echo: {}", Part::joined_text(parts));
    Completion::Status {
        task_id,
        state: TaskState::Completed,
        message: Some(vec![Part::text(echo)]),
    }
}

/// The transport's side, one round of one connection: deadline, bytes in, bytes out; done?
fn step(s: &mut TcpStream, c: &mut Connection, i: &mut Instance, t: Now) -> Result<bool> {
    c.poll(i, t);
    if c.poll_timeout().is_some_and(|at| at <= t.mono_ms) {
        c.handle_timeout(i, t);
    }
    let mut buf = [0; 16 * 1024];
    if c.wants_read() {
        match s.read(&mut buf) {
            Ok(0) => c.handle_eof(i, t),
            Err(e) if e.kind() == WouldBlock => {}
            read => c.handle_input(i, &buf[..read?], t),
        }
    }
    while !c.pending_output().is_empty() {
        match s.write(c.pending_output()) {
            Err(e) if e.kind() == WouldBlock => break,
            written => c.consume_output(written?, t),
        }
    }
    Ok(!c.is_finished())
}

fn main() -> Result<()> {
    let addr = std::env::args().nth(1).unwrap_or("127.0.0.1:8421".into());
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let origin = Instant::now();
    let url = format!("http://{}/", listener.local_addr()?);
    let config = InstanceConfig::new(vec![ListenerInfo {
        kind: ListenerKind::Tcp,
        url: url.clone(),
        loopback: true,
    }]);
    let entropy = Box::new(Urandom(std::fs::File::open("/dev/urandom")?));
    let mut inst = Instance::new(config.clone(), entropy, now(origin));
    println!("listening {url}");
    let mut conns: Vec<(TcpStream, Connection)> = Vec::new();
    // Each round: accept, answer turns, move every connection's bytes, sleep 1 ms (polling).
    loop {
        while let Ok((stream, _)) = listener.accept() {
            stream.set_nonblocking(true)?;
            let waker = std::task::Waker::noop().clone(); // polled each round anyway
            let conn = Connection::new(0, Peer::Tcp, config.conn, waker, now(origin));
            conns.push((stream, conn));
        }
        while let Some(effect) = inst.poll_effect() {
            let Effect::Turn {
                task_id, message, ..
            } = effect
            else {
                continue; // this host serves turns alone
            };
            if let Err(e) = inst.handle_completion(echo(task_id, &message.parts), now(origin)) {
                eprintln!("echo refused: {e}");
            }
        }
        conns.retain_mut(|(s, c)| {
            let open = step(s, c, &mut inst, now(origin)).unwrap_or(false);
            (!open).then(|| c.close(&mut inst)); // releases what it held in the instance
            open
        });
        std::thread::sleep(Duration::from_millis(1));
    }
}
