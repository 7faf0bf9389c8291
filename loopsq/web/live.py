"""Live output on the dashboard: a running run's (or each workflow step's) output as it is written, from the
same bounded live streams ``loopsq logs -f`` follows (``engine/live.py``).

A page renders what the stream holds when it is served and the position it reached; ``/static/live.js`` then
opens one server-sent-events connection per page, ``GET /runs/{id}/live`` or ``GET /workflow-runs/{id}/live``,
which blocks on ``XREAD`` for at most ``BLOCK_MS`` at a time, so a chunk reaches the page within about a
second of the worker's flush (the worker flushes every 0.1 s). Each event is one chunk of one source and
stream; ``event: end`` says a source ended (its stored output is the record; the page reloads to show it).

The pages ask for the text (``showOutput=true``; control characters in it escaped, ``domain.text.terminal_safe``)
unless the viewer hid the output; without it, events carry only how many characters each stream has grown by,
never the text.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from loopsq.domain.text import shown, terminal_safe
from loopsq.errors import NotFoundError, ValidationError
from loopsq.state.keys import Keys
from loopsq.state.runs import RunStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.web.context import WebContext
from loopsq.web.deps import Ctx, ShowOutput

router = APIRouter(include_in_schema=False)

#: How long one blocking read waits before the stream checks whether its sources ended (and the client is there).
BLOCK_MS = 500
#: A connection ends after this long; the browser's EventSource reconnects from the last event's id.
MAX_CONNECTION_S = 300.0
STREAMS = ("stdout", "stderr")


@dataclass
class Source:
    """One live stream: a loop run's (``name`` "") or one workflow step's (``name`` its step id)."""

    name: str
    key: str
    ended: Callable[[], bool]
    last: str = "0-0"
    decoders: dict[str, Any] = field(default_factory=lambda: {
        s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in STREAMS})


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_chunks(source: Source, entries: list[Any]) -> tuple[list[tuple[str, str]], bool]:
    """Decode live entries into (stream, text) chunks, moving ``source.last``; True once its end marker came."""
    chunks: list[tuple[str, str]] = []
    for entry_id, fields in entries:
        source.last = _text(entry_id)
        stream = _text(fields.get(b"s", b""))
        if stream == "eof":
            return chunks, True
        stream = stream if stream in STREAMS else "stdout"
        text = source.decoders[stream].decode(fields.get(b"d", b""))
        if text:
            chunks.append((stream, text))
    return chunks, False


def snapshot(raw: redis.Redis, source: Source) -> dict[str, str]:
    """What the source's live stream holds now, by stream (moves ``source.last`` to its end)."""
    chunks, _ended = read_chunks(source, list(raw.xrange(source.key, "-", "+") or []))
    out = {s: "" for s in STREAMS}
    for stream, text in chunks:
        out[stream] += text
    return out


def _event(kind: str, data: dict[str, Any], positions: dict[str, str]) -> str:
    return f"id: {json.dumps(positions, separators=(',', ':'))}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


