#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECONDS each (default 60); fails on a crash.
#
#   fuzz/run.sh                      # every target, 60 s each
#   fuzz/run.sh 600 http_connection  # one target, 10 minutes
#
# Stable Rust is enough: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags. The sanitizer
# is AddressSanitizer unless FUZZ_SANITIZER says otherwise (`none` runs about twice as fast;
# agentd-core forbids unsafe code, ASan watches its dependencies' unsafe code). Extra
# libFuzzer flags can be given in FUZZ_FLAGS (e.g. FUZZ_FLAGS="-jobs=2 -workers=2").
#
# Before fuzzing, each target replays the reproducers in fuzz/regressions/<target>/, so a
# crash once found fails this script until it is fixed.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

seconds="${1:-60}"
shift || true
sanitizer="${FUZZ_SANITIZER:-address}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

./seeds.sh

status=0
for target in "${targets[@]}"; do
    echo "=== $target: building ($sanitizer)"
    cargo fuzz build --sanitizer "$sanitizer" "$target"

    if compgen -G "regressions/$target/*" >/dev/null; then
        echo "=== $target: replaying regressions/$target/"
        if ! cargo fuzz run --sanitizer "$sanitizer" "$target" regressions/"$target"/* -- -runs=1; then
            echo "=== $target: a saved regression still fails" >&2
            status=1
            continue
        fi
    fi

    echo "=== $target: fuzzing for ${seconds}s"
    mkdir -p "corpus/$target"
    # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags.
    if ! cargo fuzz run --sanitizer "$sanitizer" "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 ${FUZZ_FLAGS:-}; then
        echo "=== $target: crashed; the input is in fuzz/artifacts/$target/" >&2
        status=1
    fi
done
exit "$status"
