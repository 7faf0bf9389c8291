"""Fake provider executable: records argv, cwd, env and stdin as JSON, then behaves as told by FAKE_* variables.

Installed by tests under a provider's name (``claude``, ``agent``...) in a directory prepended to PATH. Every
invocation is appended to ``$FAKE_RECORD_DIR/<name>.jsonl``; ``<name>.json`` holds the latest one.
``FAKE_SKIP_STDIN=1`` leaves stdin unread; ``FAKE_SLEEP`` is how many seconds it then stays silent (an agent
thinking, or hung: a run to cancel or to time out); ``FAKE_STDOUT`` (or the file ``FAKE_STDOUT_FILE``) is printed,
``fake answer`` when unset (an agent that answered; an agent run that prints nothing fails), and as ``codewith
exec`` the JSON events of a turn that completed (``CODEWITH_DONE``); ``FAKE_EXIT`` is the exit code.

``FAKE_STDOUT_FILE`` names a file whose bytes are printed instead (a long ``codewith exec --json`` event stream, say);
``FAKE_SLEEP`` seconds are slept after printing (a run to cancel or to time out).
"""

import json
import os
import sys
import time

CODEWITH_DONE = "".join(json.dumps(event) + "\n" for event in (
    {"type": "thread.started", "thread_id": "thread-1"},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "done"}},
    {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 2}},
))

name = os.path.basename(sys.argv[0])
argv = sys.argv[1:]
stdin_path = os.readlink("/proc/self/fd/0") if os.path.exists("/proc/self/fd/0") else ""
stdin = "" if os.environ.get("FAKE_SKIP_STDIN") == "1" else sys.stdin.read()
record = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "stdin": stdin, "stdinPath": stdin_path}

record_dir = os.environ.get("FAKE_RECORD_DIR")
if record_dir:
    with open(os.path.join(record_dir, name + ".jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    with open(os.path.join(record_dir, name + ".json"), "w", encoding="utf-8") as fh:
        json.dump(record, fh)

if os.environ.get("FAKE_SLEEP"):
    time.sleep(float(os.environ["FAKE_SLEEP"]))
if os.environ.get("FAKE_STDOUT_FILE"):
    with open(os.environ["FAKE_STDOUT_FILE"], "rb") as fh:
        sys.stdout.buffer.write(fh.read())
elif name == "codewith" and "exec" in argv:
    sys.stdout.write(os.environ.get("FAKE_STDOUT", CODEWITH_DONE))
else:
    sys.stdout.write(os.environ.get("FAKE_STDOUT", "fake answer\n"))
sys.stdout.flush()
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
