"""The one module that imports rq-scheduler: timers, and loopsq's RQ queue.

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

Switching the timer (for example to RQ's own scheduler) touches this file only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import redis
from redis.client import Pipeline
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.utils import now as utcnow
from rq.utils import utcformat, utcparse
from rq.worker import Worker
from rq_scheduler import Scheduler

from loopsq.domain import labels
from loopsq.domain.timeutil import gen_id, now, to_iso, to_ms
from loopsq.state.connection import sibling
from loopsq.state.keys import Keys
from loopsq.state.loop_watch import TIMER_PREFIX, armed_score_ms

log = logging.getLogger("loopsq.timers")

#: The queue of runs that require nothing of their worker; a requirement set has a queue of its own
#: (``domain.labels.queue_name``), listed in ``keys.queues``.
QUEUE_NAME = labels.BASE_QUEUE
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


class MsScheduler(Scheduler):  # type: ignore[misc]
    """rq-scheduler with millisecond scores instead of whole seconds."""

    def enqueue_at(self, scheduled_time: datetime, func: Any, *args: Any, **kwargs: Any) -> Job:
        timeout = kwargs.pop("timeout", None)
        job_id = kwargs.pop("job_id", None)
        result_ttl = kwargs.pop("job_result_ttl", None)
        queue_name = kwargs.pop("queue_name", None)
        meta = kwargs.pop("meta", None)
        job = self._create_job(
            func, args=args, kwargs=kwargs, timeout=timeout, id=job_id, result_ttl=result_ttl,
            queue_name=queue_name, meta=meta,
        )
        self.connection.zadd(self.scheduled_jobs_key, {job.id: to_ms(scheduled_time) / 1000.0})
        created: Job = job
        return created

    def get_jobs_to_queue(self, with_times: bool = False) -> Any:
        return self.get_jobs(time.time(), with_times=with_times)


def raw_from(client: redis.Redis) -> redis.Redis:
    """A bytes-responses client for RQ on the same server as ``client`` (through the same sentinels, for a
    Sentinel client: RQ's worker then follows a failover as loopsq's own client does)."""
    return sibling(client, decode_responses=False)


def scheduler(raw: redis.Redis) -> MsScheduler:
    """The timer store (no loop of its own is run)."""
    return MsScheduler(queue_name=QUEUE_NAME, connection=raw, interval=1)


def queue(raw: redis.Redis, name: str = QUEUE_NAME) -> Queue:
    """One of loopsq's RQ queues (the base one by default). Jobs never time out in RQ: loopsq enforces target
    timeouts itself."""
    return Queue(name, connection=raw, default_timeout=-1)


def queue_entry(name: str) -> str:
    """The registry entry (``keys.queues``) of a queue: its requirement set and when it was first used."""
    return json.dumps({"labels": list(labels.queue_requirements(name) or ()), "since": to_iso(now())},
                      separators=(",", ":"))


def register_queue(client: redis.Redis, keys: Keys, name: str) -> None:
    """List ``name`` in the queue registry (a no-op for the base queue, and for one listed already)."""
    if name != QUEUE_NAME:
        client.hsetnx(keys.queues, name, queue_entry(name))


def registered_queues(client: redis.Redis, keys: Keys) -> dict[str, tuple[str, ...]]:
    """Every queue a run has been routed to, with its requirement set (the base queue, with none, included)."""
    return queues_named(client.hkeys(keys.queues))


def queues_named(names: Iterable[bytes | str]) -> dict[str, tuple[str, ...]]:
    """The base queue and each of ``names`` (the registry's, ``HKEYS keys.queues``) that is one of loopsq's, with
    its requirement set."""
    found: dict[str, tuple[str, ...]] = {QUEUE_NAME: ()}
    for name in names:
        text = _text(name)
        requirements = labels.queue_requirements(text)
        if requirements is not None:
            found[text] = requirements
    return found


# Arm a loop's timer in one round trip. When the entry armed already is for the same millisecond and still
# scheduled, nothing is written but the loop's maintenance watch, which moves past the timer's time as a new arm
# would move it. Otherwise: the new job hash, its rq-scheduler entry, the swap of the loop's timer, and the drop of
# the entry it replaces if that is still scheduled, or if it was taken by a worker that is gone (``take_fire``; RQ
# never saw it, so nothing else would delete it). A scheduled entry rq-scheduler is moving right now (it enqueues
# the job before it removes the entry) keeps its job hash: a worker may be running it, and RQ deletes it when done
# (fire jobs keep no result).
#
# With an expected loop (ARGV[8] not empty) the timer is armed only while the loop's JSON is exactly that: the
# arm that follows a claim or a finalize in the same round trip (``arm_after``) then applies only when that
# transition's loop is the loop now, so it can never arm a loop that someone else has moved since.
#
# The job's queue (its ``origin``) is the loop's requirement set's (``domain.labels.queue_name``); a queue other
# than the base one is listed in loopsq's queue registry (``keys.queues``), where workers find what to listen on.
#
# KEYS: the loop's timer key, the scheduled set, the loop watch, the new job's hash, the loop, the queue registry.
# ARGV: job id prefix (loop and ms), watch score, loop id, new job id, score (s), job key prefix, worker key
#       prefix, expected loop JSON or '', the queue to list ('' for the base one) and its registry entry, then
#       the job hash's fields and values.
# Returns the armed job id, or 0 when the loop was not the one expected.
_ARM = """
if ARGV[8] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[8] then return 0 end
local id = redis.call('GET', KEYS[1])
if id and string.sub(id, 1, #ARGV[1]) == ARGV[1] and redis.call('ZSCORE', KEYS[2], id) then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
  return id
end
if ARGV[9] ~= '' then redis.call('HSETNX', KEYS[6], ARGV[9], ARGV[10]) end
redis.call('HSET', KEYS[4], unpack(ARGV, 11))
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
redis.call('SET', KEYS[1], ARGV[4])
if id and id ~= ARGV[4] then
  if redis.call('ZREM', KEYS[2], id) == 1 then
    local status = redis.call('HGET', ARGV[6] .. id, 'status')
    if status ~= 'queued' and status ~= 'started' then redis.call('DEL', ARGV[6] .. id) end
  else
    local taken = redis.call('HMGET', ARGV[6] .. id, 'loopsq_taken', 'worker_name')
    if taken[1] and taken[2] and redis.call('EXISTS', ARGV[7] .. taken[2]) == 0 then
      redis.call('DEL', ARGV[6] .. id)
    end
  end
end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
return ARGV[4]
"""


def _arm_command(raw: redis.Redis, keys: Keys, loop_id: str, at: datetime, expect_loop: str | None,
                 queue_name: str) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``_ARM`` for the loop's timer at ``at`` on ``queue_name``: the job is made as
    ``MsScheduler.enqueue_at`` makes it (rq-scheduler's ``_create_job``), not saved, its hash written by the
    script."""
    sched = scheduler(raw)
    prefix = f"{FIRE_PREFIX}{loop_id}-{to_ms(at)}-"
    watch = str(armed_score_ms(to_ms(at), int(time.time() * 1000)))
    job_id = f"{prefix}{gen_id()[:6]}"
    job = sched._create_job(FIRE, args=(loop_id,), timeout=-1, id=job_id, result_ttl=NO_RESULT_TTL,
                            queue_name=queue_name, commit=False)
    fields: list[Any] = []
    for name, value in job.to_dict(include_meta=True).items():
        fields += (name, value)
    keys_ = [keys.timer(loop_id), sched.scheduled_jobs_key, keys.loop_watch, job.key, keys.loop(loop_id),
             keys.queues]
    listed = "" if queue_name == QUEUE_NAME else queue_name
    args = [prefix, watch, loop_id, job_id, str(to_ms(at) / 1000.0), Job.key_for(""), keys.worker(""),
            expect_loop or "", listed, queue_entry(queue_name) if listed else "", *fields]
    return keys_, args


def arm(raw: redis.Redis, keys: Keys, loop_id: str, at: datetime, *, expect_loop: str | None = None,
        queue_name: str = QUEUE_NAME) -> str | None:
    """Arm the loop's single timer at ``at``, replacing any previous entry, in one round trip. Returns the
    timer's job id; None when ``expect_loop`` (a loop's JSON) was given and the loop is no longer that.

    When the entry already armed is for the same millisecond and still scheduled, no timer is written. Either way
    the loop's maintenance watch (``state.loop_watch``) moves to a grace after ``at``.
    """
    keys_, args = _arm_command(raw, keys, loop_id, at, expect_loop, queue_name)
    armed = raw.eval(_ARM, len(keys_), *keys_, *args)
    return _text(armed) if armed else None


def arm_after(pipe: Pipeline, raw: redis.Redis, keys: Keys, loop_id: str, at: datetime, loop_json: str,
              queue_name: str = QUEUE_NAME) -> None:
    """Queue ``arm`` of the loop's timer at ``at`` on ``pipe``, right behind the transition that wrote the loop
    as ``loop_json``: it applies only while the loop is exactly that (see ``_ARM``). The pipeline's reply for it
    is the armed job id, or 0. ``raw``: RQ's client, for the job's serializer."""
    keys_, args = _arm_command(raw, keys, loop_id, at, loop_json, queue_name)
    pipe.eval(_ARM, len(keys_), *keys_, *args)


def disarm(raw: redis.Redis, keys: Keys, loop_id: str) -> None:
    """Remove the loop's timer entry, if any."""
    previous = raw.getdel(keys.timer(loop_id))
    if previous:
        _drop(raw, scheduler(raw), _text(previous))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Unschedule a timer entry; its job hash goes too unless rq-scheduler is moving it onto the queue right now.
_DROP = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  local status = redis.call('HGET', KEYS[2], 'status')
  if status ~= 'queued' and status ~= 'started' then redis.call('DEL', KEYS[2]) end
end
return 1
"""


def _drop(raw: redis.Redis, sched: MsScheduler, job_id: str) -> None:
    raw.eval(_DROP, 2, sched.scheduled_jobs_key, Job.key_for(job_id), job_id)


def armed_state(raw: redis.Redis, keys: Keys, loop_ids: list[str]) -> dict[str, tuple[float | None, str | None]]:
    """For each loop: (armed time in epoch seconds or None, status of the timer's job once it fired or None).

    A timer counts as present while it is scheduled, or fired and its job still queued or running. A job that
    RQ still calls ``started`` but whose worker's liveness key (``keys.worker(<RQ worker name>)``; loopsq's jobs
    use the RQ worker's name as their worker id) is gone is reported ``orphaned``: its worker was killed while it
    ran the job, nobody will finish it, so nothing it would have re-armed gets armed.
    """
    sched_key = scheduler(raw).scheduled_jobs_key
    pipe = raw.pipeline(transaction=False)
    for loop_id in loop_ids:
        pipe.get(keys.timer(loop_id))
    job_ids = [v.decode() if v else None for v in pipe.execute()]
    pipe = raw.pipeline(transaction=False)
    for job_id in job_ids:
        if job_id:
            pipe.zscore(sched_key, job_id)
            pipe.hmget(Job.key_for(job_id), ["status", "worker_name"])
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
    status = raw.hget(Job.key_for(job_id), "status")
    if status is None or _text(status) != JobStatus.QUEUED.value:
        return None
    return raw.lpos(queue(raw, _origin(raw, job_id)).key, job_id) is not None


def drop_stranded(raw: redis.Redis, job_id: str) -> None:
    """Delete a fire job ``queued_in_place`` found in no queue: its hash, and its entry in RQ's intermediate list
    of its queue if it is there."""
    pipe = raw.pipeline(transaction=False)
    pipe.lrem(queue(raw, _origin(raw, job_id)).intermediate_queue_key, 0, job_id)
    pipe.delete(Job.key_for(job_id))
    pipe.execute()


def _origin(raw: redis.Redis, job_id: str) -> str:
    """The queue a job was put on (its hash's ``origin``; the base queue when unknown)."""
    origin = raw.hget(Job.key_for(job_id), "origin")
    return _text(origin) if origin else QUEUE_NAME


# Move due timers onto their queues: what rq-scheduler's ``enqueue_jobs`` does (the job marked queued with its
# enqueue time, its id pushed onto its queue, the one its ``origin`` names, the entry removed), for a batch in one
# round trip and atomically
# per entry: ZREM decides who moves an entry, so any number of schedulers may move at once without duplicating
# one. (Stock rq-scheduler fetches and unpickles each job, saves it whole, then ZREMs it: ~3 round trips a timer,
# and two schedulers can both enqueue one entry.)
_MOVE_DUE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local moved = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local key = ARGV[3] .. id
    local origin = redis.call('HGET', key, 'origin')
    if origin then
      if origin == '' then origin = ARGV[5] end
      redis.call('HSET', key, 'status', 'queued', 'enqueued_at', ARGV[4])
      local qkey = ARGV[6] .. origin
      redis.call('RPUSH', qkey, id)
      redis.call('SADD', KEYS[3], qkey)
      moved = moved + 1
    end
  end
end
return {moved, #ids}
"""

#: Timers moved per round trip at most (a backlog is moved in several).
MOVE_BATCH = 500


def move_due(raw: redis.Redis, now_s: float | None = None) -> int:
    """Move every due timer onto the queue in batches of ``MOVE_BATCH`` (one scripted round trip each; cost grows
    with what is due, not with what is armed). Safe to run from several schedulers at once. Returns how many."""
    sched, q = scheduler(raw), queue(raw)
    until = repr(time.time() if now_s is None else now_s)
    moved = 0
    while True:
        done, seen = raw.eval(_MOVE_DUE, 3, sched.scheduled_jobs_key, q.key, q.redis_queues_keys, until,
                              MOVE_BATCH, Job.key_for(""), utcformat(utcnow()), q.name,
                              Queue.redis_queue_namespace_prefix)
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


# Settle the job a worker took before (ARGV[4]; ARGV[6]: seconds it took) as RQ settles a finished job: the worker's
# successful count and working time go up (when it is an RQ worker), and the job, by its own result_ttl, is
# deleted (0, what timer jobs carry) or kept that long as finished, listed in the finished registry (KEYS[2],
# whose expired entries go on the way; no result stream: a fire's return value is in its run).
_SETTLE = """
local function settle(id, worker, now, took)
  local key = ARGV[1] .. id
  local wkey = ARGV[7] .. worker
  if redis.call('EXISTS', wkey) == 1 then
    redis.call('HINCRBY', wkey, 'successful_job_count', 1)
    redis.call('HINCRBYFLOAT', wkey, 'total_working_time', took)
  end
  local ttl = tonumber(redis.call('HGET', key, 'result_ttl') or '0') or 0
  if ttl <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'status', 'finished', 'ended_at', ARGV[5])
  redis.call('HDEL', key, 'loopsq_taken')
  redis.call('EXPIRE', key, ttl)
  local t = redis.call('TIME')
  local now_s = tonumber(t[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_s)
  redis.call('ZADD', KEYS[2], now_s + ttl, id)
end
"""

# Take the fire entry at the head of the queue, if the head is one (anything else is left for RQ, in order): pop
# it and mark its job started by this worker, as RQ would, so maintenance counts the timer in flight while this
# live worker runs it. The job taken before (ARGV[4]) is done: settled in the same round trip.
_TAKE_FIRE = _SETTLE + """
if ARGV[4] ~= '' then settle(ARGV[4], ARGV[3], ARGV[5], ARGV[6]) end
while true do
  local id = redis.call('LINDEX', KEYS[1], 0)
  if not id or string.sub(id, 1, #ARGV[2]) ~= ARGV[2] then return false end
  redis.call('LPOP', KEYS[1])
  local key = ARGV[1] .. id
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, 'status', 'started', 'worker_name', ARGV[3], 'started_at', ARGV[5], 'loopsq_taken', '1')
    return {id, redis.call('HGET', key, 'enqueued_at') or ''}
  end
end
"""

_FINISH = _SETTLE + """
settle(ARGV[4], ARGV[3], ARGV[5], ARGV[6])
return 1
"""

# A timer job that RQ dequeued for this worker is run as loopsq runs the ones it takes (``take_fire``), without RQ's
# per-job bookkeeping: out of RQ's intermediate list (RQ's dequeue moved it there), marked started by this worker,
# and the worker shown busy with it, as RQ would show it. KEYS: the intermediate list, the job, the RQ worker.
_START_DEQUEUED = """
redis.call('LREM', KEYS[1], 1, ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'status', 'started', 'worker_name', ARGV[2], 'started_at', ARGV[3], 'loopsq_taken', '1')
end
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('HSET', KEYS[3], 'state', 'busy', 'current_job', ARGV[1]) end
return 1
"""


def is_fire_job(job: Job) -> bool:
    """Whether ``job`` is a loop timer's fire job."""
    return str(job.id).startswith(FIRE_PREFIX) and job.func_name == FIRE


def start_dequeued(raw: redis.Redis, job: Job, worker: str) -> None:
    """Take a fire job RQ dequeued for ``worker`` as ``take_fire`` takes one (see ``_START_DEQUEUED``); it is
    settled the same way (``take_fire``'s ``done``, ``finish_taken``, ``fail_taken``)."""
    q = queue(raw, job.origin or QUEUE_NAME)
    raw.eval(_START_DEQUEUED, 3, q.intermediate_queue_key, job.key, f"{Worker.redis_worker_namespace_prefix}{worker}",
             job.id, worker, utcformat(utcnow()))


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
    q = queue(raw, queue_name)
    taken = raw.eval(_TAKE_FIRE, 2, q.key, q.finished_job_registry.key, Job.key_for(""), FIRE_PREFIX, worker,
                     done or "", utcformat(utcnow()), repr(took_s), Worker.redis_worker_namespace_prefix)
    if not taken:
        return None
    job_id, enqueued = _text(taken[0]), _text(taken[1])
    return Taken(job_id, fire_loop_id(job_id), _rq_time(enqueued))


def finish_taken(raw: redis.Redis, job_id: str, worker: str = "", took_s: float = 0.0) -> None:
    """A job from ``take_fire`` is done: settled as RQ settles a finished job (see ``take_fire``)."""
    q = queue(raw)
    raw.eval(_FINISH, 2, q.key, q.finished_job_registry.key, Job.key_for(""), FIRE_PREFIX, worker, job_id,
             utcformat(utcnow()), repr(took_s), Worker.redis_worker_namespace_prefix)


def fail_taken(raw: redis.Redis, job_id: str, worker: str, error: str, took_s: float = 0.0) -> None:
    """A job from ``take_fire`` failed with ``error`` (a traceback): recorded as RQ records a failed job, under its
    own id, in the failed registry for ``TAKEN_FAILURE_TTL``, and the worker's failed count goes up."""
    try:
        job = Job.fetch(job_id, connection=raw)
    except NoSuchJobError:
        return
    job.failure_ttl = TAKEN_FAILURE_TTL
    job.ended_at = utcnow()
    wkey = f"{Worker.redis_worker_namespace_prefix}{worker}"
    with raw.pipeline() as pipe:
        job.set_status(JobStatus.FAILED, pipeline=pipe)
        job._handle_failure(error, pipe, worker_name=worker)
        pipe.hdel(job.key, "loopsq_taken")
        pipe.execute()
    if worker and raw.exists(wkey):
        pipe = raw.pipeline()
        pipe.hincrby(wkey, "failed_job_count", 1)
        pipe.hincrbyfloat(wkey, "total_working_time", took_s)
        pipe.execute()


def taken_of(job: Job) -> Taken:
    """What ``take_fire`` tells of a fire job RQ dequeued."""
    enqueued = job.enqueued_at
    if enqueued is not None and enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=UTC)
    return Taken(str(job.id), fire_loop_id(str(job.id)), enqueued)


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


def next_due_in(raw: redis.Redis) -> float | None:
    """Seconds until the earliest armed timer (negative when overdue), None when nothing is armed."""
    first = raw.zrange(scheduler(raw).scheduled_jobs_key, 0, 0, withscores=True)
    if not first:
        return None
    return float(first[0][1]) - time.time()


def enqueue(raw: redis.Redis, func: str, *args: Any, job_id: str | None = None, result_ttl: int = RESULT_TTL,
            queue_name: str = QUEUE_NAME, keys: Keys | None = None, **kwargs: Any) -> str:
    """Enqueue a loopsq job now on ``queue_name`` (the queue of the run's requirement set, listed in the queue
    registry of ``keys``); returns its id. ``result_ttl``: seconds RQ keeps the finished job and its result (0:
    deleted when done)."""
    register_queue(raw, keys or Keys(), queue_name)
    job = queue(raw, queue_name).enqueue(
        func, *args, job_id=job_id, job_timeout=-1, result_ttl=result_ttl, failure_ttl=FAILURE_TTL, **kwargs
    )
    return str(job.id)


def queue_depth(raw: redis.Redis) -> int:
    """Jobs waiting in loopsq's queue."""
    return int(queue(raw).count)


def scheduled_count(raw: redis.Redis) -> int:
    """Timers armed."""
    return int(raw.zcard(scheduler(raw).scheduled_jobs_key))


# -- what the fleet view reads (``engine.fleet``, pipelined with its other reads): RQ's and rq-scheduler's keys ----
#: The field of an RQ job's hash that holds when the job was put on its queue (RQ's time format, UTC).
ENQUEUED_AT = "enqueued_at"


def queue_key(name: str) -> str:
    """RQ's list of the ids of the jobs waiting in queue ``name``; its head (index 0) is dequeued first."""
    return f"{Queue.redis_queue_namespace_prefix}{name}"


def job_key(job_id: str) -> str:
    """RQ's hash of job ``job_id`` (``ENQUEUED_AT`` among its fields)."""
    return str(Job.key_for(job_id))


def enqueued_time(value: bytes | str | None) -> datetime | None:
    """An ``ENQUEUED_AT`` value as an aware UTC time; None when absent or not RQ's format."""
    if not value:
        return None
    try:
        return utcparse(_text(value))
    except ValueError:
        return None


def scheduled_key() -> str:
    """rq-scheduler's sorted set of armed timers: job id -> due time in epoch seconds (to the millisecond, as
    ``MsScheduler`` writes them)."""
    return str(MsScheduler.scheduled_jobs_key)
