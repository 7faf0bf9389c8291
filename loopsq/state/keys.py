"""Every Redis key name loopsq uses, in one place.

Keys live under a namespace (default ``loopsq``; ``LOOPSQ_NAMESPACE`` or ``--namespace``) so that one Redis can
host several deployments. Nothing else in the code base spells a key. The namespace also names the deployment's RQ
queues (``base_queue``) and its timer set (``scheduled_jobs``). The default namespace keeps exactly the key and
queue names loopsq used before namespaces could be chosen, so choosing none needs no state-layout change.

A user-chosen value inside a key (a workspace key, a pool name, an idempotency key, a host, a step id) is spelled
by ``key_part``, so that no value can make another value's key: ``workspace("X:fence")`` is not
``workspace_fence("X")``. Values loopsq generates (ids, ISO slots, holder ids) are spelled as they are.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from urllib.parse import unquote_to_bytes

from loopsq.domain.namespaces import DEFAULT_NAMESPACE

#: rq-scheduler's own sorted set of scheduled jobs: the default namespace's timers (``Keys.scheduled_jobs``).
RQ_SCHEDULED_JOBS = "rq:scheduler:scheduled_jobs"

#: The longest spelling of a user-chosen value inside a key. Longer ones are cut and end in a digest (``key_part``).
MAX_PART_LENGTH = 200
#: What ends a cut spelling, before the SHA-256 digest of the whole value: ``%`` then a letter that is no hex digit,
#: which no uncut spelling contains (its every ``%`` starts an ``%XX`` escape).
DIGEST_MARK = "%sha256-"
#: What a value's characters may be to be spelled as they are: printable ASCII except the key separator ``:``, the
#: escape ``%``, Redis Cluster's hash-tag braces ``{}``, the glob characters of ``SCAN MATCH``/``KEYS`` patterns
#: (``* ? [ ] \``) and ``|``, which joins a pool and a holder in a lease key and parts of stored values.
PLAIN = frozenset(chr(code) for code in range(0x21, 0x7F)) - frozenset(":%{}*?[]\\|")
_PLAIN_RE = re.compile("[" + re.escape("".join(sorted(PLAIN))) + "]*")
_CUT_LENGTH = MAX_PART_LENGTH - len(DIGEST_MARK) - 64
_OUTSIDE_SPELLINGS = re.compile("[^" + re.escape("".join(sorted(PLAIN))) + "%]")


def _escaped(ch: str) -> str:
    if ch in PLAIN:
        return ch
    return "".join(f"%{byte:02X}" for byte in ch.encode("utf-8", "surrogatepass"))


def key_part(value: str) -> str:
    """How a user-chosen value is spelled inside a key: injective, at most ``MAX_PART_LENGTH`` characters, and
    readable in ``redis-cli``.

    A value of plain characters (``PLAIN``) that fits is spelled as it is, so that such values keep the spelling
    older versions gave them. Any other character becomes ``%XX`` per byte of its UTF-8 (percent-encoding, ``%``
    itself included), which is reversible. A spelling longer than ``MAX_PART_LENGTH`` (a value of more than 200
    characters, or one with many escapes) is cut at an escape boundary and followed by ``DIGEST_MARK`` and the
    SHA-256 of the whole value, which no uncut spelling can look like (two cut spellings meet only if SHA-256
    collides).

    Example: ``key_part("X:fence") == "X%3Afence"``, ``key_part("repo") == "repo"``.
    """
    if len(value) <= MAX_PART_LENGTH and _PLAIN_RE.fullmatch(value):
        return value
    pieces = [_escaped(ch) for ch in value[:MAX_PART_LENGTH + 1]]
    spelled = "".join(pieces)
    if len(value) <= MAX_PART_LENGTH and len(spelled) <= MAX_PART_LENGTH:
        return spelled
    head: list[str] = []
    size = 0
    for piece in pieces:
        if size + len(piece) > _CUT_LENGTH:
            break
        head.append(piece)
        size += len(piece)
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return "".join(head) + DIGEST_MARK + digest


def spelled_as_before(value: str) -> bool:
    """True when ``value`` is spelled in keys as loopsq spelled it before ``key_part`` (a plain value that fits):
    then its keys are the same under both spellings (``Keys.before_encoding``)."""
    return key_part(value) == value


def _is_a_spelling(text: str) -> bool:
    """True when ``text`` is what ``key_part`` makes of some value."""
    if len(text) > MAX_PART_LENGTH or _OUTSIDE_SPELLINGS.search(text):
        return False
    if DIGEST_MARK in text:
        return True  # maybe a cut spelling: its value cannot be known
    try:
        value = unquote_to_bytes(text).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return key_part(value) == text


def has_old_spelling(value: str) -> bool:
    """True when versions before ``key_part`` spelled ``value``'s keys otherwise, in a way that no value's keys are
    spelled now: only then may that old spelling (``Keys.before_encoding``) be read or deleted, as whatever is
    there was written for ``value`` itself. ``X:fence`` has one (``X%3Afence`` now); ``repo`` has none (the same
    both ways); nor has ``X%3Afence``, as its raw spelling is ``X:fence``'s now."""
    return not spelled_as_before(value) and not _is_a_spelling(value)


