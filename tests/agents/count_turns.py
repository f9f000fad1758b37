#!/usr/bin/env python3
"""A test agent that answers each turn at once and appends its task id to the file named by
its first argument, one line per turn: a test counts the turns it was given."""
import json
import sys

log = sys.argv[1]
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "shutdown":
        break
    if msg.get("type") != "turn":
        continue
    with open(log, "a") as f:
        f.write(msg["task"] + "\n")
    sys.stdout.write(json.dumps({"type": "reply", "task": msg["task"], "text": "done"}) + "\n")
    sys.stdout.flush()
