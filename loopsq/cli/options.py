"""Shared option groups of ``create command|agent|workflow`` (§7.1) and their conversion to a create body.

Each flag is checked here with the reference's message (plus the offending value), before anything touches
Redis, so bad input changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from loopsq.domain import limits
from loopsq.domain.checks import check_length, check_text
from loopsq.domain.cron import host_timezone_name, validate_cron, validate_timezone
from loopsq.domain.durations import format_duration, parse_duration
from loopsq.domain.loop_spec import FIRST_ONCE_DATE, before_first_once_date
from loopsq.domain.models import OVERLAP_POLICIES, RETRY_BACKOFFS
from loopsq.domain.schedules import CATCH_UP_POLICIES, EPOCH, parse_time
from loopsq.domain.targets import ENV_KEY_PATTERN, is_env_key
from loopsq.domain.text import shown
from loopsq.domain.timeutil import to_iso
from loopsq.errors import ValidationError

NO_TIMEOUT_WORDS = ("none", "unlimited", "null", "never", "off", "false")


def _q(value: str) -> str:
    return "'" + shown(value).replace("'", "\\'") + "'"


def quote(value: str) -> str:
    """A flag value as the CLI's messages quote it: ``'value'``, short and escaped."""
    return _q(value)


def bounded_flag(flag: str, value: str, limit: int) -> str:
    """A text flag of at most ``limit`` characters, without NUL: ``<flag> must be at most <limit> characters``."""
    return check_text(value, flag, limit, quote=_q)


def limit_flag(flag: str, value: int, maximum: int) -> int:
    """A page size between 1 and ``maximum`` (the API's bound for the same list)."""
    if value <= 0:
        raise ValidationError(f"{flag} must be a positive integer, got '{value}'")
    if value > maximum:
        raise ValidationError(f"{flag} must be at most {maximum}, got {_q(str(value))}")
    return value


def at_least(flag: str, text: str, ms: int, minimum: int) -> int:
    """``ms`` (parsed from ``text``) when it is at least ``minimum``: ``<flag> must be at least <min>``; for a
    bare number (milliseconds, as in the reference) the message says so, since ``--every 5`` means 5 ms."""
    if ms < minimum:
        unit_hint = (f" (a number without a unit is milliseconds: write {text.strip()}s or {text.strip()}m)"
                     if _BARE_NUMBER.fullmatch(text.strip()) else "")
        raise ValidationError(f"{flag} must be at least {format_duration(minimum)}, got {_q(text)}{unit_hint}")
    return ms


#: A duration without a unit: milliseconds (``parse_duration``).
_BARE_NUMBER = re.compile(r"\d+(\.\d*)?|\.\d+")
#: Said after ``invalid <flag>: <text>`` for a time that is not ISO-8601.
TIME_FORMAT_HINT = ("use an ISO-8601 time such as 2026-01-31T09:00, 2026-01-31T09:00:00Z or 2026-01-31 (without "
                    "an offset: in --timezone)")


def cli_time(text: str, timezone: str, flag: str, field: str) -> datetime:
    """``parse_time`` for ``--at`` and ``--expires-at``: its error names the accepted format, and a time before
    1970-01-01T00:00:00Z is refused (the scheduler never fires a slot before the epoch)."""
    check_length(text, flag, limits.MAX_TIME_LENGTH, _q)
    try:
        moment = parse_time(text, timezone, field)
    except ValidationError as exc:
        if exc.message.startswith(f"invalid {field}: "):
            raise ValidationError(f"{exc.message}: {TIME_FORMAT_HINT}") from exc
        raise
    if moment < EPOCH or before_first_once_date(text):
        raise ValidationError(f"{flag} must be {FIRST_ONCE_DATE} or later, got {_q(text)}")
    return moment


