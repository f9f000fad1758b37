#!/usr/bin/env bash
# Load and footprint benchmark for agentd. See bench/README.md.
#
#   bench/run.sh                       # build, bench both drivers, print the table
#   BENCH_SECONDS=3 bench/run.sh       # shorter runs
#
# Shape: a *target* is one server process to measure (today: agentd with a given driver;
# later e.g. the Python SDK's reference server). A *scenario* is one wrk load against the
# running target. Both dispatch through small functions (start_target / scenario_<name>),
# so adding either means adding one function and one case.
set -euo pipefail

# ---------------------------------------------------------------------------------------------
# Knobs (environment)
# ---------------------------------------------------------------------------------------------
BENCH_SECONDS=${BENCH_SECONDS:-10}                    # wrk duration per run
BENCH_TARGETS=${BENCH_TARGETS:-"smol std"}            # agentd drivers (or other targets)
BENCH_SCENARIOS=${BENCH_SCENARIOS:-"card get-unknown status send"}  # `send` last: it grows state
BENCH_CONNS=${BENCH_CONNS:-"1 32"}                    # wrk connection counts
BENCH_SKIP_BUILD=${BENCH_SKIP_BUILD:-0}               # 1: use the existing binary as is
BENCH_START_TIMEOUT=${BENCH_START_TIMEOUT:-15}        # seconds to wait for the card to answer
BENCH_KEEP=${BENCH_KEEP:-0}                           # 1: keep the temp dir (configs, logs)

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$BENCH_DIR/.." && pwd)
LUA_DIR="$BENCH_DIR/lua"
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
# To add a peer (e.g. the Python SDK reference server), add a start_<peer> function that does
# the same and a case below; the scenarios and the table need no change.
# ---------------------------------------------------------------------------------------------
TARGET_PID= TARGET_URL= COLD_START_US=

start_target() {
  case $1 in
    smol|std) start_agentd "$1" ;;
    *) note "unknown target '$1'"; return 1 ;;
  esac
}

write_agentd_config() {  # port file
  if [[ -n $BENCH_CONFIG_TEMPLATE ]]; then
    sed "s/@PORT@/$1/g" "$BENCH_CONFIG_TEMPLATE" > "$2"
  else
    # Just a loopback listener: no agent, no auth (loopback without a mechanism is open).
    printf '[a2a]\nlisten = ["tcp://%s:%s"]\n' "$HOST" "$1" > "$2"
  fi
}

