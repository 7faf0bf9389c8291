"""Notification delivery, on the leading scheduler's notifier thread: events from the change stream, the overdue
index, and signed POSTs with retries.

Events are read from the change stream itself (a consumer group, ``GROUP``), not written by the transitions: every
run's end, missed record and loop write is there already, so no transition changes for notifications and none is
missed. A change is acknowledged only after its events are in their endpoints' outboxes, and an event's id comes
from the change's id, so a notifier that dies in between derives the same events again and the outbox
(``HSETNX``) keeps one of each. Derived events:

- ``failed``: a run ended ``failed``, ``timed_out`` or ``abandoned`` (each attempt); ``recovered``: the loop's
  next ``succeeded`` run after a notified failure, or after an ``overdue`` alert;
- ``missed``: a missed record is written (not when it only grows);
- ``paused``: a loop is written paused and was not seen paused before;
- ``overdue``: per endpoint that subscribes to it, ``keys.notify_due(E)`` holds each active loop's deadline (its
  last success, or when it was first seen, plus ``--alert-after`` or twice its cadence); a deadline that passes
  alerts once. Only due entries are read, never every loop.

Delivery is at least once: an attempt that does not answer 2xx is retried after a capped exponential backoff
(``LOOPSQ_NOTIFY_BACKOFF_MIN`` 5 s doubling to ``LOOPSQ_NOTIFY_BACKOFF_MAX`` 10 min) until
``LOOPSQ_NOTIFY_GIVE_UP`` (24 h) after the event, every attempt in the endpoint's log. An endpoint that fails is
left for the rest of the pass, so a dead receiver costs one timeout a pass, not one per event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import redis

from loopsq.domain import notify as domain
from loopsq.domain.durations import duration_setting
from loopsq.domain.notify import Endpoint
from loopsq.domain.schedules import Schedule, cron_next
from loopsq.domain.timeutil import from_ms, to_iso
from loopsq.errors import LoopsqError
from loopsq.state.keys import Keys
from loopsq.state.notify import NotifyStore, Pending

log = logging.getLogger("loopsq.notify")

#: The change stream's consumer group of the notifier (one consumer: only the leading scheduler reads).
GROUP = "notify"
CONSUMER = "notifier"
READ_BATCH = 500
#: Batches read per pass at most, so that delivery is not held up by a long backlog.
READ_BATCHES = 10
DELIVER_BATCH = 50
OVERDUE_BATCH = 200
#: Seconds one POST may take.
POST_TIMEOUT_S = 10.0
#: Seconds of delivery per pass at most (the rest waits for the next pass).
PASS_BUDGET_S = 20.0
FAILED = frozenset({"failed", "timed_out", "abandoned"})


def settings(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(backoff min, backoff max, give up after), ms, from ``LOOPSQ_NOTIFY_*``."""
    env = os.environ if env is None else env
    return (duration_setting(env, "LOOPSQ_NOTIFY_BACKOFF_MIN", 5_000, "5s"),
            duration_setting(env, "LOOPSQ_NOTIFY_BACKOFF_MAX", 600_000, "10m"),
            duration_setting(env, "LOOPSQ_NOTIFY_GIVE_UP", 86_400_000, "24h"))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cadence_ms(loop: Mapping[str, Any]) -> int | None:
    """A loop's cadence: its interval, the gap between its next two cron slots, a dynamic loop's minimum; None
    for a one-off."""
    try:
        schedule = Schedule.from_dict(loop.get("schedule"))
    except (LoopsqError, KeyError, TypeError, ValueError):
        return None
    if schedule.type == "interval":
        return schedule.every_ms
    if schedule.type == "dynamic":
        return schedule.min_interval_ms
    if schedule.type == "cron":
        tz = str(loop.get("timezone") or "UTC")
        first = cron_next(schedule, datetime.now().astimezone(), tz)
        return int((cron_next(schedule, first, tz) - first) / timedelta(milliseconds=1))
    return None


