#!/usr/bin/env python3
"""A test agent that answers each turn with the trace context its turn line carried:
{"traceparent": ..., "tracestate": ...} as a data reply (null where the line had none)."""
import json
import sys

for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "shutdown":
        break
    if msg.get("type") != "turn":
        continue
    data = {"traceparent": msg.get("traceparent"), "tracestate": msg.get("tracestate")}
    sys.stdout.write(json.dumps({"type": "reply", "task": msg["task"], "data": data}) + "\n")
    sys.stdout.flush()
