#!/usr/bin/env python3
"""Test agent: answers a turn with a single line far longer than any sane limit."""
import json
import sys

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "turn":
        reply = {"type": "reply", "task": msg["task"], "text": "x" * 200_000}
        print(json.dumps(reply), flush=True)
