#!/usr/bin/env bash
# Two agentd instances: the front delegates a workflow step to the worker over a unix
# socket. Run from anywhere: bash examples/delegation/run.sh
#
# Everything lives in a fresh temporary directory (sockets, journals, logs) that is removed
# at the end, and the front listens on a free loopback port: nothing else on the machine is
# touched, and a daemon already on port 8420 does not matter.
set -euo pipefail
cd "$(dirname "$0")/../.."
# AGENTD_BIN runs another build of agentd (the tests run this script with theirs).
if [ -n "${AGENTD_BIN:-}" ]; then
    bin="$AGENTD_BIN"
else
    cargo build --release --quiet --bin agentd
    bin="$PWD/target/release/agentd"
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/agentd-example.XXXXXX")"
front="" worker=""
cleanup() {
    for pid in $front $worker; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf -- "$work"
}
trap cleanup EXIT

# The configs name /tmp/agentd-example; this run uses its own directory instead.
for name in front worker; do
    sed "s#/tmp/agentd-example#$work#g" "examples/delegation/$name.toml" >"$work/$name.toml"
done
"$bin" --config "$work/worker.toml" --listen "unix://$work/worker.sock" \
    >"$work/worker.out" 2>"$work/worker.log" &
worker=$!
"$bin" --config "$work/front.toml" --listen tcp://127.0.0.1:0 \
    >"$work/front.out" 2>"$work/front.log" &
front=$!

# Each daemon prints `listening <url>` once it serves.
url=""
for _ in $(seq 100); do
    url="$(sed -n 's/^listening \(http:.*\)/\1/p' "$work/front.out")"
    [ -n "$url" ] && [ -S "$work/worker.sock" ] && break
    sleep 0.1
done
if [ -z "$url" ] || [ ! -S "$work/worker.sock" ]; then
    echo "the daemons did not start; their logs:" >&2
    cat "$work/front.log" "$work/worker.log" >&2
    exit 1
fi

rpc() {  # rpc '<json-rpc body>' [extension]
    curl -s "$url" -H 'content-type: application/json' -H 'A2A-Version: 1.0' \
        ${2:+-H "A2A-Extensions: $2"} -d "$1"
}
echo "== ship.start: the build runs on the worker, then the run waits for a person"
answer=$(rpc '{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER",
  "messageId":"m-1","extensions":["https://agentd.dev/a2a/ext/command"],
  "parts":[{"data":{"agentd":{"op":"ship.start","target":"app"}}}]}}}' https://agentd.dev/a2a/ext/command)
echo "$answer" | python3 -c 'import json,sys; t=json.load(sys.stdin)["result"]["task"]; print(t["status"]["state"], "-", t["status"]["message"]["parts"][0]["text"])'
task=$(echo "$answer" | python3 -c 'import json,sys; print(json.load(sys.stdin)["result"]["task"]["id"])')
echo "== the answer continues the same task"
rpc '{"jsonrpc":"2.0","id":2,"method":"SendMessage","params":{"message":{"role":"ROLE_USER",
  "messageId":"m-2","taskId":"'"$task"'","parts":[{"data":{"approve":true}}]}}}' |
    python3 -c 'import json,sys; t=json.load(sys.stdin)["result"]["task"]; print(t["status"]["state"], "-", [a["parts"][0] for a in t["artifacts"]])'
