#!/usr/bin/env bash
# Load and footprint benchmark for agentd. See bench/README.md.
#
#   bench/run.sh                       # build, bench both drivers, print the table
#   BENCH_SECONDS=3 bench/run.sh       # shorter runs
#   BENCH_SCENARIOS=events bench/run.sh   # only the events-feed fan-out scenario
#   BENCH_TARGETS="smol std" bench/run.sh # skip the python-sdk peer
#   BENCH_TARGETS="smol smol-memory" BENCH_SCENARIOS=send bench/run.sh  # durable vs memory store
#   BENCH_TARGETS=smol BENCH_SCENARIOS=tls-storm bench/run.sh  # TLS handshakes beside plaintext
#
# Shape: a *target* is one server process to measure: agentd with a given driver (`smol`,
# `std`), or the peer `python-sdk` (the official A2A Python SDK's server with an echo agent,
# bench/python-sdk/). A *scenario* is one wrk load against the running target. Both dispatch
# through small functions (start_target / scenario_<name>), so adding either means adding one
# function and one case; target_has says which scenarios a target can run (the peer has no
# agentd extensions: its status/events cells are n/a). The `events` and `tls-storm` scenarios
# are the exceptions: each needs daemons of its own (the feed enabled; an https listener), so
# bench_events and bench_tls_storm run them after the plain scenarios.
# The agentd targets run with AGENTD_LOCK_STATS=1: SIGUSR1 before and after each load gives
# the time the drivers held the shared instance lock, reported per request (`lock us/req`).
# After the per-target tables comes the comparison table: agentd smol/std against python-sdk.
set -euo pipefail

# ---------------------------------------------------------------------------------------------
# Knobs (environment)
# ---------------------------------------------------------------------------------------------
BENCH_SECONDS=${BENCH_SECONDS:-10}                    # wrk duration per run
BENCH_TARGETS=${BENCH_TARGETS:-"smol std python-sdk"} # agentd drivers and/or the peer
BENCH_SCENARIOS=${BENCH_SCENARIOS:-"card get-unknown status send events tls-storm"}  # `send` last: it grows state
                                                      # (`events`, `tls-storm`: fresh daemons of their own)
BENCH_CONNS=${BENCH_CONNS:-"1 32"}                    # wrk connection counts
BENCH_SKIP_BUILD=${BENCH_SKIP_BUILD:-0}               # 1: use the existing binary as is
BENCH_START_TIMEOUT=${BENCH_START_TIMEOUT:-15}        # seconds to wait for the card to answer
BENCH_KEEP=${BENCH_KEEP:-0}                           # 1: keep the temp dir (configs, logs)
BENCH_EVENTS_SUBS=${BENCH_EVENTS_SUBS:-"1 10 100"}    # events: subscriber counts, one daemon each
BENCH_EVENTS_CONNS=${BENCH_EVENTS_CONNS:-32}          # events: wrk connections of the send load
BENCH_EVENTS_DRAIN=${BENCH_EVENTS_DRAIN:-10}          # events: seconds to let subscribers catch up
BENCH_EVENTS_BATCH_MS=${BENCH_EVENTS_BATCH_MS:-}      # events: a2a.events.batch_ms (empty: the daemon's default)
BENCH_EVENTS_RING=${BENCH_EVENTS_RING:-}              # events: a2a.events.ring (empty: the daemon's default)
BENCH_EVENTS_CLIENT=${BENCH_EVENTS_CLIENT:-rust}      # events: the subscribers, rust (events_reader.rs) or python (events_sub.py)
BENCH_PY_OTEL=${BENCH_PY_OTEL:-0}                     # python-sdk: 1 keeps the SDK's tracing wrappers on
BENCH_LOCK_STATS=${BENCH_LOCK_STATS:-1}               # agentd: 1 counts the shared lock's hold (AGENTD_LOCK_STATS)
BENCH_TLS_CONNS=${BENCH_TLS_CONNS:-32}                # tls-storm: connections doing TLS handshakes
BENCH_TLS_PLAIN_CONNS=${BENCH_TLS_PLAIN_CONNS:-32}    # tls-storm: plaintext connections GETting the card
BENCH_TLS_KEY=${BENCH_TLS_KEY:-ec}                    # tls-storm: the certificate's key, ec (P-256) or rsa (2048)

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$BENCH_DIR/.." && pwd)
LUA_DIR="$BENCH_DIR/lua"
PY_SDK_DIR="$BENCH_DIR/python-sdk"
PY_SDK_SERVER="$PY_SDK_DIR/echo_server.py"
BENCH_VENV=${BENCH_VENV:-"$REPO_ROOT/target/bench-venv"}   # made by python-sdk/setup.sh
AGENTD_BIN=${BENCH_BIN:-"$REPO_ROOT/target/release/agentd"}
# Optional TOML template for the daemon's config; "@PORT@" is replaced by the chosen port.
# The default is written by write_agentd_config below.
BENCH_CONFIG_TEMPLATE=${BENCH_CONFIG_TEMPLATE:-}

CARD_PATH=/.well-known/agent-card.json
HOST=127.0.0.1   # loopback only, always

die()  { echo "bench: $*" >&2; exit 1; }
note() { echo "bench: $*" >&2; }

# ---------------------------------------------------------------------------------------------
# Cleanup: whatever we spawned dies with us, however we exit.
# ---------------------------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/agentd-bench.XXXXXX")
SPAWNED=()        # pids of servers we started (and samplers), killed on exit

forget_pid() {
  local keep=() p
  for p in "${SPAWNED[@]:+${SPAWNED[@]}}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  SPAWNED=("${keep[@]:+${keep[@]}}")
}

