//! Figures: what ListTasks' first page and the `status` command cost (CPU time of the
//! whole request, in process: parse, handler, answer) at 1k, 10k and 100k held tasks, and
//! how many heap bytes the store holds per task; and one test, the lean-task bound (a
//! finished task's heap above its content). The figures are ignored by default; run them in
//! release:
//!
//! `cargo test --release -p agentd-core --test listing_cost -- --ignored --nocapture`
//!
//! The heap is counted by a global allocator that wraps the system's and adds up what is
//! live; it is this measurement's own binary, so no other test runs under it.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use agentd_core::a2a::types::{Message, Part, Role as MessageRole, TaskState};
use agentd_core::auth::{Principal, Role};
use agentd_core::ext::COMMAND_URI;
use agentd_core::tasks::{ContextIds, MessageDigest, TaskLimits, TaskStore};
use serde_json::{json, Value};
use support::*;

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Live bytes as glibc's malloc holds them: each block with its 8-byte header, rounded up to
/// 16 bytes, 32 at least. What the requested bytes cost the process.
static CHUNKS: AtomicUsize = AtomicUsize::new(0);
/// Live allocations.
static BLOCKS: AtomicUsize = AtomicUsize::new(0);

/// What a block of `size` bytes takes in glibc's heap.
fn chunk(size: usize) -> usize {
    ((size + 8 + 15) & !15).max(32)
}

// SAFETY: every call is passed to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        BLOCKS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        CHUNKS.fetch_add(chunk(new_size), Ordering::Relaxed);
        CHUNKS.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Held by each measurement for its whole run: the heap counters are the process's, so two
/// measurements running at once (the test harness runs tests in parallel) would count each
/// other's allocations.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stored task of `owner`, as the durable store holds it.
fn template(owner: Principal, key: &str) -> Value {
    let mut s = TaskStore::new(TaskLimits::DEFAULT);
    let first = Message {
        message_id: "m".into(),
        role: MessageRole::User,
        parts: vec![Part::text("hello")],
        ..Message::default()
    };
    let context = ContextIds {
        name: "c".into(),
        key: key.into(),
    };
    s.create("t".into(), context, owner, first, T0).unwrap();
    s.get("t").unwrap().to_doc()
}

/// Fills the instance with `n` tasks: one in ten the operator's, the rest spread over 100
/// users; four tasks to a conversation; most finished. Returns the heap bytes per task.
fn fill(h: &mut Harness, n: usize) -> usize {
    fill_counted(h, n).requested
}

/// Heap held per task: bytes asked for, bytes as glibc's malloc holds them, blocks.
#[derive(Debug)]
struct PerTask {
    requested: usize,
    chunks: usize,
    blocks: f64,
}

/// [`fill`], counting the heap every way [`PerTask`] does.
fn fill_counted(h: &mut Harness, n: usize) -> PerTask {
    let op = template(Principal::operator(), "c");
    let user = template(Principal::new("user:u0", Role::User, vec![]), "ctx-0");
    let states = [
        TaskState::Completed,
        TaskState::Completed,
        TaskState::Completed,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::Failed,
    ];
    let before = (
        LIVE.load(Ordering::Relaxed),
        CHUNKS.load(Ordering::Relaxed),
        BLOCKS.load(Ordering::Relaxed),
    );
    for i in 0..n {
        let mut doc = if i % 10 == 0 {
            op.clone()
        } else {
            user.clone()
        };
        let id = format!("task-{i:08}");
        let name = format!("conversation-{}", i / 4);
        doc["id"] = json!(id);
        doc["contextId"] = json!(name);
        if i % 10 == 0 {
            doc["contextKey"] = json!(name);
        } else {
            doc["owner"]["id"] = json!(format!("user:u{}", i % 100));
            doc["contextKey"] = json!(format!("ctx-{:032x}", i / 4));
        }
        doc["state"] = json!(states[i % states.len()]);
        // Two tasks to a millisecond: the listing's order has ties to break.
        let ms = T0 + (i / 2) as u64;
        doc["statusMs"] = json!(ms);
        doc["createdMs"] = json!(ms);
        doc["statusSeq"] = json!(i + 1);
        h.inst.restore_record("task", &id, doc, h.now).unwrap();
    }
    let n = n.max(1);
    PerTask {
        requested: (LIVE.load(Ordering::Relaxed) - before.0) / n,
        chunks: (CHUNKS.load(Ordering::Relaxed) - before.1) / n,
        blocks: (BLOCKS.load(Ordering::Relaxed) - before.2) as f64 / n as f64,
    }
}

