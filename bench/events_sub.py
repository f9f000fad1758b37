#!/usr/bin/env python3
"""Events-feed subscribers for bench/run.sh's `events` scenario (Python 3 stdlib only).

Opens N subscriptions to agentd.events/SubscribeToEvents (fromSeq 0) on one loopback port,
with raw sockets and one selectors loop, and counts what each receives:

  1. connect all N, send the request, wait for every `hello` frame, then create --ready-file;
  2. read events until --stop-file appears (run.sh creates it once wrk is done);
  3. open one more subscription only to read its hello `seq` (the newest seq on the ring),
     then drain: wait until every live subscriber has read up to it, or --drain seconds;
  4. close everything and write one `EVENTS_RESULT key=value ...` line to --out.

Per subscriber it tracks the frames, the seqs (a jump of more than one is a gap: lost
events) and how the stream ended: `goodbye` (with its reason), a chunked end without
goodbye (the feed cut it off: it fell more than the ring behind), or EOF (the connection
closed). Everything is bounded by --max-seconds; the process never outlives it.

Parsing is deliberately shallow, to keep the client's CPU cost low: frames are located by
their SSE `data: ` prefix after complete `\\n\\n` boundaries, and only the leading
`{"id":1,"jsonrpc":"2.0","result":{"event":{"kind":"…","seq":N` is matched, which is how the
daemon renders every event frame. The chunk-size lines in between are skipped, and a stream's
end is its `0\\r\\n\\r\\n` terminator.
"""

import argparse
import os
import re
import selectors
import socket
import sys
import time

EVENTS_URI = "https://agentd.dev/a2a/ext/events"
BODY = b'{"jsonrpc":"2.0","id":1,"method":"agentd.events/SubscribeToEvents","params":{"fromSeq":0}}'

EVENT_RE = re.compile(rb'data: \{"id":1,"jsonrpc":"2\.0","result":\{"event":\{"kind":"[^"]*","seq":(\d+)')
HELLO_RE = re.compile(rb'data: \{"id":1,"jsonrpc":"2\.0","result":\{"hello":\{[^\n]*?"seq":(\d+)')
GOODBYE_RE = re.compile(rb'data: \{"id":1,"jsonrpc":"2\.0","result":\{"goodbye":\{"reason":"([^"]*)"')
CHUNK_END = b"\r\n0\r\n\r\n"


def request(host, port):
    return (
        "POST / HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Content-Type: application/json\r\n"
        "A2A-Version: 1.0\r\n"
        f"A2A-Extensions: {EVENTS_URI}\r\n"
        f"Content-Length: {len(BODY)}\r\n"
        "\r\n"
    ).encode() + BODY


