"""The grace after a Redis outage in which no owner is judged dead (``recovery_paused``): shared by recovery and
by a workflow run waiting on a step another worker runs (``remote_steps``), which must not fail a step whose
worker only went quiet while Redis was away."""

from __future__ import annotations

from loopsq.engine.runtime import OUTAGE_GAP_MS, OUTAGE_GRACE_MS, Runtime
from loopsq.state.outages import note_restart, note_seen, parse_seen


def recovery_paused(rt: Runtime) -> bool:
    """Whether recovery must wait because Redis was away moments ago.

    Liveness keys expire while Redis is down, and across a restart from AOF (their TTLs are absolute times), so
    right after an outage a missing liveness key or an expired lease does not mean a dead owner. Every beat is
    recorded on the server's clock (``outages.note_seen``): a silence of every process over ``OUTAGE_GAP_MS``
    that a running process lived through, or a restart of Redis (``outages.note_restart``), starts a grace of
    ``OUTAGE_GRACE_MS`` in which recovery judges no owner dead: time for every live worker to beat again and to
    record the runs that ended meanwhile. This call is also a beat, so whoever reaches Redis first after an
    outage notices it.
    """
    pipe = rt.client.pipeline(transaction=False)
    note_seen(pipe, rt.keys, OUTAGE_GAP_MS, OUTAGE_GRACE_MS, rt.seen_ms)
    pipe.get(rt.keys.redis_run_id)
    pipe.info("server")
    seen_reply, known_run_id, info = pipe.execute(raise_on_error=False)
    seen = parse_seen(seen_reply)
    rt.seen_ms = seen.at_ms
    restarted = note_restart(rt.client, rt.keys, known_run_id, info, OUTAGE_GRACE_MS)
    return seen.in_grace or restarted