def events(raw: redis.Redis, sources: list[Source], show_output: bool, *,
           max_s: float = MAX_CONNECTION_S) -> Iterator[str]:
    """Server-sent events of every source from its ``last`` position until each ended (or ``max_s`` passed)."""
    deadline = time.monotonic() + max_s
    live = {s.key: s for s in sources}
    yield "retry: 1000\n\n"
    while live and time.monotonic() < deadline:
        reply: Any = raw.xread({k: s.last for k, s in live.items()}, count=100, block=BLOCK_MS)
        done: list[Source] = []
        for key, entries in reply or []:
            source = live[_text(key)]
            chunks, ended = read_chunks(source, entries)
            positions = {s.name: s.last for s in sources}
            for stream, text in chunks:
                body = {"text": terminal_safe(text)} if show_output else {"chars": len(text)}
                yield _event("chunk", {"source": source.name, "stream": stream, **body}, positions)
            if ended:
                done.append(source)
        if not reply:
            for source in [s for s in live.values() if s.ended()]:
                # It wrote its last chunk before its status changed: what is left comes from one more read.
                tail = list(raw.xrange(source.key, "-" if source.last == "0-0" else f"({source.last}", "+") or [])
                chunks, _ended = read_chunks(source, tail)
                for stream, text in chunks:
                    body = {"text": terminal_safe(text)} if show_output else {"chars": len(text)}
                    yield _event("chunk", {"source": source.name, "stream": stream, **body},
                                 {s.name: s.last for s in sources})
                done.append(source)
            if not done:
                yield ": keep-alive\n\n"
        for source in done:
            live.pop(source.key, None)
            yield _event("end", {"source": source.name}, {s.name: s.last for s in sources})
    if not live:
        yield _event("done", {}, {s.name: s.last for s in sources})


def _positions(value: str | None, last_event_id: str | None) -> dict[str, str]:
    text = last_event_id or value
    if not text:
        return {}
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        raise ValidationError(f"after must be a JSON object of stream positions, got {shown(text[:80])}")
    return found


def run_source(ctx: WebContext, run_id: str) -> Source:
    store = RunStore(ctx.client, ctx.keys)

    def ended() -> bool:
        run = store.get(run_id)
        return run is None or run.status != "running"

    return Source("", ctx.keys.live(run_id), ended)


def step_sources(client: redis.Redis, keys: Keys, run_id: str, step_ids: list[str]) -> list[Source]:
    store = WorkflowRunStore(client, keys)

    def ended_for(step_id: str) -> Callable[[], bool]:
        def ended() -> bool:
            state = store.load(run_id)
            step = state.steps.get(step_id, {}) if state else {}
            return state is None or state.terminal or step.get("status") not in ("pending", "running")
        return ended

    return [Source(step_id, keys.live(run_id, step_id), ended_for(step_id)) for step_id in step_ids]


SCRIPT = Path(__file__).parent / "static" / "live.js"


@router.get("/static/live.js")
def script() -> Response:
    """The dashboard's one script (public: it is the same for everyone and holds nothing)."""
    return Response(SCRIPT.read_bytes(), media_type="text/javascript",
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


def _stream(ctx: WebContext, sources: list[Source], show_output: bool) -> StreamingResponse:
    return StreamingResponse(events(ctx.raw(), sources, show_output), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@router.get("/runs/{run_id}/live")
def run_live(request: Request, ctx: Ctx, run_id: str, show_output: ShowOutput = False,
             after: str | None = Query(None, max_length=2000)) -> StreamingResponse:
    """A loop run's live output as server-sent events."""
    if not ctx.client.exists(ctx.keys.run(run_id)):
        raise NotFoundError(f"run not found: {shown(run_id)}")
    source = run_source(ctx, run_id)
    source.last = _positions(after, request.headers.get("last-event-id")).get("", "0-0")
    return _stream(ctx, [source], show_output)


@router.get("/workflow-runs/{run_id}/live")
def workflow_run_live(request: Request, ctx: Ctx, run_id: str, show_output: ShowOutput = False,
                      after: str | None = Query(None, max_length=20_000)) -> StreamingResponse:
    """Every unfinished step's live output of a workflow run as server-sent events."""
    state = WorkflowRunStore(ctx.client, ctx.keys).load(run_id)
    if state is None:
        raise NotFoundError(f"workflow run not found: {shown(run_id)}")
    positions = _positions(after, request.headers.get("last-event-id"))
    steps = [str(s["stepId"]) for s in state.ordered_steps() if s.get("status") in ("pending", "running")]
    sources = step_sources(ctx.client, ctx.keys, run_id, [] if state.terminal else steps)
    for source in sources:
        source.last = positions.get(source.name, "0-0")
    return _stream(ctx, sources, show_output)