cleanup() {
  local pid
  for pid in "${SPAWNED[@]:+${SPAWNED[@]}}"; do
    stop_pid "$pid"
  done
  if [[ $BENCH_KEEP == 1 ]]; then note "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# TERM, give it a moment to flush, then KILL. Only ever our own pids, and each pid is
# forgotten once reaped so a recycled pid is never signalled.
stop_pid() {
  local pid=$1 i
  forget_pid "$pid"
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 20); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

# Microseconds since the epoch. EPOCHREALTIME (bash >= 5) costs no fork; date is the fallback.
now_us() {
  if [[ -n ${EPOCHREALTIME:-} ]]; then
    local t=${EPOCHREALTIME//[.,]/}
    echo "$t"
  else
    echo $(( $(date +%s%N) / 1000 ))
  fi
}

# VmRSS of a pid in KiB (0 once it is gone). Pure bash: the sampler runs every 200 ms during
# load, and forking awk that often would perturb a 2-core machine.
rss_kb() {
  local key val _
  while read -r key val _; do
    if [[ $key == VmRSS: ]]; then echo "$val"; return; fi
  done < "/proc/$1/status" 2>/dev/null || true
  echo 0
}

# utime + stime of a pid in clock ticks (0 once it is gone). Fields 14 and 15 of
# /proc/<pid>/stat, counted after the ")" that closes the command name.
cpu_ticks() {
  local line rest
  { read -r line < "/proc/$1/stat"; } 2>/dev/null || { echo 0; return; }
  rest=${line##*) }
  # shellcheck disable=SC2086  # split on purpose
  set -- $rest
  echo $(( ${12} + ${13} ))
}

# A free TCP port on loopback: ask the kernel (python3), else probe random ports.
free_port() {
  if command -v python3 >/dev/null; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    return
  fi
  local p
  for _ in $(seq 1 50); do
    p=$(( 20000 + RANDOM % 40000 ))
    # Nothing answers a connect => nobody listens there.
    if ! (exec 3<>"/dev/tcp/$HOST/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

# Peak-RSS sampler: polls every 200 ms until $stop_file appears, keeps the max in $out.
# Stopped by a file rather than a signal, so the final value is always written whole.
# Not called in $(...): the sampler must be our child so we can wait for it.
start_sampler() {  # pid out_file stop_file ; sets SAMPLER_PID
  local pid=$1 out=$2 stop=$3
  (
    peak=0
    while [[ ! -e $stop ]] && kill -0 "$pid" 2>/dev/null; do
      kb=$(rss_kb "$pid")
      (( kb > peak )) && peak=$kb
      sleep 0.2
    done
    echo "$peak" > "$out"
  ) &
  SAMPLER_PID=$!
  SPAWNED+=("$SAMPLER_PID")
}
stop_sampler() {  # sampler_pid stop_file out_file ; sets SAMPLED_PEAK_KB
  touch "$2"
  wait "$1" 2>/dev/null || true   # (not in $(...): only the parent shell can wait for it)
  forget_pid "$1"
  SAMPLED_PEAK_KB=$(cat "$3" 2>/dev/null || echo 0)
}

fmt_mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }
fmt_ms()  { awk -v u="$1" 'BEGIN { printf "%.3f", u / 1000 }'; }

# ---------------------------------------------------------------------------------------------
# Setup: load generator and binary
# ---------------------------------------------------------------------------------------------
ensure_wrk() {
  command -v wrk >/dev/null && return
  command -v apt-get >/dev/null || die "wrk is missing and apt-get is not available"
  note "installing wrk from Debian"
  # The package index may be empty on a fresh image: update only if the first try fails.
  if ! apt-get install -y wrk >"$WORK/apt.log" 2>&1; then
    apt-get update >>"$WORK/apt.log" 2>&1
    apt-get install -y wrk >>"$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log" >&2; die "could not install wrk"; }
  fi
}

build_agentd() {
  if [[ $BENCH_SKIP_BUILD == 1 ]]; then
    note "BENCH_SKIP_BUILD=1: using $AGENTD_BIN as is"
  else
    note "building agentd (release)"
    (cd "$REPO_ROOT" && cargo build --release -p agentd) || die "cargo build failed"
  fi
  [[ -x $AGENTD_BIN ]] || die "no binary at $AGENTD_BIN"
}

# ---------------------------------------------------------------------------------------------
# Targets. start_target sets TARGET_PID, TARGET_URL and COLD_START_US, or returns non-zero.
# To add a peer, add a start_<peer> function that does the same, a case below and one in
# target_has; the scenarios and the tables need no change.
# ---------------------------------------------------------------------------------------------
TARGET_PID= TARGET_URL= COLD_START_US=

start_target() {
  case $1 in
    smol|std) start_agentd "$1" file ;;
    smol-memory|std-memory) start_agentd "${1%-memory}" memory ;;
    python-sdk) start_python_sdk ;;
    *) note "unknown target '$1'"; return 1 ;;
  esac
}

# Whether target $1 can run scenario $2. status and events exercise agentd's own extensions
# (command, events): A2A core has neither, so the peer reports them as n/a.
target_has() {  # target scenario
  case $1:$2 in
    python-sdk:status|python-sdk:events|python-sdk:tls-storm) return 1 ;;
    *) return 0 ;;
  esac
}

# The body marker a correct answer carries, when it differs from the scenario script's own
# default (empty: use the script's). Passed to wrk as its second script argument.
#   agentd  send -> "result" (the task, REJECTED since no agent is configured)
#   peer    send -> TASK_STATE_COMPLETED (the echo agent ran and completed the task)
# card ("name") and get-unknown (-32001, TASK_NOT_FOUND) look alike on both.
expect_for() {  # target scenario
  case $1:$2 in
    python-sdk:send) echo TASK_STATE_COMPLETED ;;
    *) echo "" ;;
  esac
}

# 1 while the events scenario starts its daemons: the config then enables the events feed.
TARGET_EVENTS=0
# Set while the tls-storm scenario starts its daemon: the https listener's port (its URL is
# then in TARGET_TLS_URL) and the PEM files of its certificate.
TARGET_TLS_PORT= TARGET_TLS_URL= TLS_CERT= TLS_KEY=
# Appended to the names of a target's config, log and state dir (one daemon per events run).
TARGET_LABEL=

write_agentd_config() {  # port file
  if [[ -n $BENCH_CONFIG_TEMPLATE ]]; then
    sed "s/@PORT@/$1/g" "$BENCH_CONFIG_TEMPLATE" > "$2"
  else
    # Just a loopback listener: no agent, no auth (loopback without a mechanism is open).
    printf '[a2a]\nlisten = ["tcp://%s:%s"]\n' "$HOST" "$1" > "$2"
  fi
  if [[ -n $TARGET_TLS_PORT ]]; then
    # tls-storm: the same daemon also listens for https on loopback (no auth: loopback).
    sed -i "s|^listen = \[\"tcp://$HOST:$1\"\]|listen = [\"tcp://$HOST:$1\", \"https://$HOST:$TARGET_TLS_PORT\"]|" "$2"
    grep -q "https://$HOST:$TARGET_TLS_PORT" "$2" || { note "tls-storm: could not add the https listener"; return 1; }
    printf '\n[a2a.tls]\ncert = "%s"\nkey = "%s"\n' "$TLS_CERT" "$TLS_KEY" >> "$2"
  fi
  if [[ $TARGET_EVENTS == 1 ]]; then
    if grep -q '^[[:space:]]*\[a2a\.events\]' "$2"; then
      note "config template has its own [a2a.events]: using it as is (it must enable the feed)"
    else
      # The stream deadline outlives the run, so no subscriber gets a `goodbye` mid-run.
      printf '[a2a.events]\nenabled = true\nstream_deadline_ms = %s\n' \
        $(( (BENCH_SECONDS + BENCH_EVENTS_DRAIN + 120) * 1000 )) >> "$2"
      if [[ -n $BENCH_EVENTS_BATCH_MS ]]; then printf 'batch_ms = %s\n' "$BENCH_EVENTS_BATCH_MS" >> "$2"; fi
      if [[ -n $BENCH_EVENTS_RING ]]; then printf 'ring = %s\n' "$BENCH_EVENTS_RING" >> "$2"; fi
    fi
  fi
}

