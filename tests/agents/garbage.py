#!/usr/bin/env python3
"""Test agent: before each answer it writes 3 lines that are not protocol, and a reply for a
task it was never given."""
import json
import sys

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") != "turn":
        continue
    print("hello, I am a debug print", flush=True)
    print("{not json", flush=True)
    print(json.dumps({"type": "bogus", "task": msg["task"]}), flush=True)
    print(json.dumps({"type": "reply", "task": "not-given", "text": "?"}), flush=True)
    print(json.dumps({"type": "reply", "task": msg["task"], "text": "after the noise"}), flush=True)
