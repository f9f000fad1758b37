//! Drives one `agentd_core::Connection` against one `Instance` the way a driver does, with
//! arbitrary peer bytes, arbitrary read splits, a fake clock and a scripted host.
//!
//! Input layout:
//!
//! * byte 0 — the instance, the peer and how its bytes are split into reads: the low 3 bits
//!   pick the largest read (`READ_SIZES`); bits 3–4 who a TCP peer is (see `identity`: the
//!   implicit loopback operator, bearer tokens, an embedder's fixed principal, a public
//!   listener with an `any` rule); bit 5 turns on introspection and the device grant; bit 6
//!   the events extension and a CORS origin; bit 7 makes the listener a unix socket and the
//!   peer a unix peer;
//! * byte 1 — what the host and the driver do (see `Mode`);
//! * the rest — the bytes the peer sends. `@@0`..`@@7` in them stand for the first eight
//!   identifiers the instance will draw (task and context ids, deterministic under
//!   `CounterEntropy(1)`), so inputs can name tasks they created: GetTask, CancelTask,
//!   SubscribeToTask and follow-up messages reach their real code paths.
//!
//! The host answers `Effect::Turn` and `Effect::Command` (message ops with a document or a
//! refusal, task ops by starting the task and then completing it like a turn), at once or
//! held until the connection waits for them.
//!
//! Properties checked, for every input: no panic; every response in the byte stream the
//! peer receives starts with `HTTP/1.1 `, is framed correctly (`content-length`, chunked
//! SSE, or close-delimited SSE) and nothing follows a `connection: close` response; buffered
//! output stays bounded; a connection holds at most one task subscription and one command
//! call; completions of the wrong kind, repeated answers and completions for canceled tasks
//! are refused; after `close` the connection is finished, writes nothing more and the
//! instance holds no subscription and no call; where nothing depends on time, the output
//! does not depend on how the input was split into reads.

#![no_main]

use std::collections::VecDeque;
use std::sync::OnceLock;

use agentd_core::a2a::types::{Artifact, Part, TaskState};
use agentd_core::auth::{AuthConfig, BearerRule, Peer, Principal, Role};
use agentd_core::errors::{ErrorKind, RpcError};
use agentd_core::ext::annotations::{Link, LinkKind};
use agentd_core::ext::command::table::ReplyKind;
use agentd_core::ext::command::DeclaredCommand;
use agentd_core::http::cors::CorsPolicy;
use agentd_core::ids::{uuid_v4, CounterEntropy};
use agentd_core::{
    CallId, CommandAnswer, Completion, Connection, Effect, Instance, InstanceConfig, ListenerInfo,
    ListenerKind, Now,
};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

const EPOCH_MS: u64 = 1_767_225_600_000;
const ENTROPY_SEED: u64 = 1;

/// The largest single read, by the low three bits of byte 0 (`usize::MAX`: all at once).
const READ_SIZES: [usize; 8] = [usize::MAX, 1, 2, 3, 8, 32, 256, 2048];

/// The connection's buffered output may never exceed this.
const OUTPUT_BOUND: usize = 8 * 1024 * 1024;

/// Driver steps without progress on the peer's bytes before the host finishes every task
/// it holds, and then before the driver gives up on the connection.
const STUCK_FINISH_TASKS: u32 = 16;
const STUCK_GIVE_UP: u32 = 64;

/// The op a workflow declares in every instance (a task op outside the built-in table).
const DECLARED_OP: &str = "deploy";

/// What the host answers a turn with, by the low three bits of byte 1. A command is
/// refused where a turn is rejected, and answered otherwise.
const TURN_ANSWERS: [Option<TaskState>; 8] = [
    Some(TaskState::Rejected),
    Some(TaskState::Completed),
    Some(TaskState::Failed),
    Some(TaskState::InputRequired),
    Some(TaskState::AuthRequired),
    Some(TaskState::Canceled),
    // Working only: the turn stays open until the driver gets stuck.
    None,
    // Completed after a flood of artifact chunks (`FLOOD_CHUNKS`): more than a stream's
    // queue holds, and more output than a connection buffers.
    Some(TaskState::Completed),
];

/// Artifact chunks the host sends in flood mode (byte 1's low bits = 7).
const FLOOD_CHUNKS: usize = 300;

