"""The history window in Redis: trimming each loop's settled runs beyond its newest ``keepRuns`` (with their
workflow runs, steps and events) and each workflow's runs of their own beyond its window, in bounded batches.

- What to look at comes from ``keys.retention_due``: whatever settles a run (finalize, abandon, an overlap skip,
  the end of a workflow run of its own) or removes a loop adds its owner there in the same transition. A pass
  reads the due owners and, per owner, only the oldest runs beyond the window: its cost grows with what it trims,
  never with the keyspace (no SCAN, no KEYS).
- Each trim is one transition (``Tx``: guards, deletes and one ``runs_trimmed`` change entry, atomic in one
  script), guarded on every trimmed run's stored JSON, so a run that changed meanwhile is left alone and a
  process killed mid-pass leaves every run either whole or gone. The change lists the ids under ``trim``:
  mirrors keep those rows, marked archived.
- Never trimmed: a running run, the slot of a pending retry, a triggered run still listed as pending, a run a
  trigger's idempotency key still points to (until the key expires), a loop run with a workflow run not ended.
  An owner whose excess is all protected is looked at again when its protection ends (or the next settle).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import redis

from loopsq.domain.models import Loop
from loopsq.domain.timeutil import to_iso, to_ms
from loopsq.state import run_codec
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys, has_old_spelling

log = logging.getLogger("loopsq.retention")

#: Owners (loops, workflows) looked at per pass, and runs trimmed per owner per pass and per transition.
MAX_OWNERS = 500
MAX_RUNS_PER_OWNER = 100
#: Runs trimmed per pass at most (a deployment upgraded with a long history catches up over several passes).
MAX_RUNS_PER_PASS = 2_000
#: When an owner's excess is held by something without an end time of its own (a pending trigger entry, a
#: workflow run not ended), look again after this long.
RECHECK_MS = 60_000
#: A workflow run of its own still named by an idempotency key (no expiry) is looked at again after this long.
IDEMPOTENT_RECHECK_MS = 3_600_000

# Drop or reschedule a due owner only if nothing re-marked it since it was read (a settle meanwhile wins).
_SETTLE_DUE = """
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur or tonumber(cur) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then redis.call('ZREM', KEYS[1], ARGV[1]) else redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1]) end
return 1
"""


@dataclass(frozen=True)
class Windows:
    """The deployment's default windows: a loop without its own ``keepRuns``, and a workflow's runs of their own."""

    keep_runs: int
    keep_workflow_runs: int


@dataclass
class TrimReport:
    """What one pass trimmed, and what it kept beyond a window because something still needs it."""

    loop_runs: int = 0
    workflow_runs: int = 0
    protected: int = 0
    owners: int = 0
    trimmed_ids: list[str] = field(default_factory=list)


@dataclass
class _Plan:
    """One owner's trim: the transition, how much it removes, and when to look at the owner again."""

    tx: Tx
    runs: int = 0
    workflow_runs: int = 0
    protected: int = 0
    recheck_ms: int | None = None
    more: bool = False
    ids: list[str] = field(default_factory=list)

    def hold(self, until_ms: int) -> None:
        self.protected += 1
        self.recheck_ms = until_ms if self.recheck_ms is None else min(self.recheck_ms, until_ms)


