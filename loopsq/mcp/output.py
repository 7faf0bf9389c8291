"""Run output for agents: ``run_logs`` (the tail of a loop run's or a workflow step's stdout and stderr) and the
short tail that progress notifications carry.

While a run or step is running its output comes from the bounded live window in Redis (what ``loopsq logs -f``
follows); once it ended, from its record (Redis, else the mirror's archive). Output is shown in full here, as
``loopsq logs`` shows it: asking for a run's logs is asking for its output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopsq.domain import limits
from loopsq.domain.text import shown
from loopsq.errors import NotFoundError
from loopsq.mcp import schemas as s
from loopsq.mcp.context import McpContext
from loopsq.mcp.registry import Call, Tool, in_thread
from loopsq.mirror import queries
from loopsq.state.runs import RunStore
from loopsq.state.workflow_runs import WorkflowRunStore

DEFAULT_TAIL_CHARS = 8000
MAX_TAIL_CHARS = 262_144
#: How much output a progress notification carries.
PROGRESS_TAIL_CHARS = 500
STREAMS = ("stdout", "stderr")


def live_window(ctx: McpContext, run_id: str, step_id: str | None = None) -> tuple[dict[str, str], str]:
    """The live window of a running run (or step): each stream's text, and both interleaved as written."""
    chunks: dict[str, bytes] = dict.fromkeys(STREAMS, b"")
    both = b""
    entries: Any = ctx.raw().xrange(ctx.keys.live(run_id, step_id))  # bytes in, bytes out (a raw client)
    for _entry_id, fields in entries:
        stream = fields.get(b"s", b"").decode()
        if stream in chunks:
            data = fields.get(b"d", b"")
            chunks[stream] += data
            both += data
    return ({name: data.decode("utf-8", errors="replace") for name, data in chunks.items()},
            both.decode("utf-8", errors="replace"))


def progress_tail(ctx: McpContext, run_id: str, step_id: str | None = None) -> str:
    """The last ``PROGRESS_TAIL_CHARS`` characters a running run (or step) printed, stdout and stderr as they came."""
    return live_window(ctx, run_id, step_id)[1][-PROGRESS_TAIL_CHARS:]


def _tails(ctx: McpContext, record: Mapping[str, Any], run_id: str, step_id: str | None,
           chars: int) -> dict[str, Any]:
    running = record.get("status") == "running"
    texts = live_window(ctx, run_id, step_id)[0] if running else {
        name: str(record.get(name) or "") for name in STREAMS}
    out: dict[str, Any] = {"status": record.get("status"), "source": "live" if running else "record"}
    for name in STREAMS:
        out[name] = texts[name][-chars:]
    out["omittedChars"] = {name: max(0, len(texts[name]) - chars) for name in STREAMS}
    return out


def _workflow_logs(ctx: McpContext, run: Mapping[str, Any], steps: list[dict[str, Any]], step_id: str | None,
                   chars: int) -> dict[str, Any]:
    run_id = str(run["id"])
    if step_id is not None:
        steps = [step for step in steps if step.get("stepId") == step_id]
        if not steps:
            raise NotFoundError(f"workflow step not found: {shown(run_id)}/{shown(step_id)}")
    return {"runId": run_id, "kind": "workflowRun", "status": run.get("status"),
            "steps": [{"stepId": step["stepId"], **_tails(ctx, step, run_id, str(step["stepId"]), chars)}
                      for step in steps]}


def run_logs(call: Call) -> dict[str, Any]:
    ctx, args = call.ctx, call.args
    run_id, step_id, chars = args["runId"], args.get("stepId"), args.get("maxChars", DEFAULT_TAIL_CHARS)
    state = WorkflowRunStore(ctx.client, ctx.keys).load(run_id)
    if state is not None:
        return _workflow_logs(ctx, state.run, state.ordered_steps(), step_id, chars)
    run = RunStore(ctx.client, ctx.keys).get(run_id)
    record: dict[str, Any] | None = run.to_dict() if run is not None else None
    if record is None:  # past Redis's retention window: the mirror's archive
        with ctx.mirror() as conn:
            archived = queries.get_workflow_run(conn, run_id)
            if archived is not None:
                return _workflow_logs(ctx, archived, queries.list_step_runs(conn, run_id), step_id, chars)
            record = queries.get_run(conn, run_id)
    if record is None:
        raise NotFoundError(f"run not found: {shown(run_id)}")
    if step_id is not None:
        raise NotFoundError(f"workflow step not found: {shown(run_id)}/{shown(step_id)}")
    return {"runId": run_id, "kind": "loopRun", **_tails(ctx, record, run_id, None, chars)}


TOOLS = (
    Tool("run_logs", "The tail of a loop run's output, or of a workflow run's steps' (one step with stepId): live "
         "while it runs, from its record once it ended. Output is shown, as `loopsq logs` shows it.",
         s.obj({"runId": s.RUN_ID, "stepId": s.string("A workflow step's id (workflow runs only).",
                                                         limits.MAX_STEP_ID_LENGTH),
                "maxChars": s.integer("At most this many trailing characters per stream.", 1, MAX_TAIL_CHARS,
                                      default=DEFAULT_TAIL_CHARS)}, ("runId",)),
         in_thread(run_logs)),
)