start_agentd() {  # driver store(file|memory)
  local driver=$1 store=${2:-file} port cfg log name=$1$TARGET_LABEL
  TARGET_LOG= TARGET_LOCKSTATS=0
  [[ $store == memory ]] && name=$1-memory$TARGET_LABEL
  port=$(free_port)
  cfg="$WORK/agentd-$name.toml"
  log="$WORK/agentd-$name.log"
  write_agentd_config "$port" "$cfg" || return 1
  # Keep the daemon's own state inside our temp dir, whatever its defaults are.
  mkdir -p "$WORK/state-$name"
  # The store: the durable file store (the default: every acknowledged task fsynced
  # first) in the state dir, or the memory store for the `-memory` targets.
  if ! grep -q '^[[:space:]]*\[store\]' "$cfg"; then
    if [[ $store == memory ]]; then
      printf '\n[store]\nkind = "memory"\n' >> "$cfg"
    else
      printf '\n[store]\ndir = "%s"\n' "$WORK/state-$name/data" >> "$cfg"
    fi
  fi

  local t0; t0=$(now_us)
  # AGENTD_LOCK_STATS=1: the drivers count their hold of the shared instance lock, and each
  # SIGUSR1 prints the totals as a `lock-stats` line on stdout (lock_stats below).
  # (BENCH_LOCK_STATS=0 leaves it off: the daemon then runs exactly as shipped, one thread less.)
  local lockstats=1
  [[ $BENCH_LOCK_STATS == 1 ]] || lockstats=0
  (cd "$WORK/state-$name" && AGENTD_LOCK_STATS=$lockstats exec "$AGENTD_BIN" --driver "$driver" --config "$cfg") >"$log" 2>&1 &
  TARGET_PID=$!
  SPAWNED+=("$TARGET_PID")
  TARGET_URL="http://$HOST:$port" TARGET_LOG=$log TARGET_LOCKSTATS=$lockstats
  [[ -n $TARGET_TLS_PORT ]] && TARGET_TLS_URL="https://$HOST:$TARGET_TLS_PORT"
  wait_ready "$TARGET_PID" "$TARGET_URL$CARD_PATH" "$t0" "$log"
}

# The peer: the A2A Python SDK's JSON-RPC server (a2a-sdk, Starlette routes) serving the echo
# agent of bench/python-sdk/echo_server.py, under uvicorn (uvloop + httptools), one process.
# The venv comes from ensure_python_sdk. The SDK's OpenTelemetry wrappers are switched off
# (OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=false) unless BENCH_PY_OTEL=1: agentd traces nothing
# per request either.
start_python_sdk() {
  local port log="$WORK/python-sdk$TARGET_LABEL.log" otel=false
  TARGET_LOG=$log TARGET_LOCKSTATS=0   # no lock-stats line: SIGUSR1 would end it
  [[ $BENCH_PY_OTEL == 1 ]] && otel=true
  [[ -n $PY_SDK_PYTHON ]] || { note "python-sdk: no venv (setup failed)"; TARGET_PID=; return 1; }
  port=$(free_port)
  mkdir -p "$WORK/state-python-sdk"
  local t0; t0=$(now_us)
  # exec: the pid we hold (and sample RSS of) is the server's own python process.
  (cd "$WORK/state-python-sdk" && OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=$otel PYTHONDONTWRITEBYTECODE=1 \
     exec "$PY_SDK_PYTHON" "$PY_SDK_SERVER" --host "$HOST" --port "$port") >"$log" 2>&1 &
  TARGET_PID=$!
  SPAWNED+=("$TARGET_PID")
  TARGET_URL="http://$HOST:$port"
  wait_ready "$TARGET_PID" "$TARGET_URL$CARD_PATH" "$t0" "$log"
}

