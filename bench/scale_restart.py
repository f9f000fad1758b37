#!/usr/bin/env python3
"""Task-count scaling and restart: RSS per task, restart time, RSS after restart.

For each N in --counts: starts the release daemon with the file store in a fresh temp dir,
populates N tasks with SendMessage (no agent is configured, so each becomes a REJECTED
task, written ahead to the store), measures RSS, stops it (SIGTERM), starts it again on the
same store and measures the time from spawn to the first ListTasks answer and the RSS after
it. Then, on the restarted daemon, the head of line: GetTask of a known task, p50 and p99,
alone, beside 4 connections calling ListTasks (pageSize 50) and beside 4 calling the
`status` command, all without pause (one wrk with 4 connections, or with --load python 4
processes that read their answers by length without parsing them, as wrk does), and beside
the same loads sent to a twin (a second daemon started on a copy of the store: the machine
is as busy, but the measured daemon holds nothing for them, so that figure is the
machine's share); medians of 3 interleaved rounds.
Last, the cost of one call: ListTasks (pageSize 50) and `status`, p50/p99 and the server's
CPU per call. With --peer python-sdk the same N tasks go
to the official A2A Python SDK's server (bench/python-sdk, in-memory task store, so no
restart) and its figures print beside agentd's in the same run. Prints three tables.
python3 standard library only, and wrk for the default load (the peer runs in the venv
bench/python-sdk/setup.sh makes).
See bench/README.md.

    bench/scale_restart.py                         # 1k, 10k, 100k on smol
    bench/scale_restart.py --counts 1000 --driver std
    bench/scale_restart.py --bin /tmp/agentd-old   # another build
    bench/scale_restart.py --peer python-sdk       # and the Python SDK server beside it
    bench/scale_restart.py --load python           # the head-of-line load without wrk
"""

import argparse
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from burst import cpu_ms, rss_kib  # bench/ is the script's directory, so on its path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = {"Content-Type": "application/json", "A2A-Version": "1.0"}


def dir_bytes(path):
    total = 0
    for d, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(d, name))
            except OSError:
                pass
    return total


class Daemon:
    def __init__(self, binary, driver, config, log):
        self.spawned = time.monotonic()
        self.proc = subprocess.Popen(
            [binary, "--config", config, "--driver", driver],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"daemon did not start (first line {line!r}); see {log.name}")
        url = line.split()[1]
        hostport = url.split("://", 1)[1].rstrip("/")
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        # Keep reading stdout so the daemon never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    @property
    def pid(self):
        return self.proc.pid

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=60)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class PeerServer(Daemon):
    """The Python SDK's echo server (bench/python-sdk/echo_server.py) on a free port."""

    def __init__(self, venv, log):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.host = "127.0.0.1"
        self.spawned = time.monotonic()
        script = os.path.join(ROOT, "bench/python-sdk/echo_server.py")
        self.proc = subprocess.Popen(
            [os.path.join(venv, "bin/python"), script, "--port", str(self.port)],
            stdout=log,
            stderr=log,
        )
        first_list_answer(self)


def rpc(conn, method, params, rid=1):
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    conn.request("POST", "/", body=body, headers=HEADERS)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{method}: HTTP {resp.status}: {data[:200]!r}")
    doc = json.loads(data)
    if "result" not in doc:
        raise RuntimeError(f"{method}: {data[:200]!r}")
    return doc["result"]