start_agentd() {  # driver
  local driver=$1 port cfg log
  port=$(free_port)
  cfg="$WORK/agentd-$driver.toml"
  log="$WORK/agentd-$driver.log"
  write_agentd_config "$port" "$cfg"
  # Keep the daemon's own state inside our temp dir, whatever its defaults are.
  mkdir -p "$WORK/state-$driver"

  local t0; t0=$(now_us)
  (cd "$WORK/state-$driver" && exec "$AGENTD_BIN" --driver "$driver" --config "$cfg") >"$log" 2>&1 &
  TARGET_PID=$!
  SPAWNED+=("$TARGET_PID")
  TARGET_URL="http://$HOST:$port"
  wait_ready "$TARGET_PID" "$TARGET_URL$CARD_PATH" "$t0" "$log"
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
scenario_card()        { run_wrk "$1" "$LUA_DIR/card.lua" "$CARD_PATH"; }
scenario_get-unknown() { run_wrk "$1" "$LUA_DIR/get-unknown.lua" /; }
scenario_status()      { run_wrk "$1" "$LUA_DIR/status.lua" /; }
scenario_send()        { run_wrk "$1" "$LUA_DIR/send.lua" /; }

RUN_SEQ=0
# Runs wrk against the current target and leaves its summary line in $WRK_RESULT (empty if
# wrk failed) and the peak RSS seen during the run in $RUN_PEAK_KB.
run_wrk() {  # conns script path
  local conns=$1 script=$2 path=$3 threads out sampler
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
        -s "$script" "$TARGET_URL$path" -- "r$RUN_SEQ-$$" >"$out" 2>&1 &
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

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
ROWS=()      # "target scenario conns rps p50 p99 errors flags"
FOOT=()      # "target idle_kb peak_kb cold_us status"
FAILED=0

bench_target() {  # target
  local t=$1 idle peak=0 sc conns r rps sock n2 un errs flags
  note "== $t"
  if ! start_target "$t"; then
    FOOT+=("$t - - - start-failed"); FAILED=1
    [[ -n $TARGET_PID ]] && stop_pid "$TARGET_PID"
    return 0
  fi
  idle=$(rss_kb "$TARGET_PID")

  for sc in $BENCH_SCENARIOS; do
    declare -F "scenario_$sc" >/dev/null || die "unknown scenario '$sc'"
    for conns in $BENCH_CONNS; do
      note "   $sc c=$conns (${BENCH_SECONDS}s)"
      "scenario_$sc" "$conns"
      (( RUN_PEAK_KB > peak )) && peak=$RUN_PEAK_KB
      r=$WRK_RESULT
      if [[ -z $r ]]; then
        ROWS+=("$t $sc $conns - - - - wrk-failed"); FAILED=1; continue
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
      ROWS+=("$t $sc $conns $rps $(fmt_ms "$(field "$r" p50_us)") $(fmt_ms "$(field "$r" p99_us)") $errs $flags")
    done
  done

  # A target that died under load is a finding, not a footnote.
  local status=ok
  kill -0 "$TARGET_PID" 2>/dev/null || { status="!died"; FAILED=1; }
  FOOT+=("$t $idle $peak $COLD_START_US $status")
  stop_pid "$TARGET_PID"
}

print_report() {
  local bin_size
  bin_size=$(stat -c %s "$AGENTD_BIN" 2>/dev/null || wc -c < "$AGENTD_BIN")
  echo
  echo "agentd bench — ${BENCH_SECONDS}s per run, wrk threads=min(2,conns), $(nproc 2>/dev/null || echo '?') cores, loopback"
  echo
  printf '%-8s %-12s %5s %10s %9s %9s %7s  %s\n' driver scenario conns 'req/s' 'p50 ms' 'p99 ms' errors flags
  printf '%-8s %-12s %5s %10s %9s %9s %7s  %s\n' -------- ------------ ----- ---------- --------- --------- ------- -----
  local row
  for row in "${ROWS[@]:+${ROWS[@]}}"; do
    # shellcheck disable=SC2086  # rows are space-separated fields by construction
    printf '%-8s %-12s %5s %10s %9s %9s %7s  %s\n' $row
  done
  echo
  printf '%-8s %12s %12s %14s  %s\n' driver 'idle RSS' 'peak RSS' 'cold start ms' status
  printf '%-8s %12s %12s %14s  %s\n' -------- ------------ ------------ -------------- ------
  local t idle peak cold st
  for row in "${FOOT[@]:+${FOOT[@]}}"; do
    read -r t idle peak cold st <<<"$row"
    if [[ $idle == - ]]; then
      printf '%-8s %12s %12s %14s  %s\n' "$t" - - - "$st"
    else
      printf '%-8s %12s %12s %14s  %s\n' "$t" "$(fmt_mib "$idle")" "$(fmt_mib "$peak")" "$(fmt_ms "$cold")" "$st"
    fi
  done
  echo
  echo "binary: $AGENTD_BIN  $bin_size bytes ($(fmt_mib $(( bin_size / 1024 ))))"
  echo "errors = socket errors (connect/read/write/timeout) + non-2xx + bodies without the expected marker"
}

main() {
  command -v curl >/dev/null || die "curl is required"
  command -v timeout >/dev/null || die "timeout (coreutils) is required"
  ensure_wrk
  build_agentd
  local t
  for t in $BENCH_TARGETS; do bench_target "$t"; done
  print_report
  return "$FAILED"
}

main "$@"
