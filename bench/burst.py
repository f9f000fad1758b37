#!/usr/bin/env python3
"""Connection bursts: time to open N connections back to back, the kernel's listen-queue
overflows meanwhile, and the daemon's RSS once they are closed.

For each driver: starts the release daemon (memory store, max_connections above N), then
for each wave opens N TCP connections to it as fast as connect() returns, with no pause
between them, and waits until the daemon holds all N (its descriptor count). It reports
the time to connect, the time until all were accepted, the TcpExt ListenOverflows and
ListenDrops deltas of /proc/net/netstat (machine-wide: run it on a quiet machine), RSS at
rest, with N held and 3 s after they were all closed. python3 standard library only. See
bench/README.md.

    bench/burst.py                        # 2,000 then 10,000 on smol and std
    bench/burst.py --n 600 --drivers smol --waves 3
"""

import argparse
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def netstat():
    """TcpExt counters of /proc/net/netstat."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:])))
    return {}


TICK = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid):
    """utime + stime of a process (its threads, live and ended; not its children), in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): utime is field 14, stime 15.
    return (int(fields[11]) + int(fields[12])) * 1000.0 / TICK


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def probe(addr):
    s = socket.create_connection(addr, timeout=5)
    s.sendall(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = s.recv(64)
    s.close()
    return data.startswith(b"HTTP/1.1 200")


def bench(binary, driver, n, waves, settle):
    tmp = tempfile.mkdtemp(prefix="agentd-burst-")
    config = os.path.join(tmp, "agentd.toml")
    with open(config, "w") as f:
        f.write(
            '[a2a]\nlisten = ["tcp://127.0.0.1:0"]\n[store]\nkind = "memory"\n'
            f"[limits]\nmax_connections = {n + 1000}\n"
        )
    log = open(os.path.join(tmp, "daemon.log"), "w")
    proc = subprocess.Popen(
        [binary, "--config", config, "--driver", driver],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    rows = []
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening "):
            raise RuntimeError(f"daemon did not start: {line!r}")
        host, port = line.split()[1].split("://", 1)[1].rstrip("/").rsplit(":", 1)
        addr = (host, int(port))
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        probe(addr)
        time.sleep(0.3)
        base_fds = fds(proc.pid)
        base_rss = rss_kib(proc.pid)
        for wave in range(waves):
            before = netstat()
            t0 = time.monotonic()
            held = []
            for _ in range(n):
                held.append(socket.create_connection(addr, timeout=30))
            connected = time.monotonic() - t0
            ok = wait_for(lambda: fds(proc.pid) >= base_fds + n, 60)
            accepted = time.monotonic() - t0
            after = netstat()
            held_rss = rss_kib(proc.pid)
            for s in held:
                s.close()
            held = []
            wait_for(lambda: fds(proc.pid) <= base_fds, 60)
            time.sleep(settle)
            served = probe(addr)
            rows.append({
                "driver": driver, "wave": wave, "n": n, "connect_s": connected,
                "accept_s": accepted if ok else float("nan"),
                "overflows": after.get("ListenOverflows", 0) - before.get("ListenOverflows", 0),
                "drops": after.get("ListenDrops", 0) - before.get("ListenDrops", 0),
                "base_rss": base_rss, "held_rss": held_rss,
                "closed_rss": rss_kib(proc.pid), "served": served,
            })
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/agentd"))
    p.add_argument("--drivers", default="smol,std")
    p.add_argument("--n", default="2000,10000", help="connections per wave (comma list)")
    p.add_argument("--waves", type=int, default=2)
    p.add_argument("--settle", type=float, default=3.0, help="seconds after the close")
    a = p.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"{a.bin}: not built (cargo build --release)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ns = [int(x) for x in a.n.split(",")]
    need = max(ns) + 200
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    somaxconn = open("/proc/sys/net/core/somaxconn").read().strip()
    print(f"agentd connection bursts, {a.bin}, somaxconn {somaxconn}, nofile {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}")
    print(f"{'driver':>6} {'wave':>4} {'conns':>6} {'connect s':>9} {'accept s':>9} "
          f"{'overflows':>9} {'drops':>6} {'RSS0 MiB':>8} {'held MiB':>8} {'closed MiB':>10} {'served':>6}")
    for driver in a.drivers.split(","):
        for n in ns:
            for r in bench(a.bin, driver, n, a.waves, a.settle):
                print(f"{r['driver']:>6} {r['wave']:>4} {r['n']:>6} {r['connect_s']:>9.2f} "
                      f"{r['accept_s']:>9.2f} {r['overflows']:>9} {r['drops']:>6} "
                      f"{r['base_rss'] / 1024:>8.1f} {r['held_rss'] / 1024:>8.1f} "
                      f"{r['closed_rss'] / 1024:>10.1f} {str(r['served']):>6}", flush=True)


if __name__ == "__main__":
    main()
