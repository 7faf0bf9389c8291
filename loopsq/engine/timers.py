"""Timers (rq-scheduler entries), and loopsq's RQ queues. What they assume of RQ's and rq-scheduler's internals
is in ``engine.rqcompat``.

- A loop's timer is a one-shot rq-scheduler entry at the loop's next due time that enqueues
  ``worker.jobs.fire(loop_id)``. rq-scheduler stores whole seconds (``calendar.timegm``); ``MsScheduler`` keeps
  milliseconds, since slots are on the millisecond and a second of truncation is four times the lag budget.
- rq-scheduler's own ``run()`` loop and lock are not used (its lock release does not check the owner, issue
  #312); ``loopsq scheduler`` calls ``enqueue_jobs()`` under loopsq's owner-checked lock. Duplicated moves are
  harmless anyway: every slot attempt is claimed with SET NX.
- A fire job goes on to take the timer jobs queued right behind it (``take_fire``), without RQ's per-job
  bookkeeping; a taken job is marked started by its worker until done, as RQ would mark it.
- RQ wants a connection without ``decode_responses``; callers pass such a "raw" client.

loopsq's RQ worker class is in ``rq_worker`` (RQ only, no rq-scheduler).

Switching the timer (for example to RQ's own scheduler) touches this file and ``engine.rqcompat`` only
(docs/timer.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import redis
from redis.client import Pipeline

from loopsq.domain import labels
from loopsq.domain.timeutil import gen_id, now, to_iso, to_ms
from loopsq.engine.rqcompat import jobs as rqjobs
from loopsq.engine.rqcompat import names, scripts
from loopsq.engine.rqcompat.jobs import Job, MsScheduler, Queue
from loopsq.state.connection import sibling
from loopsq.state.keys import Keys
from loopsq.state.loop_watch import TIMER_PREFIX, armed_score_ms

log = logging.getLogger("loopsq.timers")

#: The default namespace's queue of runs that require nothing of their worker (a namespace's is
#: ``keys.base_queue``); a requirement set has a queue of its own (``domain.labels.queue_name``), listed in
#: ``keys.queues``.
QUEUE_NAME = labels.BASE_QUEUE
_DEFAULT_KEYS = Keys()
FIRE = "worker.jobs.fire"
#: Every timer's job id starts with this, then ``<loop id>-<due ms>-<random>``.
FIRE_PREFIX = TIMER_PREFIX
#: Results of loopsq's one-off jobs (run-now, a workflow run) are of no use once the run is recorded; kept briefly
#: for debugging.
RESULT_TTL = 60
#: A timer's fire job and a trigger's job leave nothing behind once done (RQ deletes the job at once; a result
#: would cost a stream of ~5 KB per job for a minute, at one job per run): the run is the record.
NO_RESULT_TTL = 0
FAILURE_TTL = 7 * 24 * 3600


def _now_s() -> float:
    """Now in epoch seconds on Redis's clock (``timeutil.now``), as rq-scheduler scores timers: a host whose clock
    is fast must not move a timer early."""
    return to_ms(now()) / 1000.0


def raw_from(client: redis.Redis) -> redis.Redis:
    """A bytes-responses client for RQ on the same server as ``client`` (through the same sentinels, for a
    Sentinel client: RQ's worker then follows a failover as loopsq's own client does)."""
    return sibling(client, decode_responses=False)


def scheduler(raw: redis.Redis, keys: Keys = _DEFAULT_KEYS) -> MsScheduler:
    """The timer store of ``keys``' namespace (no loop of its own is run)."""
    return rqjobs.scheduler(raw, keys.base_queue, keys.scheduled_jobs)


def queue(raw: redis.Redis, name: str = QUEUE_NAME) -> Queue:
    """One of loopsq's RQ queues (the base one by default). Jobs never time out in RQ: loopsq enforces target
    timeouts itself."""
    return rqjobs.queue(raw, name)


def queue_entry(name: str, base: str = QUEUE_NAME) -> str:
    """The registry entry (``keys.queues``) of a queue under ``base``: its requirement set and when it was first
    used."""
    return json.dumps({"labels": list(labels.queue_requirements(name, base) or ()), "since": to_iso(now())},
                      separators=(",", ":"))


