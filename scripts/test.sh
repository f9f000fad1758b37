#!/usr/bin/env bash
# The test command: installs what the tests need, runs every test target to the end, checks
# that nothing the suite started is left running, and prints one summary.
#
#   bash scripts/test.sh [extra cargo test arguments, e.g. a filter or -- --nocapture]
#
# Works on a fresh Debian machine with only Rust and Python 3 (as root, or with sudo for
# apt-get). Idempotent: a second run installs nothing. The full output is in target/test.log;
# the closing line is `N passed, N failed`, and the exit status is non-zero if anything failed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$repo"
mkdir -p target
log="$repo/target/test.log"
summary_file="$repo/target/test-summary.txt"
failures_file="$repo/target/test-failures.txt"
rm -f "$summary_file" "$failures_file"
# A step that stops the script says which one it was (set -e alone exits silently).
trap 'echo "scripts/test.sh: stopped at line $LINENO: $BASH_COMMAND" >&2' ERR

# An executable on PATH or in the system directories (a non-root PATH may lack the sbins).
have() {
    type -P "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ] || [ -x "/usr/sbin/$1" ] ||
        [ -x "/bin/$1" ] || [ -x "/sbin/$1" ]
}

echo "== system packages (Debian)"
# tests/e2e_browser.rs drives a headless chromium. tests/e2e_unix_peer.rs acts as another uid
# with util-linux's setpriv and runs /usr/bin/python3 (python3-minimal) as that uid; the
# interop venv setup locks with util-linux's flock; the full-disk tests mount a tmpfs in a
# mount namespace of the daemon's own with util-linux's unshare and mount's mount.
# tests/common signals daemons with the
# kill program (procps). tests/e2e_package.rs verifies the systemd unit with systemd-analyze
# (systemd; dpkg and dpkg-deb are essential). .ci/run's release start check asks for the card
# with curl. A python3
# without ensurepip or pip (Debian's, without python3-venv) cannot build the interop venv.
missing=()
have chromium || missing+=(chromium)
{ have setpriv && have flock && have unshare; } || missing+=(util-linux)
have mount || missing+=(mount)
have kill || missing+=(procps)
have curl || missing+=(curl)
have systemd-analyze || missing+=(systemd)
[ -x /usr/bin/python3 ] || missing+=(python3-minimal)
python3 -c 'import ensurepip' >/dev/null 2>&1 || python3 -m pip --version >/dev/null 2>&1 ||
    missing+=(python3-venv)
if [ "${#missing[@]}" -eq 0 ]; then
    echo "all present"
else
    # sudo only when not root; `env` carries DEBIAN_FRONTEND through sudo's env reset.
    as_root=(env DEBIAN_FRONTEND=noninteractive)
    [ "$(id -u)" -eq 0 ] || as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
    if ! have apt-get || { [ "$(id -u)" -ne 0 ] && ! have sudo; }; then
        # Not Debian, or no way to become root: go on, the tests that need these will say so.
        echo "cannot install ${missing[*]} (needs apt-get, as root or with sudo);" \
            "the tests that need them will fail" >&2
    else
        echo "installing: ${missing[*]}"
        "${as_root[@]}" apt-get update -qq
        "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

echo "== toolchain"
cargo --version
python3 --version
if have chromium; then chromium --version 2>/dev/null || true; fi

echo "== interop venv (a2a-sdk from PyPI)"
# The interop tests build it on demand too; doing it here makes an install failure show as
# an install failure, not as a test failure. It prints the venv's path on stdout.
venv="$(bash tests/interop/setup.sh)"
echo "$venv"

echo "== reference schemas (../shared/reference)"
# The published schemas the project's output is checked against live beside the repository,
# never in it. A clone elsewhere (git clone . /tmp/x) finds them through its origin.
shared=""
origin="$(git remote get-url origin 2>/dev/null || true)"
origin="${origin#file://}"
for candidate in "${AGENTD_SHARED:-}" "$repo/../shared" "${origin:+$origin/../shared}"; do
    if [ -n "$candidate" ] && [ -d "$candidate/reference" ]; then
        shared="$(cd "$candidate" && pwd -P)"
        break
    fi
done
if [ -n "$shared" ]; then
    echo "reference schemas: $shared/reference"
    export AGENTD_SHARED="$shared"
    export AGENTD_REFERENCE="$shared/reference/agentd"
    export AGENTD_A2A_SCHEMA="$shared/reference/a2a/a2a-v1.0.1.schema.json"
    # With the schemas present, an agreement check that cannot find them is a failure.
    export CI="${CI:-true}"
elif [ -n "${CI:-}" ]; then
    echo "reference schemas: not found (set AGENTD_SHARED, or put them in ../shared);" \
        "CI is set, so the reference-schema agreement checks will fail"