struct Mode {
    answer: Option<TaskState>,
    /// Answer turns and commands only when the driver is stuck, not as they arrive.
    hold_turns: bool,
    /// The peer reads only part of the output each time (a slow reader).
    slow_reader: bool,
    /// Time passes between reads.
    clock_moves: bool,
    /// The driver closes without reporting end of input.
    no_eof: bool,
    /// The host reports `Working`, artifact chunks and an agent message with the answer.
    chatty: bool,
    /// Artifact chunks a chatty host sends per turn.
    chunks: usize,
}

impl Mode {
    fn new(b: u8) -> Self {
        Mode {
            answer: TURN_ANSWERS[usize::from(b & 7)],
            hold_turns: b & 0x08 != 0,
            slow_reader: b & 0x10 != 0,
            clock_moves: b & 0x20 != 0,
            no_eof: b & 0x40 != 0,
            chatty: b & 0x80 != 0 || b & 7 == 7,
            chunks: if b & 7 == 7 { FLOOD_CHUNKS } else { 2 },
        }
    }
}

/// SplitMix64: read sizes, clock steps and partial writes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// `FUZZ_SHOW_OUTPUT=1` prints what the peer received (to read what an input does).
fn show_output() -> bool {
    static SHOW: OnceLock<bool> = OnceLock::new();
    *SHOW.get_or_init(|| std::env::var_os("FUZZ_SHOW_OUTPUT").is_some())
}

/// The first identifiers an instance seeded like ours draws.
fn drawn_ids() -> &'static [String; 8] {
    static IDS: OnceLock<[String; 8]> = OnceLock::new();
    IDS.get_or_init(|| {
        let mut e = CounterEntropy(ENTROPY_SEED);
        std::array::from_fn(|_| uuid_v4(&mut e))
    })
}

/// Replaces `@@0`..`@@7` with the identifiers the instance will draw.
fn expand_ids(input: &[u8]) -> Vec<u8> {
    let ids = drawn_ids();
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i..].starts_with(b"@@")
            && i + 2 < input.len()
            && (b'0'..=b'7').contains(&input[i + 2])
        {
            out.extend_from_slice(ids[usize::from(input[i + 2] - b'0')].as_bytes());
            i += 3;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    out
}

/// Work the host has not finished.
enum Work {
    /// A turn on this task (held, or answered `Working` only).
    Turn(String),
    /// A command call not yet answered.
    Call {
        call: CallId,
        reply: ReplyKind,
        task_id: Option<String>,
        op: String,
    },
}

/// Bearer tokens the instance knows in the identity modes that configure them.
const OPERATOR_TOKEN: &str = "operator-token";
const USER_TOKEN: &str = "alice-token";
const AGENT_TOKEN: &str = "agent-token";

/// The instance and the peer, by byte 0: bit 7 a unix listener and peer; otherwise, by bits
/// 3–4, a TCP peer on a loopback listener with no credential configured (the implicit
/// operator), on a loopback listener with bearer tokens, an embedder's fixed principal (a
/// peer agent with grants), or on a public listener with bearer tokens and an `any` rule.
fn identity(b: u8) -> (InstanceConfig, Peer) {
    let user = Principal::new("user:alice", Role::User, Vec::new());
    let agent = Principal::new(
        "peer-agent",
        Role::Agent,
        vec!["workflow.*".into(), DECLARED_OP.into()],
    );
    let bearers = AuthConfig {
        operator_bearer: Some(AuthConfig::digest(OPERATOR_TOKEN)),
        bearers: vec![
            BearerRule {
                digest: AuthConfig::digest(USER_TOKEN),
                principal: user,
            },
            BearerRule {
                digest: AuthConfig::digest(AGENT_TOKEN),
                principal: agent.clone(),
            },
        ],
        ..AuthConfig::default()
    };
    let tcp = |loopback| ListenerInfo {
        kind: ListenerKind::Tcp,
        url: "http://127.0.0.1:8420/".into(),
        loopback,
    };
    let (listener, peer, auth) = if b & 0x80 != 0 {
        let listener = ListenerInfo {
            kind: ListenerKind::Unix("/run/agentd/a2a.sock".into()),
            url: "unix:///run/agentd/a2a.sock".into(),
            loopback: false,
        };
        (listener, Peer::Unix { uid: 1000 }, AuthConfig::default())
    } else {
        match (b >> 3) & 3 {
            0 => (tcp(true), Peer::Tcp, AuthConfig::default()),
            1 => (tcp(true), Peer::Tcp, bearers),
            2 => (tcp(true), Peer::Fixed(agent), AuthConfig::default()),
            _ => (
                tcp(false),
                Peer::Tcp,
                AuthConfig {
                    any: Some(Principal::new("guest", Role::User, Vec::new())),
                    ..bearers
                },
            ),
        }
    };
    let mut config = InstanceConfig::new(vec![listener]);
    // The fuzzed host answers every op (a document, a started task or a refusal).
    config.host.ops = agentd_core::host::OpSet::host_ops();
    config.auth = auth;
    config.introspection_enabled = b & 0x20 != 0;
    config.device_grant.enabled = b & 0x20 != 0;
    config.events_enabled = b & 0x40 != 0;
    if b & 0x40 != 0 {
        config.cors = CorsPolicy::from_list(&["http://app.example"]).expect("a valid origin");
    }
    (config, peer)
}

