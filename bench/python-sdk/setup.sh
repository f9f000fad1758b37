#!/usr/bin/env bash
# Creates (or reuses) the venv of bench/run.sh's `python-sdk` target and prints its path on
# stdout; everything else goes to stderr:
#   VENV="$(bench/python-sdk/setup.sh)"
#
# Idempotent: the install is skipped while the stamp inside the venv matches the hash of
# requirements.txt + tests/interop/requirements.txt (its constraints) + the interpreter
# version. Needs python3 and PyPI (through pip), nothing else.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${BENCH_VENV:-$repo/target/bench-venv}"
req="$here/requirements.txt"
constraints="$repo/tests/interop/requirements.txt"
python="${PYTHON:-python3}"
check='import a2a.server.routes, a2a.server.request_handlers, uvicorn, uvloop, httptools, starlette, sse_starlette'

log() { printf 'bench venv: %s\n' "$*" >&2; }

command -v "$python" >/dev/null 2>&1 || { log "$python not found"; exit 1; }
[[ -f $constraints ]] || { log "missing $constraints"; exit 1; }

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

want="$(
  {
    cat "$req" "$constraints"
    "$python" -c 'import sys; print(sys.version)'
  } | sha256sum | cut -d' ' -f1
)"
stamp="$venv/.bench-requirements.sha256"

if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
  log "up to date ($venv)"
  printf '%s\n' "$venv"
  exit 0
fi

# Only ever delete something that is recognisably a venv: the path may come from the environment.
if [[ -e $venv ]]; then
  if [[ -f $venv/pyvenv.cfg ]]; then
    log "rebuilding $venv"
    rm -rf -- "$venv"
  else
    log "$venv exists and is not a venv; refusing to touch it"
    exit 1
  fi
fi

if "$python" -m venv "$venv" >&2; then
  pip=("$venv/bin/python" -m pip)
else
  # Debian's python3 without python3-venv has no ensurepip: a bare venv filled by the
  # interpreter's own pip (pip >= 22.3 knows --python).
  rm -rf -- "$venv"
  "$python" -m pip --version >/dev/null 2>&1 \
    || { log "python3 -m venv failed and python3 has no pip: install python3-venv or python3-pip"; exit 1; }
  log "ensurepip unavailable; using the interpreter's pip with --python"
  "$python" -m venv --without-pip "$venv" >&2
  pip=("$python" -m pip --python "$venv/bin/python")
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
log "installing into $venv (PyPI)"
"${pip[@]}" install --quiet --requirement "$req" --constraint "$constraints" >&2
"$venv/bin/python" -c "$check" >&2

printf '%s\n' "$want" >"$stamp"
log "installed into $venv"
printf '%s\n' "$venv"
