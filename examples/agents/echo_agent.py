#!/usr/bin/env python3
"""An example agentd agent: echoes each turn back. Stdlib only.

agentd writes one JSON object per line on our stdin (turn, cancel, shutdown) and reads
one per line from our stdout (status, artifact, reply, ask, fail, log). The protocol is
docs/agent-protocol.md. stdout is the protocol channel: diagnostics go to stderr, which
agentd logs.
"""
import json
import sys

# The answer a confirmation asks for: a JSON Schema agentd publishes with the question.
APPROVAL = {
    "type": "object",
    "properties": {"approve": {"type": "boolean"}},
    "required": ["approve"],
}


def send(**msg):
    # One line per message, flushed at once: agentd waits for the newline.
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def approved(turn):
    """Reads the answer to our ask: a data part {"approve": bool}, or a yes/no text."""
    for part in turn.get("parts", []):
        if isinstance(part.get("data"), dict) and "approve" in part["data"]:
            return part["data"]["approve"] is True
    return turn.get("text", "").strip().lower() in ("yes", "y", "approve", "true")


asked = {}  # task id -> the text we asked to confirm

for line in sys.stdin:
    msg = json.loads(line)
    kind, task = msg.get("type"), msg.get("task")
    if kind == "shutdown":
        break
    if kind == "cancel":
        asked.pop(task, None)
        continue
    if kind != "turn":
        continue  # unknown messages are ignored, so agentd may add new ones
    text = msg.get("text", "")
    if task in asked:
        # The continuation of a task we asked about: the same task id, a new turn.
        what = asked.pop(task)
        verdict = "confirmed" if approved(msg) else "not confirmed"
        send(type="reply", task=task, text=f"{verdict}: {what}")
    elif text.lower().startswith("confirm"):
        asked[task] = text
        send(type="ask", task=task, text=f"Approve {text!r}?", schema=APPROVAL)
    else:
        send(type="status", task=task, text="echoing")
        send(type="artifact", task=task, name="echo", text=text, last=True)
        send(type="reply", task=task, text=f"echo: {text}")
print("echo agent: stdin closed, bye", file=sys.stderr)
