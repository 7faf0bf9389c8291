"""Triggered runs: reserve a run of a loop (idempotent by key with ``SET NX``, in the transition that records the
trigger) and hand it to a worker (``worker.jobs.run_triggered``). Used by the SDK, the CLI, the API and RQ callers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import redis

from loopsq.domain import limits, timeutil
from loopsq.domain.checks import check_length, check_visible
from loopsq.domain.lifecycle import ensure_not_archived
from loopsq.domain.text import quoted
from loopsq.domain.timeutil import gen_id, to_iso, to_ms
from loopsq.engine import timers
from loopsq.errors import ValidationError
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys, has_old_spelling
from loopsq.state.loops import LoopStore
from loopsq.system.tracing import valid_carrier

#: How long a trigger's idempotency key stands for its run.
DEFAULT_IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000


def trigger_with(
    client: redis.Redis,
    keys: Keys,
    id_or_name: str,
    idempotency_key: str | None,
    *,
    window_ms: int = DEFAULT_IDEMPOTENCY_WINDOW_MS,
    enqueue: bool = True,
    retry: bool = True,
    trace: Mapping[str, str] | None = None,
) -> tuple[str, bool]:
    """Reserve a triggered run of a loop; returns ``(run_id, created)``.

    With an idempotency key, the first trigger reserves the run id with ``SET NX`` (in the same transition that
    records the trigger) and every later trigger with the same key within ``window_ms`` gets that run id back
    and starts nothing. With ``enqueue`` the run is handed to a worker (``worker.jobs.run_triggered``). The loop's
    retry policy applies to the run unless ``retry`` is False. ``trace``: the trigger's W3C trace context
    (``traceparent``, ``tracestate``), stored with the trigger (only when valid) as the parent of its run's spans.
    """
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key.strip()):
        raise ValidationError(f"idempotency key must be a non-empty string, got {quoted(idempotency_key)}")
    if idempotency_key is not None:
        check_length(idempotency_key, "idempotency key", limits.MAX_IDEMPOTENCY_KEY_LENGTH)
        check_visible(idempotency_key, "idempotency key")
    if window_ms <= 0:
        raise ValidationError(f"idempotency window must be > 0 ms, got {window_ms}")
    loop = LoopStore(client, keys).require(id_or_name)
    ensure_not_archived(loop, id_or_name)
    if idempotency_key is not None and has_old_spelling(idempotency_key):
        # Written by a version before ``keys.key_part``: it stands for its run until it expires, as ours would.
        earlier = client.get(keys.before_encoding.idempotency(loop.id, idempotency_key))
        if earlier:
            return (earlier.decode() if isinstance(earlier, bytes) else str(earlier)), False
    now = timeutil.now()
    run_id = gen_id()
    request = json.dumps({"loopId": loop.id, "at": to_iso(now), "key": idempotency_key,
                          **({} if retry else {"retry": False}), **valid_carrier(trace)})
    tx = Tx("run_triggered", to_iso(now))
    if idempotency_key is not None:
        idem = keys.idempotency(loop.id, idempotency_key)
        tx.expect(idem, None).set(idem, run_id, px=window_ms)
    tx.set(keys.trigger(run_id), request, px=window_ms).zadd(keys.triggers, to_ms(now), run_id)
    if not Committer(client, keys).commit(tx).ok:
        existing = client.get(keys.idempotency(loop.id, str(idempotency_key)))
        if existing:
            return (existing.decode() if isinstance(existing, bytes) else str(existing)), False
        return trigger_with(client, keys, id_or_name, idempotency_key, window_ms=window_ms, enqueue=enqueue,
                            retry=retry, trace=trace)
    if enqueue:
        from loopsq.engine.routing import enqueue_for_loop

        enqueue_for_loop(client, keys, loop, "worker.jobs.run_triggered", run_id, job_id=f"loopsq-trigger-{run_id}",
                         result_ttl=timers.NO_RESULT_TTL)
    return run_id, True
