#!/usr/bin/env python3
"""Test agent: answers a turn in three steps, waiting between them for gate files, so a test
can drop a stream midway and reconnect at a point it chooses. The turn's text is the gate
path prefix: it waits for `<text>.1`, then for `<text>.2`."""
import json
import os
import sys
import time


def send(**msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def wait(path):
    while not os.path.exists(path):
        time.sleep(0.02)


for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "shutdown":
        break
    if msg.get("type") != "turn":
        continue
    task, gate = msg["task"], msg.get("text", "")
    send(type="status", task=task, text="step 1")
    send(type="artifact", task=task, name="part-1", text="one", last=True)
    wait(gate + ".1")
    send(type="artifact", task=task, name="part-2", text="two", last=True)
    send(type="status", task=task, text="step 2")
    wait(gate + ".2")
    send(type="artifact", task=task, name="part-3", text="three", last=True)
    send(type="reply", task=task, text="done")
