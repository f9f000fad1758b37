#!/usr/bin/env python3
"""The daemon's own CPU per request under wrk's `send` scenario, builds side by side.

Throughput on a shared 2-core machine moves by a third from one minute to the next; CPU per
request moves less, so this is how two builds of the write path are compared. For each
round and each build (--bin, repeatable; the first is the base), in a shuffled order
(seeded by the round), it starts a daemon on loopback with a fresh store (--store file, the
default, or memory) and no agent, runs wrk with bench/lua/send.lua (every request a new
task, REJECTED at once) for 2 s to warm up and then --seconds, and reads the daemon's
utime + stime (/proc/<pid>/stat) around the measured run. It prints each build's median
(min-max) microseconds of CPU per request and req/s over the rounds, and each build's
median against the first. Needs wrk; python3 standard library otherwise.

    bench/send_cpu.py --bin /tmp/agentd-before --bin target/release/agentd
    bench/send_cpu.py --driver std --rounds 6 --bin A --bin B
"""

import argparse
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SEND_LUA = os.path.join(HERE, "lua", "send.lua")
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def wait_for_port(port, proc, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"send_cpu: the daemon exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("send_cpu: the daemon did not listen in time")


def wrk(port, conns, seconds):
    out = subprocess.run(
        ["wrk", "-t2", f"-c{conns}", f"-d{seconds}s", "-s", SEND_LUA,
         f"http://127.0.0.1:{port}/"],
        capture_output=True, text=True, check=True,
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return requests, rate


def one_run(binary, args):
    port = free_port()
    work = tempfile.mkdtemp(prefix="agentd-send-cpu-")
    try:
        config = os.path.join(work, "agentd.toml")
        with open(config, "w") as f:
            f.write(f'[a2a]\nlisten = ["tcp://127.0.0.1:{port}"]\n')
            if args.store == "file":
                f.write(f'[store]\ndir = "{work}/data"\n')
            else:
                f.write('[store]\nkind = "memory"\n')
        proc = subprocess.Popen(
            [binary, "--driver", args.driver, "--config", config],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, proc)
            wrk(port, args.conns, 2)
            before = cpu_seconds(proc.pid)
            requests, rate = wrk(port, args.conns, args.seconds)
            spent = cpu_seconds(proc.pid) - before
        finally:
            proc.terminate()
            proc.wait()
        return spent / max(requests, 1) * 1e6, rate
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", action="append", help="a daemon build (repeat; the first is the base)")
    p.add_argument("--driver", choices=["smol", "std"], default="smol")
    p.add_argument("--store", choices=["file", "memory"], default="file")
    p.add_argument("--conns", type=int, default=32)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    bins = args.bin or [os.path.join(HERE, "..", "target", "release", "agentd")]
    if shutil.which("wrk") is None:
        sys.exit("send_cpu: needs wrk (apt install wrk)")
    cpu = {b: [] for b in bins}
    rate = {b: [] for b in bins}
    for r in range(args.rounds):
        order = list(bins)
        random.Random(r).shuffle(order)
        for b in order:
            us, rps = one_run(b, args)
            cpu[b].append(us)
            rate[b].append(rps)
            print(f"round {r + 1}  {b}: {us:.1f} us/request, {rps:.0f} req/s", flush=True)
    print(f"\n{args.driver}, {args.store} store, {args.conns} connections, "
          f"{args.rounds} rounds of {args.seconds} s: median (min-max)")
    for b in bins:
        v = cpu[b]
        print(f"  {b}: {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) us/request, "
              f"{statistics.median(rate[b]):.0f} req/s")
    base = statistics.median(cpu[bins[0]])
    for b in bins[1:]:
        print(f"  {b} / {bins[0]}: x{statistics.median(cpu[b]) / base:.2f} CPU per request")


if __name__ == "__main__":
    main()