# Creates or reuses the venv (bench/python-sdk/setup.sh: pinned a2a-sdk, uvicorn, ... from
# PyPI) and sets PY_SDK_PYTHON and PY_SDK_VERSIONS; on failure leaves PY_SDK_PYTHON empty,
# so the target reports start-failed and the agentd targets still run.
PY_SDK_PYTHON= PY_SDK_VERSIONS=
ensure_python_sdk() {
  local venv
  if ! venv=$(BENCH_VENV="$BENCH_VENV" "$PY_SDK_DIR/setup.sh" 2> >(sed 's/^/  /' >&2)); then
    note "python-sdk: could not set up the venv (skip the peer with BENCH_TARGETS=\"smol std\")"
    return 0
  fi
  PY_SDK_PYTHON="$venv/bin/python"
  PY_SDK_VERSIONS=$("$PY_SDK_PYTHON" -c '
from importlib.metadata import version as v
print(", ".join(f"{p} {v(p)}" for p in ("a2a-sdk", "starlette", "uvicorn", "uvloop", "httptools")))' \
    2>/dev/null) || true
}

# Cold start = spawn to the first successful card answer. curl's own startup (a few ms) sets
# the resolution; we poll as fast as curl allows, bounded by BENCH_START_TIMEOUT.
wait_ready() {  # pid url t0_us log
  local pid=$1 url=$2 t0=$3 log=$4 deadline
  deadline=$(( t0 + BENCH_START_TIMEOUT * 1000000 ))
  until curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      note "target exited before answering; last log lines:"; tail -n 20 "$log" >&2
      return 1
    fi
    if (( $(now_us) > deadline )); then
      note "target did not answer $url within ${BENCH_START_TIMEOUT}s; last log lines:"
      tail -n 20 "$log" >&2
      return 1
    fi
    sleep 0.005
  done
  COLD_START_US=$(( $(now_us) - t0 ))
}

# ---------------------------------------------------------------------------------------------
# Scenarios. Each is `scenario_<name> conns` and calls run_wrk with its Lua script and path.
# ---------------------------------------------------------------------------------------------
scenario_card()        { run_wrk "$1" "$LUA_DIR/card.lua" "$CARD_PATH" "$(expect_for "$TARGET" card)"; }
scenario_get-unknown() { run_wrk "$1" "$LUA_DIR/get-unknown.lua" / "$(expect_for "$TARGET" get-unknown)"; }
scenario_status()      { run_wrk "$1" "$LUA_DIR/status.lua" / "$(expect_for "$TARGET" status)"; }
scenario_send()        { run_wrk "$1" "$LUA_DIR/send.lua" / "$(expect_for "$TARGET" send)"; }

RUN_SEQ=0
# Runs wrk against the current target and leaves its summary line in $WRK_RESULT (empty if
# wrk failed) and the peak RSS seen during the run in $RUN_PEAK_KB.
run_wrk() {  # conns script path [expect]
  local conns=$1 script=$2 path=$3 expect=${4:-} threads out sampler
  threads=$(( conns < 2 ? conns : 2 ))
  RUN_SEQ=$((RUN_SEQ + 1))
  out="$WORK/wrk-$RUN_SEQ.txt"

  start_sampler "$TARGET_PID" "$WORK/peak-$RUN_SEQ" "$WORK/stop-$RUN_SEQ"
  sampler=$SAMPLER_PID
  # `timeout` bounds the run even if wrk wedges; --timeout bounds each request. wrk runs in
  # the background and we `wait` for it, so an INT/TERM trap fires at once and cleanup()
  # stops it (timeout puts itself in its own process group, out of reach of a terminal ^C).
  timeout --kill-after=5 $(( BENCH_SECONDS + 30 )) \
    wrk -t "$threads" -c "$conns" -d "${BENCH_SECONDS}s" --timeout 5s --latency \
        -s "$script" "$TARGET_URL$path" -- "r$RUN_SEQ-$$" "$expect" >"$out" 2>&1 &
  local wrk_pid=$!
  SPAWNED+=("$wrk_pid")
  wait "$wrk_pid" || true
  forget_pid "$wrk_pid"
  stop_sampler "$sampler" "$WORK/stop-$RUN_SEQ" "$WORK/peak-$RUN_SEQ"
  RUN_PEAK_KB=$SAMPLED_PEAK_KB
  WRK_RESULT=$(grep '^BENCH_RESULT ' "$out" || true)
  if [[ -z $WRK_RESULT ]]; then
    note "wrk produced no result ($out):"; sed 's/^/  /' "$out" >&2
  fi
}

# Pulls key=value out of a BENCH_RESULT line.
field() { local k=$2; [[ " $1 " =~ \ $k=([^ ]*)\  ]] && echo "${BASH_REMATCH[1]}" || echo 0; }

# The target's lock-stats totals (agentd, AGENTD_LOCK_STATS=1): SIGUSR1 makes it print one
# `lock-stats acquisitions=N wait_ns=N held_ns=N max_held_ns=N` line on stdout, into its log.
# Leaves that line in $LOCK_LINE, or empty for a target without it (or no answer in 2 s).
lock_stats() {
  LOCK_LINE=
  [[ $TARGET_LOCKSTATS == 1 && -n $TARGET_LOG ]] || return 0
  local before i
  before=$(grep -c '^lock-stats ' "$TARGET_LOG" || true)
  kill -USR1 "$TARGET_PID" 2>/dev/null || return 0
  for (( i = 0; i < 100; i++ )); do
    if (( $(grep -c '^lock-stats ' "$TARGET_LOG" || true) > before )); then
      LOCK_LINE=$(grep '^lock-stats ' "$TARGET_LOG" | tail -n 1)
      return 0
    fi
    sleep 0.02
  done
  note "no lock-stats line from the target within 2 s"
}

# Microseconds of lock hold (or wait, with key wait_ns) per request between two lock-stats
# lines: (after - before) / requests, "-" without figures.
lock_per_req() {  # before_line after_line requests [key]
  local key=${4:-held_ns}
  [[ -n $1 && -n $2 ]] || { echo -; return; }
  awk -v a="$(field "$2" "$key")" -v b="$(field "$1" "$key")" -v n="$3" \
    'BEGIN { if (n + 0 <= 0) print "-"; else printf "%.2f", (a - b) / n / 1000 }'
}

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
ROWS=()      # "target scenario conns rps p50 p99 errors flags"
FOOT=()      # "target idle_kb peak_kb cold_us status"
declare -A SEND_REQS=()   # target -> SendMessage requests answered in its plain `send` runs
FAILED=0

TARGET=       # the target being benched (scenarios read it for expect_for)

bench_target() {  # target
  local t=$1
  TARGET=$t
  note "== $t"
  if [[ -n $PLAIN_SCENARIOS ]]; then bench_plain "$t"; fi
  if [[ $RUN_TLS == 1 ]]; then
    if target_has "$t" tls-storm; then
      bench_tls_storm "$t"
    else
      TLSROWS+=("$t n/a - - - - - - - - n/a(agentd-listener)")
    fi
  fi
  if [[ $RUN_EVENTS == 1 ]]; then
    if target_has "$t" events; then
      bench_events "$t"
    else
      EVROWS+=("$t n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a n/a(agentd-extension)")
    fi
  fi
}

# The wrk scenarios, all against one daemon with the plain config.
bench_plain() {  # target
  local t=$1 idle peak=0 sc conns r rps sock n2 un errs flags lock0 lock1 lock
  if ! start_target "$t"; then
    FOOT+=("$t - - - start-failed"); FAILED=1
    [[ -n $TARGET_PID ]] && stop_pid "$TARGET_PID"
    return 0
  fi
  idle=$(rss_kb "$TARGET_PID")

  for sc in $PLAIN_SCENARIOS; do
    for conns in $BENCH_CONNS; do
      if ! target_has "$t" "$sc"; then
        ROWS+=("$t $sc $conns n/a n/a n/a n/a n/a n/a(agentd-extension)"); continue
      fi
      note "   $sc c=$conns (${BENCH_SECONDS}s)"
      lock_stats; lock0=$LOCK_LINE
      "scenario_$sc" "$conns"
      lock_stats; lock1=$LOCK_LINE
      (( RUN_PEAK_KB > peak )) && peak=$RUN_PEAK_KB
      r=$WRK_RESULT
      if [[ -z $r ]]; then
        ROWS+=("$t $sc $conns - - - - - wrk-failed"); FAILED=1; continue
      fi
      rps=$(field "$r" rps)
      sock=$(( $(field "$r" connect) + $(field "$r" read) + $(field "$r" write) + $(field "$r" timeout) ))
      n2=$(field "$r" non2xx); un=$(field "$r" unexpected)
      errs=$(( sock + n2 + un ))
      flags=ok
      if (( errs > 0 )); then
        flags=""
        (( sock > 0 )) && flags+="sock=$sock,"
        (( n2 > 0 )) && flags+="non2xx=$n2,"
        (( un > 0 )) && flags+="unexpected-body=$un,"
        flags="!${flags%,}"
      fi
      (( $(field "$r" requests) == 0 )) && flags="!no-requests"
      [[ $sc == send ]] && SEND_REQS[$t]=$(( ${SEND_REQS[$t]:-0} + $(field "$r" requests) ))
      lock=$(lock_per_req "$lock0" "$lock1" "$(field "$r" requests)")
      ROWS+=("$t $sc $conns $rps $(fmt_ms "$(field "$r" p50_us)") $(fmt_ms "$(field "$r" p99_us)") $errs $lock $flags")
    done
  done

  # A target that died under load is a finding, not a footnote.
  local status=ok
  kill -0 "$TARGET_PID" 2>/dev/null || { status="!died"; FAILED=1; }
  FOOT+=("$t $idle $peak $COLD_START_US $status")
  stop_pid "$TARGET_PID"
}

# ---------------------------------------------------------------------------------------------
# Scenario `events`: feed fan-out under a SendMessage load. For each subscriber count N, a fresh
# daemon with the events feed enabled (so every run starts at seq 0 with an empty ring);
# the events client (BENCH_EVENTS_CLIENT) opens N subscriptions (fromSeq 0) and, once every
# `hello` is in, wrk runs the `send` scenario with BENCH_EVENTS_CONNS connections for
# BENCH_SECONDS. Then the client reads the newest seq, lets the subscribers drain (at most
# BENCH_EVENTS_DRAIN s) and reports frames, seq gaps and how streams ended. RSS is read before the subscribers connect,
# with N subscribers idle, and sampled for the peak from then until the client is done.
# ---------------------------------------------------------------------------------------------
EVROWS=()    # "target subs rps errs sub_eps_mean sub_eps_min total_eps newest complete gaps cut before idle peak per_sub flags"

# The subscriber client's command line, without its flags: bench/events_reader.rs, compiled
# once per run with rustc, or bench/events_sub.py.
EVENTS_CLIENT=()
events_client() {
  [[ ${#EVENTS_CLIENT[@]} -gt 0 ]] && return 0
  case $BENCH_EVENTS_CLIENT in
    rust)
      command -v rustc >/dev/null || { note "rustc is missing: no events client"; return 1; }
      rustc -O --edition 2021 "$BENCH_DIR/events_reader.rs" -o "$WORK/events_reader" \
        || { note "events_reader.rs did not compile"; return 1; }
      EVENTS_CLIENT=("$WORK/events_reader") ;;
    python)
      command -v python3 >/dev/null || { note "python3 is missing: no events client"; return 1; }
      EVENTS_CLIENT=(python3 "$BENCH_DIR/events_sub.py") ;;
    *) die "BENCH_EVENTS_CLIENT: '$BENCH_EVENTS_CLIENT' is neither rust nor python" ;;
  esac
}

bench_events() {  # target
  local t=$1 n
  if ! events_client; then
    EVROWS+=("$t - - - - - - - - - - - - - - - !no-client"); FAILED=1
    return 0
  fi
  for n in $BENCH_EVENTS_SUBS; do
    [[ $n =~ ^[0-9]+$ ]] || die "BENCH_EVENTS_SUBS: '$n' is not a count"
    bench_events_n "$t" "$n"
  done
}

bench_events_n() {  # target subs
  local t=$1 n=$2 before idle peak sampler client client_pid tag r ev rc=0 i flags=""
  note "   events subs=$n send c=$BENCH_EVENTS_CONNS (${BENCH_SECONDS}s)"
  TARGET_EVENTS=1 TARGET_LABEL="-events-$n"
  if ! start_target "$t"; then
    TARGET_EVENTS=0 TARGET_LABEL=
    EVROWS+=("$t $n - - - - - - - - - - - - - - !start-failed"); FAILED=1
    [[ -n $TARGET_PID ]] && stop_pid "$TARGET_PID"
    return 0
  fi
  TARGET_EVENTS=0 TARGET_LABEL=
  sleep 0.2
  before=$(rss_kb "$TARGET_PID")

  tag="$WORK/events-$t-$n"
  # The client bounds itself (--max-seconds); `timeout` bounds it again should it wedge.
  local budget=$(( BENCH_SECONDS + BENCH_EVENTS_DRAIN + 60 ))
  timeout --kill-after=5 $(( budget + 15 )) \
    "${EVENTS_CLIENT[@]}" --host "$HOST" --port "${TARGET_URL##*:}" --subs "$n" \
      --ready-file "$tag.ready" --stop-file "$tag.stop" --out "$tag.out" \
      --drain "$BENCH_EVENTS_DRAIN" --max-seconds "$budget" 2>"$tag.log" &
  client_pid=$!
  SPAWNED+=("$client_pid")

  # Every subscriber has its hello (bounded: the client gives up after 10 s of connecting).
  for (( i = 0; i < 400; i++ )); do
    [[ -e $tag.ready ]] && break
    kill -0 "$client_pid" 2>/dev/null || break
    sleep 0.05
  done
  if [[ ! -e $tag.ready ]]; then
    note "events client did not get its subscribers up; its output:"
    sed 's/^/  /' "$tag.out" "$tag.log" >&2 2>/dev/null || true
    stop_pid "$client_pid"; stop_pid "$TARGET_PID"
    EVROWS+=("$t $n - - - - - - - - - $before - - - - !subscribe-failed"); FAILED=1
    return 0
  fi
  sleep 0.5   # let the daemon settle its per-connection buffers
  idle=$(rss_kb "$TARGET_PID")

  start_sampler "$TARGET_PID" "$tag.peak" "$tag.peakstop"
  sampler=$SAMPLER_PID
  local cpu0; cpu0=$(cpu_ticks "$TARGET_PID")
  run_wrk "$BENCH_EVENTS_CONNS" "$LUA_DIR/send.lua" /
  touch "$tag.stop"
  wait "$client_pid" || rc=$?
  forget_pid "$client_pid"
  local dcpu; dcpu=$(awk -v a="$(cpu_ticks "$TARGET_PID")" -v b="$cpu0" -v hz="$(getconf CLK_TCK 2>/dev/null || echo 100)" \
    'BEGIN { if (a < b) print "-"; else printf "%.1f", (a - b) / hz }')
  stop_sampler "$sampler" "$tag.peakstop" "$tag.peak"
  peak=$SAMPLED_PEAK_KB
  (( RUN_PEAK_KB > peak )) && peak=$RUN_PEAK_KB

  kill -0 "$TARGET_PID" 2>/dev/null || { flags+="died,"; FAILED=1; }
  stop_pid "$TARGET_PID"

  r=$WRK_RESULT
  local rps=- errs=-
  if [[ -z $r ]]; then
    flags+="wrk-failed,"; FAILED=1
  else
    rps=$(field "$r" rps)
    errs=$(( $(field "$r" connect) + $(field "$r" read) + $(field "$r" write) + $(field "$r" timeout) \
             + $(field "$r" non2xx) + $(field "$r" unexpected) ))
    (( errs > 0 )) && flags+="send-errors=$errs,"
  fi

  ev=$(grep '^EVENTS_RESULT ' "$tag.out" 2>/dev/null || true)
  if [[ -z $ev || $rc != 0 ]]; then
    note "events client failed (rc=$rc); its output:"
    sed 's/^/  /' "$tag.out" "$tag.log" >&2 2>/dev/null || true
    EVROWS+=("$t $n $rps $errs - - - - - - - $before $idle $peak - - !client-failed${flags:+,${flags%,}}"); FAILED=1
    return 0
  fi
  local st; st=$(field "$ev" status)
  [[ $st != ok ]] && flags+="client=$st,"
  local gapev head dups cut eofs byes lag tail
  gapev=$(field "$ev" gap_events); head=$(field "$ev" head_missed); dups=$(field "$ev" dups)
  cut=$(field "$ev" cutoffs); eofs=$(field "$ev" eofs); byes=$(field "$ev" goodbyes)
  lag=$(field "$ev" lagging); tail=$(field "$ev" missed_tail)
  (( gapev > 0 )) && flags+="lost=$gapev,"
  (( head > 0 )) && flags+="late-start=$head,"
  (( dups > 0 )) && flags+="dup=$dups,"
  (( cut > 0 )) && flags+="cut-off=$cut,"
  (( eofs > 0 )) && flags+="closed=$eofs,"
  (( byes > 0 )) && flags+="goodbye=$byes,"
  (( lag > 0 )) && flags+="lagging=$lag,"
  (( tail > 0 )) && flags+="unread=$tail,"
  if [[ -z $flags ]]; then flags=ok; else flags="!${flags%,}"; fi
  [[ -s $tag.log ]] && note "   events subs=$n: $(wc -l < "$tag.log") subscriber(s) incomplete (listed in $tag.log if BENCH_KEEP=1)"

  local per=-
  (( n > 0 )) && per=$(awk -v a="$idle" -v b="$before" -v n="$n" 'BEGIN { printf "%.1f", (a - b) / n }')
  EVROWS+=("$t $n $rps $errs $(field "$ev" sub_eps_mean) $(field "$ev" sub_eps_min) $(field "$ev" total_eps) \
$(field "$ev" newest) $(field "$ev" complete)/$n $(field "$ev" gaps) $cut $before $idle $peak $per \
$dcpu/$(field "$ev" cpu_s) $flags")
}

print_events_report() {
  (( ${#EVROWS[@]} )) || return 0
  echo
  echo "events fan-out — send c=$BENCH_EVENTS_CONNS for ${BENCH_SECONDS}s, N subscribers fromSeq 0 (2 events per SendMessage, 3 once each new task evicts one), $BENCH_EVENTS_CLIENT client"
  echo
  local f='%-10s %5s %9s %6s %10s %10s %10s %8s %9s %5s %4s %10s %10s %10s %8s %10s  %s\n'
  # shellcheck disable=SC2059
  printf "$f" driver subs 'send/s' errors 'ev/s/sub' 'min ev/s' 'ev/s total' events 'all seqs' gaps 'cut' \
    'RSS before' 'RSS N idle' 'RSS peak' 'KiB/sub' 'cpu s d/c' flags
  # shellcheck disable=SC2059
  printf "$f" ---------- ----- --------- ------ ---------- ---------- ---------- -------- --------- ----- ---- \
    ---------- ---------- ---------- -------- ---------- -----
  local row t n rps errs mean min total newest comp gaps cut before idle peak per cpu fl
  for row in "${EVROWS[@]}"; do
    read -r t n rps errs mean min total newest comp gaps cut before idle peak per cpu fl <<<"$row"
    [[ $before =~ ^[0-9]+$ ]] && before=$(fmt_mib "$before" | tr -d ' ')
    [[ $idle =~ ^[0-9]+$ ]] && idle=$(fmt_mib "$idle" | tr -d ' ')
    [[ $peak =~ ^[0-9]+$ ]] && peak=$(fmt_mib "$peak" | tr -d ' ')
    # shellcheck disable=SC2059
    printf "$f" "$t" "$n" "$rps" "$errs" "$mean" "$min" "$total" "$newest" "$comp" "$gaps" "$cut" \
      "$before" "$idle" "$peak" "$per" "$cpu" "$fl"
  done
  echo
  echo "ev/s = event frames read / time from the first to the last frame (per subscriber: mean, min);"
  echo "events = newest seq after the load; all seqs = subscribers that read 1..newest with no gap;"
  echo "gaps = seq jumps inside a stream; cut = streams ended without goodbye (fell > ring behind);"
  echo "KiB/sub = (RSS N idle - RSS before) / N; cpu s d/c = CPU seconds of agentd / of the subscriber"
  echo "client during the load and drain. The client runs on the same cores as agentd and wrk, so"
  echo "at high fan-out it competes for CPU (the python client far more than the rust one): read"
  echo "send/s and ev/s with that in mind."
}

# ---------------------------------------------------------------------------------------------
# Scenario `tls-storm`: BENCH_TLS_CONNS connections doing TLS handshakes (wrk over https with
# `Connection: close`: a new connection and a full handshake per request) while
# BENCH_TLS_PLAIN_CONNS plaintext keep-alive connections GET the card. One fresh daemon with
# a plaintext and an https listener on loopback; three loads of BENCH_SECONDS each:
#   plain  the plaintext card load alone          -> its p50/p99, req/s
#   storm  the handshake load alone                -> handshakes/s
#   both   both at once, started together          -> the plaintext p99 under the storm
# Around each, the lock-stats counters (lock_stats): the time the drivers held the shared
# instance lock per request (plain and storm requests together), the wait for it, and the
# longest single hold. Figures only: nothing here passes or fails on a time.
# ---------------------------------------------------------------------------------------------
TLSROWS=()   # "target phase plain_rps plain_p50 plain_p99 hs_per_s errors held_us wait_us max_ms flags"

# A self-signed certificate for 127.0.0.1 (openssl), made once per bench run.
make_tls_cert() {
  [[ -n $TLS_CERT ]] && return 0
  command -v openssl >/dev/null || { note "tls-storm: openssl is missing"; return 1; }
  local dir="$WORK/tls" newkey
  mkdir -p "$dir"
  case $BENCH_TLS_KEY in
    ec) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1) ;;
    rsa) newkey=(-newkey rsa:2048) ;;
    *) die "BENCH_TLS_KEY: '$BENCH_TLS_KEY' is not ec or rsa" ;;
  esac
  if ! openssl req -x509 "${newkey[@]}" -nodes -days 2 -subj "/CN=$HOST" \
       -addext "subjectAltName=IP:$HOST" -keyout "$dir/key.pem" -out "$dir/cert.pem" \
       >"$dir/openssl.log" 2>&1; then
    note "tls-storm: openssl could not make a certificate:"; sed 's/^/  /' "$dir/openssl.log" >&2
    return 1
  fi
  TLS_CERT="$dir/cert.pem" TLS_KEY="$dir/key.pem"
}