def prefixed(flag: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; prefix a ValidationError's message with ``flag`` unless it already names it."""
    try:
        return fn()
    except ValidationError as exc:
        if exc.message.startswith(flag):
            raise
        raise ValidationError(f"{flag}: {exc.message}") from exc


def duration_flag(flag: str, text: str, *, allow_none: bool = False) -> int | None:
    """A positive duration in ms from a human flag value (``30s``, ``5m``); ``none``-words when allowed."""
    if allow_none and text.strip().lower() in NO_TIMEOUT_WORDS:
        return None
    ms = prefixed(flag, lambda: parse_duration(text))
    if ms <= 0:
        raise ValidationError(f"{flag} must be greater than zero, got {_q(text)}")
    return int(ms)


def off_or_duration_flag(flag: str, text: str) -> int | None:
    """A duration flag where ``none`` (any of ``NO_TIMEOUT_WORDS``) or a zero duration (``0``, ``0s``) means
    "never" (None)."""
    if text.strip().lower() in NO_TIMEOUT_WORDS:
        return None
    return int(prefixed(flag, lambda: parse_duration(text))) or None


def positive_int_flag(flag: str, text: str, maximum: int | None = None) -> int:
    """A positive integer flag, of at most ``maximum`` when given: ``<flag> must be a positive integer, got '<v>'``
    or ``<flag> must be at most <maximum>, got '<v>'``."""
    stripped = text.strip()
    # ASCII digits only: str.isdigit() also admits "²", which int() refuses; and no more digits than int() takes.
    digits = stripped.lstrip("0")
    if not (stripped.isascii() and stripped.isdigit()) or not digits or len(digits) > 4000:
        raise ValidationError(f"{flag} must be a positive integer, got {_q(text)}")
    if maximum is not None and (len(digits) > len(str(maximum)) or int(digits) > maximum):
        raise ValidationError(f"{flag} must be at most {maximum}, got {_q(text)}")
    return int(digits)


def count_flag(flag: str, text: str, maximum: int, zero: str) -> int:
    """A whole-number flag where 0 means something (``zero``, e.g. ``turns the circuit breaker off``):
    ``<flag> must be a whole number (0 <zero>), got '<v>'`` or ``<flag> must be at most <maximum>, got '<v>'``."""
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit() and not stripped.lstrip("0"):
        return 0
    try:
        return positive_int_flag(flag, text, maximum)
    except ValidationError as exc:
        if "at most" in exc.message:
            raise
        raise ValidationError(f"{flag} must be a whole number (0 {zero}), got {_q(text)}") from None


def _schedule_option_list(*, defaults: bool) -> list[Callable[..., Any]]:
    """The schedule and policy options; without ``defaults`` (``update``) a flag not given reads None."""

    def opt(*names: str, default: str | None = None, **kwargs: Any) -> Callable[..., Any]:
        if defaults and default is not None:
            kwargs.update(default=default, show_default=True)
        return click.option(*names, **kwargs)

    return [
        opt("--at", "at", metavar="TIME", help="Run once at TIME (ISO-8601; no offset = --timezone)."),
        opt("--every", metavar="DURATION",
            help="Run every DURATION (fixed rate), e.g. 10s, 5m; a bare number is milliseconds."),
        opt("--cron", metavar="EXPR", help="Run on a 5-field cron expression (or @daily etc.)."),
        opt("--dynamic", is_flag=True, help="Dynamic schedule (min interval 60s)."),
        opt("--timezone", metavar="ZONE", help="IANA zone for --cron and bare times [host zone]."),
        opt("--catch-up", metavar="POLICY", default="latest", help="Missed slots: none, latest or all."),
        opt("--catch-up-limit", metavar="N", default="50", help="At most N missed slots with --catch-up all."),
        opt("--overlap", metavar="POLICY", default="skip",
            help="A slot while the previous run is active: skip, allow or replace."),
        opt("--attempts", metavar="N", default="1", help="Attempts per slot."),
        opt("--retry-delay", metavar="DURATION", default="1m", help="Delay before retrying a failed slot."),
        opt("--retry-backoff", metavar="KIND", default="fixed", help="fixed or exponential (with jitter)."),
        opt("--retry-max-delay", metavar="DURATION", help="Cap of the exponential retry delay."),
        opt("--lease", metavar="DURATION", default="30m", help="Run lease length."),
        opt("--expires-at", metavar="TIME", help="Stop scheduling after TIME."),
        opt("--expires-after-runs", metavar="N",
            help="Expire the loop after N consecutive successful runs of its schedule."),
        opt("--pause-after-failures", metavar="N",
            help="Circuit breaker: pause after N consecutive unsuccessful runs [5]; 0 turns it off."),
        opt("--keep-runs", metavar="N",
            help="Settled runs Redis keeps for this loop [LOOPSQ_KEEP_RUNS, 100]; older ones stay in the mirrors."),
        opt("-d", "--description", metavar="TEXT", help="Description."),
    ]


def schedule_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The schedule and policy option group."""
    for opt in reversed(_schedule_option_list(defaults=True)):
        fn = opt(fn)
    return fn


def update_schedule_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The schedule and policy option group of ``update``: the same flags, none with a default."""
    for opt in reversed(_schedule_option_list(defaults=False)):
        fn = opt(fn)
    return fn


def account_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--account`` and ``--account-tool``."""
    fn = click.option("--account-tool", metavar="TOOL", help="accounts tool id (default: the provider).")(fn)
    return click.option("--account", metavar="PROFILE", help="Run with this accounts profile.")(fn)


def resolve_timezone(value: str | None) -> str:
    """``--timezone`` or the host's zone."""
    if value is None:
        return host_timezone_name()
    check_length(value, "--timezone", limits.MAX_TIMEZONE_LENGTH, _q)
    return str(prefixed("--timezone", lambda: validate_timezone(value)))


def schedule_body(opts: dict[str, Any], timezone: str) -> dict[str, Any]:
    """The ``schedule`` object from --at/--every/--cron/--dynamic (exactly one)."""
    chosen = [name for name in ("at", "every", "cron") if opts.get(name) is not None]
    if opts.get("dynamic"):
        chosen.append("dynamic")
    if len(chosen) != 1:
        raise ValidationError("choose exactly one schedule: --at, --every, --cron, or --dynamic")
    if opts.get("at") is not None:
        at = cli_time(opts["at"], timezone, "--at", "schedule.at")
        return {"type": "once", "at": to_iso(at)}
    if opts.get("every") is not None:
        text = opts["every"]
        ms = prefixed("--every", lambda: parse_duration(text))
        if ms <= 0:
            raise ValidationError(f"--every: interval everyMs must be > 0, got {_q(text)}")
        return {"type": "interval", "everyMs": at_least("--every", text, ms, limits.MIN_EVERY_MS),
                "anchor": "fixed_rate"}
    if opts.get("cron") is not None:
        expr = prefixed("--cron", lambda: validate_cron(opts["cron"]))
        return {"type": "cron", "expression": expr}
    return {"type": "dynamic", "minIntervalMs": 60_000}


def policy_body(opts: dict[str, Any], timezone: str) -> dict[str, Any]:
    """Policies (catch-up, overlap, attempts, retry, lease, expiry by time or after N successful runs, circuit
    breaker, history window) from their flags; a flag that reads None (not given to ``update``) is left out.
    ``--retry-max-delay`` is checked against ``retry_backoff`` (``update`` passes the loop's own when the flag is
    not given)."""
    catch_up, overlap, backoff = opts.get("catch_up"), opts.get("overlap"), opts.get("retry_backoff")
    if catch_up is not None and catch_up not in CATCH_UP_POLICIES:
        raise ValidationError(f"--catch-up must be none, latest, or all, got {_q(catch_up)}")
    if overlap is not None and overlap not in OVERLAP_POLICIES:
        raise ValidationError(f"--overlap must be skip, allow, or replace, got {_q(overlap)}")
    if backoff is not None and backoff not in RETRY_BACKOFFS:
        raise ValidationError(f"--retry-backoff must be fixed or exponential, got {_q(backoff)}")
    body: dict[str, Any] = {}
    if catch_up is not None:
        body["catchUp"] = catch_up
    if opts.get("catch_up_limit") is not None:
        body["catchUpLimit"] = positive_int_flag("--catch-up-limit", opts["catch_up_limit"], limits.MAX_COUNT)
    if overlap is not None:
        body["overlap"] = overlap
    if opts.get("attempts") is not None:
        body["maxAttempts"] = positive_int_flag("--attempts", opts["attempts"], limits.MAX_COUNT)
    if opts.get("retry_delay") is not None:
        body["retryDelayMs"] = duration_flag("--retry-delay", opts["retry_delay"])
    if backoff is not None:
        body["retryBackoff"] = backoff
    if opts.get("lease") is not None:
        body["leaseMs"] = at_least("--lease", opts["lease"], duration_flag("--lease", opts["lease"]) or 0,
                                   limits.MIN_LEASE_MS)
    if opts.get("retry_max_delay") is not None:
        if backoff != "exponential":
            raise ValidationError(
                f"--retry-max-delay requires --retry-backoff exponential, got {_q(opts['retry_max_delay'])}"
            )
        body["retryMaxDelayMs"] = duration_flag("--retry-max-delay", opts["retry_max_delay"])
    if opts.get("expires_at") is not None:
        body["expiresAt"] = to_iso(cli_time(opts["expires_at"], timezone, "--expires-at", "--expires-at"))
    if opts.get("expires_after_runs") is not None:
        body["expiresAfterRuns"] = positive_int_flag("--expires-after-runs", opts["expires_after_runs"],
                                                     limits.MAX_COUNT)
    if opts.get("pause_after_failures") is not None:
        body["pauseAfterFailures"] = count_flag("--pause-after-failures", opts["pause_after_failures"],
                                                limits.MAX_COUNT, "turns the circuit breaker off")
    if opts.get("keep_runs") is not None:
        body["keepRuns"] = positive_int_flag("--keep-runs", opts["keep_runs"], limits.MAX_COUNT)
    if opts.get("description") is not None:
        body["description"] = check_length(opts["description"], "--description", limits.MAX_DESCRIPTION_LENGTH, _q)
    return body


def account_body(opts: dict[str, Any]) -> dict[str, str] | None:
    """The target's ``account`` from --account/--account-tool."""
    profile, tool = opts.get("account"), opts.get("account_tool")
    if tool is not None and profile is None:
        raise ValidationError("--account-tool requires --account")
    if profile is None:
        return None
    if not profile.strip():
        raise ValidationError(f"--account must not be empty, got {_q(profile)}")
    account = {"profile": bounded_flag("--account", profile, limits.MAX_WORD_LENGTH)}
    if tool is not None:
        if not tool.strip():
            raise ValidationError(f"--account-tool must not be empty, got {_q(tool)}")
        account["tool"] = bounded_flag("--account-tool", tool, limits.MAX_WORD_LENGTH)
    return account


def env_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--env KEY=VALUE`` (repeatable): the target's own environment variables."""
    return click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
                        help="Set a variable in the target's environment (repeat). loopsq's own variables "
                             "(LOOPSQ_*, REDIS_URL) are never inherited; pass one here if the target needs it.")(fn)


def env_body(pairs: tuple[str, ...]) -> dict[str, str] | None:
    """The target's ``env`` from ``--env`` values; None when none was given.

    Raises:
        ValidationError: a value without ``=``, a key that is not a variable name, a NUL in a value, or a key
            given twice.
    """
    if not pairs:
        return None
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not is_env_key(key):
            raise ValidationError(f"--env must be KEY=VALUE with KEY matching {ENV_KEY_PATTERN}, got {_q(pair)}")
        if "\0" in value:
            raise ValidationError(f"--env value of {key} must not contain NUL, got {_q(pair)}")
        if key in env:
            raise ValidationError(f"--env sets {key} twice, got {_q(pair)}")
        env[key] = value
    return env