struct Harness {
    inst: Instance,
    conn: Connection,
    now: Now,
    mode: Mode,
    rng: Rng,
    /// Everything the peer has read, in order.
    received: Vec<u8>,
    /// Turns and calls not yet finished, oldest first.
    open_work: VecDeque<Work>,
    /// Tasks the host stopped working on (`Effect::Cancel`).
    canceled: Vec<String>,
    gave_up: bool,
}

impl Harness {
    fn advance(&mut self, ms: u64) {
        self.now = Now::new(self.now.mono_ms + ms, self.now.epoch_ms + ms);
    }

    /// Checks the standing invariants after every call into the connection.
    fn check(&self) {
        let pending = self.conn.pending_output().len();
        assert!(
            pending <= OUTPUT_BOUND,
            "connection buffers {pending} output bytes (bound {OUTPUT_BOUND})"
        );
        assert!(
            self.inst.subscription_count() <= 1,
            "one connection holds {} task subscriptions",
            self.inst.subscription_count()
        );
        assert!(
            self.inst.pending_calls() <= 1,
            "one connection holds {} command calls",
            self.inst.pending_calls()
        );
    }

    /// The peer reads what the connection wrote: all of it, or for a slow reader a part.
    fn drain(&mut self, all: bool) {
        self.check();
        let pending = self.conn.pending_output();
        let n = if all || !self.mode.slow_reader {
            pending.len()
        } else {
            self.rng.below(pending.len() as u64 + 1) as usize
        };
        self.received.extend_from_slice(&pending[..n]);
        self.conn.consume_output(n, self.now);
    }

    /// The host: runs the effects the instance asks for and reports back.
    /// True when it took an effect.
    fn host(&mut self, finish_all: bool) -> bool {
        let mut took = false;
        while let Some(effect) = self.inst.poll_effect() {
            took = true;
            let work = match effect {
                Effect::Turn { task_id, .. } => {
                    self.canceled.retain(|t| *t != task_id);
                    Work::Turn(task_id)
                }
                Effect::Cancel { task_id } => {
                    self.open_work
                        .retain(|w| !matches!(w, Work::Turn(t) if *t == task_id));
                    self.canceled.push(task_id);
                    continue;
                }
                // Push is off in the fuzzed instance; a delivery would be the host's I/O.
                Effect::Deliver { .. } => continue,
                Effect::Command {
                    call,
                    op,
                    reply,
                    task_id,
                    ..
                } => Work::Call {
                    call,
                    reply,
                    task_id,
                    op: op.name().to_owned(),
                },
                // A kind of work this host does not do: nothing to answer.
                _ => continue,
            };
            if self.mode.hold_turns {
                self.open_work.push_back(work);
            } else {
                self.work(work, false);
            }
        }
        if finish_all {
            // Finishing a call may start a task: a bounded number of rounds.
            for _ in 0..4 {
                let open = std::mem::take(&mut self.open_work);
                if open.is_empty() {
                    break;
                }
                for w in open {
                    self.work(w, true);
                }
            }
        }
        took
    }