# Starts wrk in the background against a URL; bench_tls_wait collects its BENCH_RESULT.
bench_tls_wrk() {  # conns script url out ; sets BG_WRK_PID
  local conns=$1 threads
  threads=$(( conns < 2 ? conns : 2 ))
  timeout --kill-after=5 $(( BENCH_SECONDS + 30 )) \
    wrk -t "$threads" -c "$conns" -d "${BENCH_SECONDS}s" --timeout 5s --latency \
        -s "$2" "$3" -- "tls-$RUN_SEQ-$$" >"$4" 2>&1 &
  BG_WRK_PID=$!
  SPAWNED+=("$BG_WRK_PID")
}
bench_tls_wait() {  # pid out ; sets BG_RESULT
  wait "$1" || true
  forget_pid "$1"
  BG_RESULT=$(grep '^BENCH_RESULT ' "$2" || true)
  [[ -n $BG_RESULT ]] || { note "wrk produced no result ($2):"; sed 's/^/  /' "$2" >&2; }
}

bench_tls_storm() {  # target
  local t=$1 phase
  note "   tls-storm: $BENCH_TLS_CONNS handshaking ($BENCH_TLS_KEY key) + $BENCH_TLS_PLAIN_CONNS plaintext card (${BENCH_SECONDS}s x 3)"
  if [[ -n $BENCH_CONFIG_TEMPLATE ]]; then
    note "tls-storm: skipped with BENCH_CONFIG_TEMPLATE (it adds its own https listener)"
    TLSROWS+=("$t - - - - - - - - - !config-template"); return 0
  fi
  if ! make_tls_cert; then TLSROWS+=("$t - - - - - - - - - !no-certificate"); FAILED=1; return 0; fi
  TARGET_TLS_PORT=$(free_port) TARGET_LABEL="-tls"
  if ! start_target "$t" || ! curl -fsS -k -o /dev/null --max-time 5 "$TARGET_TLS_URL$CARD_PATH"; then
    TARGET_TLS_PORT= TARGET_LABEL=
    TLSROWS+=("$t - - - - - - - - - !start-failed"); FAILED=1
    [[ -n $TARGET_PID ]] && stop_pid "$TARGET_PID"
    return 0
  fi
  TARGET_TLS_PORT= TARGET_LABEL=
  for phase in plain storm both; do
    bench_tls_phase "$t" "$phase"
  done
  kill -0 "$TARGET_PID" 2>/dev/null || { TLSROWS+=("$t - - - - - - - - - !died"); FAILED=1; }
  stop_pid "$TARGET_PID"
}

