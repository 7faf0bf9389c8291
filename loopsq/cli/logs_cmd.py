"""``loopsq logs RUN [--step ID] [-f]``: the output of a loop run, a workflow run or one workflow step.

While a run or step runs, its output comes from the bounded live stream its worker writes (``engine/live.py``);
once it has ended, from its stored output (the record). A workflow run, or a workflow loop's run, prints every
step's output in step order, each line prefixed with the step's id; ``-f`` follows them all until the run ends,
and then exits as ``run-now`` does: 1 unless what it followed succeeded.
With ``--json`` every line is a JSON object ``{"runId", "stepId"?, "stream", "line"}``.

Output reaches the terminal neutralised: ESC and the other C0 controls but newline and tab, DEL and the C1 controls
are shown escaped (``\x1b``), so no escape sequence a target printed (OSC 52 writing the clipboard, say) acts.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from loopsq.cli.app import App, get_app, json_flag
from loopsq.domain.run_rules import TERMINAL
from loopsq.domain.text import json_terminal_safe, terminal_safe
from loopsq.engine import timers
from loopsq.errors import NotFoundError
from loopsq.mirror import queries
from loopsq.state import run_codec
from loopsq.state.workflow_run_state import WorkflowRunState
from loopsq.state.workflow_runs import WorkflowRunStore

#: How long one blocking read of the live streams waits (ms) before ``-f`` checks whether anything ended.
FOLLOW_BLOCK_MS = 1000
#: How long ``-f`` waits, once the output ended, for the run's final status (its exit code depends on it).
SETTLE_S = 10.0


@dataclass
class Source:
    """One stream of output: a loop run's, or a workflow step's (``step_id``)."""

    run_id: str
    step_id: str | None
    live_key: str
    #: (ended, stdout, stderr) as stored now.
    read: Callable[[], tuple[bool, str, str]]
    printed: bool = False
    last: bytes | str = "0-0"
    decoders: dict[str, Any] = field(default_factory=lambda: {
        name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")})


class Printer:
    """Writes chunks as they come: unchanged for a single source, line by line with a ``<step> | `` prefix for
    several, or as JSON lines."""

    def __init__(self, json_mode: bool, prefixed: bool) -> None:
        self.json_mode = json_mode
        self.prefixed = prefixed
        self._partial: dict[tuple[str, str | None, str], str] = {}

    def write(self, source: Source, stream: str, text: str) -> None:
        if not text:
            return
        source.printed = True
        if not (self.json_mode or self.prefixed):
            click.echo(terminal_safe(text), nl=False, err=stream == "stderr")
            return
        key = (source.run_id, source.step_id, stream)
        lines = (self._partial.pop(key, "") + text).split("\n")
        if lines[-1]:
            self._partial[key] = lines[-1]
        for line in lines[:-1]:
            self._line(source, stream, line)

    def end(self, source: Source, streams: tuple[str, ...] = ("stdout", "stderr")) -> None:
        """The source (or one of its streams) can print nothing more: a last line without its newline is printed
        too."""
        for stream in streams:
            rest = self._partial.pop((source.run_id, source.step_id, stream), None)
            if rest:
                self._line(source, stream, rest)

    def _line(self, source: Source, stream: str, line: str) -> None:
        if self.json_mode:
            row = {"runId": source.run_id, **({"stepId": source.step_id} if source.step_id else {}),
                   "stream": stream, "line": line}
            click.echo(json_terminal_safe(json.dumps(row, ensure_ascii=False)))
        else:
            click.echo(f"{source.step_id} | {terminal_safe(line)}", err=stream == "stderr")


def _step_source(app: App, store: WorkflowRunStore, run_id: str, step_id: str) -> Source:
    def read() -> tuple[bool, str, str]:
        state = store.load(run_id)
        step = state.steps.get(step_id, {}) if state else {}
        ended = state is None or state.terminal or step.get("status") not in ("pending", "running")
        return ended, str(step.get("stdout") or ""), str(step.get("stderr") or "")

    return Source(run_id, step_id, app.keys.live(run_id, step_id), read)


def _run_source(app: App, run_id: str) -> Source:
    def read() -> tuple[bool, str, str]:
        run = run_codec.load(app.client(), app.keys.run(run_id))
        if run is None:
            return True, "", ""
        return run.status != "running", run.stdout or "", run.stderr or ""

    return Source(run_id, None, app.keys.live(run_id), read)


def _workflow_of_loop_run(store: WorkflowRunStore, loop_run_id: str) -> WorkflowRunState | None:
    """The newest workflow run of a workflow loop's run (one per attempt), if it has any."""
    states = [s for s in (store.load(i) for i in store.for_loop_run(loop_run_id)) if s is not None]
    return max(states, key=lambda s: str(s.run.get("startedAt") or s.run.get("createdAt") or "")) if states else None


