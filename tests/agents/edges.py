#!/usr/bin/env python3
"""Test agent: answers at the edges of the stdout line rules, with a limit of 512 bytes.
The turn's text picks the edge: `exact`, a reply line of exactly 512 bytes before its
newline (the last of them a `\r`), written in two pieces; `over`, a reply line of 513
bytes; `eof`, a reply with no newline, then an exit."""
import json
import sys
import time

LIMIT = 512


def padded(task, n):
    """A reply line of exactly n bytes: spaces before its closing brace."""
    base = json.dumps({"type": "reply", "task": task, "text": "ok"})
    return base[:-1] + " " * (n - len(base)) + "}"


for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") != "turn":
        continue
    task, text, out = msg["task"], msg.get("text"), sys.stdout
    if text == "exact":
        body = padded(task, LIMIT - 1) + "\r"
        out.write(body[:100])
        out.flush()
        time.sleep(0.05)  # the reader sees the line in two reads
        out.write(body[100:] + "\n")
        out.flush()
    elif text == "over":
        out.write(padded(task, LIMIT + 1) + "\n")
        out.flush()
    elif text == "eof":
        out.write(json.dumps({"type": "reply", "task": task, "text": "last words"}))
        out.flush()
        sys.exit(0)
