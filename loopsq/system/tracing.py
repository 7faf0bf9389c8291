"""Tracing, the optional ``otel`` extra: the one door to OpenTelemetry spans, and a no-op when tracing is off.

Tracing is on when the OpenTelemetry SDK is installed (``pip install 'loopsq[otel]'``) and either
``LOOPSQ_TRACING`` is ``1``, or (``LOOPSQ_TRACING`` unset) the standard variables name an exporter:
``OTEL_TRACES_EXPORTER`` other than ``none``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``. ``LOOPSQ_TRACING=0`` and ``OTEL_SDK_DISABLED=true`` turn it off. Off, no
OpenTelemetry module is imported by this one and every call is a check of one global (``span`` hands back a shared
no-op). On, ``loopsq.system.otel`` builds this process's own tracer provider (never the global one).

Context crosses processes as W3C trace context: a carrier ``{"traceparent": ..., "tracestate": ...}`` (stored with
a trigger, passed in an RQ job), and ``TRACEPARENT``/``TRACESTATE`` in a target's environment.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from loopsq.errors import ValidationError
from loopsq.system.trace_context import Carrier, valid_carrier

log = logging.getLogger(__name__)

TRACING_ENV = "LOOPSQ_TRACING"
_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


class Span:
    """A span's handle: the no-op one, and the interface of ``loopsq.system.otel``'s recording one."""

    def set(self, key: str, value: str | int | bool | None) -> None:
        """Set attribute ``key`` (None: left unset)."""

    def fail(self, message: str | None) -> None:
        """Mark the span's status as an error with ``message``."""

    def carrier(self) -> Carrier:
        """This span's W3C context (``traceparent``, ``tracestate`` when any); empty when not recording."""
        return {}

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NOOP = Span()

_lock = threading.Lock()
#: None: not decided yet; False: off; else the backend (``loopsq.system.otel.Backend``).
_backend: Any = None
_service = "loopsq"


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for tracing (see the module's docstring); the SDK is not looked at here.

    Raises:
        ValidationError: for a ``LOOPSQ_TRACING`` that is not one of 1/0, true/false, on/off, yes/no.
    """
    env = os.environ if env is None else env
    flag = env.get(TRACING_ENV, "").strip().lower()
    if flag in _OFF or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if flag in _ON:
        return True
    if flag:
        raise ValidationError(f"{TRACING_ENV} must be 1 or 0, got '{env[TRACING_ENV]}'")
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return (bool(exporter) and exporter != "none") or bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(service: str) -> bool:
    """Name this process's service (``OTEL_SERVICE_NAME`` wins) and decide now whether it traces; returns that.
    Called at a process's start, so that a bad ``LOOPSQ_TRACING`` is bad input there.

    Raises:
        ValidationError: for a bad ``LOOPSQ_TRACING``.
    """
    global _service
    with _lock:
        _service = service
    wanted()
    return enabled()


def enabled() -> bool:
    """Whether spans are recorded in this process (decided once, on first use)."""
    backend = _backend
    if backend is None:
        backend = _decide()
    return backend is not False


def _decide() -> Any:
    global _backend
    with _lock:
        if _backend is not None:
            return _backend
        try:
            on = wanted()
        except ValidationError as exc:  # (reported at the process's start by ``configure``)
            log.warning("tracing off: %s", exc)
            on = False
        if on and not _sdk_installed():
            on = False
        if on:
            from loopsq.system.otel import Backend

            _backend = Backend.from_env(_service)
        else:
            _backend = False
        return _backend


def _sdk_installed() -> bool:
    """Whether the SDK can be imported, found without importing any of OpenTelemetry (the API comes with FastAPI:
    it is there without the extra)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("opentelemetry.sdk") is not None
    except (ImportError, ValueError) as exc:
        found, why = False, str(exc)
    else:
        why = "No module named 'opentelemetry.sdk'"
    if not found:
        log.warning("tracing off: the OpenTelemetry SDK is not installed (pip install 'loopsq[otel]'): %s", why)
    return found


def use(backend: Any) -> None:
    """Use ``backend`` (a ``loopsq.system.otel.Backend``; False: off; None: decide again on next use). For tests."""
    global _backend
    with _lock:
        _backend = backend


def span(name: str, *, parent: object = None,
         attributes: Mapping[str, str | int | bool | None] | None = None) -> AbstractContextManager[Span]:
    """A span named ``name``, current inside the ``with`` block; the no-op span when tracing is off.

    Args:
        name: the span's name (``loopsq.fire``, ``loopsq.claim``, ...).
        parent: a carrier (a trigger's W3C context) or a ``current()`` value (another thread's span); None: the
            span current on this thread.
        attributes: set on the span (None values are left out).
    """
    backend = _backend if _backend is not None else _decide()
    if backend is False:
        return NOOP
    return backend.span(name, parent, attributes)  # type: ignore[no-any-return]


def current() -> object:
    """The context current on this thread, to parent spans another thread starts (None when off)."""
    backend = _backend if _backend is not None else _decide()
    return None if backend is False else backend.current()


def record(name: str, start_ns: int, attributes: Mapping[str, str | int | bool | None] | None = None) -> None:
    """Record a span that started at ``start_ns`` (``time.time_ns()``) and ends now: for work worth a span only
    once its outcome is known (the scheduler's timer moves that moved something)."""
    backend = _backend if _backend is not None else _decide()
    if backend is not False:
        backend.record(name, start_ns, attributes)


def caller_carrier() -> Carrier:
    """The W3C context of the span current in the calling application (the SDK's ``trigger``), whatever its
    tracer provider; empty when it has none. Imports nothing: an application without a span imported
    ``opentelemetry`` for none."""
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    out: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(out)
    return valid_carrier(out)


def env_carrier(env: Mapping[str, str] | None = None) -> Carrier:
    """The W3C trace context a traced caller handed this process (``TRACEPARENT``, ``TRACESTATE``): a script run
    inside a trace that calls ``loopsq trigger`` or ``run-now``."""
    env = os.environ if env is None else env
    return valid_carrier({"traceparent": env.get("TRACEPARENT"), "tracestate": env.get("TRACESTATE")})


__all__ = ["NOOP", "Carrier", "Span", "caller_carrier", "configure", "current", "enabled", "env_carrier", "record",
           "span", "use", "valid_carrier", "wanted"]
