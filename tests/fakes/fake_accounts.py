"""Fake OpenAccounts ``accounts`` CLI, driven by FAKE_ACCOUNTS_* variables of the env it is run with.

``accounts env <profile> --tool <tool>`` appends its argv as one JSON line to ``$FAKE_ACCOUNTS_LOG`` (when set),
prints ``$FAKE_ACCOUNTS_STDOUT`` to stdout and ``$FAKE_ACCOUNTS_STDERR`` to stderr, and exits with
``$FAKE_ACCOUNTS_EXIT`` (default 0). ``{profile}`` and ``{tool}`` in the stdout text are replaced.
"""

import json
import os
import sys

args = sys.argv[1:]
log = os.environ.get("FAKE_ACCOUNTS_LOG")
if log:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(args) + "\n")
profile = args[1] if len(args) > 1 else ""
tool = args[3] if len(args) > 3 else ""
out = os.environ.get("FAKE_ACCOUNTS_STDOUT", "")
sys.stdout.write(out.replace("{profile}", profile).replace("{tool}", tool))
sys.stderr.write(os.environ.get("FAKE_ACCOUNTS_STDERR", ""))
sys.exit(int(os.environ.get("FAKE_ACCOUNTS_EXIT", "0")))