def _tags(loop: Mapping[str, Any] | None) -> dict[str, Any]:
    tags = (loop or {}).get("tags")
    if isinstance(tags, list):  # (``key:value`` texts, should loops ever store them so)
        return dict(str(t).partition(":")[::2] for t in tags)
    return dict(tags) if isinstance(tags, Mapping) else {}


class Notifier:
    """One notifier's passes: read changes, check deadlines, deliver. ``client`` decodes responses."""

    def __init__(self, client: redis.Redis, keys: Keys, env: Mapping[str, str] | None = None) -> None:
        self.client, self.keys = client, keys
        self.store = NotifyStore(client, keys)
        self.backoff_min, self.backoff_max, self.give_up = settings(env)
        self._loops: dict[str, dict[str, Any] | None] = {}
        self._dropped = False
        #: Polled between deliveries: a stopping scheduler does not wait for the rest of a pass.
        self.stopping: Callable[[], bool] = lambda: False

    def now_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def run_pass(self) -> int:
        """One pass; returns how many events were delivered. Nothing happens while no endpoint exists."""
        endpoints = self.store.list()
        if not endpoints:
            if not self._dropped:  # the last endpoint went: the group must not hold the stream back (``stream_trim``)
                with contextlib.suppress(redis.ResponseError):
                    self.client.xgroup_destroy(self.keys.changes, GROUP)
                self._dropped = True
            return 0
        self._dropped = False
        self._loops = {}
        now_ms = self.now_ms()
        self.read_changes(endpoints, now_ms)
        self.check_overdue(endpoints, now_ms)
        return self.deliver(endpoints)

    # -- events --------------------------------------------------------------------------------------------
    def _ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.keys.changes, GROUP, id="$", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read_changes(self, endpoints: list[Endpoint], now_ms: int) -> None:
        """Derive events from the changes not yet read (first this consumer's unacknowledged ones)."""
        self._ensure_group()
        for start in ("0", ">"):
            for _ in range(READ_BATCHES):  # (a backlog is worked through over several passes)
                reply: Any = self.client.xreadgroup(GROUP, CONSUMER, {self.keys.changes: start}, count=READ_BATCH)
                entries: list[Any] = reply[0][1] if reply else []
                if not entries:
                    break
                for entry_id, fields in entries:
                    # (a pending entry the stream trimmed since comes back without fields: nothing to derive)
                    self._on_change(endpoints, _s(entry_id), fields or {}, now_ms)
                self.client.xack(self.keys.changes, GROUP, *[_s(e[0]) for e in entries])
                if start == "0" or len(entries) < READ_BATCH:
                    break

    def _loop(self, loop_id: str) -> dict[str, Any] | None:
        if loop_id not in self._loops:
            raw = self.client.get(self.keys.loop(loop_id))
            self._loops[loop_id] = json.loads(_s(raw)) if raw else None
        return self._loops[loop_id]

    def _on_change(self, endpoints: list[Endpoint], entry_id: str, fields: Mapping[Any, Any], now_ms: int) -> None:
        data = json.loads(_s(fields.get("data") or "{}"))
        at = _s(fields.get("at") or to_iso(from_ms(now_ms)))
        also = data.get("also") or []
        upsert = data.get("upsert") or {}
        n = 0
        for loop in upsert.get("loops") or []:
            self._loops[str(loop.get("id"))] = loop
            n += 1
            self._on_loop(endpoints, loop, f"{entry_id}.{n}", at, now_ms)
        for run in upsert.get("loop_runs") or []:
            n += 1
            self._on_run(endpoints, run, f"{entry_id}.{n}", at, now_ms, also)
        for loop_id in (data.get("delete") or {}).get("loops") or []:
            self._forget(endpoints, str(loop_id))

    def _on_loop(self, endpoints: list[Endpoint], loop: dict[str, Any], event_id: str, at: str, now_ms: int) -> None:
        loop_id = str(loop.get("id"))
        if loop.get("status") == "paused":
            if self.client.sadd(self.keys.notify_paused, loop_id):
                self._emit(endpoints, "paused", loop, event_id, at, now_ms,
                           {"loop": loop.get("name"), "loopId": loop_id, "reason": loop.get("statusReason")})
        else:
            self.client.srem(self.keys.notify_paused, loop_id)
        for endpoint in endpoints:
            if "overdue" not in endpoint.events:
                continue
            if loop.get("status") != "active":
                self.client.zrem(self.keys.notify_due(endpoint.name), loop_id)
                continue
            if self.client.sismember(self.keys.notify_overdue(endpoint.name), loop_id):
                continue  # alerted already: only its next success starts a new deadline
            after = endpoint.alert_after_ms or 2 * (cadence_ms(loop) or 0)
            if after > 0:  # a deadline from when it was first seen active; a success moves it
                self.client.zadd(self.keys.notify_due(endpoint.name), {loop_id: now_ms + after}, nx=True)

    def _on_run(self, endpoints: list[Endpoint], run: dict[str, Any], event_id: str, at: str, now_ms: int,
                also: list[str]) -> None:
        loop_id, status = str(run.get("loopId")), run.get("status")
        loop = self._loop(loop_id)
        base = {"loop": run.get("loopName") or (loop or {}).get("name"), "loopId": loop_id, "run": run.get("id"),
                "scheduledFor": run.get("scheduledFor"), "attempt": run.get("attempt"), "status": status}
        if status in FAILED:
            self.client.hset(self.keys.notify_failing, loop_id, str(run.get("id")))
            self._emit(endpoints, "failed", loop, event_id, at, now_ms,
                       {**base, "exitCode": run.get("exitCode"), "error": run.get("error")})
        elif status == "missed" and "missed_extended" not in also:
            self._emit(endpoints, "missed", loop, event_id, at, now_ms,
                       {**base, "count": run.get("missedCount") or 1, "reason": run.get("error"),
                        "kind": run.get("missedKind")})
        elif status == "succeeded":
            was_failing = bool(self.client.hdel(self.keys.notify_failing, loop_id))
            told = [e for e in endpoints if "overdue" in e.events
                    and self.client.srem(self.keys.notify_overdue(e.name), loop_id)]
            wanted = endpoints if was_failing else told
            self._emit(wanted, "recovered", loop, event_id, at, now_ms, base)
            for endpoint in endpoints:
                if "overdue" in endpoint.events and loop is not None and loop.get("status") == "active":
                    after = endpoint.alert_after_ms or 2 * (cadence_ms(loop) or 0)
                    if after > 0:
                        self.client.zadd(self.keys.notify_due(endpoint.name), {loop_id: now_ms + after})

    def _forget(self, endpoints: list[Endpoint], loop_id: str) -> None:
        self.client.hdel(self.keys.notify_failing, loop_id)
        self.client.srem(self.keys.notify_paused, loop_id)
        for endpoint in endpoints:
            self.client.zrem(self.keys.notify_due(endpoint.name), loop_id)
            self.client.srem(self.keys.notify_overdue(endpoint.name), loop_id)

    def _emit(self, endpoints: list[Endpoint], event: str, loop: Mapping[str, Any] | None, event_id: str, at: str,
              now_ms: int, data: dict[str, Any]) -> None:
        body = domain.event_body(event, at, data)
        for endpoint in endpoints:
            if endpoint.wants(event, _tags(loop)):
                self.store.enqueue(endpoint.name, f"msg_{event_id}", body, now_ms)

    def check_overdue(self, endpoints: list[Endpoint], now_ms: int) -> None:
        """Alert once for each loop whose deadline passed (a bounded batch per endpoint and pass)."""
        for endpoint in endpoints:
            if "overdue" not in endpoint.events:
                continue
            key = self.keys.notify_due(endpoint.name)
            found: Any = self.client.zrangebyscore(key, "-inf", now_ms, start=0, num=OVERDUE_BATCH, withscores=True)
            for raw_id, score in found:
                loop_id = _s(raw_id)
                self.client.zrem(key, loop_id)
                loop = self._loop(loop_id)
                if loop is None or loop.get("status") != "active":
                    continue
                self.client.sadd(self.keys.notify_overdue(endpoint.name), loop_id)
                after = endpoint.alert_after_ms or 2 * (cadence_ms(loop) or 0)
                data = {"loop": loop.get("name"), "loopId": loop_id, "alertAfterMs": after,
                        "deadline": to_iso(from_ms(int(score)))}
                if endpoint.wants("overdue", _tags(loop)):
                    body = domain.event_body("overdue", to_iso(from_ms(now_ms)), data)
                    self.store.enqueue(endpoint.name, f"msg_overdue_{loop_id}_{int(score)}", body, now_ms)

    # -- delivery ------------------------------------------------------------------------------------------
    def deliver(self, endpoints: list[Endpoint], budget_s: float = PASS_BUDGET_S) -> int:
        """POST the due events of every endpoint; returns how many were delivered."""
        started, delivered = time.monotonic(), 0
        for endpoint in endpoints:
            for event in self.store.due(endpoint.name, self.now_ms(), DELIVER_BATCH):
                if time.monotonic() - started > budget_s or self.stopping():
                    return delivered
                if self._attempt(endpoint, event):
                    delivered += 1
                else:
                    break  # the receiver is failing: its other events wait for the next pass
        return delivered

    def _attempt(self, endpoint: Endpoint, event: Pending) -> bool:
        timestamp = int(time.time())
        request = urllib.request.Request(endpoint.url, data=event.body.encode(), method="POST",
                                         headers=domain.headers(endpoint.secret, event.id, timestamp, event.body))
        began = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as response:
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            status, error = exc.code, f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            error = str(getattr(exc, "reason", None) or exc)[:300]
        ok = status is not None and 200 <= status < 300
        now_ms = self.now_ms()
        entry: dict[str, Any] = {"at": to_iso(from_ms(now_ms)), "id": event.id,
                                 "type": json.loads(event.body).get("type"), "attempt": event.attempts + 1,
                                 "status": status, "ok": ok, "ms": int((time.monotonic() - began) * 1000)}
        if error:
            entry["error"] = error
        if ok:
            self.store.done(endpoint.name, event.id)
        elif now_ms - event.first_at_ms >= self.give_up:
            self.store.done(endpoint.name, event.id)
            entry["gaveUp"] = True
            log.warning("notification %s to %s: gave up after %d attempts", event.id, endpoint.name,
                        event.attempts + 1)
        else:
            wait = domain.backoff_ms(event.attempts + 1, self.backoff_min, self.backoff_max)
            self.store.retry_at(endpoint.name, event, now_ms + wait)
            entry["retryInMs"] = wait
        self.store.log_attempt(endpoint.name, entry)
        return ok


class NotifierThread(threading.Thread):
    """The notifier on its own thread and connection, while ``leading`` is set, about every ``every_s``; a
    failing pass is logged and the next one goes on (Redis outages are ridden out by the client)."""

    def __init__(self, client: redis.Redis, keys: Keys, leading: threading.Event, stop: threading.Event,
                 every_s: float = 1.0) -> None:
        super().__init__(name="loopsq-notify", daemon=True)
        self.notifier = Notifier(client, keys)
        self.notifier.stopping = stop.is_set
        self.leading, self.stop, self.every_s = leading, stop, every_s

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            if not self.leading.is_set():
                continue
            try:
                self.notifier.run_pass()
            except redis.RedisError as exc:
                log.warning("notifications: %s", exc)
            except Exception:
                log.exception("notifications failed; continuing")
