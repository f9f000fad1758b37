#!/usr/bin/env bash
# Two agentd instances: the front delegates a workflow step to the worker over a unix
# socket. Run from the repository root: bash examples/delegation/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --quiet
bin=target/release/agentd
mkdir -p /tmp/agentd-example && chmod 700 /tmp/agentd-example
$bin --config examples/delegation/worker.toml >/tmp/agentd-example/worker.log 2>&1 & worker=$!
$bin --config examples/delegation/front.toml >/tmp/agentd-example/front.log 2>&1 & front=$!
trap 'kill $front $worker 2>/dev/null; wait 2>/dev/null' EXIT
until curl -sf http://127.0.0.1:8420/.well-known/agent-card.json >/dev/null; do sleep 0.1; done
until [ -S /tmp/agentd-example/worker.sock ]; do sleep 0.1; done

rpc() {  # rpc '<json-rpc body>' [extension]
    curl -s http://127.0.0.1:8420/ -H 'content-type: application/json' -H 'A2A-Version: 1.0' \
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
