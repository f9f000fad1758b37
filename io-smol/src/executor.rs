//! The driver's executor: the tasks (accept loops, connections, the daemon's runtime) run on
//! a few threads that share one queue, each thread driving async-io's reactor while idle.
//!
//! Why not `smol::Executor`: it wakes a second thread for every task it schedules and again
//! for every task a thread picks up, in case that task runs long. Under a light load each
//! such wake-up finds nothing to do, yet costs a futex or eventfd write, a context switch
//! in and one out: a request without an agent woke the daemon's threads three times where
//! once was enough, and an agent turn on the file store five to seven times.
//!
//! Here a task woken on an executor thread stays on that thread, in its slot, and runs as
//! soon as the thread is free: a connection that hands work to the runtime, and the runtime
//! that answers it, go on without waking anyone. A second task woken there displaces the
//! first to the shared queue, and a task woken elsewhere (a store thread, a reader thread)
//! goes there too; only then is a sleeping thread woken, one at a time, and a thread that
//! takes a task and leaves more behind wakes the next. After [`SLOT_STREAK`] tasks in a row
//! from its slot a thread moves the slot's task behind the queue's, so two tasks waking
//! each other do not starve the rest. A slot's task waits at most for the task its thread
//! runs (the daemon's tasks run in bounded slices); another thread cannot take it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

use async_task::{Runnable, ScheduleInfo, Task, WithInfo};

/// Tasks one thread runs before it lets its reactor look for I/O (and its stop signal be
/// seen).
const BATCH: usize = 64;

/// Tasks from its slot a thread runs in a row before it takes one from the shared queue.
const SLOT_STREAK: usize = 16;

/// A multi-threaded executor: [`Executor::spawn`] tasks, and call [`Executor::run`] on each
/// thread that should run them (inside `async_io::block_on`, which drives the reactor).
#[derive(Clone, Default)]
pub struct Executor {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<VecDeque<Runnable>>,
    sleepers: Mutex<Sleepers>,
    /// No sleeping thread needs a wake-up for a new task: one woken has not looked at the
    /// queue yet (it will find the task), or none sleeps (a thread awake will). Read without
    /// the lock so that scheduling on a busy executor takes no lock but the queue's.
    notified: AtomicBool,
}

/// The threads that found no task and sleep until woken.
#[derive(Default)]
struct Sleepers {
    /// How many sleep, woken or not.
    count: usize,
    /// The ones not yet woken, by id, with their thread's waker; the newest last.
    waiting: Vec<(usize, Waker)>,
    /// Ids given back by threads that woke, for the next to sleep.
    free: Vec<usize>,
}

impl Sleepers {
    fn insert(&mut self, waker: &Waker) -> usize {
        self.count += 1;
        let id = self.free.pop().unwrap_or(self.count);
        self.waiting.push((id, waker.clone()));
        id
    }

    /// A sleeper looked for work again and found none. False: it was not woken in between
    /// (its waker is brought up to date); true: it was, and now waits again.
    fn update(&mut self, id: usize, waker: &Waker) -> bool {
        match self.waiting.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) => {
                if !w.will_wake(waker) {
                    w.clone_from(waker);
                }
                false
            }
            None => {
                self.waiting.push((id, waker.clone()));
                true
            }
        }
    }

    /// A sleeper woke (found work, or stops). True if it had been woken by a notice.
    fn remove(&mut self, id: usize) -> bool {
        self.count -= 1;
        self.free.push(id);
        match self.waiting.iter().position(|(i, _)| *i == id) {
            Some(at) => {
                self.waiting.remove(at);
                false
            }
            None => true,
        }
    }

    /// See [`Shared::notified`].
    fn is_notified(&self) -> bool {
        self.count == 0 || self.count > self.waiting.len()
    }

    /// The waker of a sleeper to wake, unless one was woken already and has not looked.
    fn notify(&mut self) -> Option<Waker> {
        if self.waiting.len() == self.count {
            self.waiting.pop().map(|(_, w)| w)
        } else {
            None
        }
    }
}

thread_local! {
    /// What this thread's worker keeps outside the shared state.
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local { executor: 0, slot: None, idle: None })
    };
}

struct Local {
    /// The executor whose worker this thread runs (the address of its shared state; 0:
    /// none).
    executor: usize,
    /// The task this thread runs next.
    slot: Option<Runnable>,
    /// The worker's waker while it waits for work: a task put in the slot then must wake
    /// it, as nothing else will (same thread: no system call).
    idle: Option<Waker>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while these locks are held; a poisoned one is taken over.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn id(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as usize
    }

