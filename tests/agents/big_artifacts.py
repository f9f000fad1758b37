#!/usr/bin/env python3
"""Test agent: a turn "N SIZE" answers with N artifacts of SIZE bytes each, then a reply;
"N SIZE ask" asks a question instead of replying, so the task stays live (input-required)."""
import json
import sys

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") != "turn":
        continue
    words = msg.get("text", "1 10").split()
    count, size = int(words[0]), int(words[1])
    for i in range(count):
        out = {"type": "artifact", "task": msg["task"], "name": f"part-{i}", "text": "x" * size, "last": True}
        print(json.dumps(out), flush=True)
    if words[2:] == ["ask"]:
        print(json.dumps({"type": "ask", "task": msg["task"], "text": f"sent {count}; more?"}), flush=True)
    else:
        print(json.dumps({"type": "reply", "task": msg["task"], "text": f"sent {count}"}), flush=True)