bench_tls_phase() {  # target phase
  local t=$1 phase=$2 l0 l1 plain_pid storm_pid plain_out storm_out pr="" sr="" n=0 errs=0 flags=""
  RUN_SEQ=$((RUN_SEQ + 1))
  plain_out="$WORK/tls-plain-$RUN_SEQ.txt" storm_out="$WORK/tls-storm-$RUN_SEQ.txt"
  note "   tls-storm $phase"
  lock_stats; l0=$LOCK_LINE
  if [[ $phase != plain ]]; then
    bench_tls_wrk "$BENCH_TLS_CONNS" "$LUA_DIR/tls-handshake.lua" "$TARGET_TLS_URL$CARD_PATH" "$storm_out"
    storm_pid=$BG_WRK_PID
  fi
  if [[ $phase != storm ]]; then
    bench_tls_wrk "$BENCH_TLS_PLAIN_CONNS" "$LUA_DIR/card.lua" "$TARGET_URL$CARD_PATH" "$plain_out"
    plain_pid=$BG_WRK_PID
  fi
  if [[ $phase != storm ]]; then bench_tls_wait "$plain_pid" "$plain_out"; pr=$BG_RESULT; fi
  if [[ $phase != plain ]]; then bench_tls_wait "$storm_pid" "$storm_out"; sr=$BG_RESULT; fi
  lock_stats; l1=$LOCK_LINE
  local r
  for r in "$pr" "$sr"; do
    [[ -n $r ]] || continue
    n=$(( n + $(field "$r" requests) ))
    errs=$(( errs + $(field "$r" connect) + $(field "$r" read) + $(field "$r" write) \
             + $(field "$r" timeout) + $(field "$r" non2xx) + $(field "$r" unexpected) ))
  done
  [[ $phase != storm && -z $pr ]] && { flags+="plain-wrk-failed,"; FAILED=1; }
  [[ $phase != plain && -z $sr ]] && { flags+="storm-wrk-failed,"; FAILED=1; }
  (( errs > 0 )) && flags+="errors=$errs,"
  if [[ -z $flags ]]; then flags=ok; else flags="!${flags%,}"; fi
  local rps=- p50=- p99=- hs=- max=-
  if [[ -n $pr ]]; then
    rps=$(field "$pr" rps) p50=$(fmt_ms "$(field "$pr" p50_us)") p99=$(fmt_ms "$(field "$pr" p99_us)")
  fi
  [[ -n $sr ]] && hs=$(field "$sr" rps)
  [[ -n $l0 && -n $l1 ]] && max=$(awk -v m="$(field "$l1" max_held_ns)" 'BEGIN { printf "%.3f", m / 1e6 }')
  TLSROWS+=("$t $phase $rps $p50 $p99 $hs $errs $(lock_per_req "$l0" "$l1" "$n") \
$(lock_per_req "$l0" "$l1" "$n" wait_ns) $max $flags")
}

