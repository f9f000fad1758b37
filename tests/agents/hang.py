#!/usr/bin/env python3
"""Test agent: starts a grandchild (`sleep`), reports its pid, and never answers."""
import json
import subprocess
import sys
import time

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "turn":
        grandchild = subprocess.Popen(["sleep", "1000"])
        note = {"type": "status", "task": msg["task"], "text": str(grandchild.pid)}
        print(json.dumps(note), flush=True)
        while True:  # ignores stdin from now on, cancels and shutdowns included
            time.sleep(1000)