    /// Does one piece of work: a turn is answered as the mode says (`finish`: to its final
    /// state even in the working-only mode); a command is answered, or its task started and
    /// then worked on like a turn.
    fn work(&mut self, work: Work, finish: bool) {
        match work {
            Work::Turn(task_id) => match (self.mode.answer, finish) {
                (Some(state), _) => self.complete(&task_id, state, self.mode.chatty),
                (None, true) => self.complete(&task_id, TaskState::Completed, self.mode.chatty),
                (None, false) => {
                    let _ = self.inst.handle_completion(
                        Completion::Status {
                            task_id: task_id.clone(),
                            state: TaskState::Working,
                            message: None,
                        },
                        self.now,
                    );
                    self.open_work.push_back(Work::Turn(task_id));
                }
            },
            Work::Call {
                call,
                reply,
                task_id,
                op,
            } => {
                if self.mode.answer == Some(TaskState::Rejected) {
                    let refusal = RpcError::new(ErrorKind::OpNotServed, format!("{op}: not here"));
                    self.answer_once(call, CommandAnswer::Refused(refusal));
                    return;
                }
                match reply {
                    ReplyKind::Message => {
                        // A message op never starts a task.
                        let wrong = self.inst.handle_completion(
                            Completion::CommandStarted {
                                call,
                                link: Link {
                                    kind: LinkKind::Run,
                                    id: "run-x".into(),
                                },
                            },
                            self.now,
                        );
                        assert!(wrong.is_err(), "a message op {op:?} started a task");
                        let doc = json!({"ok": true, "op": op, "n": [1, 2.5, null, "x"]});
                        self.answer_once(call, CommandAnswer::Document(doc));
                    }
                    ReplyKind::Task => {
                        // A task op's answer is its task, not a document.
                        let wrong = self.inst.handle_completion(
                            Completion::CommandResult {
                                call,
                                answer: CommandAnswer::Document(json!({})),
                            },
                            self.now,
                        );
                        assert!(
                            wrong.is_err(),
                            "a task op {op:?} was answered with a document"
                        );
                        let started = self.inst.handle_completion(
                            Completion::CommandStarted {
                                call,
                                link: Link {
                                    kind: LinkKind::Run,
                                    id: format!("run-{call}"),
                                },
                            },
                            self.now,
                        );
                        if started.is_ok() {
                            let task_id = task_id.expect("a started task op has a task id");
                            self.work(Work::Turn(task_id), finish);
                        }
                    }
                }
            }
        }
    }

    /// Answers a call; a second answer to it must be refused.
    fn answer_once(&mut self, call: CallId, answer: CommandAnswer) {
        let first = self
            .inst
            .handle_completion(Completion::CommandResult { call, answer }, self.now);
        if first.is_ok() {
            let again = self.inst.handle_completion(
                Completion::CommandResult {
                    call,
                    answer: CommandAnswer::Document(json!(1)),
                },
                self.now,
            );
            assert!(again.is_err(), "a command call was answered twice");
        }
    }

    fn complete(&mut self, task_id: &str, state: TaskState, chatty: bool) {
        if self.canceled.iter().any(|t| t == task_id) {
            // The host stopped; a late completion must be refused, not applied.
            let r = self.inst.handle_completion(
                Completion::Status {
                    task_id: task_id.to_owned(),
                    state,
                    message: None,
                },
                self.now,
            );
            assert!(r.is_err(), "a completion for a canceled task was applied");
            return;
        }
        if chatty {
            let _ = self.inst.handle_completion(
                Completion::Status {
                    task_id: task_id.to_owned(),
                    state: TaskState::Working,
                    message: Some(vec![Part::text("thinking")]),
                },
                self.now,
            );
            let chunks = self.mode.chunks;
            for i in 0..chunks {
                let text = if chunks > 2 {
                    format!("chunk {i} {}", "x".repeat(1000))
                } else {
                    format!("chunk {i}")
                };
                let _ = self.inst.handle_completion(
                    Completion::Artifact {
                        task_id: task_id.to_owned(),
                        artifact: Artifact {
                            artifact_id: "answer".into(),
                            description: String::new(),
                            extensions: Vec::new(),
                            metadata: None,
                            name: "answer".into(),
                            parts: vec![Part::text(text)],
                        },
                        append: i > 0,
                        last_chunk: i + 1 == chunks,
                    },
                    self.now,
                );
            }
        }
        if chatty && state == TaskState::InputRequired {
            let _ = self.inst.handle_completion(
                Completion::Ask {
                    task_id: task_id.to_owned(),
                    schema: Some(
                        json!({"type": "object", "properties": {"answer": {"type": "string"}}}),
                    ),
                    channel: Some("cli".into()),
                    // Now and then an approval only an operator may give.
                    operator_only: self.rng.below(4) == 0,
                },
                self.now,
            );
        }
        let message = chatty.then(|| vec![Part::text("done")]);
        let _ = self.inst.handle_completion(
            Completion::Status {
                task_id: task_id.to_owned(),
                state,
                message,
            },
            self.now,
        );
    }

