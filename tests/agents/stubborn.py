#!/usr/bin/env python3
"""Test agent: answers every turn, but ignores shutdown and stdin's end, running on."""
import json
import sys
import time

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "turn":
        print(json.dumps({"type": "reply", "task": msg["task"], "text": "done"}), flush=True)
while True:
    time.sleep(1000)