/// Microseconds one request takes, the median of `runs`.
fn cost(h: &mut Harness, p: &Principal, request: &[u8], runs: usize) -> f64 {
    let mut c = h.conn_as(0, p.clone());
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = c.feed(h, request);
            let spent = t.elapsed().as_secs_f64() * 1e6;
            assert!(one(&out).json().get("error").is_none());
            h.take_effects();
            spent
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn status_request() -> Vec<u8> {
    let body = json!({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{
        "role":"ROLE_USER","messageId":fresh_id(),"extensions":[COMMAND_URI],
        "parts":[{"data":{"agentd":{"op":"status"}}}]}}});
    rpc_ext(&body.to_string(), &[COMMAND_URI])
}

#[test]
#[ignore = "a measurement: run it in release with --ignored --nocapture"]
fn listing_and_status_cost() {
    let _alone = alone();
    println!(
        "{:>7} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "tasks",
        "B/task",
        "list op µs",
        "list user",
        "op+state",
        "op+ctx",
        "status op",
        "status usr"
    );
    for n in [1_000usize, 10_000, 100_000] {
        let mut h = Harness::with(|c| {
            c.tasks.max_tasks = 1_000_000;
            c.tasks.total_bytes = usize::MAX / 2;
        });
        let per_task = fill(&mut h, n);
        let op = Principal::operator();
        let user = Principal::new("user:u7", Role::User, vec![]);
        let runs = 21;
        let list = |params: Value| call("ListTasks", 1, params);
        let list_op = cost(&mut h, &op, &list(json!({})), runs);
        let list_user = cost(&mut h, &user, &list(json!({})), runs);
        let working = json!({"status": "TASK_STATE_WORKING"});
        let list_state = cost(&mut h, &op, &list(working), runs);
        let ctx = json!({"contextId": format!("ctx-{:032x}", 1)});
        let list_ctx = cost(&mut h, &op, &list(ctx), runs);
        let status_op = cost(&mut h, &op, &status_request(), runs);
        let status_user = cost(&mut h, &user, &status_request(), runs);
        println!(
            "{n:>7} {per_task:>9} {list_op:>11.1} {list_user:>11.1} {list_state:>11.1} \
             {list_ctx:>11.1} {status_op:>11.1} {status_user:>11.1}"
        );
    }
}

/// What `n` tasks made as a daemon makes them cost per task: created, the message
/// accepted, REJECTED with a reason (no agent), with ids of a uuid's length, each in its own
/// conversation (a SendMessage without a contextId).
struct MadeLive {
    /// The serialized size of one task's history, artifacts and status message.
    content: usize,
    requested: usize,
    chunks: usize,
    blocks: f64,
}

fn made_live(n: usize) -> MadeLive {
    let mut s = TaskStore::new(TaskLimits {
        max_tasks: 1_000_000,
        total_bytes: usize::MAX / 2,
        ..TaskLimits::DEFAULT
    });
    let owner = Principal::new("user:u0", Role::User, vec![]);
    let (before, chunks, blocks) = (
        LIVE.load(Ordering::Relaxed),
        CHUNKS.load(Ordering::Relaxed),
        BLOCKS.load(Ordering::Relaxed),
    );
    let mut content = 0;
    for i in 0..n {
        let id = format!("{i:08x}-0000-4000-8000-000000000000");
        let first = Message {
            message_id: format!("m-{i:08x}-0000-4000-8000-000000000000"),
            role: MessageRole::User,
            parts: vec![Part::text("hello")],
            ..Message::default()
        };
        let context = ContextIds {
            name: format!("c-{i:08x}-0000-4000-8000-000000000000"),
            key: format!("k-{i:08x}-0000-4000-8000-000000000000"),
        };
        let mid = first.message_id.clone();
        s.create(id.clone(), context, owner.clone(), first, T0)
            .unwrap();
        s.accept_message(&id, &owner.id, &mid, MessageDigest::from_bytes([0; 32]));
        let reason = vec![Part::text("no agent is configured")];
        s.set_status(&id, TaskState::Rejected, Some(reason), T0)
            .unwrap();
        if i == 0 {
            let doc = s.get(&id).unwrap().to_doc();
            content = doc["history"].to_string().len()
                + doc["artifacts"].to_string().len()
                + doc["statusMessage"].to_string().len();
        }
    }
    s.pack_finished();
    let m = MadeLive {
        content,
        requested: (LIVE.load(Ordering::Relaxed) - before) / n,
        chunks: (CHUNKS.load(Ordering::Relaxed) - chunks) / n,
        blocks: (BLOCKS.load(Ordering::Relaxed) - blocks) as f64 / n as f64,
    };
    drop(s);
    m
}

