#!/usr/bin/env python3
"""The daemon's own CPU per conversation turn, with the echo agent and with no agent.

For each build (--bin, repeatable: a before and an after in one run) it starts two daemons
on loopback (memory store): one with no agent (every turn is REJECTED at once) and one with
examples/agents/echo_agent.py as the conversation agent. Then, in --rounds interleaved
rounds, it sends --turns SendMessage turns (blocking) and as many SendStreamingMessage turns
(the stream read to its end) from --conns keep-alive connections to each daemon in turn,
and prints the daemon's own CPU per turn over the turns, in ms: with the smol driver the sum
of its threads' run time (/proc/<pid>/task/*/schedstat, ns; its threads live as long as it
does), with std utime + stime of the process (/proc/<pid>/stat, clock ticks: it counts the
per-connection threads that ended during the load). A child's CPU is in neither. Each
round takes the daemons in a shuffled order (seeded), so a drift of the machine's speed
does not always fall on the same one. The agent's processes
(the keeper and python, every descendant of the daemon) are read the same way and printed
apart. --store file gives the daemons the durable file store instead. --smol-threads runs each
build once per limits.smol_threads value given (0: unset), as builds of their own. The summary gives the median over rounds, the spread (min-max), the ratio
agent / no agent per build, and the ratio of each build to the first. python3 standard
library only. See bench/README.md.

    bench/turn_cpu.py                                   # target/release/agentd, smol
    bench/turn_cpu.py --driver std --turns 4000
    bench/turn_cpu.py --bin /tmp/agentd-before --bin target/release/agentd
    bench/turn_cpu.py --threads                          # CPU per turn by daemon thread
    bench/turn_cpu.py --smol-threads 0,1                 # default executor threads, then one
    bench/turn_cpu.py --conns 1 --floor                  # beside the two floor servers
"""

import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from burst import cpu_ms, rss_kib  # bench/ is the script's directory, so on its path
from scale_restart import Daemon, spread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = {"Content-Type": "application/json", "A2A-Version": "1.0"}
KINDS = ("send", "stream")
ECHO = os.path.join(ROOT, "examples", "agents", "echo_agent.py")


def thread_cpu_ms(pid):
    """{thread name: ms} of the daemon's live threads (same-named threads summed), from
    /proc/<pid>/task/<tid>/schedstat (nanoseconds, finer than stat's clock ticks)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + ns / 1e6
    return out


def daemon_cpu_ms(pid, driver):
    """The daemon's CPU so far, in ms: precise where every thread outlives the load (smol)."""
    if driver == "smol":
        return sum(thread_cpu_ms(pid).values())
    return cpu_ms(pid)


