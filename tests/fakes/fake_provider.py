"""Fake provider executable: records argv, cwd, env and stdin as JSON, then behaves as told by FAKE_* variables.

Installed by tests under a provider's name (``claude``, ``cursor-agent``...) in a directory prepended to PATH.
The record goes to ``$FAKE_RECORD_DIR/<name>.json``. ``FAKE_SKIP_STDIN=1`` leaves stdin unread;
``FAKE_STDOUT`` is printed; ``FAKE_EXIT`` is the exit code.
"""

import json
import os
import sys

name = os.path.basename(sys.argv[0])
stdin_path = os.readlink("/proc/self/fd/0") if os.path.exists("/proc/self/fd/0") else ""
stdin = "" if os.environ.get("FAKE_SKIP_STDIN") == "1" else sys.stdin.read()
record = {
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "env": dict(os.environ),
    "stdin": stdin,
    "stdinPath": stdin_path,
}
record_dir = os.environ.get("FAKE_RECORD_DIR")
if record_dir:
    with open(os.path.join(record_dir, name + ".json"), "w", encoding="utf-8") as fh:
        json.dump(record, fh)
sys.stdout.write(os.environ.get("FAKE_STDOUT", ""))
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
