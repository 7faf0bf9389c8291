"""``LoopsClient``: the Python SDK for other services — create and manage loops, trigger runs with an
idempotency key, run now, read runs, set fleet-wide pools, and manage notification endpoints.

    from loopsq.sdk import LoopsClient
    client = LoopsClient("redis://:PASSWORD@redis.internal:6379/0")  # or redis+sentinel://…, rediss://…
    run_id = client.trigger("nightly-report", idempotency_key="order-42")

With no URL, ``LoopsClient()`` reads ``LOOPSQ_REDIS_URL``, then ``REDIS_URL``, then the Redis of a ``loopsq up``
running on the data dir; with none of them it raises ``RedisNotConfiguredError`` and connects nowhere.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from loopsq.domain import limits, notify, timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.namespaces import check_namespace
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.text import quoted, shown
from loopsq.engine.cancel import cancel_run
from loopsq.engine.triggers import DEFAULT_IDEMPOTENCY_WINDOW_MS, trigger_with
from loopsq.errors import NotFoundError, ValidationError
from loopsq.state import layout
from loopsq.state.clock import RedisClock
from loopsq.state.connection import connect, target_of
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.notify import LOG_SIZE, NotifyStore
from loopsq.state.pools import Pool, PoolState, PoolStore
from loopsq.state.runs import RunStore
from loopsq.system.config import configured_namespace, resolve_redis_url
from loopsq.system.prompt_files import resolve_prompt_file
from loopsq.system.tracing import caller_carrier


class LoopsClient:
    """A client of one loopsq deployment (its Redis)."""

    def __init__(self, redis_url: str | None = None, *, client: redis.Redis | None = None,
                 keys: Keys | None = None, namespace: str | None = None) -> None:
        """Connect to ``redis_url`` (validated first; ``RedisUrlError`` when malformed), else to the configured Redis
        (``RedisNotConfiguredError`` when there is none), unless a ``client`` is given. The deployment is the one
        of ``namespace``, else ``LOOPSQ_NAMESPACE``'s, else the default one (``loopsq``); a bad one is a
        ``ValidationError`` naming ``LoopsClient(namespace)`` or ``LOOPSQ_NAMESPACE`` and the value.

        Raises:
            StateLayoutError: the Redis holds state in a layout this release does not read (``state.layout``).
        """
        if keys is None:
            keys = Keys(check_namespace(namespace, "LoopsClient(namespace)") if namespace is not None
                        else configured_namespace())
        if client is None:
            url = target_of(redis_url, "LoopsClient(redis_url)") if redis_url is not None else resolve_redis_url()
            client = connect(url)
            # Times this client writes (a resume's next slot, a trigger's creation) go on Redis's clock.
            with contextlib.suppress(redis.RedisError):
                RedisClock().measure(client)
        self.client = client
        self.keys = keys
        layout.check(self.client, self.keys)  # (refuses; the scheduler and workers stamp a new Redis)
        self.loops = LoopStore(self.client, self.keys)
        self.runs_store = RunStore(self.client, self.keys)
        self.pool_store = PoolStore(self.client, self.keys)

    def create(self, body: Mapping[str, Any]) -> Loop:
        """Create a loop from a camelCase body (``name``, ``schedule``, ``target``, policies), as ``POST
        /api/loops`` takes it: e.g. ``"requires": ["gpu"]`` (worker labels every run needs) and ``"pool": "gpu"``
        (a fleet-wide pool, which must exist; ``ValidationError`` otherwise, and nothing is written).

        An agent target may give ``promptFile`` instead of ``prompt``: the file is read here (a relative path
        against the working directory) and stored as the prompt with ``promptSource``.
        """
        if isinstance(body, Mapping) and "target" in body:
            body = {**body, "target": resolve_prompt_file(body["target"], "target")}
        from loopsq.engine.routing import arm_created

        return arm_created(self.client, self.keys, self.loops.create(new_loop(body, timeutil.now())))

    def update(self, id_or_name: str, changes: Mapping[str, Any]) -> Loop:
        """Edit a loop in place with a partial camelCase body, as ``PATCH /api/loops/{loop}`` takes it (e.g.
        ``{"schedule": {"type": "interval", "everyMs": 60000}, "maxAttempts": 3}``; null returns a field to its
        default). Validated as ``create`` validates; the id, name, status and history stay, and a new schedule
        starts from now. Raises ``ValidationError`` (nothing written), ``NotFoundError`` or ``ConflictError``
        (archived)."""
        if isinstance(changes, Mapping) and isinstance(changes.get("target"), Mapping):
            changes = {**changes, "target": resolve_prompt_file(changes["target"], "target")}
        from loopsq.engine.routing import arm_updated

        return arm_updated(self.client, self.keys, self.loops.edit(id_or_name, changes, timeutil.now()))

    def apply(self, specs: Sequence[Mapping[str, Any]], *, dry_run: bool = False, owner: str | None = None,
              prune: bool = False, workflows: Sequence[Mapping[str, Any]] = ()) -> builtins.list[dict[str, Any]]:
        """``loopsq apply`` on a list of loop specs (create bodies, identity by name, plus an optional ``status``)
        and of ``workflows`` specs: returns the plan, ``[{"action": "create"|"update"|"unchanged"|"prune", "kind":
        "loop"|"workflow", "name", "changes"}]``, carried out unless ``dry_run``. Every spec is validated first:
        one bad spec raises ``ValidationError`` (``loops[<i>] "<name>": …``) and nothing is written."""
        from loopsq.ops.apply_plan import check_owner, execute, plan
        from loopsq.ops.apply_specs import body_specs

        now = timeutil.now()
        steps = plan(self.client, self.keys, body_specs(specs, list(workflows)), now, check_owner(owner, prune),
                     prune)
        if not dry_run:
            execute(self.client, self.keys, steps, now)
        return [s.public() for s in steps]

    def list(self, *, archived: bool | None = False) -> list[Loop]:
        """Loops: not archived (default), archived only (``archived=True``) or all (``archived=None``)."""
        loops = self.loops.all()
        return loops if archived is None else [loop for loop in loops if loop.archived == archived]

    def archive(self, id_or_name: str) -> Loop:
        """Archive a loop (0.3.15): left out of lists and counts, not run; an active loop is paused."""
        return self.loops.archive(id_or_name, timeutil.now())

    def unarchive(self, id_or_name: str) -> Loop:
        """Restore an archived loop with the status it had."""
        return self.loops.unarchive(id_or_name, timeutil.now())

    restore = unarchive

    def rename(self, id_or_name: str, new_name: str) -> Loop:
        """Rename a loop (0.3.50); its id and run history stay."""
        return self.loops.rename(id_or_name, new_name, timeutil.now())

    def get(self, id_or_name: str) -> Loop:
        """One loop; ``NotFoundError('loop not found: …')`` otherwise."""
        return self.loops.require(id_or_name)

    def pause(self, id_or_name: str) -> Loop:
        """Pause a loop."""
        return self.loops.pause(id_or_name, timeutil.now())

    def resume(self, id_or_name: str) -> Loop:
        """Resume a loop (a stopped one is scheduled again)."""
        return self.loops.resume(id_or_name, timeutil.now())

    def stop(self, id_or_name: str) -> Loop:
        """Stop a loop."""
        return self.loops.stop(id_or_name, timeutil.now())

    def delete(self, id_or_name: str) -> Loop:
        """Remove a loop definition."""
        return self.loops.remove(id_or_name, timeutil.now())

    def runs(self, id_or_name: str | None = None, limit: int = 100) -> builtins.list[LoopRun]:
        """Runs, newest first (of one loop when given); ``limit`` from 1 to ``limits.MAX_PAGE_LIMIT`` (1,000)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= limits.MAX_PAGE_LIMIT:
            raise ValidationError(f"limit must be an integer from 1 to {limits.MAX_PAGE_LIMIT}, got {quoted(limit)}")
        key = self.keys.loop_runs(self.get(id_or_name).id) if id_or_name else self.keys.runs
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in self.client.zrevrange(key, 0, limit - 1)]
        return self.runs_store.get_many(ids)

    def run(self, run_id: str) -> LoopRun | None:
        """One run by id."""
        return self.runs_store.get(run_id)

    def trigger(self, id_or_name: str, idempotency_key: str | None = None,
                window_ms: int = DEFAULT_IDEMPOTENCY_WINDOW_MS, *, retry: bool = True) -> str:
        """Start a run of a loop on a worker now; returns its run id.

        The same ``idempotency_key`` within ``window_ms`` (default 24 h) returns the same run id and starts
        nothing new. The loop's retry policy applies to the run, unless ``retry=False``. The span current in the
        calling application (OpenTelemetry), if any, becomes the parent of the run's spans.
        """
        return trigger_with(self.client, self.keys, id_or_name, idempotency_key, window_ms=window_ms,
                            retry=retry, trace=caller_carrier())[0]

    def cancel_run(self, run_id: str, reason: str | None = None) -> LoopRun:
        """Cancel a running loop run (``loopsq cancel``): the worker executing it kills its process group within a
        second and records it failed with ``cancelled by user[: reason]``, not retried. Returns the run as it
        stands; NotFoundError or ConflictError (not running) otherwise."""
        return cancel_run(self.client, self.keys, run_id, timeutil.now(), reason)

    # -- fleet-wide pools ------------------------------------------------------------------------------------------
    def pool_set(self, name: str, limit: int) -> Pool:
        """Create pool ``name`` (a label) with ``limit`` slots (1 to 10000), or change its limit: at most ``limit``
        runs naming it hold one of its slots at once, fleet-wide. ``ValidationError`` names a bad name or limit."""
        return self.pool_store.set(name, limit)

    def pools(self) -> builtins.list[Pool]:
        """Every pool, by name."""
        return self.pool_store.list()

    def pool(self, name: str) -> PoolState:
        """Pool ``name`` with its live holders and its waiters; ``NotFoundError('pool not found: …')`` otherwise."""
        state = self.pool_store.state(name)
        if state is None:
            raise NotFoundError(f"pool not found: {shown(name)}")
        return state

    def pool_delete(self, name: str) -> None:
        """Remove pool ``name`` (runs holding its slots finish); ``NotFoundError`` when there is none."""
        if not self.pool_store.delete(name):
            raise NotFoundError(f"pool not found: {shown(name)}")

    # -- notifications ---------------------------------------------------------------------------------------------
    def notifications(self) -> builtins.list[dict[str, Any]]:
        """Every notification endpoint (``loopsq notify list``), by name, as ``GET /api/notifications`` gives them:
        ``{name, webhook, on, tags, alertAfterMs, createdAt, pending}`` (never the secret)."""
        return NotifyStore(self.client, self.keys).listing()

    def notification_add(self, name: str, webhook: str, *, on: Sequence[str] | None = None,
                         tags: Mapping[str, str] | None = None,
                         alert_after_ms: int | None = None) -> dict[str, Any]:
        """Add notification ``name`` (``loopsq notify add``), or replace its settings, keeping its secret: signed
        webhooks POSTed to ``webhook`` on the events ``on`` (default failed, recovered, missed, paused; also
        overdue) of the loops carrying every one of ``tags``. Returns the endpoint; a new one's includes its
        ``secret`` this once. ``ValidationError`` names a bad field, and nothing is written."""
        body: dict[str, Any] = {"webhook": webhook, "tags": dict(tags or {}), "alertAfterMs": alert_after_ms}
        if on is not None:
            body["on"] = list(on) if isinstance(on, list | tuple) else on
        saved, created = NotifyStore(self.client, self.keys).set(notify.endpoint_from_body(name, body))
        return saved.to_dict(secret=created)

    def notification_remove(self, name: str) -> None:
        """Remove notification ``name`` with its undelivered events and its log; ``NotFoundError`` when there is
        none."""
        NotifyStore(self.client, self.keys).require_remove(name)

    def notification_log(self, name: str | None = None, limit: int = 20) -> builtins.list[dict[str, Any]]:
        """The newest ``limit`` (1 to 1,000) delivery attempts of notification ``name`` (of each one when None),
        newest first (``loopsq notify log``): ``{notification, at, type, id, attempt, status, ok, error?}``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LOG_SIZE:
            raise ValidationError(f"limit must be an integer from 1 to {LOG_SIZE}, got {quoted(limit)}")
        return NotifyStore(self.client, self.keys).logs(name, limit)

    def close(self) -> None:
        """Close the connection."""
        self.client.close()