def register_queue(client: redis.Redis, keys: Keys, name: str) -> None:
    """List ``name`` in the queue registry (a no-op for the base queue, and for one listed already)."""
    if name != keys.base_queue:
        client.hsetnx(keys.queues, name, queue_entry(name, keys.base_queue))


def registered_queues(client: redis.Redis, keys: Keys) -> dict[str, tuple[str, ...]]:
    """Every queue a run has been routed to, with its requirement set (the base queue, with none, included)."""
    return queues_named(client.hkeys(keys.queues), keys.base_queue)


def queues_named(names: Iterable[bytes | str], base: str = QUEUE_NAME) -> dict[str, tuple[str, ...]]:
    """The base queue ``base`` and each of ``names`` (the registry's, ``HKEYS keys.queues``) that is one of
    loopsq's under it, with its requirement set."""
    found: dict[str, tuple[str, ...]] = {base: ()}
    for name in names:
        text = _text(name)
        requirements = labels.queue_requirements(text, base)
        if requirements is not None:
            found[text] = requirements
    return found



def _arm_command(raw: redis.Redis, keys: Keys, loop_id: str, at: datetime, expect_loop: str | None,
                 queue_name: str) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``scripts.ARM`` for the loop's timer at ``at`` on ``queue_name``: the job is made as
    ``MsScheduler.enqueue_at`` makes it (rq-scheduler's ``_create_job``), not saved, its hash written by the
    script."""
    prefix = f"{FIRE_PREFIX}{loop_id}-{to_ms(at)}-"
    watch = str(armed_score_ms(to_ms(at), to_ms(now())))
    job_id = f"{prefix}{gen_id()[:6]}"
    fields = rqjobs.unsaved_job_fields(raw, queue_name, FIRE, (loop_id,), job_id, NO_RESULT_TTL)
    keys_ = [keys.timer(loop_id), keys.scheduled_jobs, keys.loop_watch, names.job_key(job_id), keys.loop(loop_id),
             keys.queues]
    listed = "" if queue_name == keys.base_queue else queue_name
    args = [prefix, watch, loop_id, job_id, str(to_ms(at) / 1000.0), names.JOB_PREFIX, keys.worker(""),
            expect_loop or "", listed, queue_entry(queue_name, keys.base_queue) if listed else "", *fields]
    return keys_, args


def arm(raw: redis.Redis, keys: Keys, loop_id: str, at: datetime, *, expect_loop: str | None = None,
        queue_name: str | None = None) -> str | None:
    """Arm the loop's single timer at ``at``, replacing any previous entry, in one round trip. Returns the
    timer's job id; None when ``expect_loop`` (a loop's JSON) was given and the loop is no longer that.

    When the entry already armed is for the same millisecond and still scheduled, no timer is written. Either way
    the loop's maintenance watch (``state.loop_watch``) moves to a grace after ``at``.
    """
    keys_, args = _arm_command(raw, keys, loop_id, at, expect_loop, queue_name or keys.base_queue)
    armed = raw.eval(scripts.ARM, len(keys_), *keys_, *args)
    return _text(armed) if armed else None


def arm_after(pipe: Pipeline, raw: redis.Redis, keys: Keys, loop_id: str, at: datetime, loop_json: str,
              queue_name: str | None = None) -> None:
    """Queue ``arm`` of the loop's timer at ``at`` on ``pipe``, right behind the transition that wrote the loop
    as ``loop_json``: it applies only while the loop is exactly that (see ``scripts.ARM``). The pipeline's reply for it
    is the armed job id, or 0. ``raw``: RQ's client, for the job's serializer."""
    keys_, args = _arm_command(raw, keys, loop_id, at, loop_json, queue_name or keys.base_queue)
    pipe.eval(scripts.ARM, len(keys_), *keys_, *args)


def disarm(raw: redis.Redis, keys: Keys, loop_id: str) -> None:
    """Remove the loop's timer entry, if any."""
    previous = raw.getdel(keys.timer(loop_id))
    if previous:
        raw.eval(scripts.DROP, 2, keys.scheduled_jobs, names.job_key(_text(previous)), _text(previous))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value



