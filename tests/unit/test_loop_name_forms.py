"""Loop names that look alike are one name or refused (``loop_spec.validate_name``): a composed and a decomposed
``é`` are stored composed (NFC) and name one loop, found by either spelling in Redis and in the mirror; a fullwidth,
styled or ligature character is refused with one line naming the plain spelling."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from loopsq.domain.loop_spec import new_loop, validate_name
from loopsq.errors import ConflictError, ValidationError
from loopsq.mirror import queries
from loopsq.mirror.schema import open_db
from loopsq.state.loops import LoopStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)
COMPOSED = "caf\u00e9"
DECOMPOSED = "cafe\u0301"


def body(name: str) -> dict[str, object]:
    return {"name": name, "schedule": {"type": "interval", "everyMs": 60_000},
            "target": {"type": "command", "command": "true"}}


def test_a_decomposed_name_is_stored_composed_and_the_composed_one_is_the_same_loop(fake_redis: redis.Redis) -> None:
    store = LoopStore(fake_redis)
    loop = store.create(new_loop(body(DECOMPOSED), NOW))
    assert loop.name == COMPOSED
    with pytest.raises(ConflictError, match=f"^loop name already exists: {COMPOSED}$"):
        store.create(new_loop(body(COMPOSED), NOW))
    assert store.require(DECOMPOSED).id == store.require(COMPOSED).id == loop.id


def test_a_renamed_loop_is_renamed_composed(fake_redis: redis.Redis) -> None:
    store = LoopStore(fake_redis)
    loop = store.create(new_loop(body("plain"), NOW))
    assert store.rename(loop.id, DECOMPOSED, NOW).name == COMPOSED
    assert store.require(DECOMPOSED).id == loop.id


def test_the_mirror_finds_a_loop_by_either_spelling(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "m.db")
    conn.execute("INSERT INTO loops (id, name, status, schedule_json, target_json, catch_up, catch_up_limit, "
                 "overlap, max_attempts, retry_delay_ms, lease_ms, created_at, updated_at) VALUES "
                 "('l1', ?, 'active', '{}', '{}', 'none', 1, 'skip', 1, 1, 1, 'x', 'x')", (COMPOSED,))
    found = [queries.find_loop(conn, name) for name in (COMPOSED, DECOMPOSED)]
    assert [loop["id"] if loop else None for loop in found] == ["l1", "l1"]
    conn.close()


@pytest.mark.parametrize(("name", "message"), [
    ("\uff4e\uff49\uff47\uff48\uff54\uff4c\uff59", "U+FF4E at position 1): write \"nightly\""),  # fullwidth
    ("report\U0001d41a", "U+1D41A at position 7): write \"reporta\""),  # mathematical bold a
    ("\ufb01les", "U+FB01 at position 1): write \"files\""),  # the fi ligature
    ("a\u00a0b", "U+00A0 at position 2): write \"a b\""),  # no-break space inside (around it: trimmed)
])
def test_a_name_with_a_compatibility_character_is_refused_naming_the_plain_spelling(name: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        new_loop(body(name), NOW)
    assert caught.value.message == ("name must not contain compatibility characters such as fullwidth or styled "
                                    f"letters, ligatures or no-break spaces ({message}, got \"{name}\"")
    assert validate_name(f"\u00a0{unicodedata.normalize('NFKC', name)}\u3000") == unicodedata.normalize("NFKC", name)
