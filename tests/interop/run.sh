#!/usr/bin/env bash
# Runs the A2A SDK interop suite against an agentd binary.
#
#   tests/interop/run.sh [--driver std|smol] <path-to-agentd> [-- <pytest args>]
#
# Starts the binary on a free loopback port with a throwaway config
# (`[a2a] listen = ["tcp://127.0.0.1:PORT"]`), waits
# for its agent card (up to 10 s), runs pytest with AGENTD_URL set, and
# always stops the daemon. Exits with pytest's status; "no tests ran"
# (pytest's 5) counts as a failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
    echo "usage: $0 [--driver std|smol] <path-to-agentd> [-- <pytest args>]" >&2
    exit 2
}

driver=""
bin=""
pytest_args=()
while (($#)); do
    case "$1" in
    --driver)
        (($# >= 2)) || usage
        driver="$2"
        shift 2
        ;;
    --driver=*)
        driver="${1#--driver=}"
        shift
        ;;
    --)
        shift
        pytest_args=("$@")
        break
        ;;
    -h | --help) usage ;;
    -*)
        echo "unknown option: $1" >&2
        usage
        ;;
    *)
        [[ -z "$bin" ]] || usage
        bin="$1"
        shift
        ;;
    esac
done
[[ -n "$bin" ]] || usage
case "$driver" in "" | std | smol) ;; *)
    echo "--driver must be std or smol, not '$driver'" >&2
    exit 2
    ;;
esac
if [[ "$bin" != */* ]]; then
    bin="$(command -v -- "$bin" || true)"
fi
[[ -n "$bin" && -x "$bin" ]] || {
    echo "not an executable: ${bin:-$1}" >&2
    exit 2
}
bin="$(cd "$(dirname -- "$bin")" && pwd)/$(basename -- "$bin")"

venv="$("$here/setup.sh")"
py="$venv/bin/python"

work="$(mktemp -d "${TMPDIR:-/tmp}/agentd-interop.XXXXXX")"
daemon_pid=""
cleanup() {
    local status=$?
    if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$daemon_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    rm -rf -- "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

show_log() {
    echo "---- agentd output (last 50 lines) ----" >&2
    tail -n 50 "$work/agentd.log" >&2 || true
    echo "---------------------------------------" >&2
}

# A free port: bind 0, read it back, release it. Another process could take
# it before agentd binds; agentd then exits and we say so below.
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
url="http://127.0.0.1:$port/"
# The listener lives in the [a2a] section (src/config.rs; unknown top-level
# keys are refused). No [agent] section: the suite expects the agentless
# behaviour (every turn REJECTED). One workflow, whose start declares the
# `interop.start` command and whose human step gates its task.
printf '[a2a]\nlisten = ["tcp://127.0.0.1:%s"]\n' "$port" >"$work/agentd.toml"
# Its own data dir: the two drivers' runs may overlap, and nothing lands in ~/.local/state.
printf '\n[store]\ndir = "%s/data"\n' "$work" >>"$work/agentd.toml"
cat >>"$work/agentd.toml" <<'TOML'

[[workflows]]
name = "interop"

[[workflows.steps]]
id = "start"
kind = "a2a"
command = "interop.start"
roles = ["operator", "user"]
schema = { type = "object", properties = { ticket = { type = "integer" } }, required = ["ticket"], additionalProperties = false }

[[workflows.steps]]
id = "ask"
kind = "human"
prompt = "Approve ticket {{inputs.ticket}}?"
schema = { type = "object", properties = { approve = { type = "boolean" } }, required = ["approve"] }

[[workflows.steps]]
id = "report"
kind = "exec"
program = "/bin/echo"
args = ['{"ticket": {{inputs.ticket}}, "approved": {{steps.ask.output.approve}}}']
TOML

cmd=("$bin")
[[ -z "$driver" ]] || cmd+=(--driver "$driver")
cmd+=(--config "$work/agentd.toml")
echo "interop: starting ${cmd[*]}" >&2
"${cmd[@]}" >"$work/agentd.log" 2>&1 </dev/null &
daemon_pid=$!

# Readiness is the card answering 200, whatever the daemon prints. One
# poller with a real 10 s deadline; it also notices the daemon dying (or
# lingering as a zombie) so a crash is reported at once.
set +e
"$py" - "$url" "$daemon_pid" <<'EOF'
import sys, time, urllib.request
url, pid = sys.argv[1] + ".well-known/agent-card.json", sys.argv[2]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy

def alive():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    if not alive():
        sys.exit(3)
    try:
        with opener.open(url, timeout=1) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.05)
sys.exit(1)
EOF
wait_status=$?
set -e
case "$wait_status" in
0) ;;
3)
    echo "interop: agentd exited before it served its card" >&2
    show_log
    exit 1
    ;;
*)
    echo "interop: agentd did not serve its card at $url within 10 s" >&2
    show_log
    exit 1
    ;;
esac
echo "interop: agentd is up at $url" >&2

set +e
AGENTD_URL="$url" PYTHONDONTWRITEBYTECODE=1 \
    "$py" -m pytest -c "$here/pytest.ini" --rootdir "$here" "$here" "${pytest_args[@]}"
status=$?
set -e

if ((status == 5)); then
    echo "interop: pytest collected no tests; counting that as a failure" >&2
    status=1
fi
if ((status != 0)); then
    show_log
fi
exit "$status"
