"""Fake provider executable: records argv, cwd, env and stdin as JSON, then behaves as told by FAKE_* variables.

Installed by tests under a provider's name (``claude``, ``agent``...) in a directory prepended to PATH. Every
invocation is appended to ``$FAKE_RECORD_DIR/<name>.jsonl``; ``<name>.json`` holds the latest one (for codewith,
the latest that is not a control command). ``FAKE_SKIP_STDIN=1`` leaves stdin unread; ``FAKE_SLEEP`` is how many
seconds it then stays silent (an agent thinking, or hung); ``FAKE_STDOUT`` is printed (``fake answer`` when unset:
an agent that answered; an agent run that prints nothing fails); ``FAKE_EXIT`` is the exit code.

As ``codewith``, it also plays a durable agent: ``… agent start`` prints ``{"agent": {"agentId": ...}}``;
``agent read <id>`` prints the next status of ``FAKE_CODEWITH_STATUSES`` (comma-separated, default
``completed``; the last one repeats) with ``FAKE_CODEWITH_REASON`` as its statusReason; ``agent logs`` and
``agent stop`` print small JSON objects.
"""

import json
import os
import sys

name = os.path.basename(sys.argv[0])
argv = sys.argv[1:]
stdin_path = os.readlink("/proc/self/fd/0") if os.path.exists("/proc/self/fd/0") else ""
stdin = "" if os.environ.get("FAKE_SKIP_STDIN") == "1" else sys.stdin.read()
record = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "stdin": stdin, "stdinPath": stdin_path}

control = None
options = argv[: argv.index("--")] if "--" in argv else argv
if name == "codewith":
    for index in range(len(options) - 1):
        if options[index] == "agent" and options[index + 1] in ("start", "read", "logs", "stop"):
            control = options[index + 1]
            break

record_dir = os.environ.get("FAKE_RECORD_DIR")
if record_dir:
    with open(os.path.join(record_dir, name + ".jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    if control in (None, "start"):
        with open(os.path.join(record_dir, name + ".json"), "w", encoding="utf-8") as fh:
            json.dump(record, fh)

if control is not None:
    agent_id = os.environ.get("FAKE_AGENT_ID", "agent-1")
    if control == "start":
        print(json.dumps({"agent": {"agentId": agent_id, "status": "running"}, "created": True}))
    elif control == "read":
        state_path = os.path.join(record_dir or ".", "codewith-reads")
        reads = 0
        if os.path.exists(state_path):
            with open(state_path) as fh:
                reads = int(fh.read())
        with open(state_path, "w") as fh:
            fh.write(str(reads + 1))
        statuses = os.environ.get("FAKE_CODEWITH_STATUSES", "completed").split(",")
        status = statuses[min(reads, len(statuses) - 1)]
        agent = {"agentId": argv[-1], "status": status}
        if os.environ.get("FAKE_CODEWITH_REASON"):
            agent["statusReason"] = os.environ["FAKE_CODEWITH_REASON"]
        print(json.dumps({"agent": agent}))
    elif control == "logs":
        print(json.dumps({"data": [{"seq": 1, "eventType": "turn_completed", "createdAt": 1}]}))
    else:
        print("{}")
    sys.exit(0)

if os.environ.get("FAKE_SLEEP"):
    import time

    time.sleep(float(os.environ["FAKE_SLEEP"]))
sys.stdout.write(os.environ.get("FAKE_STDOUT", "fake answer\n"))
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