    fn schedule(self: &Arc<Self>, runnable: Runnable, info: ScheduleInfo) {
        // A task woken while it runs (it yields, or another thread woke it meanwhile) goes
        // behind the others.
        let runnable = match info.woken_while_running {
            true => runnable,
            false => match self.keep_here(runnable) {
                None => return,
                Some(r) => r,
            },
        };
        self.push(runnable);
    }

    /// Queues `runnable` for any thread and wakes one if none is on its way.
    fn push(&self, runnable: Runnable) {
        lock(&self.queue).push_back(runnable);
        self.notify();
    }

    /// Puts `runnable` in this thread's slot if the thread runs one of this executor's
    /// workers; returns what goes to the shared queue instead (it, or the slot's former
    /// task).
    fn keep_here(self: &Arc<Self>, runnable: Runnable) -> Option<Runnable> {
        let id = self.id();
        let mut runnable = Some(runnable);
        let (displaced, idle) = LOCAL
            .try_with(|l| match l.try_borrow_mut() {
                Ok(mut l) if l.executor == id => {
                    let displaced = std::mem::replace(&mut l.slot, runnable.take());
                    (displaced, l.idle.take())
                }
                _ => (None, None),
            })
            .unwrap_or((None, None));
        if let Some(w) = idle {
            w.wake();
        }
        runnable.or(displaced)
    }

    /// Wakes one sleeping thread, unless one woken has yet to look.
    fn notify(&self) {
        if self
            .notified
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let waker = lock(&self.sleepers).notify();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// The next task from the shared queue, and whether more wait there.
    fn pop(&self) -> (Option<Runnable>, bool) {
        let mut q = lock(&self.queue);
        let r = q.pop_front();
        (r, !q.is_empty())
    }

    fn queued(&self) -> bool {
        !lock(&self.queue).is_empty()
    }

    /// Takes this thread out of the executor's workers: what its slot holds goes to the
    /// shared queue, where another thread runs it.
    fn leave(&self) {
        let left = LOCAL
            .try_with(|l| {
                let mut l = l.borrow_mut();
                l.executor = 0;
                l.idle = None;
                l.slot.take()
            })
            .ok()
            .flatten();
        if let Some(r) = left {
            self.push(r);
        }
    }
}

/// This thread's membership of an executor's workers, for as long as [`Executor::run`]
/// runs: ended on return or when its future is dropped (cancelled, or a task's panic
/// unwinding through it), so no task is left in a slot nobody runs.
struct Enrolled(Arc<Shared>);

impl Enrolled {
    fn new(shared: &Arc<Shared>) -> Self {
        let id = shared.id();
        let _ = LOCAL.try_with(|l| l.borrow_mut().executor = id);
        Enrolled(shared.clone())
    }
}

impl Drop for Enrolled {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl Executor {
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns `future`; it first runs on this thread if this thread runs a worker, else on
    /// whichever thread is free. A panic inside it ends that task alone.
    pub fn spawn<F>(&self, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let shared = self.shared.clone();
        let schedule = WithInfo(move |r, info| shared.schedule(r, info));
        let (runnable, task) = async_task::Builder::new()
            .propagate_panic(true)
            .spawn(|()| future, schedule);
        runnable.schedule();
        task
    }

