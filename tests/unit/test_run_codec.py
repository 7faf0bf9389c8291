"""A settled run is stored compressed, a running one as JSON, and both read back whole, through every reader."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime

import fakeredis
import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.run_rules import LoopRun
from loopsq.state import run_codec
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.state.snapshot import snapshot_tables

KEYS = Keys()
OWNER = Owner("w1", "host-a", 100)
PAGE = " ".join(f"word-{i}" for i in range(200)) + "\n"
#: ``ZDICT_V1``'s checksum, and a row stored with it (a settled run whose stdout is "frozen").
DICT_ID_V1 = 3128081710
FROZEN_ROW = (
    b"x\xbb\xbar\xbd.\xab\x86$\xab4C\xe4\x84\x95c\x88\x9a\xb4\xd2\x8a\xf2\xabR\xf30\x13\x98\x91\x81\x91\x99\xae"
    b"\x81!\x10\x11\x97\xd4\x90\x9d\x83\x9c\xb4\xf0\x98\x83\x9c\xe4\xf0(\x83\xfb\x07\xe1TXPU\x8c\x82A\x05\x94j"
    b"\x01s\xd1\xfb\x83"
)


def at(second: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)


def run(status: str, stdout: str = PAGE) -> LoopRun:
    return LoopRun(id="r1", loop_id="l1", loop_name="n", scheduled_for="2026-01-01T00:00:00.000Z", attempt=1,
                   status=status, created_at="2026-01-01T00:00:00.000Z", updated_at="2026-01-01T00:00:00.000Z",
                   stdout=stdout, extra={"verdict": "done"})


@pytest.fixture
def client() -> redis.Redis:
    return fakeredis.FakeRedis(decode_responses=True)


def test_a_settled_run_is_compressed_and_reads_back_whole() -> None:
    stored = run_codec.encode(run("succeeded"))
    assert isinstance(stored, bytes) and len(stored) < len(run("succeeded").to_json()) / 2
    assert run_codec.decode(stored) == run("succeeded")
    assert run_codec.decode(stored).extra == {"verdict": "done"}  # fields it does not know survive too


def test_a_running_or_short_run_stays_json() -> None:
    assert run_codec.encode(run("running")) == run("running").to_json()
    assert run_codec.encode(run("failed", stdout="x")) == run("failed", stdout="x").to_json()


def test_reads_return_the_stored_value_exactly_on_a_decoding_client(client: redis.Redis) -> None:
    client.set("a", run_codec.encode(run("succeeded")))
    client.set("b", run_codec.encode(run("running")))
    assert run_codec.read(client, "a") == run_codec.encode(run("succeeded"))
    assert run_codec.read(client, "b") == run("running").to_json()
    assert run_codec.read_many(client, ["a", "missing", "b"])[1] is None
    assert [r.status for r in run_codec.load_many(client, ["a", "missing", "b"])] == ["succeeded", "running"]


def test_finalize_compresses_and_every_reader_sees_the_run(client: redis.Redis) -> None:
    loop = new_loop({"name": "c", "schedule": {"type": "interval", "everyMs": 60_000},
                     "target": {"type": "command", "command": "true"}}, at(0))
    LoopStore(client, KEYS).create(loop)
    store = RunStore(client, KEYS)
    claim = store.claim(loop.id, at(0), OWNER, at(1), source="ad_hoc")
    assert isinstance(claim, Claim)
    assert isinstance(run_codec.read(client, KEYS.run(claim.run.id)), str)  # running: JSON, guards compare it
    assert store.renew_lease(claim.run.id, claim.token, 30_000, at(2))
    ended = store.finalize(claim.run.id, claim.token, at(3), status="succeeded", exit_code=0, duration_ms=5,
                           stdout=PAGE, stderr="", error=None, pid=None)
    assert ended is not None
    assert isinstance(client.execute_command("GET", KEYS.run(claim.run.id), **run_codec._RAW), bytes)
    assert store.get(claim.run.id) == ended[0]
    assert store.get_many([claim.run.id]) == [ended[0]]
    assert snapshot_tables(client, KEYS)["loop_runs"] == [ended[0].to_dict()]
    # The settled row still refuses its slot, read in its compressed form.
    refused = store.claim(loop.id, at(0), OWNER, at(4), source="ad_hoc")
    assert not isinstance(refused, Claim) and refused.run == ended[0]


def test_the_preset_dictionary_never_changes() -> None:
    # Rows compressed with it can only be read with it: a changed dictionary would make every stored row unreadable.
    assert zlib.adler32(run_codec.ZDICT_V1) == DICT_ID_V1
    assert run_codec.decode(FROZEN_ROW).stdout == "frozen"


def test_the_dictionary_makes_rows_smaller() -> None:
    text = run("succeeded").to_json().encode()
    assert len(run_codec.encode(run("succeeded"))) < len(zlib.compress(text, 6)) - 50