def armed_state(raw: redis.Redis, keys: Keys, loop_ids: list[str]) -> dict[str, tuple[float | None, str | None]]:
    """For each loop: (armed time in epoch seconds or None, status of the timer's job once it fired or None).

    A timer counts as present while it is scheduled, or fired and its job still queued or running. A job that
    RQ still calls ``started`` but whose worker's liveness key (``keys.worker(<RQ worker name>)``; loopsq's jobs
    use the RQ worker's name as their worker id) is gone is reported ``orphaned``: its worker was killed while it
    ran the job, nobody will finish it, so nothing it would have re-armed gets armed.
    """
    sched_key = keys.scheduled_jobs
    pipe = raw.pipeline(transaction=False)
    for loop_id in loop_ids:
        pipe.get(keys.timer(loop_id))
    job_ids = [v.decode() if v else None for v in pipe.execute()]
    pipe = raw.pipeline(transaction=False)
    for job_id in job_ids:
        if job_id:
            pipe.zscore(sched_key, job_id)
            pipe.hmget(names.job_key(job_id), ["status", "worker_name"])
    replies = pipe.execute()
    found: dict[str, tuple[float | None, str | None, str | None]] = {}
    it = iter(replies)
    for loop_id, job_id in zip(loop_ids, job_ids, strict=True):
        if not job_id:
            found[loop_id] = (None, None, None)
            continue
        score, (status, worker) = next(it), next(it)
        found[loop_id] = (float(score) if score is not None else None, _text(status) if status else None,
                          _text(worker) if worker else None)
    running = [(loop_id, worker) for loop_id, (_, status, worker) in found.items() if status == "started" and worker]
    pipe = raw.pipeline(transaction=False)
    for _, worker in running:
        pipe.exists(keys.worker(str(worker)))
    alive = pipe.execute() if running else []
    dead = {loop_id for (loop_id, _), live in zip(running, alive, strict=True) if not live}
    return {
        loop_id: (score, "orphaned" if loop_id in dead else status) for loop_id, (score, status, _) in found.items()
    }


def queued_in_place(raw: redis.Redis, job_id: str) -> bool | None:
    """Whether a fire job whose hash says ``queued`` really waits in the queue its ``origin`` names. None when its
    hash says anything else or is gone: nothing to judge. False: the job is stranded, no worker will ever take it
    (lost in a failover, say) while its loop counts it in flight.

    A job in RQ's intermediate list of the queue only counts as stranded too. A dequeue moves it there and the
    worker takes it out within milliseconds (``start_dequeued``); one left there had its dequeue's reply lost (a
    worker's connection closed under it in a failover) and would wait for RQ's own cleanup, run by RQ's
    maintenance every 10 minutes and only a minute after a first sighting. The caller asks only about a loop
    overdue past its grace (``engine.stalls``), long after any dequeue in progress; should one still be taking
    the job, the slot's claim keeps the re-armed timer from running it twice."""
    status = raw.hget(names.job_key(job_id), "status")
    if status is None or _text(status) != "queued":
        return None
    return raw.lpos(names.queue_key(_origin(raw, job_id)), job_id) is not None


def drop_stranded(raw: redis.Redis, job_id: str) -> None:
    """Delete a stranded fire job (``engine.stalls``): its hash, its entry in RQ's intermediate list of its queue if
    it is there, and the execution that shows it running on the worker that took it, if one did."""
    worker = raw.hget(names.job_key(job_id), "worker_name")
    pipe = raw.pipeline(transaction=False)
    pipe.lrem(names.intermediate_queue_key(_origin(raw, job_id)), 0, job_id)
    if worker and names.WORKER_HAS_EXECUTIONS:
        pipe.delete(names.taken_execution_key(job_id))
        pipe.srem(names.worker_executions_key(_text(worker)), f"{job_id}:{names.TAKEN_EXECUTION_ID}")
    pipe.delete(names.job_key(job_id))
    pipe.execute()


def _origin(raw: redis.Redis, job_id: str) -> str:
    """The queue a job was put on (its hash's ``origin``; the base queue when unknown)."""
    origin = raw.hget(names.job_key(job_id), "origin")
    return _text(origin) if origin else QUEUE_NAME


