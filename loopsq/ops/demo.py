"""The ``loopsq up --demo`` example: a command loop every 10 s, a three-step workflow loop every 30 s, and a
steering loop: a fake agent that says ``no_op`` twice (asking for its next run 5 s later) and then ``done``, which
stops its loop."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine.routing import arm_created
from loopsq.engine.triggers import trigger_with
from loopsq.errors import ConflictError
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore

HELLO_LOOP = "demo-hello"
WORKFLOW = "demo-workflow"
WORKFLOW_LOOP = "demo-workflow-loop"
HELLO_COMMAND = "echo hello from loopsq"
HELLO_EVERY_MS = 10_000
WORKFLOW_EVERY_MS = 30_000
STEERING_LOOP = "demo-steering"
STEERING_EVERY_MS = 10_000
#: The fake agent: counts its runs in a file of its own, writes its outcome to $LOOPS_CONTROL_FILE.
STEERING_COMMAND = (
    'f="${TMPDIR:-/tmp}/loopsq-demo-steering-$LOOPS_LOOP_ID"; n=$(( $(cat "$f" 2>/dev/null || echo 0) + 1 )); '
    'echo $n > "$f"; if [ $n -lt 3 ]; then echo "fake agent: nothing to do (run $n)"; '
    'printf \'{"outcome":"no_op","nextIn":"5s","note":"nothing new (run %s)"}\' $n > "$LOOPS_CONTROL_FILE"; '
    'else echo "fake agent: all done"; rm -f "$f"; '
    'printf \'{"outcome":"done","note":"finished after %s runs"}\' $n > "$LOOPS_CONTROL_FILE"; fi'
)


def _command(cmd: str) -> dict[str, Any]:
    return {"type": "command", "command": cmd, "shell": True}


def workflow_spec() -> dict[str, Any]:
    """The demo workflow: fetch, then transform, then report (each step depends on the one before)."""
    return {
        "name": WORKFLOW,
        "description": "loopsq up --demo: three command steps in dependency order",
        "steps": [
            {"id": "fetch", "target": _command("echo fetched 3 items")},
            {"id": "transform", "dependsOn": ["fetch"], "target": _command("echo transformed 3 items")},
            {"id": "report", "dependsOn": ["transform"], "target": _command("echo 'report: 3 items, 0 errors'")},
        ],
    }


def _interval(every_ms: int) -> dict[str, Any]:
    return {"type": "interval", "everyMs": every_ms, "anchor": "fixed_rate"}


def create_demo(client: redis.Redis, now: datetime, keys: Keys | None = None) -> list[str]:
    """Create whichever of the demo loops and workflow is absent; returns one line per item saying what it did.

    A newly created ``demo-hello`` is also triggered at once. Existing items (by name) are left as they are, so
    running ``up --demo`` again changes nothing.
    """
    keys = keys or Keys()
    loops = LoopStore(client, keys)
    workflows = WorkflowStore(client, keys)
    said: list[str] = []

    def add_loop(body: dict[str, Any], what: str) -> bool:
        name = str(body["name"])
        if loops.find(name) is not None:
            said.append(f"demo: loop {name} exists; left as it is")
            return False
        try:
            loop = arm_created(loops.client, loops.keys, loops.create(new_loop(body, now)))
        except ConflictError:  # created meanwhile by someone else
            said.append(f"demo: loop {name} exists; left as it is")
            return False
        said.append(f"demo: created loop {name} ({what}) next={loop.next_run_at}")
        return True

    if add_loop({"name": HELLO_LOOP, "description": "loopsq up --demo: says hello every 10 s",
                 "schedule": _interval(HELLO_EVERY_MS), "target": _command(HELLO_COMMAND)},
                f"every 10s: {HELLO_COMMAND}"):
        # A first run right away (a worker takes it as soon as one is up), not only 10 s from now.
        run_id, _created = trigger_with(client, keys, HELLO_LOOP, None)
        said.append(f"demo: triggered run {run_id} of {HELLO_LOOP} now")

    spec = workflows.find(WORKFLOW)
    if spec is not None and spec.get("status") == "active":
        said.append(f"demo: workflow {WORKFLOW} exists; left as it is")
    else:
        try:
            spec = workflows.create(workflow_body_from_json(workflow_spec()), now)
            said.append(f"demo: created workflow {WORKFLOW} (steps fetch -> transform -> report)")
        except ConflictError:
            spec = workflows.require(WORKFLOW)
            said.append(f"demo: workflow {WORKFLOW} exists; left as it is")
    add_loop({"name": WORKFLOW_LOOP, "description": "loopsq up --demo: runs demo-workflow every 30 s",
              "schedule": _interval(WORKFLOW_EVERY_MS), "target": {"type": "workflow", "workflowId": spec["id"]}},
             f"every 30s: workflow {WORKFLOW}")
    add_loop({"name": STEERING_LOOP, "description": "loopsq up --demo: a fake agent that steers its own loop",
              "schedule": _interval(STEERING_EVERY_MS), "target": _command(STEERING_COMMAND), "steerable": True,
              "minIntervalMs": 2_000},
             "a fake agent: no_op twice, each asking for its next run in 5s, then done, which stops the loop")
    return said
