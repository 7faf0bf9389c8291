"""The indexes maintenance works from, so that a pass costs nothing when nothing is wrong.

- ``keys.loop_watch``: active loop id -> when maintenance must look at the loop if nothing else happens (ms).
  Every write of an active loop sets it to ``WRITE_GRACE_MS`` after the write (the writer arms the timer right
  after; a crash in between is noticed then); arming the loop's timer sets it to ``DUE_GRACE_MS`` after the
  timer's time (a timer that fired has its loop written again by the claim, long before that). A loop that is
  not active leaves the index in the same transition. So the loops due for a look are those whose score passed:
  a timer lost, a write never followed by its arm, a timer fired and never claimed.
- ``keys.loop_expiry``: active loop id -> its ``expiresAt`` (ms).

Both are written by the same transition as the loop itself: ``Committer.commit`` adds ``index_ops`` to every
transition that writes or drops a loop (``Tx.put("loops", ...)`` / ``Tx.drop("loops", ...)``), wherever it is
built. A rare full reconciliation (``engine.maintenance``) re-seeds them, so an index entry lost for any reason
costs lateness, never a stranded loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopsq.domain.models import Loop
from loopsq.domain.run_rules import timer_at
from loopsq.domain.timeutil import from_iso, to_ms

if TYPE_CHECKING:
    from loopsq.state.keys import Keys

#: After a write of an active loop, how long its writer has to arm the timer before maintenance looks.
WRITE_GRACE_MS = 2_000
#: After a timer's time, how long its fire has to be claimed (the claim writes the loop) before maintenance looks.
DUE_GRACE_MS = 5_000

TABLE = "loops"
#: rq-scheduler's sorted set of scheduled timers (the default namespace's, ``Keys.scheduled_jobs``), and the start
#: of every loop timer's job id (``engine.timers`` uses these; a unit test holds them equal to rq-scheduler's).
SCHEDULED_KEY = "rq:scheduler:scheduled_jobs"
TIMER_PREFIX = "loopsq-fire-"


def index_ops(upsert: dict[str, list[dict[str, Any]]], delete: dict[str, list[str]], at: str,
              keys: Keys) -> list[tuple[str, str, str, str]]:
    """The index writes (``Tx`` op tuples) for the loops a transition at ``at`` writes (``upsert``, its full
    snapshots per table) or drops (``delete``)."""
    ops: list[tuple[str, str, str, str]] = []
    for entity in upsert.get(TABLE, []):
        ops += _entity_ops(entity, at, keys)
    for loop_id in delete.get(TABLE, []):
        ops += [("zrem", keys.loop_watch, loop_id, ""), ("zrem", keys.loop_expiry, loop_id, "")]
    return ops


def _entity_ops(entity: dict[str, Any], at: str, keys: Keys) -> list[tuple[str, str, str, str]]:
    loop_id = str(entity["id"])
    if entity.get("status") != "active":
        return [("zrem", keys.loop_watch, loop_id, ""), ("zrem", keys.loop_expiry, loop_id, "")]
    at_ms = to_ms(from_iso(at))
    parts = [str(at_ms + WRITE_GRACE_MS)]
    want = timer_at(Loop.from_dict(entity))
    if want is not None:
        # The timer already armed at the time this write wants (a finalize after the claim armed the next slot):
        # no arm follows, so the watch goes to the armed score at once (checked inside the transition).
        parts += [str(armed_score_ms(to_ms(want), at_ms)), keys.timer(loop_id), f"{TIMER_PREFIX}{loop_id}-{to_ms(want)}-",
                  keys.scheduled_jobs]
    ops = [("watch", keys.loop_watch, loop_id, "\n".join(parts))]
    expires = entity.get("expiresAt")
    if expires:
        ops.append(("zadd", keys.loop_expiry, repr(float(to_ms(from_iso(str(expires))))), loop_id))
    else:
        ops.append(("zrem", keys.loop_expiry, loop_id, ""))
    return ops


def armed_score_ms(at_ms: int, now_ms: int) -> int:
    """The watch score of a loop whose timer was just armed at ``at_ms``."""
    return max(at_ms, now_ms) + DUE_GRACE_MS