    /// One round of the driver's loop after an event: the host works, the connection
    /// produces what became ready, the peer reads.
    fn service(&mut self, finish_all: bool) {
        self.drain(false);
        // Until the host has nothing new to take: answering may let the connection go on
        // to a pipelined request that asks for another turn.
        self.host(finish_all);
        for _ in 0..8 {
            self.conn.poll(&mut self.inst, self.now);
            self.drain(false);
            if !self.host(finish_all) {
                break;
            }
        }
        // The driver takes the records after each call; their labels are bounded and print
        // on one line.
        while let Some(r) = self.conn.poll_request_record() {
            for label in [r.method.get(), r.route.get(), r.task_id.get()]
                .into_iter()
                .flatten()
            {
                assert!(label.len() <= agentd_core::reqlog::LABEL_CAP, "{label:?}");
                assert!(!label.contains(['\n', '\r']), "{label:?}");
            }
        }
    }

    /// Moves the clock to the connection's next deadline, if any, and acts on it.
    fn fire_timeout(&mut self) -> bool {
        let Some(at) = self.conn.poll_timeout() else {
            return false;
        };
        if at > self.now.mono_ms {
            self.advance(at - self.now.mono_ms);
        }
        self.conn.handle_timeout(&mut self.inst, self.now);
        self.drain(false);
        true
    }

    /// The connection will not read: let the host, the clock and the peer move it on.
    /// False when the driver gives up.
    fn unstick(&mut self, stuck: &mut u32) -> bool {
        *stuck += 1;
        if *stuck > STUCK_GIVE_UP {
            self.gave_up = true;
            return false;
        }
        let finish_all = *stuck >= STUCK_FINISH_TASKS;
        let eager = !self.mode.clock_moves && !self.mode.slow_reader;
        if !self.open_work.is_empty() && (eager || finish_all || self.rng.below(2) == 0) {
            // The host finishes the oldest work it holds.
            if let Some(w) = self.open_work.pop_front() {
                self.work(w, true);
            }
        } else if !self.conn.pending_output().is_empty() && self.rng.below(2) == 0 {
            // The slow peer catches up.
            self.drain(true);
        } else if !self.fire_timeout() {
            self.drain(true);
        }
        self.service(finish_all);
        true
    }
}

fn run(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let max_read = READ_SIZES[usize::from(data[0] & 7)];
    let mode = Mode::new(data[1]);
    let payload = expand_ids(&data[2..]);
    let (received, gave_up) = serve(data, max_read, &payload);
    if show_output() {
        eprintln!(
            "--- peer received ---\n{}",
            String::from_utf8_lossy(&received)
        );
    }
    check_responses(&received, mode.slow_reader);

    // Where nothing depends on time or on when the host runs (it holds turns until the
    // connection waits for one), the bytes the peer receives must not depend on how its
    // bytes were split into reads either. Not when the driver closes without reporting the
    // end of input: it closes as soon as the last byte is read, and when that is depends on
    // the reads (in one read, before a held answer to the first of pipelined requests).
    let deterministic = mode.hold_turns && !mode.slow_reader && !mode.clock_moves && !mode.no_eof;
    if deterministic && !gave_up && max_read != usize::MAX {
        let (whole, whole_gave_up) = serve(data, usize::MAX, &payload);
        if !whole_gave_up && whole != received {
            let at = whole
                .iter()
                .zip(&received)
                .position(|(a, b)| a != b)
                .unwrap_or(whole.len().min(received.len()));
            panic!(
                "output depends on read splits: at byte {at}, whole reads gave {:?}, reads of at most {max_read} gave {:?}",
                show(&whole[at.saturating_sub(40)..]),
                show(&received[at.saturating_sub(40)..])
            );
        }
    }
}

