//! The async floor: bench/turn_floor.rs's server on async-io's reactor, the one agentd's smol
//! driver waits in (turn_cpu.py `--floor` builds it with `cargo build --release --example
//! turn_floor_async`).
//!
//! The same requests, answers and agent lines as the blocking floor, from one thread and one
//! connection at a time, with no parsing or state beyond it. What changes is only how it
//! waits: the connection and the agent's stdout are `async_io::Async` sources, so each wait
//! for the agent is a pass of the reactor (the poller's timer and notifier, `epoll_wait`, and
//! the source's re-arm) where the blocking floor makes one `read`. The turn line is written
//! as the daemon writes it, blocking. The difference between this server's two modes is what
//! talking to the agent costs any server built on this reactor, before its own work.
//!
//! Prints `listening http://127.0.0.1:PORT/` when ready; runs until killed.

#[path = "turn_floor.rs"]
#[allow(dead_code)] // its blocking server and `main` are the other floor's
mod blocking;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::process::ChildStdout;

use async_io::Async;
use blocking::{contains, parse_request, send_answer, stream_events, stream_head, Agent};
use futures_lite::{AsyncReadExt, AsyncWriteExt};

/// The agent, its stdout read through the reactor.
struct AsyncAgent {
    agent: Agent<Async<ChildStdout>>,
    /// Read but not yet whole lines.
    partial: Vec<u8>,
}

impl AsyncAgent {
    fn spawn(cmd: &[String]) -> AsyncAgent {
        let agent = Agent::spawn(cmd, |out| {
            Async::new(out).expect("register the agent's stdout")
        });
        AsyncAgent {
            agent,
            partial: Vec::new(),
        }
    }

    fn start_turn(&mut self) {
        self.agent.start_turn();
    }

    /// The next batch of whole lines the agent wrote, and whether it holds the `reply`.
    async fn next_lines(&mut self) -> (Vec<u8>, bool) {
        let mut chunk = [0u8; 1 << 16];
        loop {
            // The daemon does not read before it hears the pipe is readable, nor does this.
            self.agent
                .stdout
                .readable()
                .await
                .expect("wait for the agent");
            let n = self
                .agent
                .stdout
                .read(&mut chunk)
                .await
                .expect("read the agent");
            assert!(n > 0, "the agent closed its stdout");
            self.partial.extend_from_slice(&chunk[..n]);
            if let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') {
                let lines: Vec<u8> = self.partial.drain(..=last).collect();
                let done = contains(&lines, b"\"reply\"");
                return (lines, done);
            }
        }
    }
}

async fn serve(mut s: Async<TcpStream>, agent: &mut Option<AsyncAgent>) -> std::io::Result<()> {
    s.get_ref().set_nodelay(true)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let Some((total, streaming)) = parse_request(&buf) else {
            // Readable first, then one read: no read that hears EAGAIN, as in the daemon.
            s.readable().await?;
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
            continue;
        };
        buf.drain(..total);
        if streaming {
            s.write_all(&stream_head()).await?;
            match agent {
                None => s.write_all(&stream_events(b"", true, false)).await?,
                Some(a) => {
                    // Each batch is answered as it comes, as the blocking floor does.
                    a.start_turn();
                    loop {
                        let (lines, done) = a.next_lines().await;
                        s.write_all(&stream_events(&lines, done, true)).await?;
                        if done {
                            break;
                        }
                    }
                }
            }
        } else {
            if let Some(a) = agent {
                a.start_turn();
                while !a.next_lines().await.1 {}
            }
            s.write_all(&send_answer(agent.is_some())).await?;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut agent = match args.first().map(String::as_str) {
        Some("--agent") if args.len() > 1 => Some(AsyncAgent::spawn(&args[1..])),
        None => None,
        _ => {
            eprintln!("usage: turn_floor_async [--agent CMD [ARGS...]]");
            std::process::exit(2);
        }
    };
    let listener = Async::<TcpListener>::bind(([127, 0, 0, 1], 0)).expect("bind loopback");
    println!(
        "listening http://{}/",
        listener.get_ref().local_addr().unwrap()
    );
    std::io::stdout().flush().unwrap();
    async_io::block_on(async {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let _ = serve(s, &mut agent).await;
        }
    });
}