#: Timers moved per round trip at most (a backlog is moved in several).
MOVE_BATCH = 500


def move_due(raw: redis.Redis, now_s: float | None = None, keys: Keys = _DEFAULT_KEYS) -> int:
    """Move every due timer of ``keys``' namespace onto its queue in batches of ``MOVE_BATCH`` (one scripted round trip each; cost grows
    with what is due, not with what is armed). Safe to run from several schedulers at once. Returns how many."""
    until = repr(_now_s() if now_s is None else now_s)
    moved = 0
    while True:
        done, seen = raw.eval(scripts.MOVE_DUE, 3, keys.scheduled_jobs, names.queue_key(keys.base_queue),
                              names.QUEUES_KEY, until, MOVE_BATCH, names.JOB_PREFIX, names.rq_now_text(),
                              keys.base_queue, names.QUEUE_PREFIX)
        moved += int(done)
        if int(seen) < MOVE_BATCH:
            return moved


def move_due_stock(raw: redis.Redis) -> int:
    """rq-scheduler's own moving of due timers (``get_jobs_to_queue`` + ``enqueue_job``), kept as the baseline of
    ``bench/timer_move.py``; loopsq moves with ``move_due``."""
    sched = scheduler(raw)
    moved = 0
    for job in sched.get_jobs_to_queue():
        sched.enqueue_job(job)
        moved += 1
    return moved



def is_fire_job(job: Job) -> bool:
    """Whether ``job`` is a loop timer's fire job."""
    return str(job.id).startswith(FIRE_PREFIX) and job.func_name == FIRE


def start_dequeued(raw: redis.Redis, job: Job, worker: str) -> None:
    """Take a fire job RQ dequeued for ``worker`` as ``take_fire`` takes one (see ``_START_DEQUEUED``); it is
    settled the same way (``take_fire``'s ``done``, ``finish_taken``, ``fail_taken``)."""
    raw.eval(scripts.START_DEQUEUED, 3, names.intermediate_queue_key(job.origin or QUEUE_NAME), job.key,
             names.worker_key(worker), job.id, worker, names.rq_now_text())


#: How long RQ's failed registry keeps a taken timer job that failed (its error and loop), as RQ's
#: ``failure_ttl``: a day, so failures are seen on the dashboard without accumulating (issue 12).
TAKEN_FAILURE_TTL = 24 * 3600


class Taken(NamedTuple):
    """A timer job taken off a queue (``take_fire``) or dequeued by RQ: what its fire needs to know."""

    job_id: str
    loop_id: str
    #: When the scheduler moved it onto its queue (None: unknown).
    enqueued_at: datetime | None

    @property
    def due_ms(self) -> int | None:
        """The time its timer was armed at (epoch ms, from its id)."""
        return fire_due_ms(self.job_id)


def take_fire(raw: redis.Redis, worker: str, done: str | None = None, took_s: float = 0.0,
              queue_name: str = QUEUE_NAME) -> Taken | None:
    """Take the timer job at the head of loopsq's queue ``queue_name`` for ``worker`` to fire without another RQ
    job, or None when the head is not a timer's job (or the queue is empty).

    ``done``: the job this worker took before and has finished (in ``took_s`` seconds); it is settled in the same
    round trip as RQ would settle it (pass it to ``finish_taken`` instead when not taking another).
    """
    taken = raw.eval(scripts.TAKE_FIRE, 2, names.queue_key(queue_name), names.finished_registry_key(queue_name),
                     names.JOB_PREFIX, FIRE_PREFIX, worker, done or "", names.rq_now_text(), repr(took_s),
                     names.WORKER_PREFIX)
    if not taken:
        return None
    job_id, enqueued = _text(taken[0]), _text(taken[1])
    return Taken(job_id, fire_loop_id(job_id), _rq_time(enqueued))


def finish_taken(raw: redis.Redis, job_id: str, worker: str = "", took_s: float = 0.0,
                 queue_name: str = QUEUE_NAME) -> None:
    """A job from ``take_fire`` is done: settled as RQ settles a finished job (see ``take_fire``)."""
    raw.eval(scripts.FINISH, 2, names.queue_key(queue_name), names.finished_registry_key(queue_name),
             names.JOB_PREFIX, FIRE_PREFIX, worker, job_id, names.rq_now_text(), repr(took_s), names.WORKER_PREFIX)