else
    echo "reference schemas: not found (set AGENTD_SHARED, or put them in ../shared);" \
        "the reference-schema agreement checks are skipped"
fi

# What the leftover check below looks for: this checkout's built binaries (the daemon, the
# test binaries), its test agents and the interop venv's python.
target_dir="$(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
patterns=("$target_dir/" "$repo/tests/agents/" "$venv/")
# Every process the suite starts inherits this marker (nothing in the tests clears the
# environment), so leftovers are found even when their command line names none of the above.
marker="AGENTD_TEST_RUN=$$.$(date +%s%N)"

# Prints "pid command line" for each process of this run still alive: those carrying the
# marker, and those matching a pattern that were not already running before the run.
suite_processes() {
    local dir pid cmd pattern
    for dir in /proc/[0-9]*; do
        pid="${dir#/proc/}"
        # (2>/dev/null first: it must also cover the redirection, for a process just gone)
        cmd="$(tr '\0' ' ' 2>/dev/null <"$dir/cmdline")" || continue
        [ -n "$cmd" ] || continue # kernel threads and zombies
        if grep -qzxF "$marker" "$dir/environ" 2>/dev/null; then
            echo "$pid $cmd"
            continue
        fi
        case " $before " in *" $pid "*) continue ;; esac
        for pattern in "${patterns[@]}"; do
            if [[ "$cmd" == *"$pattern"* ]]; then
                echo "$pid $cmd"
                break
            fi
        done
    done
}
before=""
before="$(suite_processes | cut -d' ' -f1 | tr '\n' ' ')"

echo "== cargo test --workspace --no-fail-fast (output in target/test.log)"
# --no-fail-fast: one failing target must not hide the results of the others.
cargo_status=0
env "$marker" cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log" ||
    cargo_status="${PIPESTATUS[0]}"

echo "== leftover processes"
# Give processes being stopped a moment to exit, then whatever remains was left behind.
for _ in $(seq 20); do
    leftovers="$(suite_processes)"
    [ -z "$leftovers" ] && break
    sleep 0.5
done
if [ -n "$leftovers" ]; then
    echo "the suite left these processes running (pid, command line):"
    echo "$leftovers" | sed 's/^/  /'
    echo "  stop them with: kill $(echo "$leftovers" | cut -d' ' -f1 | tr '\n' ' ')"
else
    echo "none"
fi

echo "== summary"
# Totals of every test binary's `test result:` line; failed tests by target; targets that
# failed without a failed test (a crash, a signal): cargo names those in "to rerun pass".
{
    read -r passed failed ignored crashed
    mapfile -t failures
} < <(awk '
    /^     Running / {
        label = $0; sub(/^     Running /, "", label); sub(/ \(.*$/, "", label)
        if (label ~ /^unittests /) {   # several crates have src/lib.rs: name the crate
            bin = $NF; sub(/^\(/, "", bin); sub(/-[0-9a-f]+\)$/, "", bin); sub(/.*\//, "", bin)
            label = bin " " label
        }
        seen = 0; target_failed = 0; next
    }
    /^   Doc-tests / { label = "doc-tests " $2; seen = 0; target_failed = 0; next }
    /^test result:/ { p += $4; f += $6; i += $8; seen = 1; target_failed = $6; next }
    /^test .* \.\.\. FAILED$/ {
        name = $0; sub(/^test /, "", name); sub(/ \.\.\. FAILED$/, "", name)
        out[++n] = "  " label ": " name; next
    }
    /^error: test failed, to rerun pass `/ {
        if (!seen || target_failed == 0) { c++; out[++n] = "  " label ": did not finish (crashed or killed; see target/test.log)" }
    }
    END { print p + 0, f + 0, i + 0, c + 0; for (k = 1; k <= n; k++) print out[k] }
' "$log")

# Every failure counts in the closing line, so `0 failed` always means a clean run.
failed=$((failed + crashed))
if [ "$cargo_status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failures+=("  cargo test exited with status $cargo_status without a failed test (a build error?)")
    failed=$((failed + 1))
fi
if [ -n "$leftovers" ]; then
    failures+=("  processes left running after the suite (listed above)")
    failed=$((failed + 1))
fi
if [ "${#failures[@]}" -gt 0 ]; then
    echo "failed:"
    printf '%s\n' "${failures[@]}" | tee "$failures_file" # .ci/run repeats them last
fi
echo "$ignored ignored (see target/test.log)"
line="$passed passed, $failed failed"
echo "$line" >"$summary_file" # read by .ci/run for its closing line
echo "$line"
if [ "$failed" -ne 0 ]; then exit 1; fi