def resolve_sources(app: App, run_id: str, step_id: str | None) -> list[Source]:
    """What ``logs RUN [--step ID]`` prints: one source, or every step of a workflow run in step order.

    Raises:
        NotFoundError: ``run not found: <id>`` or ``workflow step not found: <run>/<step>``.
    """
    store = WorkflowRunStore(app.client(), app.keys)
    state = store.load(run_id)
    if state is None and app.client().exists(app.keys.run(run_id)):
        state = _workflow_of_loop_run(store, run_id)
        if state is None:
            if step_id is not None:
                raise NotFoundError(f"workflow step not found: {run_id}/{step_id}")
            return [_run_source(app, run_id)]
    if state is None:
        if app.client().exists(app.keys.live(run_id, step_id)):  # its record is gone, its live window not yet
            return [_run_source(app, run_id)] if step_id is None else [_step_source(app, store, run_id, step_id)]
        return _archived_sources(app, run_id, step_id)
    if step_id is not None:
        if step_id not in state.steps:
            raise NotFoundError(f"workflow step not found: {run_id}/{step_id}")
        return [_step_source(app, store, state.run_id, step_id)]
    return [_step_source(app, store, state.run_id, str(s["stepId"])) for s in state.ordered_steps()]


def _archived_sources(app: App, run_id: str, step_id: str | None) -> list[Source]:
    """A run past Redis's history window, from the mirror (the archive): it ended long ago.

    Raises:
        NotFoundError: ``run not found: <id>`` or ``workflow step not found: <run>/<step>``.
    """
    conn = app.mirror()

    def stored(row: dict[str, Any]) -> Callable[[], tuple[bool, str, str]]:
        return lambda: (True, str(row.get("stdout") or ""), str(row.get("stderr") or ""))

    if queries.get_workflow_run(conn, run_id) is not None:
        steps = queries.list_step_runs(conn, run_id)
        if step_id is not None:
            steps = [s for s in steps if s["stepId"] == step_id]
            if not steps:
                raise NotFoundError(f"workflow step not found: {run_id}/{step_id}")
        return [Source(run_id, str(s["stepId"]), app.keys.live(run_id, str(s["stepId"])), stored(s)) for s in steps]
    row = queries.get_run(conn, run_id)
    if row is None or step_id is not None:
        raise NotFoundError(f"run not found: {run_id}" if row is None else f"workflow step not found: {run_id}/{step_id}")
    return [Source(run_id, None, app.keys.live(run_id), stored(row))]


def _print_stored(printer: Printer, source: Source, stdout: str, stderr: str) -> None:
    printer.write(source, "stdout", stdout)
    printer.end(source, ("stdout",))
    printer.write(source, "stderr", stderr)
    printer.end(source, ("stderr",))


def _print_entries(printer: Printer, source: Source, entries: list[Any]) -> bool:
    """Print live entries; True once the source's end marker came."""
    for entry_id, fields in entries:
        source.last = entry_id
        stream = fields.get(b"s", b"").decode()
        if stream == "eof":
            printer.end(source)
            return True
        decoder = source.decoders.get(stream, source.decoders["stdout"])
        printer.write(source, stream if stream in ("stdout", "stderr") else "stdout", decoder.decode(fields.get(b"d", b"")))
    return False