@dataclass(frozen=True)
class Keys:
    """Key names under one namespace."""

    namespace: str = DEFAULT_NAMESPACE
    #: Spell user-chosen values raw, as versions before ``key_part`` did (``before_encoding``).
    raw_parts: bool = False

    def _k(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    def _part(self, value: str) -> str:
        return value if self.raw_parts else key_part(value)

    @property
    def before_encoding(self) -> Keys:
        """These keys as versions before ``key_part`` spelled them (user-chosen values raw, so ``X:fence`` could
        be another value's key): only to read, carry over or delete what such a version wrote, and only for a value
        that ``has_old_spelling`` (any other has the same keys both ways, or an old spelling that is now another
        value's)."""
        return replace(self, raw_parts=True)

    # -- deployment -------------------------------------------------------------------------------------------
    @property
    def pattern(self) -> str:
        """SCAN pattern of every key under this namespace (``<ns>:*``)."""
        return self._k("*")

    @property
    def base_queue(self) -> str:
        """The RQ queue of runs that require nothing: the namespace itself (``loopsq`` for the default, RQ's
        ``rq:queue:loopsq``, as before namespaces). A requirement set's queue is ``<ns>+<label>+...``
        (``domain.labels.queue_name``), so two namespaces never share a queue."""
        return self.namespace

    @property
    def scheduled_jobs(self) -> str:
        """Sorted set in rq-scheduler's format (job id -> due time in epoch seconds): this namespace's armed
        timers. The default namespace keeps rq-scheduler's own key (``RQ_SCHEDULED_JOBS``); any other has its own
        (``<ns>:timers``), so one deployment's scheduler never moves another's timers."""
        return RQ_SCHEDULED_JOBS if self.namespace == DEFAULT_NAMESPACE else self._k("timers")

    @property
    def instance(self) -> str:
        """String: random id of this Redis dataset; a mirror that sees it change rebuilds."""
        return self._k("instance")

    @property
    def changes(self) -> str:
        """Stream: the single change stream; one entry per state transition."""
        return self._k("changes")

    @property
    def meta(self) -> str:
        """Hash: the state's layout (``layout``, ``readableFrom``; ``migratingTo`` while ``loopsq migrate`` works),
        which every process checks before it writes (``state.layout``)."""
        return self._k("meta")

    @property
    def migrate_lock(self) -> str:
        """String with a TTL: the one ``loopsq migrate`` (or scheduler start) moving the state forward now."""
        return self._k("migrate-lock")

    @property
    def old_slot_pattern(self) -> str:
        """SCAN pattern of layout 1's key per slot (``<ns>:slot:<loop id>:<scheduledFor>``, the run id), which
        layout 2 keeps in ``slots``; only ``state.layout`` and ``state.migrations`` look for it."""
        return self._k("slot", "*")

    @property
    def probe(self) -> str:
        """String (60 s TTL): written right before a ``WAIT``, whose answer then covers every earlier write on that
        master (``durability.replicated``)."""
        return self._k("probe")

    # -- loops ------------------------------------------------------------------------------------------------
    def loop(self, loop_id: str) -> str:
        """String: a loop's JSON (camelCase)."""
        return self._k("loop", loop_id)

    @property
    def loops(self) -> str:
        """Set: ids of every loop."""
        return self._k("loops")

    @property
    def loop_names(self) -> str:
        """Hash: loop name -> id (loop names are unique in loopsq)."""
        return self._k("loop-names")

    # -- workflow specs -------------------------------------------------------------------------------------------
    def workflow(self, workflow_id: str) -> str:
        """String: a workflow spec's JSON."""
        return self._k("workflow", workflow_id)

    @property
    def workflows(self) -> str:
        """Set: ids of every workflow spec, active or archived."""
        return self._k("workflows")

    @property
    def workflow_names(self) -> str:
        """Hash: active workflow name -> id (active names are unique, as in the reference)."""
        return self._k("workflow-names")

    # -- runs ------------------------------------------------------------------------------------------------
    def run(self, run_id: str) -> str:
        """String: a loop run's JSON."""
        return self._k("run", run_id)

    @property
    def runs(self) -> str:
        """Sorted set: every run id, scored by creation time (ms)."""
        return self._k("runs")

    def loop_runs(self, loop_id: str) -> str:
        """Sorted set: a loop's run ids by creation time (ms)."""
        return self._k("loop", loop_id, "runs")

    def slots(self, loop_id: str) -> str:
        """Hash: scheduledFor -> the run id holding that slot of the loop (one row per slot, as the reference).
        One hash per loop rather than a key per slot: a small hash is a listpack, ~3x leaner per slot."""
        return self._k("loop", loop_id, "slots")

    def claim(self, loop_id: str, scheduled_for: str, attempt: int, rerun: int | None = None) -> str:
        """String (SET NX): the one claim of ``(loop, slot, attempt)``, or of its ``rerun``-th re-run after a worker
        shutdown (``...:<attempt>:rerun:<n>``: a re-run keeps its attempt); its value is the claimer's token."""
        if rerun:
            return self._k("claim", loop_id, scheduled_for, str(attempt), "rerun", str(rerun))
        return self._k("claim", loop_id, scheduled_for, str(attempt))

    def lease(self, run_id: str) -> str:
        """String with a TTL: a running run's lease; the value is the owner's token."""
        return self._k("lease", run_id)

    @property
    def running(self) -> str:
        """Set: ids of runs whose status is ``running`` (what recovery scans)."""
        return self._k("running")

    def loop_active(self, loop_id: str) -> str:
        """Set: ids of a loop's running runs (what the overlap policy looks at)."""
        return self._k("loop", loop_id, "active")

    def workspace(self, key: str) -> str:
        """String: the workspace lease of ``key`` (``--workspace``): ``<run id>|<its lease token>|<fence>``; live
        while that run's lease holds that token (``state.workspaces``)."""
        return self._k("workspace", self._part(key))

    def workspace_fence(self, key: str) -> str:
        """String: the last fencing number handed out for workspace ``key`` (one more per acquisition)."""
        return self._k("workspace", self._part(key), "fence")

    def workspace_queue(self, key: str) -> str:
        """Sorted set: runs waiting for workspace ``key`` (overlap allow), by when they started waiting."""
        return self._k("workspace", self._part(key), "queue")

    def cancel(self, run_id: str) -> str:
        """String with a TTL: a request to cancel a running run; the value is the reason."""
        return self._k("cancel", run_id)

    def idempotency(self, loop_id: str, key: str) -> str:
        """String with a TTL (SET NX): the run id a trigger's idempotency key stands for."""
        return self._k("idem", loop_id, self._part(key))

    @property
    def triggers(self) -> str:
        """Sorted set: triggered run ids not yet claimed, scored by trigger time (ms); maintenance re-enqueues."""
        return self._k("triggers")

    def trigger(self, run_id: str) -> str:
        """String: a pending trigger's request (JSON: loop id, slot, key)."""
        return self._k("trigger", run_id)

    def run_request(self, request_id: str) -> str:
        """String with a TTL: the run id a run-now request produced (the CLI waits on it)."""
        return self._k("request", request_id)

    # -- the fleet: queues, pools, missed slots -------------------------------------------------------------------
    @property
    def queues(self) -> str:
        """Hash: RQ queue name -> JSON ``{"labels": [...], "since": iso}``: every requirement set a run has been
        routed by (``domain.labels.queue_name``); workers listen on each one their labels satisfy."""
        return self._k("queues")

    @property
    def pools(self) -> str:
        """Hash: pool name -> JSON ``{"limit": N, ...}``: the fleet-wide pools (``loopsq pool set``)."""
        return self._k("pools")

    def pool_holders(self, pool: str) -> str:
        """Hash: holder id -> ``<lease key>|<token>|<fence>|<since ms>``: who holds a slot of ``pool`` (and since
        when); a holder is live while its lease key holds its token (``state.pools``)."""
        return self._k("pool", self._part(pool), "holders")

    def pool_waiters(self, pool: str) -> str:
        """Sorted set: holders waiting for a slot of ``pool``, by when they started waiting (ms): a fair queue."""
        return self._k("pool", self._part(pool), "waiters")

    def pool_seen(self, pool: str) -> str:
        """Hash: waiter id -> when it last asked (ms); a waiter that stops asking leaves the queue."""
        return self._k("pool", self._part(pool), "seen")

    def pool_fence(self, pool: str) -> str:
        """String: the last fencing number handed out for ``pool`` (one more per acquisition)."""
        return self._k("pool", self._part(pool), "fence")

    def pool_lease(self, pool: str, holder: str) -> str:
        """String with a TTL: the lease of ``holder``'s slot of ``pool``; the value is its token. ``|`` (never in a
        spelled pool name) joins the two, so no pool and holder make another pair's key, nor any ``pool_*`` key."""
        return self._k("pool-lease", f"{self._part(pool)}|{holder}")

    @property
    def stalls(self) -> str:
        """Hash: loop id -> JSON ``{"cause", "at", "repaired"}``: loops the progress watchdog found stalled (what
        ``doctor`` reports); an entry goes once the loop runs again."""
        return self._k("stalls")

    @property
    def repaired_counts(self) -> str:
        """Hash: stall cause -> how many loops the progress watchdog repaired for it
        (``loopsq_loops_repaired_total``)."""
        return self._k("repaired", "counts")

    def slot_fires(self, loop_id: str, scheduled_for: str) -> str:
        """String with a short TTL: how often one slot of a loop was fired and refused (a hot loop's count)."""
        return self._k("fires", loop_id, scheduled_for)

    @property
    def missed_counts(self) -> str:
        """Hash: missed-slot reason kind -> how many slots were missed for it (``loopsq_slots_missed_total``)."""
        return self._k("missed", "counts")

    # -- processes ---------------------------------------------------------------------------------------------
    @property
    def hosts(self) -> str:
        """Hash: host -> epoch ms of the latest liveness beat of a worker there (a host with a live worker reaps
        its own orphans; runs there are left to it)."""
        return self._k("hosts")

    def host_runs(self, host: str) -> str:
        """Set: the running runs whose process was started on ``host``."""
        return self._k("host", self._part(host), "runs")

    def worker(self, worker_id: str) -> str:
        """String with a short TTL: a live worker's liveness record (JSON: host, pid, start time, runs)."""
        return self._k("worker", worker_id)

    @property
    def workers(self) -> str:
        """Set: ids of every worker that registered (dead ones are found by their missing liveness key)."""
        return self._k("workers")

    def scheduler(self, scheduler_id: str) -> str:
        """String with a short TTL: a live scheduler process."""
        return self._k("scheduler", scheduler_id)

    @property
    def schedulers(self) -> str:
        """Set: ids of every scheduler that registered."""
        return self._k("schedulers")

    @property
    def scheduler_lock(self) -> str:
        """String with a TTL: which scheduler moves due timers and runs maintenance now (owner-checked)."""
        return self._k("scheduler-lock")

    @property
    def seen(self) -> str:
        """String: the Redis server's time (epoch ms) of the latest liveness beat of any loopsq process; a silence
        there means an outage (``outages.note_seen``)."""
        return self._k("seen")

    @property
    def redis_run_id(self) -> str:
        """String: the ``run_id`` of the Redis server recovery last looked at; another one means a restart."""
        return self._k("redis-run-id")

    @property
    def recovery_grace(self) -> str:
        """String with a TTL: set after an outage; while it exists recovery judges no owner dead (their liveness
        keys may have expired while Redis was away)."""
        return self._k("recovery-grace")

    def timer(self, loop_id: str) -> str:
        """String: the rq-scheduler job id armed for a loop."""
        return self._k("timer", loop_id)

    # -- maintenance indexes -----------------------------------------------------------------------------------
    @property
    def loop_watch(self) -> str:
        """Sorted set: active loop id -> when maintenance must look at it if nothing else happens (ms): shortly
        after each write of the loop, then, once its timer is armed, a grace after the timer's time
        (``state.loop_watch``)."""
        return self._k("maint", "watch")

    @property
    def loop_expiry(self) -> str:
        """Sorted set: active loop id -> its ``expiresAt`` (ms), written with the loop."""
        return self._k("maint", "expiry")

    @property
    def reconcile(self) -> str:
        """Hash: the rare full reconciliation's ``cursor`` (an SSCAN cursor over ``loops``) and ``nextAt`` (ms)."""
        return self._k("maint", "reconcile")

    # -- web sessions ----------------------------------------------------------------------------------------
    def web_session(self, session_id: str) -> str:
        """String with a TTL (the session's lifetime): an open dashboard session; logout deletes it."""
        return self._k("web-session", session_id)

    # -- workflow runs ---------------------------------------------------------------------------------------
    def wf_run(self, run_id: str) -> str:
        """String: a workflow run's JSON."""
        return self._k("wfrun", run_id)

    def wf_steps(self, run_id: str) -> str:
        """Hash: step id -> step run JSON, for one workflow run."""
        return self._k("wfrun", run_id, "steps")

    def wf_events(self, run_id: str) -> str:
        """List: a workflow run's events in sequence order (sequence = position + 1, gap-free)."""
        return self._k("wfrun", run_id, "events")

    @property
    def wf_runs(self) -> str:
        """Sorted set: every workflow run id by creation time (ms)."""
        return self._k("wfruns")

    @property
    def wf_running(self) -> str:
        """Set: the workflow runs not ended yet (maintenance looks there for runs whose worker died)."""
        return self._k("wfruns", "running")

    def wf_idempotency(self, workflow_id: str, key: str) -> str:
        """String: the workflow run an idempotency key stands for (``<loopId>:<slot>:attempt:<n>`` for loops)."""
        return self._k("wfidem", workflow_id, self._part(key))

    def loop_run_workflows(self, loop_run_id: str) -> str:
        """Set: workflow runs started for a loop run (what a parent-lease expiry fails)."""
        return self._k("run", loop_run_id, "wfruns")

    def live(self, run_id: str, step_id: str | None = None) -> str:
        """Stream: live output chunks of a running run or workflow step (bounded; expires soon after the end).
        ``-`` stands for no step (None or ""), so a step named ``-`` is spelled ``%2D``."""
        if not step_id:
            return self._k("live", run_id, "-")
        part = self._part(step_id)
        return self._k("live", run_id, "%2D" if part == "-" else part)

    def workflow_runs(self, workflow_id: str) -> str:
        """Sorted set: a workflow's settled runs of their own (no parent loop run), by end time (ms)."""
        return self._k("workflow", workflow_id, "runs")

    # -- retention -------------------------------------------------------------------------------------------
    @property
    def retention_due(self) -> str:
        """Sorted set: ``loop:<id>`` / ``workflow:<id>`` whose history window may need trimming, scored by when
        to look (ms). Whatever settles a run adds its owner; maintenance trims in bounded batches from here."""
        return self._k("retention", "due")

    @property
    def retention_seeded(self) -> str:
        """String: set once every loop and workflow that existed before history windows was marked due."""
        return self._k("retention", "seeded")

    # -- notifications (``state.notify``) ------------------------------------------------------------------------
    @property
    def notify_endpoints(self) -> str:
        """Hash: endpoint name -> JSON ``{webhook, on, tags, alertAfterMs, secret, createdAt}``."""
        return self._k("notify", "endpoints")

    def notify_outbox(self, name: str) -> str:
        """Sorted set: an endpoint's undelivered event ids, scored by their next attempt (ms)."""
        return self._k("notify", "outbox", self._part(name))

    def notify_events(self, name: str) -> str:
        """Hash: an endpoint's undelivered event id -> JSON ``{body, attempts, firstAt}``."""
        return self._k("notify", "events", self._part(name))

    def notify_log(self, name: str) -> str:
        """List: an endpoint's last delivery attempts, newest first (bounded, ``state.notify.LOG_SIZE``)."""
        return self._k("notify", "log", self._part(name))

    def notify_due(self, name: str) -> str:
        """Sorted set: loop id -> when it is overdue (ms) for an endpoint that subscribes to ``overdue``."""
        return self._k("notify", "due", self._part(name))

    def notify_overdue(self, name: str) -> str:
        """Set: loops an endpoint was told are overdue (their next success tells it ``recovered``)."""
        return self._k("notify", "overdue", self._part(name))

    @property
    def notify_failing(self) -> str:
        """Hash: loop id -> the id of its failed run that was notified (its next success is ``recovered``)."""
        return self._k("notify", "failing")

    @property
    def notify_paused(self) -> str:
        """Set: loops seen paused (so a pause is notified once, however often the paused loop is rewritten)."""
        return self._k("notify", "paused")