class Sub:
    __slots__ = ("idx", "sock", "buf", "head_done", "hello_seq", "frames", "first_seq", "last_seq",
                 "gaps", "gap_events", "dups", "ended", "end_reason", "t_first", "t_last", "nbytes",
                 "status")

    def __init__(self, idx, sock):
        self.idx = idx
        self.sock = sock
        self.buf = b""
        self.head_done = False
        self.status = None
        self.hello_seq = None      # newest seq when it subscribed
        self.frames = 0            # event frames read
        self.first_seq = None
        self.last_seq = 0          # highest seq read (0: none yet)
        self.gaps = 0              # seq jumps (> 1)
        self.gap_events = 0        # seqs skipped by those jumps
        self.dups = 0              # seqs that did not increase
        self.ended = False
        self.end_reason = None     # goodbye:<reason> | cutoff | eof | error:<...>
        self.t_first = None        # monotonic time of the first / last event frame
        self.t_last = None
        self.nbytes = 0

    def feed(self, data, now):
        """Consumes bytes read from the socket."""
        self.nbytes += len(data)
        buf = self.buf + data
        if not self.head_done:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                self.buf = buf
                return
            head = buf[:i].decode("latin-1")
            line = head.split("\r\n", 1)[0]
            parts = line.split(" ")
            self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            if self.status != 200 or "chunked" not in head.lower():
                self.finish(f"error:http-{self.status}")
                return
            self.head_done = True
            buf = b"\r\n" + buf[i + 4:]   # so the first chunk looks like the others
        # Only whole SSE events: up to the last blank line.
        j = buf.rfind(b"\n\n")
        if j >= 0:
            done, buf = buf[:j + 2], buf[j + 2:]
            if self.hello_seq is None:
                m = HELLO_RE.search(done)
                if m:
                    self.hello_seq = int(m.group(1))
            seqs = EVENT_RE.findall(done)
            if seqs:
                if self.t_first is None:
                    self.t_first = now
                self.t_last = now
                self.frames += len(seqs)
                last = self.last_seq
                if self.first_seq is None:
                    self.first_seq = int(seqs[0])
                for s in seqs:
                    s = int(s)
                    if s <= last:
                        self.dups += 1
                        continue
                    if s != last + 1:
                        self.gaps += 1
                        self.gap_events += s - last - 1
                    last = s
                self.last_seq = last
            if b'"goodbye"' in done:
                m = GOODBYE_RE.search(done)
                self.end_reason = "goodbye:" + (m.group(1).decode() if m else "?")
        self.buf = buf
        if buf.startswith(CHUNK_END):
            self.finish(self.end_reason or "cutoff")

    def finish(self, reason):
        if not self.ended:
            self.ended = True
            self.end_reason = self.end_reason or reason


