"""W3C trace context as loopsq carries it between processes: a carrier ``{"traceparent": ..., "tracestate": ...}``
(headers, a trigger's record, an RQ job's ``meta``), kept only when valid. No OpenTelemetry import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: A W3C ``traceparent`` (version 00 layout; an all-zero trace or span id is invalid).
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
#: The W3C limit of a ``tracestate`` header.
MAX_TRACESTATE = 512

Carrier = dict[str, str]


def valid_carrier(headers: Mapping[str, Any] | None) -> Carrier:
    """The W3C trace context in ``headers`` (keys in any case), kept only when valid: an invalid ``traceparent``
    is ignored, as W3C trace context asks, and so is a ``tracestate`` without one or over 512 characters."""
    if not headers:
        return {}
    lowered = {str(k).lower(): v for k, v in headers.items()}
    parent = lowered.get("traceparent")
    if not isinstance(parent, str) or not _TRACEPARENT.match(parent.strip()):
        return {}
    out = {"traceparent": parent.strip()}
    state = lowered.get("tracestate")
    if isinstance(state, str) and state.strip() and len(state) <= MAX_TRACESTATE:
        out["tracestate"] = state.strip()
    return out
