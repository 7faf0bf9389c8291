"""How a loop run is stored at ``keys.run(id)``: a running run as its JSON, a settled one zlib-compressed.

A settled run is written once and read rarely (its history reads come from the mirror), but it stays in Redis for
its loop's whole history window, so it is most of a loop's footprint: with 1 KB of output, a run's JSON is ~1.6 KB
and its compressed form ~0.7 KB (``bench/footprint.py``). A running run stays JSON, since its lease renewals
rewrite it and every guard compares it. RQ stores its job data compressed the same way.

The stored value tells its own form: JSON starts with ``{``, a zlib stream with its header byte (``0x78``; it
uses the preset dictionary ``ZDICT_V1``). Readers
that go through this module get the exact stored value back (``read``/``read_many``: text for JSON, bytes for a
compressed row), so a transition can guard on it, and ``decode`` turns either into a ``LoopRun``. A client that
decodes replies (``decode_responses``) reads the bytes undecoded (redis-py's ``NEVER_DECODE``); a compressed value
read any other way fails loudly (``UnicodeDecodeError``) rather than being taken for text.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import redis
from redis.client import NEVER_DECODE

from loopsq.domain.run_rules import LoopRun

#: Settled rows shorter than this stay JSON: compressing them saves too little to pay for itself.
COMPRESS_MIN_BYTES = 384
_LEVEL = 6
#: A preset dictionary (zlib's ``zdict``) of what every row repeats: its field names in ``LoopRun.to_dict``
#: order and the common values. It saves ~130 bytes a row (~20% of a compressed row with 1 KB of output). A
#: stream names its dictionary by checksum, so rows written with it can only be read with it: **never change
#: these bytes**; a better dictionary needs a new name and a decoder that picks by the stream's dictionary id.
ZDICT_V1 = (
    b'{"id":"","loopId":"","loopName":"","scheduledFor":"T00:00:00.000Z","attempt":1,"status":"failed",'
    b'"status":"skipped","createdAt":"","updatedAt":"","startedAt":"","finishedAt":"","claimedBy":"worker:",'
    b'"pid":,"exitCode":1,"durationMs":,"stderr":"","error":"","source":"ad_hoc","source":"manual","host":"",'
    b'"pidStartTime":.,"workerId":"worker:","idempotencyKey":"","previousAttempts":[{"attempt":1,'
    b'"status":"failed","error":"","exitCode":1,"startedAt":"","finishedAt":"","durationMs":,"workerId":"",'
    b'"host":"","stdout":"","stderr":""}],"rerun":1,"noRetry":true,"status":"succeeded","exitCode":0,'
    b'"stdout":"'
)
_RAW: dict[str, Any] = {NEVER_DECODE: []}

Stored = str | bytes


def encode(run: LoopRun) -> Stored:
    """The stored form of ``run``: JSON while it runs (or when short), else its JSON compressed."""
    text = run.to_json()
    if run.status == "running":
        return text
    return compress_text(text)


def compress_text(text: str) -> Stored:
    """A settled run's JSON ``text`` as stored: compressed, unless short or compressing saves nothing (also what
    ``state.migrations`` makes of a JSON row an older layout wrote)."""
    if len(text) < COMPRESS_MIN_BYTES:
        return text
    packer = zlib.compressobj(_LEVEL, zdict=ZDICT_V1)
    packed = packer.compress(text.encode()) + packer.flush()
    return packed if len(packed) < len(text) else text


def _text_or_bytes(value: object) -> Stored | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode() if value[:1] == b"{" else value
    return str(value)


def decode(stored: Stored) -> LoopRun:
    """The run in a stored value (either form)."""
    if isinstance(stored, bytes):
        if stored[:1] == b"{":
            stored = stored.decode()
        else:
            unpacker = zlib.decompressobj(zdict=ZDICT_V1)
            stored = (unpacker.decompress(stored) + unpacker.flush()).decode()
    return LoopRun.from_json(stored)


def read(client: redis.Redis, key: str) -> Stored | None:
    """The value at ``key`` exactly as stored (``str`` for JSON, ``bytes`` for a compressed row), or None."""
    return _text_or_bytes(client.execute_command("GET", key, **_RAW))  # type: ignore[no-untyped-call]


def read_many(client: redis.Redis, keys: Sequence[str]) -> list[Stored | None]:
    """``read`` for many keys in one round trip (MGET)."""
    if not keys:
        return []
    replies = client.execute_command("MGET", *keys, **_RAW)  # type: ignore[no-untyped-call]
    return [_text_or_bytes(v) for v in replies]


def load(client: redis.Redis, key: str) -> LoopRun | None:
    """The run at ``key``, or None."""
    stored = read(client, key)
    return decode(stored) if stored is not None else None


def load_many(client: redis.Redis, keys: Sequence[str]) -> list[LoopRun]:
    """The runs that exist at ``keys``, in order."""
    return [decode(s) for s in read_many(client, keys) if s is not None]