def fail_taken(raw: redis.Redis, job_id: str, worker: str, error: str, took_s: float = 0.0) -> None:
    """A job from ``take_fire`` failed with ``error`` (a traceback): recorded as RQ records a failed job, under its
    own id, in the failed registry for ``TAKEN_FAILURE_TTL``, and the worker's failed count goes up."""
    rqjobs.fail_job(raw, job_id, worker, error, TAKEN_FAILURE_TTL, took_s)


def taken_of(job: Job) -> Taken:
    """What ``take_fire`` tells of a fire job RQ dequeued."""
    return Taken(str(job.id), fire_loop_id(str(job.id)), rqjobs.enqueued_at(job))


def _rq_time(text: str) -> datetime | None:
    """A time as RQ stores it in a job hash (``utcformat``), None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def fire_due_ms(job_id: str) -> int | None:
    """The due time (epoch ms) in a timer's job id, None when it has none."""
    parts = job_id[len(FIRE_PREFIX):].rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def fire_loop_id(job_id: str) -> str:
    """The loop of a timer's job id (``loopsq-fire-<loop id>-<due ms>-<random>``)."""
    return job_id[len(FIRE_PREFIX):].rsplit("-", 2)[0]


def next_due_in(raw: redis.Redis, keys: Keys = _DEFAULT_KEYS) -> float | None:
    """Seconds until the earliest armed timer of ``keys``' namespace (negative when overdue), None when nothing is
    armed."""
    first = raw.zrange(keys.scheduled_jobs, 0, 0, withscores=True)
    if not first:
        return None
    return float(first[0][1]) - _now_s()


def enqueue(raw: redis.Redis, func: str, *args: Any, job_id: str | None = None, result_ttl: int = RESULT_TTL,
            queue_name: str | None = None, keys: Keys | None = None, **kwargs: Any) -> str:
    """Enqueue a loopsq job now on ``queue_name`` (the queue of the run's requirement set, listed in the queue
    registry of ``keys``); returns its id. ``result_ttl``: seconds RQ keeps the finished job and its result (0:
    deleted when done)."""
    keys = keys or _DEFAULT_KEYS
    queue_name = queue_name or keys.base_queue
    register_queue(raw, keys, queue_name)
    return rqjobs.enqueue(raw, queue_name, func, *args, job_id=job_id, result_ttl=result_ttl,
                          failure_ttl=FAILURE_TTL, **kwargs)


def queue_depth(raw: redis.Redis, keys: Keys = _DEFAULT_KEYS) -> int:
    """Jobs waiting in the base queue of ``keys``' namespace."""
    return rqjobs.queue_count(raw, keys.base_queue)


def scheduled_count(raw: redis.Redis, keys: Keys = _DEFAULT_KEYS) -> int:
    """Timers armed in ``keys``' namespace."""
    return int(raw.zcard(keys.scheduled_jobs))


# -- what the fleet view reads (``engine.fleet``, pipelined with its other reads): RQ's and rq-scheduler's keys ----
ENQUEUED_AT = names.ENQUEUED_AT


def queue_key(name: str) -> str:
    """RQ's list of the ids of the jobs waiting in queue ``name``; its head (index 0) is dequeued first."""
    return names.queue_key(name)


def job_key(job_id: str) -> str:
    """RQ's hash of job ``job_id`` (``ENQUEUED_AT`` among its fields)."""
    return names.job_key(job_id)


def enqueued_time(value: bytes | str | None) -> datetime | None:
    """An ``ENQUEUED_AT`` value as an aware UTC time; None when absent or not RQ's format."""
    if not value:
        return None
    try:
        return names.parse_rq_time(_text(value))
    except ValueError:
        return None


def scheduled_key(keys: Keys = _DEFAULT_KEYS) -> str:
    """The sorted set of ``keys``' namespace's armed timers, in rq-scheduler's format: job id -> due time in epoch
    seconds (to the millisecond, as ``MsScheduler`` writes them)."""
    return keys.scheduled_jobs
