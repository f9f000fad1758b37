#!/usr/bin/env bash
# Regenerates footprint/startup.order: the functions agentd runs, in the order of the phase
# that first runs them, so the linker packs each phase's code side by side. See README.md.
#
#   footprint/make-order.sh          # needs valgrind, curl, nm, python3
#
# How: an unstripped release build (its own target dir and the same profile: build.rs keeps
# the symbols with AGENTD_KEEP_SYMBOLS=1, which changes no symbol name) runs under callgrind,
# once per driver. Two dumps and the exit split each run into phases:
#   start   from exec to the first answer (the card): what an idle daemon has touched
#   serve   common requests: GetTask, SendMessage, the status command, two errors
#   stop    SIGTERM's drain and exit (left out: it runs once, at the end)
# The file lists start (smol, the default driver, first; then std), then serve: each phase
# the functions no earlier phase ran, in their original address order.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
OUT="$HERE/startup.order"
TARGET_DIR=${ORDER_TARGET_DIR:-"$ROOT/target/footprint-order"}
for tool in valgrind callgrind_control curl nm python3; do
  command -v "$tool" >/dev/null || { echo "make-order: needs $tool" >&2; exit 1; }
done

echo "make-order: building an unstripped release binary in $TARGET_DIR" >&2
(cd "$ROOT" && AGENTD_KEEP_SYMBOLS=1 CARGO_TARGET_DIR="$TARGET_DIR" \
  cargo build --release --bin agentd)
BIN="$TARGET_DIR/release/agentd"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agentd-order.XXXXXX")
PID=
cleanup() {
  [[ -n $PID ]] && kill -KILL "$PID" 2>/dev/null || true
  [[ -n ${ORDER_KEEP:-} ]] && echo "kept $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT

rpc() {  # url body [extensions header]
  curl -s -o /dev/null -H 'Content-Type: application/json' -H 'A2A-Version: 1.0' \
    ${3:+-H "A2A-Extensions: $3"} --data "$2" "$1/"
}

# One profiled daemon on DRIVER: dumps cg.DRIVER.out.1 (start) and .2 (serve).
profile_driver() {  # driver
  local driver=$1 port url dir=$WORK/$1 cmd=https://agentd.dev/a2a/ext/command i
  mkdir -p "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  url="http://127.0.0.1:$port"
  printf '[a2a]\nlisten = ["tcp://127.0.0.1:%s"]\n[store]\ndir = "%s/store"\n' "$port" "$dir" \
    > "$dir/agentd.toml"
  valgrind --tool=callgrind --demangle=no --compress-strings=no --dump-instr=no \
    --callgrind-out-file="$WORK/cg.$driver.out" \
    "$BIN" --config "$dir/agentd.toml" --driver "$driver" > "$dir/daemon.log" 2>&1 &
  PID=$!
  for _ in $(seq 300); do
    curl -sf -o /dev/null "$url/.well-known/agent-card.json" && break
    kill -0 "$PID" 2>/dev/null || { cat "$dir/daemon.log" >&2; exit 1; }
    sleep 0.1
  done
  sleep 1
  callgrind_control --dump=start "$PID" >/dev/null
  for i in 1 2 3; do
    curl -s -o /dev/null "$url/.well-known/agent-card.json"
    rpc "$url" '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"no-such-task"}}'
    rpc "$url" '{"jsonrpc":"2.0","id":2,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"order-'$i'","parts":[{"text":"hello"}]}}}'
    rpc "$url" '{"jsonrpc":"2.0","id":3,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","messageId":"s-'$i'","extensions":["'$cmd'"],"parts":[{"data":{"agentd":{"op":"status"}}}]}}}' "$cmd"
    rpc "$url" '{"jsonrpc":"2.0","id":4,"method":"NoSuchMethod"}'
    rpc "$url" '{not json'
  done
  sleep 1
  callgrind_control --dump=serve "$PID" >/dev/null
  kill -TERM "$PID"
  wait "$PID" || true
  PID=
}

# smol first: it is the default driver, so its start-up code goes to the very front.
profile_driver smol
profile_driver std

python3 - "$BIN" "$OUT" "$WORK" <<'EOF'
import re, subprocess, sys

binary, out, work = sys.argv[1], sys.argv[2], sys.argv[3]

def phase_functions(path):
    """The binary's functions a callgrind dump saw run (fn= lines under the binary's ob=)."""
    obj, names, desc = None, set(), None
    for line in open(path):
        if line.startswith("desc: Trigger:"):
            desc = line
        elif line.startswith("ob="):
            obj = line[3:].strip()
        elif line.startswith("fn=") and obj == binary:
            names.add(re.sub(r"'\d+$", "", line[3:].strip()))  # callgrind's recursion marks
    return desc or "", names

# (phase, driver) -> functions, from the numbered dumps (the unnumbered one is the stop).
phases = {}
for driver in ("smol", "std"):
    for n, phase in ((1, "start"), (2, "serve")):
        desc, names = phase_functions(f"{work}/cg.{driver}.out.{n}")
        if desc.strip() != f"desc: Trigger: dump {phase}":
            sys.exit(f"make-order: cg.{driver}.out.{n} is not the {phase} dump: {desc!r}")
        phases[(phase, driver)] = names

# Text symbols by address: the order within a phase keeps the compiler's own neighbours.
addr = {}
nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True)
for line in nm.stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[1] in "tTwW":
        addr.setdefault(parts[2], int(parts[0], 16))

seen, lines = set(), []
for key in (("start", "smol"), ("start", "std"), ("serve", "smol"), ("serve", "std")):
    fresh = sorted((addr[n], n) for n in phases[key] if n in addr and n not in seen)
    seen.update(n for _, n in fresh)
    lines += [n for _, n in fresh]
    print(f"make-order: {key[0]} ({key[1]}): {len(fresh)} new functions", file=sys.stderr)
with open(out, "w") as f:
    f.write("".join(n + "\n" for n in lines))
print(f"make-order: wrote {len(lines)} symbols to {out}", file=sys.stderr)
EOF