def print_logs(app: App, sources: list[Source], follow: bool, *, prefixed: bool) -> None:
    """Print every source's output: stored for what has ended, live for what runs (followed with ``follow``);
    ``prefixed``: each line behind its step's id (a whole workflow run)."""
    printer = Printer(app.json, prefixed)
    raw = timers.raw_from(app.client())
    live: list[Source] = []
    for source in sources:
        ended, stdout, stderr = source.read()
        if ended:
            _print_stored(printer, source, stdout, stderr)
        elif follow:
            live.append(source)
        else:
            _print_entries(printer, source, list(raw.xrange(source.live_key, "-", "+") or []))
            printer.end(source)
    while live:
        reply: Any = raw.xread({s.live_key: s.last for s in live}, count=100, block=FOLLOW_BLOCK_MS)
        by_key = {s.live_key.encode(): s for s in live}
        done: set[str] = set()
        for key, entries in reply or []:
            source = by_key[key if isinstance(key, bytes) else str(key).encode()]
            if _print_entries(printer, source, entries):
                done.add(source.live_key)
        if not reply:
            for source in live:
                ended, stdout, stderr = source.read()
                if ended:
                    # It wrote its last chunk before its status changed: what is left comes from one more read.
                    _print_entries(printer, source, list(raw.xrange(source.live_key, _after(source.last), "+") or []))
                    if not source.printed:  # nothing live (a silent step, or a stream already gone)
                        _print_stored(printer, source, stdout, stderr)
                    printer.end(source)
                    done.add(source.live_key)
        live = [s for s in live if s.live_key not in done]


def _after(entry_id: bytes | str) -> str:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return "-" if text == "0-0" else f"({text}"


@click.command("logs")
@click.argument("run_id")
@click.option("--step", "step_id", metavar="ID", help="Only this workflow step (for a workflow run).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing output until the run (or step) ends.")
@json_flag
def logs(run_id: str, step_id: str | None, follow: bool) -> None:
    """Print a run's output: live while it runs, stored once it ended; a workflow run's steps, each line
    prefixed with its step id (-f follows until it ends)."""
    app = get_app()
    sources = resolve_sources(app, run_id, step_id)
    print_logs(app, sources, follow, prefixed=step_id is None and sources[0].step_id is not None)
    if follow and followed_status(app, run_id, step_id) not in (None, "succeeded"):
        raise click.exceptions.Exit(1)  # as run-now: a script following a run learns how it ended


def followed_status(app: App, run_id: str, step_id: str | None) -> str | None:
    """How what ``logs -f`` followed ended: the step's status with ``step_id``, else the run's (a workflow run's,
    or a loop run's); None when it cannot be told (the record is gone, or it did not settle within
    ``SETTLE_S`` of its output ending: the run is finalised just after its last output)."""
    store = WorkflowRunStore(app.client(), app.keys)
    deadline = time.monotonic() + SETTLE_S
    while True:
        state = store.load(run_id)
        loop_run = None if state is not None else run_codec.load(app.client(), app.keys.run(run_id))
        if state is None and loop_run is not None and step_id is not None:
            state = _workflow_of_loop_run(store, run_id)
        if state is not None and step_id is not None:
            status = state.steps.get(step_id, {}).get("status")
            settled = status not in ("pending", "running")
        elif state is not None:
            status, settled = state.run.get("status"), state.terminal
        elif loop_run is not None:
            status, settled = loop_run.status, loop_run.status in TERMINAL
        else:
            return _archived_status(app, run_id, step_id)
        if settled:
            return str(status) if status is not None else None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _archived_status(app: App, run_id: str, step_id: str | None) -> str | None:
    """The status of a run (or step) only the mirror still has."""
    conn = app.mirror()
    row = queries.get_workflow_run(conn, run_id)
    if row is not None and step_id is not None:
        row = next((s for s in queries.list_step_runs(conn, run_id) if s["stepId"] == step_id), None)
    elif row is None:
        row = queries.get_run(conn, run_id)
    status = row.get("status") if row is not None else None
    return str(status) if status else None