def spread(d, n, conns, request):
    """Makes n calls `request(conn, worker, i)` from `conns` keep-alive connections of
    their own, at once; returns the wall seconds (the first error is raised)."""
    errors = []

    def worker(t, count):
        c = d.conn()
        try:
            for i in range(count):
                request(c, t, i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            c.close()

    per = [n // conns + (1 if t < n % conns else 0) for t in range(conns)]
    ts = [threading.Thread(target=worker, args=(t, k)) for t, k in enumerate(per)]
    start = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return time.monotonic() - start


def populate(d, n, threads):
    def send(c, t, i):
        msg = {"role": "ROLE_USER", "messageId": f"m-{t}-{i}", "parts": [{"text": "hello"}]}
        rpc(c, "SendMessage", {"message": msg}, rid=i)

    return spread(d, n, threads, send)


def first_list_answer(d, timeout=120):
    """Seconds from the daemon's spawn to its first ListTasks answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = d.conn()
        try:
            rpc(c, "ListTasks", {"pageSize": 1})
            return time.monotonic() - d.spawned
        except (ConnectionError, OSError, http.client.HTTPException):
            time.sleep(0.002)
        finally:
            c.close()
    raise RuntimeError("no ListTasks answer")


COMMAND = "https://agentd.dev/a2a/ext/command"


# The `status` command, as one JSON-RPC request.
STATUS_REQUEST = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "SendMessage",
    "params": {
        "message": {
            "role": "ROLE_USER",
            "messageId": "status",
            "extensions": [COMMAND],
            "parts": [{"data": {"agentd": {"op": "status"}}}],
        }
    },
}


def status_call(conn):
    body = json.dumps(STATUS_REQUEST)
    conn.request("POST", "/", body=body, headers={**HEADERS, "A2A-Extensions": COMMAND})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200 or b'"result"' not in data:
        raise RuntimeError(f"status: HTTP {resp.status}: {data[:200]!r}")


def get_task_latencies(d, task_id, calls):
    c = d.conn()
    out = []
    try:
        for _ in range(calls):
            t = time.perf_counter()
            rpc(c, "GetTask", {"id": task_id})
            out.append(time.perf_counter() - t)
    finally:
        c.close()
    out.sort()
    return out[len(out) // 2] * 1e3, out[min(len(out) - 1, len(out) * 99 // 100)] * 1e3


def load_request(name):
    """The load's request, encoded once: ListTasks (pageSize 50) or the `status` command."""
    headers = dict(HEADERS)
    if name == "status":
        body = STATUS_REQUEST
        headers["A2A-Extensions"] = COMMAND
    else:
        body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 50}}
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (
        f"POST / HTTP/1.1\r\nHost: load\r\n{head}Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )


def load_loop(host, port, name):
    """One load connection: ListTasks (pageSize 50) or status, without pause, until killed.
    Like wrk, it spends its time waiting for the daemon, not parsing: the request is encoded
    once and each answer is read by its Content-Length and checked only for its status line.
    (Parsing a 50-task page in Python costs more CPU than the daemon spends making it, and
    on 2 cores four such callers would measure the machine, not the daemon.)"""
    import socket

    os.nice(10)
    request = load_request(name)
    sock = socket.create_connection((host, port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""

    def more():
        chunk = sock.recv(262144)
        if not chunk:
            raise RuntimeError("load: connection closed")
        return chunk

    while True:
        sock.sendall(request)
        while b"\r\n\r\n" not in buf:
            buf += more()
        head, _, buf = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"load: {head[:100]!r}")
        fields = dict(
            (k.strip().lower(), v.strip().lower())
            for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
        )
        if fields.get(b"transfer-encoding") == b"chunked":
            while True:
                while b"\r\n" not in buf:
                    buf += more()
                size, _, buf = buf.partition(b"\r\n")
                size = int(size.split(b";")[0], 16)
                while len(buf) < size + 2:
                    buf += more()
                buf = buf[size + 2 :]
                if size == 0:
                    break
        else:
            length = int(fields.get(b"content-length", b"0"))
            while len(buf) < length:
                buf += more()
            buf = buf[length:]


# The head-of-line load's client: "wrk" (one niced wrk, 4 connections, bench/lua) or
# "python" (4 niced processes of load_loop); main() sets it from --load.
LOAD_CLIENT = "python"


class Load:
    """4 connections calling `name` (ListTasks or status) on `target` without pause, niced
    so the figure is the daemon's head of line, not the load's CPU. With wrk (the default
    where it is installed) the load costs a fraction of the CPU the Python callers do, which
    on 2 cores take a share from the daemon and the measuring client alike."""

    def __init__(self, target, name):
        self.name = name
        self.procs, self.wrk = [], None
        if LOAD_CLIENT == "wrk":
            script = os.path.join(ROOT, "bench", "lua", "list-tasks.lua" if name == "ListTasks" else "status.lua")
            self.wrk = subprocess.Popen(
                ["nice", "-n", "10", "wrk", "-t1", "-c4", "-d3600s", "-s", script,
                 f"http://{target.host}:{target.port}/", "--", "hol"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            return
        # Separate processes: a thread would share the measuring thread's GIL.
        self.procs = [
            multiprocessing.Process(target=load_loop, args=(target.host, target.port, name))
            for _ in range(4)
        ]
        for pr in self.procs:
            pr.start()

    def check(self):
        """Raises if the load ended before it was stopped."""
        alive = self.wrk.poll() is None if self.wrk else all(pr.is_alive() for pr in self.procs)
        if not alive:
            raise RuntimeError(f"the {self.name} load ended early (its error is above)")

    def stop(self):
        if self.wrk:
            if self.wrk.poll() is None:
                self.wrk.send_signal(signal.SIGINT)  # wrk stops and prints its summary
            try:
                self.output = self.wrk.communicate(timeout=30)[0]
            except subprocess.TimeoutExpired:
                self.wrk.kill()
                self.output = self.wrk.communicate()[0]
            return
        for pr in self.procs:
            pr.terminate()
        for pr in self.procs:
            pr.join()

    def check_result(self):
        """With wrk: every answer was a 2xx with the expected body (bench/lua/common.lua)."""
        if not self.wrk:
            return
        line = next((l for l in self.output.splitlines() if l.startswith("BENCH_RESULT ")), "")
        if not line:
            raise RuntimeError(f"the {self.name} load (wrk) printed no result: {self.output[-500:]!r}")
        f = dict(kv.split("=", 1) for kv in line.split()[1:])
        bad = [k for k in ("connect", "read", "write", "timeout", "status", "non2xx", "unexpected")
               if f.get(k, "1") != "0"]
        if int(f.get("requests", "0")) == 0 or bad:
            raise RuntimeError(f"the {self.name} load (wrk) failed: {bad or 'no answers'}: "
                               f"{self.output[-500:]!r}")


def call_cost(d, name, calls):
    """`calls` ListTasks (pageSize 50) or `status` calls on one connection: p50 and p99 in
    ms, and the server's CPU (utime + stime) per call in ms."""
    c = d.conn()
    lat = []
    try:
        cpu0 = cpu_ms(d.pid)
        for _ in range(calls):
            t = time.perf_counter()
            if name == "status":
                status_call(c)
            else:
                rpc(c, "ListTasks", {"pageSize": 50})
            lat.append(time.perf_counter() - t)
        cpu = (cpu_ms(d.pid) - cpu0) / calls
    finally:
        c.close()
    lat.sort()
    return lat[len(lat) // 2] * 1e3, lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1e3, cpu


def head_of_line(d, calls=2000, loads=("ListTasks", "status"), twin=None, rounds=3):
    """GetTask p50/p99 (ms) on `d` alone and beside 4 callers of each of `loads` (keys
    "alone" and the load's name); with `twin` (a second daemon on a copy of the store) also
    beside the same 4 callers sending their load to the twin instead (keys "<load>@twin"):
    the machine is as busy, but `d` holds nothing for them, so that figure is the machine's
    share. Each the median over `rounds` rounds, the conditions interleaved within a round."""
    c = d.conn()
    task_id = rpc(c, "ListTasks", {"pageSize": 1})["tasks"][0]["id"]
    c.close()
    conditions = [("alone", None, None)]
    for name in loads:
        if twin is not None:
            conditions.append((f"{name}@twin", twin, name))
        conditions.append((name, d, name))
    runs = {key: [] for key, _, _ in conditions}
    for _ in range(rounds):
        for key, target, name in conditions:
            if target is None:
                runs[key].append(get_task_latencies(d, task_id, calls))
                continue
            load = Load(target, name)
            time.sleep(0.3)
            try:
                runs[key].append(get_task_latencies(d, task_id, calls))
                load.check()
            finally:
                load.stop()
            load.check_result()
    return {
        key: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        for key, rs in runs.items()
    }


def run(binary, driver, n, threads, keep):
    tmp = tempfile.mkdtemp(prefix="agentd-scale-")
    store = os.path.join(tmp, "store")
    config = os.path.join(tmp, "agentd.toml")
    with open(config, "w") as f:
        f.write(
            '[a2a]\nlisten = ["tcp://127.0.0.1:0"]\n'
            f'[store]\nkind = "file"\ndir = "{store}"\n'
            f"[limits]\nmax_tasks = {max(n, 10000)}\ntasks_bytes = {64 << 30}\n"
        )
    log = open(os.path.join(tmp, "daemon.log"), "w")
    row = {"n": n}
    try:
        d = Daemon(binary, driver, config, log)
        try:
            c = d.conn()
            rpc(c, "ListTasks", {"pageSize": 1})
            c.close()
            row["idle_kib"] = rss_kib(d.pid)
            row["populate_s"] = populate(d, n, threads)
            # Settled: the daemon gives a burst's garbage back to the system two or three
            # periods after its resident set stops growing (src/memory.rs, GrowthPolicy).
            time.sleep(4.0)
            row["before_kib"] = rss_kib(d.pid)
        finally:
            d.stop()
        row["disk"] = dir_bytes(store)
        # The head of line's twin: the same tasks in a second daemon, for the control load.
        twin_config = os.path.join(tmp, "twin.toml")
        twin_store = os.path.join(tmp, "twin-store")
        shutil.copytree(store, twin_store)
        with open(config) as f, open(twin_config, "w") as g:
            g.write(f.read().replace(f'dir = "{store}"', f'dir = "{twin_store}"'))
        d = Daemon(binary, driver, config, log)
        try:
            row["restart_s"] = first_list_answer(d)
            row["after_first_kib"] = rss_kib(d.pid)
            time.sleep(1.0)
            row["after_kib"] = rss_kib(d.pid)
            c = d.conn()
            got = rpc(c, "ListTasks", {"pageSize": 1})
            c.close()
            row["listed"] = got.get("totalSize", "?")
            twin = Daemon(binary, driver, twin_config, log)
            try:
                row["hol"] = head_of_line(d, twin=twin)
            finally:
                twin.stop()
            row["cost"] = {k: call_cost(d, k, 200) for k in ("ListTasks", "status")}
        finally:
            d.stop()
    finally:
        log.close()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)
    return row


def run_peer(venv, n, threads):
    """The Python SDK server with N tasks: RSS per task, the cost of ListTasks, head of line."""
    tmp = tempfile.mkdtemp(prefix="agentd-scale-peer-")
    log = open(os.path.join(tmp, "peer.log"), "w")
    row = {"n": n}
    try:
        d = PeerServer(venv, log)
        try:
            row["idle_kib"] = rss_kib(d.pid)
            row["populate_s"] = populate(d, n, threads)
            time.sleep(0.5)
            row["before_kib"] = rss_kib(d.pid)
            row["hol"] = head_of_line(d, loads=("ListTasks",))
            row["cost"] = {"ListTasks": call_cost(d, "ListTasks", 200)}
        finally:
            d.stop()
    finally:
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return row


def peer_venv():
    setup = os.path.join(ROOT, "bench/python-sdk/setup.sh")
    out = subprocess.run(["bash", setup], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "target/release/agentd"))
    p.add_argument("--driver", default="smol", choices=["smol", "std"])
    p.add_argument("--counts", default="1000,10000,100000")
    p.add_argument("--threads", type=int, default=8, help="client threads (keep-alive each)")
    p.add_argument("--keep", action="store_true", help="keep the temp dirs")
    p.add_argument("--peer", choices=["python-sdk"], help="the same counts on a peer server")
    p.add_argument(
        "--peer-max",
        type=int,
        default=10000,
        help="largest count for the peer (the SDK fills ~200 tasks/s at 10k, slower beyond)",
    )
    p.add_argument(
        "--load",
        choices=["wrk", "python"],
        default="wrk" if shutil.which("wrk") else "python",
        help="the head-of-line load's client (default wrk where it is installed)",
    )
    a = p.parse_args()
    global LOAD_CLIENT
    LOAD_CLIENT = a.load
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"{a.bin}: not built (cargo build --release)")
    counts = [int(n) for n in a.counts.split(",")]
    venv = peer_venv() if a.peer else None
    rows, peers = [], []
    for n in counts:
        rows.append(run(a.bin, a.driver, n, a.threads, a.keep))
        if venv and n <= a.peer_max:
            peers.append(run_peer(venv, n, a.threads))
    print(f"agentd scale/restart, driver {a.driver}, {a.bin}, head-of-line load: {a.load}")
    cols = (
        f"{'tasks':>7} {'fill s':>7} {'tasks/s':>8} {'idle MiB':>8} {'RSS MiB':>8} "
        f"{'B/task':>7} {'disk MiB':>8} {'B/task':>6} {'restart s':>9} "
        f"{'RSS@1st':>8} {'RSS+1s':>8} {'after/before':>12}"
    )
    print(cols)
    for r in rows:
        n = r["n"]
        per_task = (r["before_kib"] - r["idle_kib"]) * 1024 / n
        print(
            f"{n:>7} {r['populate_s']:>7.1f} {n / r['populate_s']:>8.0f} "
            f"{r['idle_kib'] / 1024:>8.1f} {r['before_kib'] / 1024:>8.1f} {per_task:>7.0f} "
            f"{r['disk'] / 2**20:>8.1f} {r['disk'] / n:>6.0f} {r['restart_s']:>9.3f} "
            f"{r['after_first_kib'] / 1024:>8.1f} {r['after_kib'] / 1024:>8.1f} "
            f"{r['after_kib'] / r['before_kib']:>12.2f}"
        )
    print(
        "GetTask of a known task, ms (p50 / p99), medians of 3 interleaved rounds; beside 4"
        " callers of ListTasks or status, sent to the twin (a second daemon with the same"
        " tasks: the machine's share) or to this daemon"
    )
    kinds = ("alone", "ListTasks@twin", "ListTasks", "status@twin", "status")
    print(f"{'tasks':>7} " + " ".join(f"{k:>15}" for k in kinds) + f" {'p99/alone':>10} {'p99/twin':>10}")
    for server, rs in (("", rows), (f"  ({a.peer})", peers)):
        for r in rs:
            h = r["hol"]
            cells = " ".join(
                f"{h[k][0]:>7.2f}/{h[k][1]:<7.2f}" if k in h else f"{'n/a':>15}" for k in kinds
            )
            alone = " ".join(f"{h[k][1] / h['alone'][1]:.1f}x" for k in ("ListTasks", "status") if k in h)
            twin = " ".join(
                f"{h[k][1] / h[k + '@twin'][1]:.1f}x" for k in ("ListTasks", "status") if k + "@twin" in h
            )
            print(f"{r['n']:>7} {cells} {alone:>10} {twin or 'n/a':>10}{server}")
    print("One call on one connection, 200 calls: p50 / p99 ms, server CPU ms per call")
    print(f"{'tasks':>7} {'server':>10} {'ListTasks p50/p99':>18} {'CPU':>6} {'status p50/p99':>16} {'CPU':>6}")
    for server, rs in (("agentd", rows), (a.peer, peers)):
        for r in rs:
            c = r["cost"]
            lt = c["ListTasks"]
            st = c.get("status")
            status = f"{st[0]:>7.2f}/{st[1]:<8.2f} {st[2]:>6.2f}" if st else f"{'n/a':>16} {'':>6}"
            print(f"{r['n']:>7} {server:>10} {lt[0]:>8.2f}/{lt[1]:<9.2f} {lt[2]:>6.2f} {status}")
    if peers:
        print(f"RSS per task ({a.peer}, in-memory store): " + ", ".join(
            f"{r['n']}: {(r['before_kib'] - r['idle_kib']) * 1024 / r['n']:.0f} B"
            f" (fill {r['n'] / r['populate_s']:.0f} tasks/s)" for r in peers))


if __name__ == "__main__":
    main()
