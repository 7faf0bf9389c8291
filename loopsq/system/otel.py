"""The OpenTelemetry side of ``loopsq.system.tracing``, imported only once tracing is on: this process's tracer
provider and its exporters from the standard ``OTEL_*`` variables, and spans with W3C context in and out.

Exporters (``OTEL_TRACES_EXPORTER``, comma-separated, default ``otlp``): ``otlp`` (OTLP over HTTP/protobuf, to
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``/v1/traces, default localhost:4318),
``console`` and ``none``. The service is ``OTEL_SERVICE_NAME``, else the process's (``loopsq-worker``, ...);
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` and ``OTEL_BSP_*`` apply as the SDK reads them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from loopsq.system.trace_context import Carrier, valid_carrier

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
Attributes = Mapping[str, str | int | bool | None] | None


class _Span:
    """A recording span's handle (``loopsq.system.tracing.Span``'s interface)."""

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: str | int | bool | None) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def fail(self, message: str | None) -> None:
        self._span.set_status(Status(StatusCode.ERROR, message))

    def carrier(self) -> Carrier:
        out: dict[str, str] = {}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(self._span))
        return valid_carrier(out)


def _exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    out: list[SpanExporter] = []
    for name in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(","):
        name = name.strip().lower()
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            out.append(OTLPSpanExporter())
        elif name == "console":
            out.append(ConsoleSpanExporter())
        elif name not in ("none", ""):
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter '%s' left out (otlp, console or none)", name)
    return out


class Backend:
    """Spans of one tracer provider (this process's, or a test's)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("loopsq")

    @classmethod
    def from_env(cls, service: str, env: Mapping[str, str] | None = None) -> Backend:
        """A provider named ``OTEL_SERVICE_NAME`` (else ``service``) exporting in batches to the exporters the
        environment names; flushed at the interpreter's exit."""
        env = os.environ if env is None else env
        provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service}))
        for exporter in _exporters(env):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    def span(self, name: str, parent: object, attributes: Attributes) -> Any:
        return self._span(name, parent, attributes)

    @contextmanager
    def _span(self, name: str, parent: object, attributes: Attributes) -> Iterator[_Span]:
        with self.tracer.start_as_current_span(name, context=_context(parent),
                                               attributes=_clean(attributes)) as span:
            yield _Span(span)

    def current(self) -> object:
        return otel_context.get_current()

    def record(self, name: str, start_ns: int, attributes: Attributes) -> None:
        span = self.tracer.start_span(name, attributes=_clean(attributes), start_time=start_ns)
        span.end(end_time=time.time_ns())


def _context(parent: object) -> otel_context.Context | None:
    """The context a span with ``parent`` starts in: a carrier's remote span, another thread's context, or (None)
    this thread's."""
    if parent is None:
        return None
    if isinstance(parent, otel_context.Context):
        return parent
    if isinstance(parent, Mapping):
        carrier = valid_carrier(parent)
        return _PROPAGATOR.extract(carrier) if carrier else None
    return None


def _clean(attributes: Attributes) -> dict[str, str | int | bool] | None:
    return {k: v for k, v in attributes.items() if v is not None} if attributes else None