def _s(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _claims(run: dict[str, Any]) -> list[tuple[int, int | None]]:
    """The (attempt, re-run) of every claim a loop run's row may have had: each attempt up to its own, and each
    re-run after a shutdown of an attempt, up to the highest the row records (``rerun``, ``previousAttempts``).
    Each claim key goes when its attempt settles; a row's trim drops any left (by an older version, say)."""
    claims: list[tuple[int, int | None]] = [(attempt, None) for attempt in range(1, int(run.get("attempt") or 1) + 1)]
    reruns: dict[int, int] = {}
    for entry in [*(run.get("previousAttempts") or []), run]:
        attempt, rerun = int(entry.get("attempt") or 1), int(entry.get("rerun") or 0)
        reruns[attempt] = max(reruns.get(attempt, 0), rerun)
    claims += [(attempt, n) for attempt, top in sorted(reruns.items()) for n in range(1, top + 1)]
    return claims


class Retention:
    """Trims history windows in Redis (one ``Retention`` per maintenance pass or process)."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None, committer: Committer | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.committer = committer or Committer(client, self.keys)
        self._settle = client.register_script(_SETTLE_DUE)

    # -- the pass -------------------------------------------------------------------------------------------
    def seed(self, now: datetime) -> int:
        """Once per deployment: mark every loop and workflow due, so history written before windows existed (or
        by a loop that settles nothing any more) is trimmed too. Returns how many were marked (0 after the first
        time)."""
        if not self.client.set(self.keys.retention_seeded, to_iso(now), nx=True):
            return 0
        members = [f"loop:{_s(i)}" for i in self.client.smembers(self.keys.loops)]
        members += [f"workflow:{_s(i)}" for i in self.client.smembers(self.keys.workflows)]
        for start in range(0, len(members), 1000):
            self.client.zadd(self.keys.retention_due, {m: to_ms(now) for m in members[start:start + 1000]})
        return len(members)

    def trim_due(self, now: datetime, windows: Windows, *, max_runs: int = MAX_RUNS_PER_PASS,
                 after_trim: Callable[[], None] | None = None) -> TrimReport:
        """Trim the owners due at ``now``, at most ``max_runs`` runs in all. ``after_trim`` is called after each
        trim transition (crash tests kill the process there)."""
        report = TrimReport()
        due = cast(list[tuple[Any, float]], self.client.zrangebyscore(
            self.keys.retention_due, "-inf", to_ms(now), start=0, num=MAX_OWNERS, withscores=True))
        for raw_member, score in due:
            if report.loop_runs + report.workflow_runs >= max_runs:
                break
            member = str(_s(raw_member))
            kind, _, owner_id = member.partition(":")
            budget = min(MAX_RUNS_PER_OWNER, max_runs - report.loop_runs - report.workflow_runs)
            if kind == "loop":
                plan = self.plan_loop(owner_id, now, windows.keep_runs, budget)
            elif kind == "workflow":
                plan = self.plan_workflow(owner_id, now, windows.keep_workflow_runs, budget)
            else:
                plan = None
            report.owners += 1
            if plan is not None and plan.tx.ops:
                if not self.committer.commit(plan.tx).ok:
                    log.info("trim of %s raced with a change; trying again next pass", member)
                    continue  # left due: the next pass re-reads it
                if after_trim is not None:
                    after_trim()
            if plan is None:
                self._settle(keys=[self.keys.retention_due], args=[member, repr(score), ""])
                continue
            report.loop_runs += plan.runs
            report.workflow_runs += plan.workflow_runs
            report.protected += plan.protected
            report.trimmed_ids.extend(plan.ids)
            if plan.more:
                continue  # more beyond the window: due again on the next pass
            recheck = "" if plan.recheck_ms is None else str(plan.recheck_ms)
            self._settle(keys=[self.keys.retention_due], args=[member, repr(score), recheck])
        if report.loop_runs or report.workflow_runs:
            log.info("trimmed %d loop run(s) and %d workflow run(s) beyond their windows (%d kept: still needed)",
                     report.loop_runs, report.workflow_runs, report.protected)
        return report

    # -- a loop ---------------------------------------------------------------------------------------------
    def plan_loop(self, loop_id: str, now: datetime, default_keep: int, budget: int) -> _Plan | None:
        """The trim of one loop's settled runs beyond its window (None: nothing beyond it). A removed loop has no
        window: all its settled runs go."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.loop(loop_id))
        pipe.zcard(self.keys.loop_runs(loop_id))
        pipe.scard(self.keys.loop_active(loop_id))
        loop_raw, count, active = pipe.execute()
        loop = Loop.from_json(str(_s(loop_raw))) if loop_raw else None
        keep = (loop.keep_runs or default_keep) if loop is not None else 0
        excess = int(count) - int(active) - keep
        if excess <= 0:
            return None
        take = min(excess, budget)
        ids = [str(_s(i)) for i in self.client.zrange(self.keys.loop_runs(loop_id), 0, take + int(active) - 1)]
        raws = run_codec.read_many(self.client, [self.keys.run(i) for i in ids])
        runs = list(zip(ids, raws, strict=True))
        plan = _Plan(Tx("runs_trimmed", to_iso(now)), more=excess > budget)
        candidates: list[tuple[str, run_codec.Stored, dict[str, Any]]] = []
        for run_id, raw in runs:
            if raw is None:  # an index entry whose run is gone (left by an older version): drop the entry
                plan.tx.zrem(self.keys.loop_runs(loop_id), run_id).zrem(self.keys.runs, run_id)
                continue
            run = run_codec.decode(raw).to_dict()
            if run.get("status") == "running":
                continue
            if loop is not None and loop.retry_scheduled_for == run.get("scheduledFor"):
                plan.hold(to_ms(now) + RECHECK_MS)  # its retry settles it again, which re-marks the loop
                continue
            candidates.append((run_id, raw, run))
            if len(candidates) >= take:
                break
        self._add_loop_runs(plan, loop_id, candidates, now)
        return plan

    def _add_loop_runs(self, plan: _Plan, loop_id: str,
                       candidates: Sequence[tuple[str, run_codec.Stored, dict[str, Any]]],
                       now: datetime) -> None:
        pipe = self.client.pipeline(transaction=False)
        for run_id, _raw, run in candidates:
            pipe.hget(self.keys.slots(loop_id), str(run["scheduledFor"]))
            pipe.zscore(self.keys.triggers, run_id)
            for idem_key in _loop_idempotency_keys(self.keys, loop_id, run.get("idempotencyKey")):
                pipe.get(idem_key) if idem_key else pipe.echo("")
                pipe.pttl(idem_key) if idem_key else pipe.echo("")
            pipe.smembers(self.keys.loop_run_workflows(run_id))
        replies = pipe.execute() if candidates else []
        workflows: dict[str, list[str]] = {}
        chosen: list[tuple[str, run_codec.Stored, dict[str, Any], str | None]] = []
        for index, (run_id, raw, run) in enumerate(candidates):
            slot_owner, pending, idem, idem_ttl, old_idem, old_ttl, wf_ids = replies[index * 7: index * 7 + 7]
            if pending is not None:
                plan.hold(to_ms(now) + RECHECK_MS)  # a trigger entry not cleared yet (maintenance clears it)
                continue
            ttls = [ttl for value, ttl in ((idem, idem_ttl), (old_idem, old_ttl)) if value and _s(value) == run_id]
            if ttls:
                ttl = max(int(t) if t is not None and int(t) > 0 else RECHECK_MS for t in ttls)
                plan.hold(to_ms(now) + ttl + 1)
                continue
            workflows[run_id] = sorted(str(_s(w)) for w in wf_ids)
            chosen.append((run_id, raw, run, _s(slot_owner)))
        states = self._workflow_states([w for ids in workflows.values() for w in ids])
        for run_id, raw, run, slot_owner in chosen:
            wf_states = [states.get(w) for w in workflows[run_id]]
            if any(state is not None and state[1].get("status") == "running" for state in wf_states):
                plan.hold(to_ms(now) + RECHECK_MS)
                continue
            tx = plan.tx.expect(self.keys.run(run_id), raw).delete_key(self.keys.run(run_id))
            slots, slot = self.keys.slots(loop_id), str(run["scheduledFor"])
            if slot_owner == run_id:
                tx.expect_field(slots, slot, run_id).hdel(slots, slot)
            tx.zrem(self.keys.loop_runs(loop_id), run_id).zrem(self.keys.runs, run_id)
            for attempt, rerun in _claims(run):
                tx.delete_key(self.keys.claim(loop_id, str(run["scheduledFor"]), attempt, rerun))
            for key in (self.keys.lease(run_id), self.keys.cancel(run_id), self.keys.live(run_id),
                        self.keys.loop_run_workflows(run_id)):
                tx.delete_key(key)
            tx.trim("loop_runs", run_id)
            plan.runs += 1
            plan.ids.append(run_id)
            for wf_id, state in zip(workflows[run_id], wf_states, strict=True):
                if state is not None:
                    self._drop_workflow_run(plan, wf_id, state)

    # -- a workflow's runs of their own ------------------------------------------------------------------------
    def plan_workflow(self, workflow_id: str, now: datetime, keep: int, budget: int) -> _Plan | None:
        """The trim of a workflow's settled runs of their own beyond its window (None: nothing beyond it)."""
        index = self.keys.workflow_runs(workflow_id)
        excess = int(self.client.zcard(index)) - keep
        if excess <= 0:
            return None
        ids = [str(_s(i)) for i in self.client.zrange(index, 0, min(excess, budget) - 1)]
        plan = _Plan(Tx("runs_trimmed", to_iso(now)), more=excess > budget)
        states = self._workflow_states(ids)
        for wf_id in ids:
            state = states.get(wf_id)
            if state is None:
                plan.tx.zrem(index, wf_id).zrem(self.keys.wf_runs, wf_id)
                continue
            if state[1].get("status") == "running":
                plan.hold(to_ms(now) + RECHECK_MS)
                continue
            if state[3] is not None and not state[1].get("loopRunId"):
                plan.hold(to_ms(now) + IDEMPOTENT_RECHECK_MS)  # its idempotency key still stands for it
                continue
            plan.tx.zrem(index, wf_id)
            self._drop_workflow_run(plan, wf_id, state)
        return plan

    # -- workflow runs ----------------------------------------------------------------------------------------
    def _workflow_states(self, ids: Sequence[str]) -> dict[str, tuple[str, dict[str, Any], list[str], str | None]]:
        """Per workflow run that exists: (raw JSON, run, step ids, the idempotency key that still names this run,
        in either spelling: ``_idempotency_keys``)."""
        if not ids:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for wf_id in ids:
            pipe.get(self.keys.wf_run(wf_id))
            pipe.hkeys(self.keys.wf_steps(wf_id))
        replies = pipe.execute()
        found: dict[str, tuple[str, dict[str, Any], list[str], str | None]] = {}
        for i, wf_id in enumerate(ids):
            raw, steps = _s(replies[2 * i]), replies[2 * i + 1]
            if raw is not None:
                found[wf_id] = (raw, json.loads(raw), sorted(str(_s(s)) for s in steps), None)
        keyed = [(wf_id, _idempotency_keys(self.keys, state[1])) for wf_id, state in found.items()
                 if state[1].get("idempotencyKey")]
        if keyed:
            values = iter(self.client.mget([key for _, keys in keyed for key in keys]))
            for wf_id, keys in keyed:
                named = [key for key in keys if _s(next(values)) == wf_id]
                state = found[wf_id]
                found[wf_id] = (state[0], state[1], state[2], named[0] if named else None)
        return found

    def _drop_workflow_run(self, plan: _Plan, wf_id: str,
                           state: tuple[str, dict[str, Any], list[str], str | None]) -> None:
        raw, _run, steps, idem_key = state
        tx = plan.tx.expect(self.keys.wf_run(wf_id), raw)
        for key in (self.keys.wf_run(wf_id), self.keys.wf_steps(wf_id), self.keys.wf_events(wf_id),
                    self.keys.cancel(wf_id)):
            tx.delete_key(key)
        for step_id in steps:
            tx.delete_key(self.keys.live(wf_id, step_id))
        tx.zrem(self.keys.wf_runs, wf_id).srem(self.keys.wf_running, wf_id)
        if idem_key is not None:
            tx.expect(idem_key, wf_id).delete_key(idem_key)
        tx.trim("workflow_runs", wf_id)
        plan.workflow_runs += 1
        plan.ids.append(wf_id)


def _idempotency_keys(keys: Keys, run: dict[str, Any]) -> list[str]:
    """The keys a workflow run's idempotency key may be stored under: the current spelling, and the raw one of
    versions before ``keys.key_part`` (a loop's ``<loopId>:<slot>:attempt:<n>`` always differs), which has no TTL
    and would otherwise stay forever once its run is trimmed."""
    workflow_id, key = str(run["workflowId"]), str(run["idempotencyKey"])
    spelled = [keys.wf_idempotency(workflow_id, key)]
    if has_old_spelling(key):
        spelled.append(keys.before_encoding.wf_idempotency(workflow_id, key))
    return spelled


def _loop_idempotency_keys(keys: Keys, loop_id: str, key: Any) -> tuple[str, str]:
    """A triggered run's idempotency key in both spellings (``""`` for none): one written before
    ``keys.key_part`` stands for its run until it expires, as the current one does."""
    if not key:
        return "", ""
    return (keys.idempotency(loop_id, str(key)),
            keys.before_encoding.idempotency(loop_id, str(key)) if has_old_spelling(str(key)) else "")
