#!/usr/bin/env python3
"""Test agent: a turn "N SIZE" answers with N artifacts of SIZE bytes each, then a reply."""
import json
import sys

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") != "turn":
        continue
    count, size = (int(x) for x in msg.get("text", "1 10").split())
    for i in range(count):
        out = {"type": "artifact", "task": msg["task"], "name": f"part-{i}", "text": "x" * size, "last": True}
        print(json.dumps(out), flush=True)
    print(json.dumps({"type": "reply", "task": msg["task"], "text": f"sent {count}"}), flush=True)
