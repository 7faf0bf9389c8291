"""Runs in Redis: claim a slot attempt (SET NX), record the pid, renew and fence leases, finalize and advance
the loop, record overlap skips, abandon runs whose owner is gone. Each is one atomic transition.

Every write of a running run is fenced by its lease: the lease key holds the owner's token, and a transition
that requires the lease checks the token in the same script. A worker that lost its lease writes nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from redis.client import Pipeline

from loopsq.domain import run_rules as rules
from loopsq.domain.budget import account
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.scrub import Scrubber, secret_values
from loopsq.domain.steering import steer
from loopsq.domain.timeutil import gen_id, to_iso, to_ms
from loopsq.errors import ConflictError
from loopsq.state import durability, missed, run_codec
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys
from loopsq.state.run_moves import LoopMoves, _s

MAX_RETRIES = 50
#: The longest a (loop, slot, attempt) claim, or a re-run's, can outlive its run (its key goes when the attempt or
#: re-run settles, and with the row when the row is trimmed: from then on the settled row refuses the slot, and once
#: the row has left the history window the loop's own state does, since a loop never moves back to a slot it has
#: passed).
CLAIM_TTL_MS = 30 * 24 * 3600 * 1000


def scrubbed(run: LoopRun, loop: Loop | None) -> LoopRun:
    """``run`` with what it stores of its output scrubbed of secrets (``domain.scrub``: the secret shapes and the
    loop's own ``env`` values): stdout, stderr, error, the control file's note and warning. Every end of a run
    passes here, before it is written and before the loop is advanced (so a ``needs_human`` note, which becomes
    the loop's status reason, is scrubbed too)."""
    scrubber = Scrubber(secret_values(loop.target.get("env")) if loop is not None else ())
    changes: dict[str, Any] = {}
    for name in ("stdout", "stderr", "error", "control_warning"):
        value = getattr(run, name)
        if value:
            clean = scrubber.text(value)
            if clean != value:
                changes[name] = clean
    if run.control and isinstance(run.control.get("note"), str):
        note = scrubber.text(run.control["note"])
        if note != run.control["note"]:
            changes["control"] = {**run.control, "note": note}
    return run.with_changes(**changes) if changes else run


def retention_member(loop_id: str) -> str:
    """A loop's member in ``keys.retention_due``."""
    return f"loop:{loop_id}"




@dataclass(frozen=True)
class Owner:
    """Who executes a run: the worker id (also its liveness key), the host and the process id."""

    worker_id: str
    host: str
    pid: int


@dataclass(frozen=True)
class Claim:
    """A won claim: the running run, the loop as the claim left it, and the lease token."""

    run: LoopRun
    loop: Loop
    token: str
    #: The replies of what ``after`` queued behind the claim (empty when nothing was).
    after: list[Any] = field(default_factory=list)


#: Commands to queue behind a transition that wrote a loop, in its round trip: called with the pipeline, the loop
#: as written and its JSON (an arm of the loop's timer: ``engine.timers.arm_after``). They run even when the
#: transition did not apply, so each must be guarded by that JSON.
After = Callable[[Pipeline, Loop, str], object]


def _then(after: After | None, loop: Loop, loop_json: str) -> Callable[[Pipeline], object] | None:
    if after is None:
        return None
    return lambda pipe: after(pipe, loop, loop_json)


@dataclass(frozen=True)
class Refusal:
    """A claim that was not won, and why: ``claimed`` (someone else has it), ``done`` (slot settled),
    ``exhausted`` (no attempts left), ``running`` (the slot's run is still going), ``gone`` (no loop),
    ``inactive`` (a claim that would move the loop, of a loop no longer active), ``past`` (the loop has moved past
    this slot: it was handled already; ``run_rules.slot_is_past``)."""

    reason: str
    run: LoopRun | None = None


class RunStore(LoopMoves):
    """Loop runs in Redis (the loop-moving transitions without a run come from ``LoopMoves``)."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None, committer: Committer | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.committer = committer or Committer(client, self.keys)
        #: Replicas that must acknowledge a claim before its run starts (``durability.claim_replicas``).
        self.claim_replicas = durability.claim_replicas(client)

    # -- reads ----------------------------------------------------------------------------------------------
    def get(self, run_id: str) -> LoopRun | None:
        """The run ``run_id`` or None."""
        return run_codec.load(self.client, self.keys.run(run_id))

    def get_many(self, run_ids: Sequence[str]) -> list[LoopRun]:
        """The runs that exist among ``run_ids``."""
        if not run_ids:
            return []
        return run_codec.load_many(self.client, [self.keys.run(i) for i in run_ids])

    def running_ids(self) -> list[str]:
        """Ids of every running run."""
        return sorted(str(_s(i)) for i in self.client.smembers(self.keys.running))

    def active_ids(self, loop_id: str) -> list[str]:
        """Ids of a loop's running runs."""
        return sorted(str(_s(i)) for i in self.client.smembers(self.keys.loop_active(loop_id)))

    def lease_token(self, run_id: str) -> str | None:
        """The current lease token of a run (None: no live lease)."""
        return _s(self.client.get(self.keys.lease(run_id)))

    def cancel_reason(self, run_id: str) -> str | None:
        """The reason of a pending cancel request for the run, if any."""
        return _s(self.client.get(self.keys.cancel(run_id)))

    # -- missed slots ---------------------------------------------------------------------------------------
    def record_missed(self, loop_id: str, first: datetime, last: datetime, count: int, kind: str, reason: str,
                      now: datetime) -> LoopRun | None:
        """Record ``count`` slots of the loop, ``first`` to ``last``, that did not run, coalesced into the loop's
        newest ``missed`` row of the same ``kind`` when that is its newest record (``state.missed.record``).
        ``kind`` is one of ``domain.missed.KINDS``; ``reason`` the row's ``error`` (``domain.missed.catch_up``,
        ...). Returns the missed row, or None when the loop is gone or every slot of the streak has a row."""
        return missed.record(self.client, self.keys, self.committer, loop_id, first, last, count, kind, reason, now)

    # -- claim ----------------------------------------------------------------------------------------------
    def claim(
        self,
        loop_id: str,
        slot: datetime,
        owner: Owner,
        now: datetime,
        *,
        source: str = "scheduled",
        run_id: str | None = None,
        idempotency_key: str | None = None,
        ends_backlog: bool = False,
        nonce: str | None = None,
        trigger_request: str | None = None,
        retry: bool = True,
        known_loop: str | None = None,
        fresh_slot: bool = False,
        after: After | None = None,
    ) -> Claim | Refusal:
        """Claim the next attempt of ``(loop, slot)`` for ``owner``: at most one claimer ever wins an attempt.

        Scheduled, due-slot and retry-slot claims also move the loop (``run_rules.after_claim``, with
        ``ends_backlog`` for the slot where catch-up cut its backlog) in the same transition; ad-hoc and triggered
        runs never move it. ``nonce`` ends the lease token, so a claimer whose reply was lost can find out it won
        (``won_claim``). ``trigger_request``: the pending trigger's request (``keys.trigger(run_id)``) that this
        claim consumes; a trigger already consumed is refused ``claimed``. ``retry=False`` marks the run ``noRetry``.
        A row a worker shutdown gave up is re-run under the same attempt (``run_rules.next_attempt``), claimed as
        ``(loop, slot, attempt, rerun)``.

        ``known_loop``: the loop's JSON as the caller read it just now, and ``fresh_slot``: the caller expects no
        run at this slot yet (a scheduled slot reached for the first time). The first try then reads nothing and
        goes straight to the transition, whose guards check both; a wrong guess costs a retry that reads.
        ``after``: queued behind the transition in its round trip with the loop it wrote (``After``).
        """
        slot_iso = to_iso(slot)
        for attempt in range(MAX_RETRIES):
            loop_raw: str | None
            if attempt == 0 and known_loop is not None and fresh_slot:
                loop_raw, slot_reply = known_loop, None
            else:
                pipe = self.client.pipeline(transaction=False)
                pipe.get(self.keys.loop(loop_id))
                pipe.hget(self.keys.slots(loop_id), slot_iso)
                loop_reply, slot_reply = pipe.execute()
                loop_raw = _s(loop_reply)
            if loop_raw is None:
                return Refusal("gone")
            loop = Loop.from_json(loop_raw)
            moves_loop = source in ("scheduled", "due_slot", "retry_slot")
            if moves_loop and loop.status != "active":
                return Refusal("inactive")  # paused or stopped since the caller looked (the loop guard sees to that)
            existing_id = _s(slot_reply)
            existing_raw = run_codec.read(self.client, self.keys.run(existing_id)) if existing_id else None
            existing = run_codec.decode(existing_raw) if existing_raw else None
            stamp = to_iso(now)
            if existing is None and run_id is not None and self.client.exists(self.keys.run(run_id)):
                return Refusal("claimed", self.get(run_id))
            moves_loop = source in ("scheduled", "due_slot", "retry_slot")
            if existing is None and moves_loop and rules.slot_is_past(loop, slot_iso):
                return Refusal("past")
            trigger_key = self.keys.trigger(run_id) if trigger_request is not None and run_id else None
            if trigger_key is not None and _s(self.client.get(trigger_key)) != trigger_request:
                return Refusal("claimed", self.get(str(run_id)))
            if existing is None:
                run = LoopRun(
                    id=run_id or gen_id(), loop_id=loop.id, loop_name=loop.name, scheduled_for=slot_iso,
                    attempt=1, status="running", created_at=stamp, updated_at=stamp,
                )
            elif existing.status == "running":
                return Refusal("running", existing)
            elif existing.status not in rules.RETRYABLE:
                return Refusal("done", existing)
            elif source in rules.MANUAL_SOURCES or not rules.may_run_again(existing, loop):
                return Refusal("exhausted", existing)
            else:
                run = rules.next_attempt(existing, stamp)
            token = f"{owner.worker_id}:{run.id}:{run.attempt}:{nonce or gen_id()}"
            run = run.with_changes(
                started_at=stamp, claimed_by=owner.worker_id, worker_id=owner.worker_id, host=owner.host,
                lease_expires_at=to_iso(now + timedelta(milliseconds=loop.lease_ms)),
                source=rules.run_source(existing, source), idempotency_key=idempotency_key or run.idempotency_key,
                no_retry=(run.no_retry or not retry) or None,
            )
            new_loop = (
                rules.after_claim(loop, slot, now, is_retry=loop.retry_scheduled_for == slot_iso, ends_backlog=ends_backlog)
                if moves_loop
                else loop
            )
            claim_key = self.keys.claim(loop_id, slot_iso, run.attempt, run.rerun)
            tx = (
                Tx("run_claimed", stamp)
                .expect(claim_key, None)
                .expect_field(self.keys.slots(loop_id), slot_iso, existing_id)
                .expect(self.keys.run(run.id), existing_raw)
                .expect(self.keys.loop(loop_id), loop_raw)
                .set(claim_key, token, px=CLAIM_TTL_MS)
                .hset(self.keys.slots(loop_id), slot_iso, run.id)
                .set(self.keys.run(run.id), run_codec.encode(run))
                .set(self.keys.lease(run.id), token, px=rules.lease_ttl_ms(loop.lease_ms))
                .sadd(self.keys.running, run.id)
                .sadd(self.keys.loop_active(loop_id), run.id)
                # Its host's worker reaps it should we die, from the claim on (its pid comes later: ``mark_started``).
                .sadd(self.keys.host_runs(owner.host), run.id)
                .put("loop_runs", run.to_dict())
            )
            if existing is None:
                created = to_ms(now)
                tx.zadd(self.keys.runs, created, run.id).zadd(self.keys.loop_runs(loop_id), created, run.id)
            if trigger_key is not None:
                # The trigger is consumed with its claim: a duplicate of its job finds nothing left to run.
                tx.expect(trigger_key, trigger_request).delete_key(trigger_key).zrem(self.keys.triggers, run.id)
            then = None
            if new_loop != loop:
                new_json = new_loop.to_json()
                tx.set(self.keys.loop(loop_id), new_json).put("loops", new_loop.to_dict())
                tx.note("loop_advanced")
                then = _then(after, new_loop, new_json)
            # Across a failover an unreplicated claim is lost, and its slot would run again (``durability``).
            replicas = self.claim_replicas
            waited = durability.replicas_to_wait(self.client, replicas)
            result = self.committer.commit(tx, replicas=waited, wait_ms=durability.WAIT_MS, then=then,
                                           locate=replicas > 0)
            if result.ok:
                if not durability.settle(self.client, result.server or (None, None), replicas, waited,
                                         result.replicated or 0, claim=claim_key, token=token):
                    return Refusal("claimed", None)
                return Claim(run, new_loop, token, after=result.after)
            if result.failed_guard == 0:  # another claimer won this attempt: name its run
                winner = _s(self.client.hget(self.keys.slots(loop_id), slot_iso))
                return Refusal("claimed", (self.get(winner) if winner else None) or existing)
        return Refusal("claimed", None)

    def won_claim(self, loop_id: str, slot: datetime, nonce: str) -> Claim | None:
        """The claim of ``(loop, slot)`` made with ``nonce``, if it is the slot's current one and still running.

        A claim Redis applied whose reply was lost (Redis went away right after) is resent by the client and
        refused by its own guard; this tells the claimer it won after all, so the run is executed rather than
        left running with nobody executing it.
        """
        slot_iso = to_iso(slot)
        run_id = _s(self.client.hget(self.keys.slots(loop_id), slot_iso))
        run = self.get(run_id) if run_id else None
        if run is None or run.status != "running":
            return None
        token = _s(self.client.get(self.keys.claim(loop_id, slot_iso, run.attempt, run.rerun)))
        loop_raw = _s(self.client.get(self.keys.loop(loop_id)))
        if token is None or not token.endswith(f":{nonce}") or loop_raw is None:
            return None
        return Claim(run, Loop.from_json(loop_raw), token)

    # -- while running ----------------------------------------------------------------------------------------
    def _update_running(self, run_id: str, token: str, change_type: str, now: datetime, fn: object,
                        known: str | None = None) -> LoopRun | None:
        """Apply ``fn(run) -> run`` to a running run we hold the lease of; None if the lease is lost.

        ``known`` is the run's JSON as the caller last wrote it: tried first, saving a read (re-read if stale).
        """
        assert callable(fn)
        for attempt in range(MAX_RETRIES):
            raw = known if attempt == 0 and known else run_codec.read(self.client, self.keys.run(run_id))
            if raw is None:
                return None
            run = run_codec.decode(raw)
            if run.status != "running":
                return None
            new: LoopRun = fn(run)
            tx = (
                Tx(change_type, to_iso(now))
                .expect(self.keys.lease(run_id), token)
                .expect(self.keys.run(run_id), raw)
                .set(self.keys.run(run_id), run_codec.encode(new))
                .patch("loop_runs", run.to_dict(), new.to_dict())
            )
            if new.host and new.pid is not None and new.pid != run.pid:
                tx.sadd(self.keys.host_runs(new.host), run_id)  # its process started there
            result = self.committer.commit(tx)
            if result.ok:
                return new
            if result.failed_guard == 0:
                return None
        return None

    def mark_started(
        self, run_id: str, token: str, now: datetime, *, pid: int, pid_start_time: float | None, host: str,
        known: str | None = None,
    ) -> LoopRun | None:
        """Record the child's pid, its start time and host (for liveness checks against pid reuse)."""
        return self._update_running(
            run_id, token, "run_started", now,
            lambda run: run.with_changes(pid=pid, pid_start_time=pid_start_time, host=host, updated_at=to_iso(now)),
            known,
        )

    def renew_lease(self, run_id: str, token: str, lease_ms: int, now: datetime) -> bool:
        """Compare-and-extend: renew the lease only while ``token`` still owns it. False: the lease is lost."""
        expires = to_iso(now + timedelta(milliseconds=lease_ms))
        for _ in range(MAX_RETRIES):
            raw = run_codec.read(self.client, self.keys.run(run_id))
            if raw is None:
                return False
            run = run_codec.decode(raw)
            if run.status != "running":
                return False
            new = run.with_changes(lease_expires_at=expires)
            tx = (
                Tx("run_lease_renewed", to_iso(now))
                .expect(self.keys.lease(run_id), token)
                .expect(self.keys.run(run_id), raw)
                .set(self.keys.lease(run_id), token, px=rules.lease_ttl_ms(lease_ms))
                .set(self.keys.run(run_id), run_codec.encode(new))
                .patch("loop_runs", run.to_dict(), new.to_dict())
            )
            result = self.committer.commit(tx)
            if result.ok:
                return True
            if result.failed_guard == 0:
                return False
        return False

    def request_cancel(self, run_id: str, reason: str, ttl_ms: int = 3_600_000) -> None:
        """Ask whichever process executes ``run_id`` to stop it (it polls this key)."""
        self.client.set(self.keys.cancel(run_id), reason, px=ttl_ms)

    def request_cancel_if_running(self, run_id: str, reason: str,
                                  ttl_ms: int = 3_600_000) -> tuple[LoopRun, bool] | None:
        """``request_cancel`` only while the run is still running, in one optimistic transaction (WATCH on the
        run): a run that ended meanwhile gets no stale request, which an attempt reusing the row would inherit.
        Returns the run as read and whether the request was made; None when Redis holds no such run."""
        key = self.keys.run(run_id)
        for _ in range(MAX_RETRIES):  # the beat rewrites a running run at each lease renewal; a retry then wins
            with self.client.pipeline() as pipe:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]  # redis-py leaves watch untyped
                    raw = run_codec.read(pipe, key)
                    if raw is None:
                        return None
                    run = run_codec.decode(raw)
                    if run.status != "running":
                        return run, False
                    pipe.multi()
                    pipe.set(self.keys.cancel(run_id), reason, px=ttl_ms)
                    pipe.execute()
                    return run, True
                except redis.WatchError:
                    continue
        raise ConflictError(f"run {run_id} kept changing; try again")

    # -- ending -----------------------------------------------------------------------------------------------
    def _finish(
        self,
        run_id: str,
        change_type: str,
        now: datetime,
        build: object,
        *,
        token: str | None,
        expect_lease: str | None = None,
        rng: random.Random | None = None,
        known: tuple[str, str] | None = None,
        after: After | None = None,
        replies: list[Any] | None = None,
    ) -> tuple[LoopRun, Loop | None] | None:
        """End a running run and advance its loop, atomically. ``after`` is queued behind the transition when it
        changes the loop (``claim``); ``replies`` receives what those commands answered.

        ``token``: fence on our own lease (finalize). Otherwise ``expect_lease`` is the lease value recovery saw
        (None: expired), so a run that was renewed or finalized meanwhile is left alone.
        """
        assert callable(build)
        for attempt in range(MAX_RETRIES):
            raw: run_codec.Stored | None
            loop_raw: str | None
            if attempt == 0 and known is not None:
                raw, loop_raw = known  # what the caller last saw; a stale guess only costs a retry
            else:
                raw, loop_raw = run_codec.read(self.client, self.keys.run(run_id)), None
            if raw is None:
                return None
            run = run_codec.decode(raw)
            if run.status != "running":
                return None
            if not (attempt == 0 and known is not None):
                loop_raw = _s(self.client.get(self.keys.loop(run.loop_id)))
            loop = Loop.from_json(loop_raw) if loop_raw is not None else None
            final: LoopRun = scrubbed(build(run), loop)
            tx = Tx(change_type, to_iso(now)).expect(self.keys.lease(run_id), token if token else expect_lease)
            tx.expect(self.keys.run(run_id), raw)
            new_loop: Loop | None = None
            then = None
            if loop is not None and loop_raw is not None:
                advance = account(steer(rules.after_finish(loop, final, now, rng), final, now), final, now)
                tx.expect(self.keys.loop(run.loop_id), loop_raw)
                if advance.loop != loop:
                    new_loop = advance.loop
                    new_json = new_loop.to_json()
                    tx.set(self.keys.loop(run.loop_id), new_json).put("loops", new_loop.to_dict())
                    then = _then(after, new_loop, new_json)
                tx.note(advance.transition)
            (
                tx.set(self.keys.run(run_id), run_codec.encode(final))
                .delete_key(self.keys.lease(run_id))
                .delete_key(self.keys.cancel(run_id))
                .srem(self.keys.running, run_id)
                .srem(self.keys.loop_active(run.loop_id), run_id)
                # The attempt (or its re-run) is settled: its claim is of no further use (the row refuses the slot
                # from now on).
                .delete_key(self.keys.claim(run.loop_id, run.scheduled_for, run.attempt, run.rerun))
                .zadd(self.keys.retention_due, to_ms(now), retention_member(run.loop_id))
                .put("loop_runs", final.to_dict())
            )
            if run.host:
                tx.srem(self.keys.host_runs(run.host), run_id)
            # A finalize (``token``) waits for a replica as the claim did; one a failover will discard is recorded
            # again on the new master (``durability``).
            replicas = self.claim_replicas if token else 0
            waited = durability.replicas_to_wait(self.client, replicas)
            result = self.committer.commit(tx, replicas=waited, wait_ms=durability.WAIT_MS, then=then,
                                           locate=replicas > 0)
            if result.ok and not durability.settle(self.client, result.server or (None, None), replicas, waited,
                                                   result.replicated or 0):
                continue
            if result.ok:
                if replies is not None:
                    replies[:] = result.after
                return final, new_loop
            if result.failed_guard == 0:
                return None
        return None

    def finalize(
        self,
        run_id: str,
        token: str,
        now: datetime,
        *,
        status: str,
        exit_code: int | None,
        duration_ms: int,
        stdout: str,
        stderr: str,
        error: str | None,
        pid: int | None,
        rng: random.Random | None = None,
        known: tuple[str, str] | None = None,
        fields: Mapping[str, object] | None = None,
        pid_start_time: float | None = None,
        after: After | None = None,
        replies: list[Any] | None = None,
    ) -> tuple[LoopRun, Loop | None] | None:
        """Record a run's outcome and advance its loop, fenced by the lease. None: the lease was lost.

        ``known``: the run's and the loop's JSON as the caller last saw them (saves two reads when current).
        ``fields``: further run fields to record (the control file's outcome, ``engine.steering``).
        ``pid``/``pid_start_time``: the process's, recorded here when ``mark_started`` has not yet.
        ``after``/``replies``: commands queued behind the transition when it moves the loop (``_finish``).
        """

        def build(run: LoopRun) -> LoopRun:
            return run.with_changes(
                status=status, finished_at=to_iso(now), exit_code=exit_code, duration_ms=duration_ms,
                stdout=stdout, stderr=stderr, error=error, pid=pid if pid is not None else run.pid,
                pid_start_time=run.pid_start_time if run.pid_start_time is not None else pid_start_time,
                lease_expires_at=None, updated_at=to_iso(now), **(fields or {}),
            )

        return self._finish(run_id, f"run_{status}", now, build, token=token, rng=rng, known=known, after=after,
                            replies=replies)

    def recorded_end(self, run_id: str, *, attempt: int, worker_id: str, status: str,
                     finished_at: datetime) -> tuple[LoopRun, Loop | None] | None:
        """The run and its loop if the stored run is the end that ``finalize`` of that attempt by that worker with
        that status at ``finished_at`` records; None otherwise.

        Tells a finalize whose reply was lost (Redis applied it and went away; the resent transition met its own
        guard) from one that lost its lease.
        """
        run = self.get(run_id)
        if run is None or (run.attempt, run.worker_id, run.status, run.finished_at) != (
                attempt, worker_id, status, to_iso(finished_at)):
            return None
        loop_raw = _s(self.client.get(self.keys.loop(run.loop_id)))
        return run, Loop.from_json(loop_raw) if loop_raw else None

    def abandon(
        self, run_id: str, now: datetime, *, error: str, seen_lease: str | None, change_type: str = "run_abandoned",
        after: After | None = None, replies: list[Any] | None = None,
    ) -> tuple[LoopRun, Loop | None] | None:
        """Recovery: mark a run whose owner is gone ``abandoned`` and advance its loop (retry if attempts left).

        ``seen_lease`` is the lease value recovery observed; if it changed meanwhile, nothing is written.
        """

        def build(run: LoopRun) -> LoopRun:
            duration = None
            if run.started_at:
                from loopsq.domain.timeutil import from_iso

                duration = max(0, to_ms(now) - to_ms(from_iso(run.started_at)))
            return run.with_changes(
                status="abandoned", finished_at=to_iso(now), lease_expires_at=None, error=error,
                duration_ms=duration, updated_at=to_iso(now),
            )

        return self._finish(run_id, change_type, now, build, token=None, expect_lease=seen_lease, after=after,
                            replies=replies)
