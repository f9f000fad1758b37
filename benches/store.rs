//! Store throughput and append→durable latency with group commit, on the disk under the
//! bench directory (`AGENTD_BENCH_DIR`, default the system temp dir).
//!
//! `cargo bench --bench store` (seconds per row: `AGENTD_BENCH_SECS`, default 3).
//! Each appender loops: append one ~250-byte record, wait until it is durable. Latency is
//! measured from before `append` to the return of `wait_durable`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use agentd::store::{Options, Record, Store};
use serde_json::json;

fn main() {
    let secs: u64 = std::env::var("AGENTD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let base = std::env::var_os("AGENTD_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    println!(
        "store bench: {} s per row, directory {}",
        secs,
        base.display()
    );
    println!(
        "{:>10} {:>12} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "appenders", "appends/s", "p50 µs", "p99 µs", "max µs", "fsyncs/s", "per fsync"
    );
    for threads in [1usize, 8, 64] {
        let dir = base.join(format!(
            "agentd-store-bench-{}-{threads}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let (store, _) = Store::open(&dir, Options::default()).expect("open store");
        let store = Arc::new(store);
        let start = Arc::new(Barrier::new(threads + 1));
        let run = Duration::from_secs(secs);
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (store, start) = (store.clone(), start.clone());
                std::thread::spawn(move || {
                    let body = json!({"id": format!("task-{t}"), "status": {"state": "TASK_STATE_WORKING"}, "pad": "x".repeat(160)});
                    let mut lat = Vec::with_capacity(1 << 16);
                    start.wait();
                    let t0 = Instant::now();
                    let mut i = 0u64;
                    while t0.elapsed() < run {
                        let rec = Record::put("task", format!("{t}-{}", i % 1000), body.clone());
                        let a = Instant::now();
                        let ticket = store.append(&[rec]).expect("append");
                        store.wait_durable(ticket, Duration::from_secs(30)).expect("durable");
                        lat.push(a.elapsed());
                        i += 1;
                    }
                    lat
                })
            })
            .collect();
        let before = store.stats();
        start.wait();
        let t0 = Instant::now();
        let mut lat: Vec<Duration> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let wall = t0.elapsed().as_secs_f64();
        let after = store.stats();
        lat.sort_unstable();
        let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_micros();
        let fsyncs = after.batches - before.batches;
        println!(
            "{:>10} {:>12.0} {:>10} {:>10} {:>10} {:>12.0} {:>10.1}",
            threads,
            lat.len() as f64 / wall,
            pct(0.50),
            pct(0.99),
            lat.last().unwrap().as_micros(),
            fsyncs as f64 / wall,
            lat.len() as f64 / fsyncs.max(1) as f64,
        );
        Arc::into_inner(store).unwrap().close().expect("close");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