/// Serves `payload` on one connection of a fresh instance; returns what the peer received
/// and whether the driver gave up on a connection that would not move.
fn serve(data: &[u8], max_read: usize, payload: &[u8]) -> (Vec<u8>, bool) {
    let mode = Mode::new(data[1]);

    let now = Now::new(0, EPOCH_MS);
    let (config, peer) = identity(data[0]);
    let mut inst = Instance::new(config.clone(), Box::new(CounterEntropy(ENTROPY_SEED)), now);
    inst.register_command(DeclaredCommand {
        op: DECLARED_OP.into(),
        workflow: "deploy-flow".into(),
        schema: json!({
            "type": "object",
            "properties": {"target": {"type": "string", "minLength": 1}, "dry_run": {"type": "boolean"}},
            "required": ["target"],
            "additionalProperties": false,
        }),
        roles: vec![Role::User],
    })
    .expect("the declared command registers");
    let mut conn = Connection::new(0, peer, config.conn, std::task::Waker::noop().clone(), now);
    // Every answer is recorded, as a driver logging at debug asks, so the fuzzer reaches the
    // request-log records and their labels too.
    conn.keep_records(agentd_core::reqlog::Keep::All);
    let mut h = Harness {
        inst,
        conn,
        now,
        mode,
        rng: Rng(u64::from(data[0]) << 8 | u64::from(data[1])),
        received: Vec::new(),
        open_work: VecDeque::new(),
        canceled: Vec::new(),
        gave_up: false,
    };

    // The peer's bytes, in reads of the sizes the input picked, while the connection reads.
    let mut pos = 0;
    let mut stuck = 0;
    while pos < payload.len() && !h.conn.is_finished() {
        if h.conn.wants_read() {
            stuck = 0;
            let left = payload.len() - pos;
            let n = if max_read >= left {
                if max_read == usize::MAX {
                    left
                } else {
                    1 + h.rng.below(left as u64) as usize
                }
            } else {
                1 + h.rng.below(max_read as u64) as usize
            };
            h.conn
                .handle_input(&mut h.inst, &payload[pos..pos + n], h.now);
            pos += n;
            h.service(false);
            if h.mode.clock_moves {
                let step = match h.rng.below(8) {
                    0 => h.rng.below(200_000),
                    _ => h.rng.below(100),
                };
                h.advance(step);
                if h.conn.poll_timeout().is_some_and(|t| h.now.mono_ms >= t) {
                    h.conn.handle_timeout(&mut h.inst, h.now);
                    h.service(false);
                }
            }
        } else if !h.unstick(&mut stuck) {
            break;
        }
    }

    // The peer is done sending. A driver sees that only when it reads, so first the
    // connection must want to read again; what was asked is still answered, then it ends.
    if !h.mode.no_eof {
        let mut stuck = 0;
        while !h.conn.is_finished() && !h.conn.wants_read() && h.unstick(&mut stuck) {}
        if !h.conn.is_finished() && h.conn.wants_read() {
            h.conn.handle_eof(&mut h.inst, h.now);
            h.service(false);
            let mut stuck = 0;
            while !h.conn.is_finished() && h.unstick(&mut stuck) {}
        }
    }
    h.drain(true);
    let pending_before_close = h.conn.pending_output().len();
    assert_eq!(pending_before_close, 0, "output left after the final drain");

    h.conn.close(&mut h.inst);
    assert!(h.conn.is_finished(), "not finished after close");
    assert!(
        h.conn.pending_output().is_empty(),
        "output pending after close"
    );
    assert_eq!(
        h.inst.subscription_count(),
        0,
        "subscriptions left in the instance after close"
    );
    assert_eq!(
        h.inst.pending_calls(),
        0,
        "command calls left in the instance after close"
    );
    // The host may still report on tasks after their connection is gone.
    let _ = h.host(true);
    assert_eq!(h.inst.subscription_count(), 0);
    (h.received, h.gave_up)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned()
}