    /// Runs tasks on this thread until `stop` completes. Call it inside
    /// `async_io::block_on`, once per thread; the thread waits in the reactor when it has
    /// no task.
    pub async fn run<T>(&self, stop: impl Future<Output = T>) -> T {
        let _enrolled = Enrolled::new(&self.shared);
        let mut worker = Worker {
            shared: self.shared.clone(),
            sleeping: None,
            streak: 0,
        };
        let work = std::future::poll_fn(move |cx| worker.poll(cx.waker()));
        futures_lite::future::or(stop, work).await
    }
}

/// One thread's worker.
struct Worker {
    shared: Arc<Shared>,
    /// Its id among the sleepers while it sleeps.
    sleeping: Option<usize>,
    /// Tasks taken from the slot in a row.
    streak: usize,
}

impl Worker {
    fn poll<T>(&mut self, waker: &Waker) -> Poll<T> {
        let _ = LOCAL.try_with(|l| l.borrow_mut().idle = None);
        let mut ran = 0;
        loop {
            match self.next() {
                Some((r, more)) => {
                    // Work left in the queue gets another thread; so does the notice that
                    // woke this one, if it took its task from the slot instead.
                    let notice = self.wake();
                    if more || (notice && self.shared.queued()) {
                        self.shared.notify();
                    }
                    r.run();
                    ran += 1;
                    if ran == BATCH {
                        waker.wake_by_ref();
                        return Poll::Pending;
                    }
                }
                None => {
                    // Registered first, then a last look: a task queued between the look
                    // that found none and the registration is not missed.
                    if !self.sleep(waker) {
                        let _ = LOCAL.try_with(|l| l.borrow_mut().idle = Some(waker.clone()));
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    fn slot() -> Option<Runnable> {
        LOCAL
            .try_with(|l| l.borrow_mut().slot.take())
            .ok()
            .flatten()
    }

    /// The next task, and whether more wait in the shared queue.
    fn next(&mut self) -> Option<(Runnable, bool)> {
        if self.streak < SLOT_STREAK {
            if let Some(r) = Self::slot() {
                self.streak += 1;
                return Some((r, false));
            }
        } else if let Some(r) = Self::slot() {
            // The streak is over: the slot's task goes behind the queue's, where any thread
            // may take it.
            lock(&self.shared.queue).push_back(r);
        }
        self.streak = 0;
        match self.shared.pop() {
            (Some(r), more) => Some((r, more)),
            (None, _) => Self::slot().map(|r| (r, false)),
        }
    }

    /// Registers this worker as sleeping. False if it already was and has not been woken
    /// since: it may wait. True: look for work once more first.
    fn sleep(&mut self, waker: &Waker) -> bool {
        let mut s = lock(&self.shared.sleepers);
        match self.sleeping {
            None => self.sleeping = Some(s.insert(waker)),
            Some(id) => {
                if !s.update(id, waker) {
                    return false;
                }
            }
        }
        self.shared
            .notified
            .store(s.is_notified(), Ordering::Release);
        true
    }

    /// Found work: no longer a sleeper. True if a notice had woken it.
    fn wake(&mut self) -> bool {
        let Some(id) = self.sleeping.take() else {
            return false;
        };
        let mut s = lock(&self.shared.sleepers);
        let notice = s.remove(id);
        self.shared
            .notified
            .store(s.is_notified(), Ordering::Release);
        notice
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(id) = self.sleeping.take() {
            let notice = {
                let mut s = lock(&self.shared.sleepers);
                let notice = s.remove(id);
                self.shared
                    .notified
                    .store(s.is_notified(), Ordering::Release);
                notice
            };
            // A notice meant for work it will not do goes to another thread.
            if notice {
                self.shared.notify();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// `threads` threads run `ex` until the returned sender is dropped or sent to.
    fn start(
        ex: &Executor,
        threads: usize,
    ) -> (async_channel::Sender<()>, Vec<std::thread::JoinHandle<()>>) {
        let (tx, rx) = async_channel::bounded::<()>(1);
        let handles = (0..threads)
            .map(|_| {
                let ex = ex.clone();
                let rx = rx.clone();
                std::thread::spawn(move || {
                    let _ = async_io::block_on(ex.run(rx.recv()));
                })
            })
            .collect();
        (tx, handles)
    }

    fn stop(tx: async_channel::Sender<()>, handles: Vec<std::thread::JoinHandle<()>>) {
        tx.close();
        for h in handles {
            h.join().unwrap();
        }
    }

    /// Spins (holding its thread, as a busy task would) until `done` or `within` has
    /// passed; says whether `done` came first.
    fn spin_until(within: Duration, done: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + within;
        while !done() {
            if Instant::now() >= deadline {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn runs_tasks_spawned_from_outside_and_inside() {
        for threads in [1, 2, 4] {
            let ex = Executor::new();
            let (tx, handles) = start(&ex, threads);
            let count = Arc::new(AtomicUsize::new(0));
            for _ in 0..1000 {
                let (ex2, count) = (ex.clone(), count.clone());
                ex.spawn(async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    let count = count.clone();
                    // Spawned on an executor thread: into its slot.
                    ex2.spawn(async move {
                        count.fetch_add(1, Ordering::SeqCst);
                    })
                    .detach();
                })
                .detach();
            }
            wait_for("2000 tasks", || count.load(Ordering::SeqCst) == 2000);
            stop(tx, handles);
        }
    }

    /// Two tasks that hand a message back and forth wake each other on one thread (the
    /// slot) 20,000 times, while other tasks queued behind them still run.
    #[test]
    fn ping_pong_does_not_starve_the_queue() {
        for threads in [1, 2] {
            let ex = Executor::new();
            let (tx, handles) = start(&ex, threads);
            let (a_tx, a_rx) = async_channel::bounded::<u32>(1);
            let (b_tx, b_rx) = async_channel::bounded::<u32>(1);
            let pongs = Arc::new(AtomicUsize::new(0));
            let p = pongs.clone();
            ex.spawn(async move {
                while let Ok(n) = a_rx.recv().await {
                    if b_tx.send(n + 1).await.is_err() {
                        break;
                    }
                }
            })
            .detach();
            ex.spawn(async move {
                a_tx.send(0).await.unwrap();
                while let Ok(n) = b_rx.recv().await {
                    p.fetch_add(1, Ordering::SeqCst);
                    if n >= 20_000 || a_tx.send(n + 1).await.is_err() {
                        break;
                    }
                }
            })
            .detach();
            // Tasks queued from outside while the two wake each other.
            let others = Arc::new(AtomicUsize::new(0));
            for _ in 0..100 {
                let o = others.clone();
                ex.spawn(async move {
                    o.fetch_add(1, Ordering::SeqCst);
                })
                .detach();
            }
            wait_for("the other tasks", || others.load(Ordering::SeqCst) == 100);
            wait_for("the ping-pong", || pongs.load(Ordering::SeqCst) >= 10_000);
            stop(tx, handles);
        }
    }

    /// Wakes from other threads, one at a time, each waited for: every one is seen, so
    /// no wake-up is lost between a thread's last look and its sleep.
    #[test]
    fn no_wake_up_is_lost() {
        for threads in [1, 2, 3] {
            let ex = Executor::new();
            let (tx, handles) = start(&ex, threads);
            let (in_tx, in_rx) = async_channel::unbounded::<u32>();
            let (out_tx, out_rx) = std::sync::mpsc::channel::<u32>();
            ex.spawn(async move {
                while let Ok(n) = in_rx.recv().await {
                    out_tx.send(n).unwrap();
                }
            })
            .detach();
            for n in 0..5_000 {
                in_tx.send_blocking(n).unwrap();
                let got = out_rx
                    .recv_timeout(Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("{threads} threads: message {n} not seen: {e}"));
                assert_eq!(got, n);
            }
            stop(tx, handles);
        }
    }

    /// A task that never yields its thread (it spins until told) leaves the others to the
    /// other thread: the work it woke into its slot does not wait behind it forever, as a
    /// second wake-up moves it to the shared queue.
    #[test]
    fn a_busy_thread_leaves_queued_work_to_the_other() {
        let ex = Executor::new();
        let (tx, handles) = start(&ex, 2);
        let release = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let (r, d, ex2) = (release.clone(), done.clone(), ex.clone());
        ex.spawn(async move {
            // Two tasks woken here: the first displaced to the queue by the second.
            for _ in 0..2 {
                let d = d.clone();
                ex2.spawn(async move {
                    d.fetch_add(1, Ordering::SeqCst);
                })
                .detach();
            }
            spin_until(Duration::from_secs(10), || r.load(Ordering::SeqCst));
        })
        .detach();
        wait_for("the displaced task", || done.load(Ordering::SeqCst) >= 1);
        release.store(true, Ordering::SeqCst);
        wait_for("both tasks", || done.load(Ordering::SeqCst) == 2);
        stop(tx, handles);
    }

    /// Two tasks queued at once, the first waiting (spinning) for the second: the second
    /// gets the other thread, woken for it, not the first's once that is done.
    #[test]
    fn two_queued_tasks_run_at_once() {
        let ex = Executor::new();
        let (tx, handles) = start(&ex, 2);
        for round in 0..100 {
            let second_ran = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicBool::new(false));
            let (s, d) = (second_ran.clone(), done.clone());
            ex.spawn(async move {
                spin_until(Duration::from_secs(5), || s.load(Ordering::SeqCst));
                d.store(true, Ordering::SeqCst);
            })
            .detach();
            let s = second_ran.clone();
            ex.spawn(async move { s.store(true, Ordering::SeqCst) })
                .detach();
            wait_for("the first task", || done.load(Ordering::SeqCst));
            assert!(
                second_ran.load(Ordering::SeqCst),
                "round {round}: the second task waited for the first"
            );
        }
        stop(tx, handles);
    }

    /// The same with two tasks woken by the reactor at once (timers of one instant): the
    /// reactor's thread keeps one, and the other wakes the second thread.
    #[test]
    fn two_tasks_woken_by_the_reactor_run_at_once() {
        let ex = Executor::new();
        let (tx, handles) = start(&ex, 2);
        for round in 0..50 {
            let at = Instant::now() + Duration::from_millis(5);
            let ran = Arc::new(AtomicUsize::new(0));
            let overlapped = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicUsize::new(0));
            for _ in 0..2 {
                let (ran, overlapped, done) = (ran.clone(), overlapped.clone(), done.clone());
                ex.spawn(async move {
                    async_io::Timer::at(at).await;
                    ran.fetch_add(1, Ordering::SeqCst);
                    // Each waits (a while at most) to see the other running too.
                    if spin_until(Duration::from_secs(2), || ran.load(Ordering::SeqCst) == 2) {
                        overlapped.store(true, Ordering::SeqCst);
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                })
                .detach();
            }
            wait_for("both timers' tasks", || done.load(Ordering::SeqCst) == 2);
            assert!(
                overlapped.load(Ordering::SeqCst),
                "round {round}: one task ran only after the other"
            );
        }
        stop(tx, handles);
    }

    /// A thread whose `run` is dropped before its stop (here by a timeout) is no worker
    /// any more: a task it spawns or wakes later goes to the threads that are.
    #[test]
    fn a_dropped_run_leaves_no_task_behind() {
        let ex = Executor::new();
        let (tx, handles) = start(&ex, 1);
        let ex2 = ex.clone();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        std::thread::spawn(move || {
            async_io::block_on(futures_lite::future::or(
                ex2.run(std::future::pending::<()>()),
                async {
                    async_io::Timer::after(Duration::from_millis(20)).await;
                },
            ));
            ex2.spawn(async move { r.store(true, Ordering::SeqCst) })
                .detach();
        })
        .join()
        .unwrap();
        wait_for("the task spawned after the dropped run", || {
            ran.load(Ordering::SeqCst)
        });
        stop(tx, handles);
    }

    /// A second of mixed load: tasks woken from outside threads, by timers and by each
    /// other, spawning more; every message gets through.
    #[test]
    fn mixed_wake_ups_lose_nothing() {
        for threads in [1, 2, 4] {
            let ex = Executor::new();
            let (tx, handles) = start(&ex, threads);
            let (out_tx, out_rx) = async_channel::unbounded::<u32>();
            let mut feeds = Vec::new();
            for chain in 0..8u32 {
                let (in_tx, in_rx) = async_channel::bounded::<u32>(1);
                let (ex2, out_tx) = (ex.clone(), out_tx.clone());
                ex.spawn(async move {
                    while let Ok(n) = in_rx.recv().await {
                        if n % 3 == 0 {
                            async_io::Timer::after(Duration::from_micros(200)).await;
                        }
                        let out_tx = out_tx.clone();
                        // Passed on through a task of its own.
                        ex2.spawn(async move {
                            let _ = out_tx.send(n).await;
                        })
                        .detach();
                    }
                })
                .detach();
                let feed = std::thread::spawn(move || {
                    for i in 0..300 {
                        in_tx.send_blocking(chain * 1000 + i).unwrap();
                    }
                });
                feeds.push(feed);
            }
            for f in feeds {
                f.join().unwrap();
            }
            let mut got = Vec::new();
            while got.len() < 8 * 300 {
                let n = async_io::block_on(futures_lite::future::or(
                    async { out_rx.recv().await.ok() },
                    async {
                        async_io::Timer::after(Duration::from_secs(5)).await;
                        None
                    },
                ))
                .unwrap_or_else(|| panic!("{threads} threads: {} of 2400 got through", got.len()));
                got.push(n);
            }
            got.sort_unstable();
            got.dedup();
            assert_eq!(got.len(), 2400, "{threads} threads");
            stop(tx, handles);
        }
    }

    #[test]
    fn a_panicking_task_ends_alone() {
        let ex = Executor::new();
        let (tx, handles) = start(&ex, 1);
        ex.spawn(async { panic!("a task's own panic") }).detach();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        ex.spawn(async move { r.store(true, Ordering::SeqCst) })
            .detach();
        wait_for("the next task", || ran.load(Ordering::SeqCst));
        stop(tx, handles);
    }
}