/// Issue 17's lean-task bound, held: a finished one-message task costs at most 1.5 KiB of
/// heap (as malloc holds it) above its content. Not ignored: the counting allocator makes
/// it exact, whatever the build.
#[test]
fn a_finished_task_costs_at_most_1_5_kib_above_its_content() {
    let _alone = alone();
    let m = made_live(10_000);
    let above = m.chunks.saturating_sub(m.content);
    assert!(
        above <= 1536,
        "a task holds {} B against {} B of content: {above} B above it",
        m.chunks,
        m.content
    );
}

/// What a held task costs against its content (issue 17's lean-task target: at most 1.5 KiB
/// above the serialized size of its history and artifacts), for the one-message task
/// [`fill`] stores, at 10k tasks.
#[test]
#[ignore = "a measurement: run it in release with --ignored --nocapture"]
fn task_memory() {
    let _alone = alone();
    let doc = template(Principal::new("user:u0", Role::User, vec![]), "ctx-0");
    let content = doc["history"].to_string().len() + doc["artifacts"].to_string().len();
    let mut h = Harness::with(|c| {
        c.tasks.max_tasks = 1_000_000;
        c.tasks.total_bytes = usize::MAX / 2;
    });
    let p = fill_counted(&mut h, 10_000);
    println!(
        "per task at 10k: content (history + artifacts as JSON) {content} B; heap asked {} B, \
         held by malloc {} B in {:.1} blocks; {} B above the content",
        p.requested,
        p.chunks,
        p.blocks,
        p.chunks.saturating_sub(content)
    );
    let m = made_live(10_000);
    println!(
        "made live at 10k: content (history, artifacts, status message) {} B; heap \
         asked {} B, held by malloc {} B in {:.1} blocks; {} B above the content",
        m.content,
        m.requested,
        m.chunks,
        m.blocks,
        m.chunks.saturating_sub(m.content)
    );
    println!(
        "sizes: TaskRecord {} B, Message {} B, Part {} B, Principal {} B",
        std::mem::size_of::<agentd_core::tasks::TaskRecord>(),
        std::mem::size_of::<Message>(),
        std::mem::size_of::<Part>(),
        std::mem::size_of::<Principal>()
    );
}

/// What a restart spends putting 100k task records back, as the store hands them over (JSON
/// text): through a JSON tree per record (`serde_json::Value`, then the record), against
/// read straight into the record (`Instance::restore_record_json`).
#[test]
#[ignore = "a measurement: run it in release with --ignored --nocapture"]
fn restore_cost() {
    let _alone = alone();
    let n = 100_000;
    let user = template(Principal::new("user:u0", Role::User, vec![]), "ctx-0");
    let texts: Vec<(String, String)> = (0..n)
        .map(|i| {
            let mut doc = user.clone();
            let id = format!("task-{i:08}");
            doc["id"] = json!(id);
            doc["statusSeq"] = json!(i + 1);
            (id, doc.to_string())
        })
        .collect();
    let fresh = || {
        Harness::with(|c| {
            c.tasks.max_tasks = 1_000_000;
            c.tasks.total_bytes = usize::MAX / 2;
        })
    };
    let mut h = fresh();
    let t = Instant::now();
    for (id, text) in &texts {
        let doc: Value = serde_json::from_str(text).unwrap();
        h.inst.restore_record("task", id, doc, h.now).unwrap();
    }
    let through_tree = t.elapsed();
    drop(h);
    let mut h = fresh();
    let t = Instant::now();
    for (id, text) in &texts {
        h.inst.restore_record_json("task", id, text, h.now).unwrap();
    }
    let straight = t.elapsed();
    println!(
        "restore of {n} task records: through a JSON tree {through_tree:?}, read straight \
         into the record {straight:?} ({:.2}x)",
        through_tree.as_secs_f64() / straight.as_secs_f64()
    );
}
