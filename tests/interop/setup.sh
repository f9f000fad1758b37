#!/usr/bin/env bash
# Creates (or reuses) the Python venv for the interop suite and prints its
# path on stdout; everything else goes to stderr, so callers can do
#   VENV="$(tests/interop/setup.sh)"
#
# Idempotent: the install is skipped while the stamp inside the venv matches
# the hash of requirements.txt plus the interpreter version. Needs only
# python3 (3.11) and network access to PyPI.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${AGENTD_INTEROP_VENV:-$repo/target/interop-venv}"
req="$here/requirements.txt"
# More requirements on top (the SDK's server for the client CLI's tests), and the modules
# whose import proves the venv whole.
extra="${AGENTD_INTEROP_EXTRA_REQUIREMENTS:-}"
check="${AGENTD_INTEROP_CHECK:-a2a.client, pytest, httpx, prometheus_client}"
python="${PYTHON:-python3}"

log() { printf 'interop setup: %s\n' "$*" >&2; }

command -v "$python" >/dev/null 2>&1 || { log "$python not found"; exit 1; }

# cargo test runs the suite for both drivers at once: one builder at a time.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

# The stamp covers the interpreter too: a venv made by another python3
# (say after an upgrade) has stale compiled wheels and must be rebuilt.
want="$(
    {
        cat "$req" ${extra:+"$extra"}
        "$python" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
)"
stamp="$venv/.interop-requirements.sha256"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
    "$venv/bin/python" -c "import $check" >/dev/null 2>&1; then
    log "venv up to date"
    printf '%s\n' "$venv"
    exit 0
fi

# Only ever delete something that is recognisably a venv: the path may come
# from the environment.
if [[ -e "$venv" ]]; then
    if [[ -f "$venv/pyvenv.cfg" ]]; then
        log "rebuilding venv at $venv"
        rm -rf -- "$venv"
    else
        log "$venv exists and is not a venv; refusing to touch it"
        exit 1
    fi
fi

mkdir -p -- "$(dirname -- "$venv")"
if "$python" -m venv "$venv" >&2; then
    pip=("$venv/bin/python" -m pip)
else
    # Debian's python3 without python3-venv has no ensurepip. Fall back to a
    # bare venv filled by the interpreter's own pip (pip >= 22.3 knows
    # --python), which needs nothing but PyPI.
    rm -rf -- "$venv"
    if ! "$python" -m pip --version >/dev/null 2>&1; then
        log "python3 -m venv failed and python3 has no pip: install python3-venv or python3-pip"
        exit 1
    fi
    log "ensurepip unavailable; using the interpreter's pip with --python"
    "$python" -m venv --without-pip "$venv" >&2
    pip=("$python" -m pip --python "$venv/bin/python")
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
"${pip[@]}" install --quiet --requirement "$req" ${extra:+--requirement "$extra"} >&2
"$venv/bin/python" -c "import $check" >&2

printf '%s\n' "$want" >"$stamp"
log "installed into $venv"
printf '%s\n' "$venv"