/// Checks that `out` is a sequence of well-framed HTTP/1.1 responses. A Server-Sent Events
/// stream may be cut short (the driver closed it); anything else only when the peer stopped
/// reading (`reader_may_stall`) and the connection dropped its output.
fn check_responses(out: &[u8], reader_may_stall: bool) {
    const START: &[u8] = b"HTTP/1.1 ";
    let mut i = 0;
    while i < out.len() {
        let rest = &out[i..];
        if rest.len() < START.len() && reader_may_stall && START.starts_with(rest) {
            return;
        }
        assert!(
            rest.starts_with(START),
            "response at offset {i} does not start with `HTTP/1.1 `: {:?}",
            show(rest)
        );
        let Some(head_len) = find(rest, b"\r\n\r\n") else {
            assert!(
                reader_may_stall,
                "response head at {i} never ends: {:?}",
                show(rest)
            );
            return;
        };
        let head = std::str::from_utf8(&rest[..head_len]).expect("response head is UTF-8");
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status: u16 = status_line
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        assert!(
            (100..600).contains(&status) && status_line.as_bytes().get(12) == Some(&b' '),
            "bad status line {status_line:?}"
        );
        let (mut length, mut chunked, mut close, mut sse, mut etag) =
            (None::<usize>, false, false, false, false);
        for line in lines {
            let (name, value) = line
                .split_once(": ")
                .unwrap_or_else(|| panic!("bad header line {line:?} in {head:?}"));
            assert!(
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "bad header name {name:?}"
            );
            assert!(
                !value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
                "bad header value {value:?}"
            );
            match name {
                "content-length" => {
                    assert!(length.is_none(), "two content-length headers: {head:?}");
                    length = Some(value.parse().expect("content-length is a number"));
                }
                "transfer-encoding" => {
                    assert_eq!(value, "chunked");
                    chunked = true;
                }
                "connection" => close |= value == "close",
                "content-type" => sse |= value == "text/event-stream",
                "etag" => etag = true,
                _ => {}
            }
        }
        let mut at = i + head_len + 4;
        if status == 100 {
            assert!(
                length.is_none() && !chunked && !close,
                "100 Continue with framing headers: {head:?}"
            );
            i = at;
            continue;
        }
        assert!(status >= 200, "unexpected interim status {status}");
        if chunked {
            assert!(
                sse && length.is_none(),
                "chunked non-stream response: {head:?}"
            );
            // Chunks up to the last; the stream may be cut short when the driver closes.
            loop {
                let Some(line_len) = find(&out[at..], b"\r\n") else {
                    return;
                };
                let size_text = std::str::from_utf8(&out[at..at + line_len]).expect("chunk size");
                let size = usize::from_str_radix(size_text, 16)
                    .unwrap_or_else(|_| panic!("bad chunk size line {size_text:?}"));
                at += line_len + 2;
                if size == 0 {
                    if out.len() < at + 2 {
                        return;
                    }
                    assert_eq!(&out[at..at + 2], b"\r\n", "chunked stream end");
                    at += 2;
                    break;
                }
                if out.len() < at + size + 2 {
                    return;
                }
                let chunk = &out[at..at + size];
                // A task stream event may open with its SSE id (`<taskId>:<run>:<n>`): one
                // line, no carriage return, before the data.
                let data = match chunk.strip_prefix(b"id: ") {
                    Some(rest) => {
                        let end = find(rest, b"\n").expect("the id line ends");
                        let id = std::str::from_utf8(&rest[..end]).expect("the id is text");
                        assert!(
                            !id.contains('\r') && id.split(':').count() == 3,
                            "bad SSE id {id:?}"
                        );
                        &rest[end + 1..]
                    }
                    None => chunk,
                };
                assert!(
                    data.starts_with(b"data: ") || data.starts_with(b": "),
                    "chunk is not an SSE event: {:?}",
                    show(data)
                );
                assert!(data.ends_with(b"\n\n"), "SSE event does not end its block");
                assert_eq!(&out[at + size..at + size + 2], b"\r\n", "chunk end");
                at += size + 2;
            }
        } else if sse {
            assert!(
                close && length.is_none(),
                "unframed stream stays open: {head:?}"
            );
            return;
        } else if status == 204 || status == 304 {
            assert!(length.is_none(), "{status} with a content-length");
        } else {
            let n = length.unwrap_or_else(|| panic!("response without content-length: {head:?}"));
            let left = &out[at..];
            // A card answers HEAD with the length of the body a GET would carry.
            let head_only = etag && n > 0 && (left.is_empty() || left.starts_with(START));
            if !head_only {
                if left.len() < n {
                    assert!(reader_may_stall, "response body cut short: {head:?}");
                    return;
                }
                at += n;
            }
        }
        if close {
            assert_eq!(
                at,
                out.len(),
                "bytes after a `connection: close` response: {:?}",
                show(&out[at..])
            );
        }
        i = at;
    }
}

fuzz_target!(|data: &[u8]| run(data));