def descendants(pid):
    """Every live descendant of pid (the agent's keeper and the agent itself)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def children_cpu_ms(pid):
    total = 0.0
    for c in descendants(pid):
        try:
            total += cpu_ms(c)
        except OSError:
            pass
    return total


def body(method, mid):
    msg = {"role": "ROLE_USER", "messageId": mid, "parts": [{"text": "hello"}]}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": msg}})


def turn(conn, kind, mid, want):
    """One turn; checks that the answer ends in the expected state."""
    method = "SendMessage" if kind == "send" else "SendStreamingMessage"
    conn.request("POST", "/", body=body(method, mid), headers=HEADERS)
    resp = conn.getresponse()
    data = resp.read()  # a stream is read to its end: the task's final state closes it
    if resp.status != 200 or want not in data:
        raise RuntimeError(f"{method}: HTTP {resp.status}: {data[-300:]!r}")


def load(d, kind, n, conns, want, tag):
    """n turns from `conns` keep-alive connections; returns the wall seconds."""
    return spread(d, n, conns, lambda c, t, i: turn(c, kind, f"{tag}-{t}-{i}", want))


class FloorServer(Daemon):
    """A floor server (bench/turn_floor.rs or turn_floor_async.rs; see their headers)."""

    def __init__(self, binary, agent, log):
        self.spawned = time.monotonic()
        cmd = [binary] + (["--agent", "python3", ECHO] if agent else [])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"turn_floor did not start (first line {line!r})")
        self.host, port = line.split("://", 1)[1].strip().rstrip("/").rsplit(":", 1)
        self.port = int(port)

    def stop(self):
        # The floor has no shutdown of its own; its agent ends on its closed stdin.
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def build_floors(tmp):
    """The two floors, as (label, executable): the blocking one (rustc -O, std only) and the
    same server on async-io's reactor (a cargo example of this package)."""
    out = os.path.join(tmp, "turn_floor")
    src = os.path.join(ROOT, "bench", "turn_floor.rs")
    subprocess.run(["rustc", "-O", "--edition", "2021", src, "-o", out], check=True)
    subprocess.run(["cargo", "build", "--quiet", "--release", "--example", "turn_floor_async"],
                   cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return [
        ("floor: bench/turn_floor.rs, blocking, one connection at a time", out),
        ("async floor: bench/turn_floor_async.rs, async-io's reactor, one connection at a time",
         os.path.join(target, "release", "examples", "turn_floor_async")),
    ]


def config(tmp, name, agent, store="memory", smol_threads=None):
    path = os.path.join(tmp, f"{name}.toml")
    with open(path, "w") as f:
        f.write('[a2a]\nlisten = ["tcp://127.0.0.1:0"]\n')
        if smol_threads:
            f.write(f"[limits]\nsmol_threads = {smol_threads}\n")
        if store == "memory":
            f.write('[store]\nkind = "memory"\n')
        else:
            f.write(f'[store]\nkind = "file"\ndir = {json.dumps(os.path.join(tmp, name + "-store"))}\n')
        if agent:
            f.write(f"[agent]\nname = \"bench\"\ncommand = [\"python3\", {json.dumps(ECHO)}]\n")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", help="a daemon build (repeat to compare builds)")
    ap.add_argument("--driver", default="smol", choices=["smol", "std"])
    ap.add_argument("--turns", type=int, default=2000, help="turns per kind, daemon and round")
    ap.add_argument("--conns", type=int, default=4, help="keep-alive client connections")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default="send,stream", help="send, stream or both")
    ap.add_argument("--store", default="memory", choices=["memory", "file"],
                    help="the daemons' store (file: write-ahead and fsync per task, in a temp dir)")
    ap.add_argument("--threads", action="store_true", help="also print CPU per turn by thread")
    ap.add_argument("--smol-threads", default="",
                    help="comma-separated limits.smol_threads values (0: unset): each build runs "
                         "once per value, as builds of their own")
    ap.add_argument("--floor", action="store_true",
                    help="add the floors as the last builds: bench/turn_floor.rs (rustc -O) and "
                         "bench/turn_floor_async.rs (cargo example)")
    a = ap.parse_args()
    bins = a.bin or [os.path.join(ROOT, "target", "release", "agentd")]
    smol = [int(v) for v in a.smol_threads.split(",") if v] or [0]
    for b in bins:
        if not os.access(b, os.X_OK):
            sys.exit(f"{b}: no such executable (cargo build --release)")
    # Each (binary, smol_threads) pair is a build of its own.
    builds = [(b, t) for b in bins for t in smol]
    bins = [b if not t else f"{b} (smol_threads {t})" for b, t in builds]
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            sys.exit(f"unknown kind {k!r}: send or stream")

    tmp = tempfile.mkdtemp(prefix="agentd-turn-cpu-")
    daemons = {}  # (bin index, mode) -> Daemon
    logs = []
    try:
        floors = build_floors(tmp) if a.floor else []
        bins += [label for label, _ in floors]
        for i, b in enumerate(bins):
            for mode in ("none", "agent"):
                log = open(os.path.join(tmp, f"daemon-{i}-{mode}.log"), "w")
                logs.append(log)
                if i >= len(builds):
                    floor = floors[i - len(builds)][1]
                    daemons[(i, mode)] = FloorServer(floor, mode == "agent", log)
                    continue
                binary, smol_threads = builds[i]
                cfg = config(tmp, f"{i}-{mode}", mode == "agent", a.store, smol_threads)
                daemons[(i, mode)] = Daemon(binary, a.driver, cfg, log)
        want = {"none": b"TASK_STATE_REJECTED", "agent": b"TASK_STATE_COMPLETED"}
        # Warm-up: the agent process starts on the first turn; both kinds' paths get warm.
        for (i, mode), d in daemons.items():
            for k in kinds:
                load(d, k, 50, a.conns, want[mode], f"w{i}{mode}{k}")

        print(f"driver {a.driver}, {a.store} store, {a.turns} turns per kind x {a.conns} connections, "
              f"{a.rounds} rounds, {os.cpu_count()} cpus")
        for i, b in enumerate(bins):
            print(f"  build {i}: {b}")
        print()
        print(f"{'round':>5} {'build':>5} {'agent':>5} {'kind':>6} {'turns/s':>8} "
              f"{'daemon ms/turn':>14} {'agent ms/turn':>13} {'RSS MiB':>8}")
        results = {}  # (i, mode, kind) -> [ms/turn]
        by_thread = {}  # (i, mode, kind) -> {thread: ms}
        order = random.Random(17)
        for r in range(a.rounds):
            for k in kinds:
                keys = list(daemons)
                order.shuffle(keys)
                for i, mode in keys:
                    d = daemons[(i, mode)]
                    # The floor is one thread that lives as long as it does: schedstat.
                    drv = "smol" if isinstance(d, FloorServer) else a.driver
                    before, kids = daemon_cpu_ms(d.pid, drv), children_cpu_ms(d.pid)
                    threads = thread_cpu_ms(d.pid) if a.threads else {}
                    wall = load(d, k, a.turns, a.conns, want[mode], f"r{r}{i}{mode}{k}")
                    ms = (daemon_cpu_ms(d.pid, drv) - before) / a.turns
                    kid = (children_cpu_ms(d.pid) - kids) / a.turns
                    results.setdefault((i, mode, k), []).append(ms)
                    if a.threads:
                        acc = by_thread.setdefault((i, mode, k), {})
                        for name, v in thread_cpu_ms(d.pid).items():
                            acc[name] = acc.get(name, 0.0) + (v - threads.get(name, 0.0)) / a.turns
                    agent_col = f"{kid:13.3f}" if mode == "agent" else f"{'-':>13}"
                    print(f"{r + 1:>5} {i:>5} {mode:>5} {k:>6} {a.turns / wall:8.0f} "
                          f"{ms:14.3f} {agent_col} {rss_kib(d.pid) / 1024:8.1f}", flush=True)

        print()
        print("median (min-max) daemon ms per turn over the rounds; ratio = agent / no agent")
        print(f"{'build':>5} {'kind':>6} {'no agent':>20} {'echo agent':>20} {'ratio':>6}")
        med = {}
        for i in range(len(bins)):
            for k in kinds:
                cells = []
                for mode in ("none", "agent"):
                    v = results[(i, mode, k)]
                    med[(i, mode, k)] = statistics.median(v)
                    cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
                ratio = med[(i, "agent", k)] / max(med[(i, "none", k)], 1e-9)
                print(f"{i:>5} {k:>6} {cells[0]:>20} {cells[1]:>20} {ratio:6.2f}")
        if len(bins) > 1:
            print()
            print("each build against build 0 (median daemon ms per turn, ratio build / build 0)")
            for i in range(1, len(bins)):
                for k in kinds:
                    for mode in ("none", "agent"):
                        ratio = med[(i, mode, k)] / max(med[(0, mode, k)], 1e-9)
                        print(f"  build {i} {k:>6} {mode:>5}: {med[(0, mode, k)]:.3f} -> "
                              f"{med[(i, mode, k)]:.3f} ms  x{ratio:.2f}")
        if a.threads:
            print()
            print("daemon CPU ms per turn by thread (live threads, summed over rounds / rounds)")
            for (i, mode, k), acc in sorted(by_thread.items()):
                top = sorted(acc.items(), key=lambda kv: -kv[1])
                parts = ", ".join(f"{n} {v / a.rounds:.3f}" for n, v in top if v > 0)
                print(f"  build {i} {mode:>5} {k:>6}: {parts}")
    finally:
        for d in daemons.values():
            d.stop()
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
