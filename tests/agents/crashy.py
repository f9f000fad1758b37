#!/usr/bin/env python3
"""Test agent: a turn whose text is "crash" makes it exit 3 mid-turn; others are answered."""
import json
import sys

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") != "turn":
        continue
    task = msg["task"]
    print(json.dumps({"type": "status", "task": task, "text": "working"}), flush=True)
    if msg["text"] == "crash":
        print("crashing on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    print(json.dumps({"type": "reply", "task": task, "text": "fine"}), flush=True)