def connect(host, port, timeout):
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_hello_seq(host, port, timeout):
    """One short-lived subscription, only for the newest seq its hello reports."""
    s = connect(host, port, timeout)
    try:
        s.sendall(request(host, port))
        buf = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            data = s.recv(65536)
            if not data:
                break
            buf += data
            m = HELLO_RE.search(buf)
            if m:
                return int(m.group(1))
        return None
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--subs", type=int, required=True)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--drain", type=float, default=10.0, help="seconds to wait for the tail after stop")
    ap.add_argument("--connect-timeout", type=float, default=10.0)
    ap.add_argument("--max-seconds", type=float, default=120.0, help="hard bound on the whole run")
    ap.add_argument("--recv", type=int, default=256 * 1024, help="bytes per recv()")
    a = ap.parse_args()
    if a.host not in ("127.0.0.1", "::1", "localhost"):
        sys.exit("events_sub: loopback only")

    t_start = time.monotonic()
    hard_deadline = t_start + a.max_seconds
    sel = selectors.DefaultSelector()
    subs = []
    result = {"subs": a.subs, "status": "ok"}

    def out(**kv):
        result.update(kv)
        line = "EVENTS_RESULT " + " ".join(f"{k}={v}" for k, v in result.items())
        with open(a.out, "w") as f:
            f.write(line + "\n")

    def pump(timeout):
        """One select round: read whatever is ready."""
        now = time.monotonic()
        for key, _ in sel.select(timeout):
            sub = key.data
            try:
                data = sub.sock.recv(a.recv)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as e:
                data = None
                sub.finish(f"error:{type(e).__name__}")
            if data:
                sub.feed(data, now)
            elif data == b"":
                sub.finish("eof")
            if sub.ended:
                sel.unregister(sub.sock)
                sub.sock.close()

    try:
        # 1. Connect and subscribe.
        req = request(a.host, a.port)
        for i in range(a.subs):
            s = connect(a.host, a.port, a.connect_timeout)
            s.sendall(req)
            s.setblocking(False)
            sub = Sub(i, s)
            subs.append(sub)
            sel.register(s, selectors.EVENT_READ, sub)
        hello_deadline = time.monotonic() + a.connect_timeout
        while any(s.hello_seq is None and not s.ended for s in subs):
            if time.monotonic() > hello_deadline:
                missing = sum(1 for s in subs if s.hello_seq is None)
                out(status=f"no-hello:{missing}")
                return 1
            pump(0.05)
        bad = [s for s in subs if s.ended]
        if bad:
            out(status=f"subscribe-failed:{bad[0].end_reason}")
            return 1
        open(a.ready_file, "w").close()
        cpu0 = time.process_time()

        # 2. Read until run.sh says the load is over.
        next_check = 0.0
        while True:
            now = time.monotonic()
            if now > hard_deadline:
                result["status"] = "timeout"
                break
            if now >= next_check:
                if os.path.exists(a.stop_file):
                    break
                next_check = now + 0.05
            pump(0.05)

        # 3. The newest seq, then drain towards it.
        newest = None
        if result["status"] == "ok":
            newest = read_hello_seq(a.host, a.port, a.connect_timeout)
        t_stop = time.monotonic()
        if newest is not None:
            drain_deadline = min(hard_deadline, t_stop + a.drain)
            while time.monotonic() < drain_deadline:
                if all(s.ended or s.last_seq >= newest for s in subs):
                    break
                pump(0.05)
        else:
            newest = max((s.last_seq for s in subs), default=0)
            if result["status"] == "ok":
                result["status"] = "no-newest"

        # 4. Report.
        live = [s for s in subs if not s.ended]
        firsts = [s.t_first for s in subs if s.t_first is not None]
        t0 = min(firsts) if firsts else None
        t1 = max((s.t_last for s in subs if s.t_last is not None), default=None)
        frames = sum(s.frames for s in subs)
        dur = (t1 - t0) if (t0 is not None and t1 is not None and t1 > t0) else 0.0
        rates = []
        for s in subs:
            d = (s.t_last - t0) if (s.t_last is not None and t0 is not None) else 0.0
            rates.append(s.frames / d if d > 0 else 0.0)
        cut = [s for s in subs if s.end_reason == "cutoff"]
        eof = [s for s in subs if s.end_reason == "eof" or (s.end_reason or "").startswith("error:")]
        goodbye = [s for s in subs if (s.end_reason or "").startswith("goodbye:")]
        # Complete: saw seq 1..newest, in order, none missing (a subscriber that started at
        # fromSeq 0 on a fresh daemon is owed every seq).
        complete = [s for s in subs if s.gap_events == 0 and s.dups == 0 and s.last_seq >= newest
                    and (s.first_seq in (None, 1) or newest == 0) and s.end_reason in (None,)]
        lagging = [s for s in live if s.last_seq < newest]
        missed_tail = sum(max(0, newest - s.last_seq) for s in subs)
        head_missed = sum((s.first_seq - 1) for s in subs if s.first_seq is not None)
        out(
            newest=newest,
            frames=frames,
            duration_s=f"{dur:.3f}",
            total_eps=f"{frames / dur:.1f}" if dur > 0 else "0",
            sub_eps_mean=f"{sum(rates) / len(rates):.1f}" if rates else "0",
            sub_eps_min=f"{min(rates):.1f}" if rates else "0",
            complete=len(complete),
            gaps=sum(s.gaps for s in subs),
            gap_events=sum(s.gap_events for s in subs),
            head_missed=head_missed,
            dups=sum(s.dups for s in subs),
            cutoffs=len(cut),
            eofs=len(eof),
            goodbyes=len(goodbye),
            lagging=len(lagging),
            missed_tail=missed_tail,
            bytes=sum(s.nbytes for s in subs),
            drain_s=f"{time.monotonic() - t_stop:.3f}",
            cpu_s=f"{time.process_time() - cpu0:.2f}",
        )
        # One line per subscriber that did not see everything, for the curious (kept log).
        for s in subs:
            if s not in complete:
                print(f"sub {s.idx}: frames={s.frames} first={s.first_seq} last={s.last_seq} "
                      f"gaps={s.gaps}/{s.gap_events} dups={s.dups} end={s.end_reason}", file=sys.stderr)
        return 0
    except OSError as e:
        out(status=f"error:{type(e).__name__}")
        print(f"events_sub: {e}", file=sys.stderr)
        return 1
    finally:
        for s in subs:
            try:
                s.sock.close()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