print_tls_report() {
  (( ${#TLSROWS[@]} )) || return 0
  echo
  echo "tls-storm — $BENCH_TLS_CONNS connections doing TLS handshakes ($BENCH_TLS_KEY key, Connection: close) beside"
  echo "$BENCH_TLS_PLAIN_CONNS plaintext keep-alive connections GETting the card, ${BENCH_SECONDS}s per phase"
  echo
  local f='%-10s %-6s %10s %9s %9s %8s %7s %12s %12s %12s  %s\n'
  # shellcheck disable=SC2059
  printf "$f" target phase 'card req/s' 'p50 ms' 'p99 ms' 'hs/s' errors 'lock us/req' 'wait us/req' 'max hold ms' flags
  # shellcheck disable=SC2059
  printf "$f" ---------- ------ ---------- --------- --------- -------- ------- ------------ ------------ ------------ -----
  local row base=""
  for row in "${TLSROWS[@]}"; do
    # shellcheck disable=SC2086,SC2059  # rows are space-separated fields by construction
    printf "$f" $row
  done
  # The figure the scenario is for: the plaintext p99 under the storm against without it.
  local t ph rps p50 p99 _r
  local -A plain99=() both99=()
  for row in "${TLSROWS[@]}"; do
    read -r t ph rps p50 p99 _r <<<"$row"
    [[ $ph == plain ]] && plain99[$t]=$p99
    [[ $ph == both ]] && both99[$t]=$p99
  done
  for t in "${!plain99[@]}"; do
    [[ -n ${both99[$t]:-} ]] || continue
    echo "$t: plaintext card p99 ${plain99[$t]} ms alone, ${both99[$t]} ms under the storm ($(ratio "${both99[$t]}" "${plain99[$t]}"))"
  done
  echo
  echo "plain = the plaintext load alone; storm = the handshake load alone; both = together."
  echo "hs/s = handshakes (= https requests) per second; lock/wait us/req = microseconds the"
  echo "drivers held / waited for the shared instance lock, over every request of the phase"
  echo "(plaintext and https); max hold = the longest single hold since the daemon started."
}

print_report() {
  local bin_size=
  [[ -f $AGENTD_BIN ]] && bin_size=$(stat -c %s "$AGENTD_BIN" 2>/dev/null || wc -c < "$AGENTD_BIN")
  echo
  echo "agentd bench — ${BENCH_SECONDS}s per run, wrk threads=min(2,conns), $(nproc 2>/dev/null || echo '?') cores, loopback"
  echo
  if (( ${#ROWS[@]} + ${#FOOT[@]} )); then
    printf '%-10s %-12s %5s %10s %9s %9s %7s %12s  %s\n' target scenario conns 'req/s' 'p50 ms' 'p99 ms' errors 'lock us/req' flags
    printf '%-10s %-12s %5s %10s %9s %9s %7s %12s  %s\n' ---------- ------------ ----- ---------- --------- --------- ------- ------------ -----
    local row
    for row in "${ROWS[@]:+${ROWS[@]}}"; do
      # shellcheck disable=SC2086  # rows are space-separated fields by construction
      printf '%-10s %-12s %5s %10s %9s %9s %7s %12s  %s\n' $row
    done
    echo "lock us/req = microseconds the drivers held the shared instance lock per request answered"
    echo "(AGENTD_LOCK_STATS counters, read by SIGUSR1 before and after the run)"
    echo
    printf '%-10s %12s %12s %14s  %s\n' target 'idle RSS' 'peak RSS' 'cold start ms' status
    printf '%-10s %12s %12s %14s  %s\n' ---------- ------------ ------------ -------------- ------
    local t idle peak cold st
    for row in "${FOOT[@]:+${FOOT[@]}}"; do
      read -r t idle peak cold st <<<"$row"
      if [[ $idle == - ]]; then
        printf '%-10s %12s %12s %14s  %s\n' "$t" - - - "$st"
      else
        printf '%-10s %12s %12s %14s  %s\n' "$t" "$(fmt_mib "$idle")" "$(fmt_mib "$peak")" "$(fmt_ms "$cold")" "$st"
        # The aim is an idle daemon under 4 MB; above it, the start-up code has most likely
        # outgrown footprint/startup.order (see footprint/README.md).
        if [[ $t != python-sdk ]] && (( idle * 1024 >= 4000000 )); then
          IDLE_NOTE="idle RSS of $t is above 4 MB: regenerate footprint/startup.order (footprint/make-order.sh)"
        fi
      fi
    done
    [[ -n ${IDLE_NOTE:-} ]] && echo "note: $IDLE_NOTE"
  fi
  print_tls_report
  print_events_report
  echo
  [[ -n $bin_size ]] && echo "binary: $AGENTD_BIN  $bin_size bytes ($(fmt_mib $(( bin_size / 1024 ))))"
  [[ -n $PY_SDK_VERSIONS ]] && echo "python-sdk: $PY_SDK_VERSIONS; one uvicorn process (one event loop)"
  echo "errors = socket errors (connect/read/write/timeout) + non-2xx + bodies without the expected marker"
  print_compare
}

# ---------------------------------------------------------------------------------------------
# Comparison: agentd (smol, std) against the python-sdk peer, from the rows above. req/s per
# scenario x conns, then footprint; ratio columns are agentd / python-sdk.
# ---------------------------------------------------------------------------------------------
COMPARE_TARGETS="smol std python-sdk"

# "1.23x" (or "12.3x"), "-" when either side is not a positive number.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    if (a ~ /^n\/a/ || b ~ /^n\/a/) { print "n/a"; exit }
    if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 <= 0 || a + 0 <= 0) { print "-"; exit }
    r = a / b; if (r >= 10) printf "%.1fx", r; else printf "%.2fx", r }'
}

print_compare() {
  [[ " $BENCH_TARGETS " == *" python-sdk "* ]] || return 0
  (( ${#ROWS[@]} + ${#FOOT[@]} )) || return 0
  local -A rps=() foot=()
  local row t sc conns r p50 p99 errs fl
  for row in "${ROWS[@]:+${ROWS[@]}}"; do
    read -r t sc conns r p50 p99 errs _ fl <<<"$row"
    # A run with errors keeps its figure, marked: the figure is still worth reading.
    [[ $fl == ok || $fl == n/a* || $r == - ]] || r="$r!"
    rps[$t/$sc/$conns]=$r
  done
  local idle peak cold st
  for row in "${FOOT[@]:+${FOOT[@]}}"; do
    read -r t idle peak cold st <<<"$row"
    foot[idle/$t]=$idle foot[peak/$t]=$peak foot[cold/$t]=$cold
  done

  echo
  echo "agentd vs python-sdk — same scenarios, same wrk settings, one run each"
  echo
  local f='%-12s %5s %12s %12s %12s %9s %9s\n'
  # shellcheck disable=SC2059
  printf "$f" scenario conns 'smol req/s' 'std req/s' 'python req/s' 'smol/py' 'std/py'
  # shellcheck disable=SC2059
  printf "$f" ------------ ----- ------------ ------------ ------------ --------- ---------
  local a b c
  for sc in $PLAIN_SCENARIOS; do
    for conns in $BENCH_CONNS; do
      a=${rps[smol/$sc/$conns]:--} b=${rps[std/$sc/$conns]:--} c=${rps[python-sdk/$sc/$conns]:--}
      # shellcheck disable=SC2059
      printf "$f" "$sc" "$conns" "$a" "$b" "$c" "$(ratio "${a%!}" "${c%!}")" "$(ratio "${b%!}" "${c%!}")"
    done
  done
  echo
  local g='%-20s %12s %12s %12s %9s %9s\n' what
  # shellcheck disable=SC2059
  printf "$g" footprint smol std python-sdk 'smol/py' 'std/py'
  # shellcheck disable=SC2059
  printf "$g" -------------------- ------------ ------------ ------------ --------- ---------
  local -A shown=()
  local v label
  for what in idle peak cold; do
    for t in $COMPARE_TARGETS; do
      v=${foot[$what/$t]:--}
      if [[ $v =~ ^[0-9]+$ ]]; then
        if [[ $what == cold ]]; then shown[$t]=$(fmt_ms "$v"); else shown[$t]=$(fmt_mib "$v" | tr -d ' '); fi
      else
        shown[$t]=-; v=-
      fi
      shown[$t.raw]=$v
    done
    case $what in idle) label='idle RSS' ;; peak) label='peak RSS (load)' ;; cold) label='cold start ms' ;; esac
    # shellcheck disable=SC2059
    printf "$g" "$label" "${shown[smol]}" "${shown[std]}" "${shown[python-sdk]}" \
      "$(ratio "${shown[smol.raw]}" "${shown[python-sdk.raw]}")" "$(ratio "${shown[std.raw]}" "${shown[python-sdk.raw]}")"
  done
  # The peak is mostly the tasks `send` left in the store, and the targets stored very
  # different numbers of them: growth per task is the figure that compares.
  local -A tasks=() per=()
  for t in $COMPARE_TARGETS; do
    tasks[$t]=${SEND_REQS[$t]:--}
    per[$t]=-
    if [[ ${tasks[$t]} =~ ^[0-9]+$ && ${foot[idle/$t]:-} =~ ^[0-9]+$ && ${foot[peak/$t]:-} =~ ^[0-9]+$ ]] \
       && (( tasks[$t] > 0 )); then
      per[$t]=$(awk -v p="${foot[peak/$t]}" -v i="${foot[idle/$t]}" -v n="${tasks[$t]}" \
        'BEGIN { printf "%.2f", (p - i) / n }')
    fi
  done
  # shellcheck disable=SC2059
  printf "$g" "tasks (send reqs)" "${tasks[smol]}" "${tasks[std]}" "${tasks[python-sdk]}" - -
  # shellcheck disable=SC2059
  printf "$g" "KiB (peak-idle)/task" "${per[smol]}" "${per[std]}" "${per[python-sdk]}" \
    "$(ratio "${per[smol]}" "${per[python-sdk]}")" "$(ratio "${per[std]}" "${per[python-sdk]}")"
  echo
  echo "ratios = agentd / python-sdk: above 1 means agentd does more req/s, below 1 means agentd"
  echo "uses less memory or starts sooner. n/a = the scenario exercises an agentd extension the peer"
  echo "does not have; ! = that run had errors (see the flags above); - = not run or no figure."
  echo "send is not the same work on both sides: agentd (no agent configured) stores a task and"
  echo "rejects it; the peer runs its echo agent and keeps the completed task in memory."
  echo "(peak-idle)/task = RSS growth over the run / tasks its send runs created: an upper bound on"
  echo "what one stored task costs (the peak also holds connection buffers and allocator slack)."
}

main() {
  command -v curl >/dev/null || die "curl is required"
  command -v timeout >/dev/null || die "timeout (coreutils) is required"
  local sc
  PLAIN_SCENARIOS= RUN_EVENTS=0 RUN_TLS=0
  for sc in $BENCH_SCENARIOS; do
    if [[ $sc == events ]]; then RUN_EVENTS=1; continue; fi
    if [[ $sc == tls-storm ]]; then RUN_TLS=1; continue; fi
    declare -F "scenario_$sc" >/dev/null || die "unknown scenario '$sc'"
    PLAIN_SCENARIOS+="$sc "
  done
  ensure_wrk
  local t need_agentd=0
  for t in $BENCH_TARGETS; do
    case $t in
      smol|std|smol-memory|std-memory) need_agentd=1 ;;
      python-sdk) ensure_python_sdk ;;
      *) die "unknown target '$t' (known: smol std smol-memory std-memory python-sdk)" ;;
    esac
  done
  if (( need_agentd )); then build_agentd; fi
  for t in $BENCH_TARGETS; do bench_target "$t"; done
  print_report
  return "$FAILED"
}

main "$@"
