"""RQ's and rq-scheduler's Redis layout as loopsq relies on it: key names, hash fields, the time format, and the
RQ line in use. Each name is one assumption, checked against the installed RQ by ``tests/contract``."""

from __future__ import annotations

from datetime import datetime

from rq.utils import now as _rq_now
from rq.utils import utcformat, utcparse
from rq.version import VERSION

#: The RQ line installed: 2 (2.12) or 3 (3.x). The differences loopsq meets are handled in this package only.
RQ_MAJOR = int(VERSION.split(".", 1)[0])
#: RQ 3 replaced the worker hash's ``current_job`` field by a set of executions (``worker_executions_key``).
WORKER_HAS_EXECUTIONS = RQ_MAJOR >= 3

#: Every RQ key starts with ``rq:`` (RQ 3 reads another prefix from ``RQ_KEY_PREFIX``: loopsq does not support
#: one). RQ's list of the ids of the jobs waiting in a queue is this prefix + the queue's name; its head (index 0)
#: is dequeued first.
QUEUE_PREFIX = "rq:queue:"
#: RQ's set of every queue's key (what ``Queue.all`` reads): a queue a job is pushed onto is added to it.
QUEUES_KEY = "rq:queues"
#: RQ's hash of a job is this prefix + the job id.
JOB_PREFIX = "rq:job:"
#: RQ's hash of a worker is this prefix + the worker's name (``state``, counts, ``queues``, heartbeat).
WORKER_PREFIX = "rq:worker:"
#: An execution's hash is this prefix + ``<job id>:<execution id>``.
EXECUTION_PREFIX = "rq:execution:"
#: The field of an RQ job's hash that holds when the job was put on its queue (RQ's time format, UTC).
ENQUEUED_AT = "enqueued_at"
#: rq-scheduler's sorted set of scheduled jobs: job id -> due time in epoch seconds.
SCHEDULED_KEY = "rq:scheduler:scheduled_jobs"


def queue_key(name: str) -> str:
    """RQ's list of the ids of the jobs waiting in queue ``name``; its head (index 0) is dequeued first."""
    return f"{QUEUE_PREFIX}{name}"


def intermediate_queue_key(name: str) -> str:
    """RQ's intermediate list of queue ``name``: a dequeue (BLMOVE/LMOVE) moves a job's id there until the worker
    starts it (RQ's worker removes it then, when it listens on one queue; its maintenance cleans the rest)."""
    return f"{QUEUE_PREFIX}{name}:intermediate"


def job_key(job_id: str) -> str:
    """RQ's hash of job ``job_id`` (``ENQUEUED_AT``, ``status``, ``origin``, ``worker_name`` among its fields)."""
    return f"{JOB_PREFIX}{job_id}"


def worker_key(name: str) -> str:
    """RQ's hash of worker ``name``."""
    return f"{WORKER_PREFIX}{name}"


def worker_executions_key(name: str) -> str:
    """RQ 3's set of a worker's executions (``<job id>:<execution id>``), which says what the worker runs now (RQ
    2 kept one ``current_job`` field in the worker's hash instead)."""
    return f"{WORKER_PREFIX}{name}:executions"


def started_registry_key(queue_name: str) -> str:
    """RQ's started registry of a queue (``<job id>:<execution id>`` -> expiry)."""
    return f"rq:wip:{queue_name}"


def finished_registry_key(queue_name: str) -> str:
    """RQ's finished registry of a queue (job id -> when its result expires)."""
    return f"rq:finished:{queue_name}"


def failed_registry_key(queue_name: str) -> str:
    """RQ's failed registry of a queue (job id -> when the failure expires)."""
    return f"rq:failed:{queue_name}"


def job_registry_keys(queue_name: str) -> list[str]:
    """Every registry of a queue but the started one, where RQ's ``Job.delete`` may remove a job from (RQ 3 adds
    a registry of jobs ready to enqueue)."""
    names = ["finished", "deferred", "scheduled", "failed", "canceled"]
    if RQ_MAJOR >= 3:
        names.append("ready")
    return [f"rq:{name}:{queue_name}" for name in names]


def executions_registry_key(job_id: str) -> str:
    """RQ's sorted set of a job's executions (execution id -> expiry)."""
    return f"rq:executions:{job_id}"


def rq_now_text() -> str:
    """Now in RQ's time format (``utcformat``: ``%Y-%m-%dT%H:%M:%S.%fZ``, UTC), as RQ writes times in its hashes."""
    return str(utcformat(_rq_now()))


def rq_now() -> datetime:
    """Now, as RQ's patchable clock gives it (aware UTC)."""
    value: datetime = _rq_now()
    return value


def parse_rq_time(text: str) -> datetime:
    """A time in RQ's format as an aware UTC datetime (ValueError when it is not)."""
    value: datetime = utcparse(text)
    return value


#: On RQ 3, a timer job loopsq runs without RQ's worker bookkeeping (taken, or dequeued and started by loopsq) is
#: shown as its worker's current job by an execution of this id (``<job id>:loopsq`` in the worker's executions
#: set, its hash under ``EXECUTION_PREFIX``): what RQ's ``Worker.get_current_job`` and rq-dashboard read. RQ 2
#: reads the worker hash's ``current_job`` field instead.
TAKEN_EXECUTION_ID = "loopsq"
#: How long such an execution's hash outlives a worker killed while it ran the job (RQ 3 drops the worker's
#: executions set with the worker; the hash alone would stay).
TAKEN_EXECUTION_TTL_S = 24 * 3600


def taken_execution_key(job_id: str) -> str:
    """The hash of the execution that shows a taken timer job (``TAKEN_EXECUTION_ID``) on RQ 3."""
    return f"{EXECUTION_PREFIX}{job_id}:{TAKEN_EXECUTION_ID}"
