"""A data dir's mirror name, which names its consumer group: ``LOOPSQ_MIRROR_NAME`` (validated), else an id made
once and kept in ``mirror_meta`` across restarts and rebuilds (the group it followed before names were kept, when
Redis still has it)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.domain.loop_spec import new_loop
from loopsq.mirror.apply import MIRROR_NAME_KEY, get_meta, reset
from loopsq.mirror.follow import rebuild
from loopsq.mirror.identity import configured_name, legacy_name, mirror_group
from loopsq.mirror.schema import open_db
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
BAD_NAME = "LOOPSQ_MIRROR_NAME must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"


def _make(client: redis.Redis, name: str) -> None:
    body = {"name": name, "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
            "target": {"type": "command", "command": "true"}}
    LoopStore(client, KEYS).create(new_loop(body, T0))


@pytest.mark.parametrize("value", ["archive", "a", "box-1.eu_west", "x" * 64])
def test_a_well_formed_mirror_name_is_taken_as_it_is(value: str) -> None:
    assert configured_name({"LOOPSQ_MIRROR_NAME": value}) == value


@pytest.mark.parametrize("value", ["my mirror", "-lead", ".hidden", "x" * 65, "a:b", "é", "name\n"])
def test_a_malformed_mirror_name_is_refused_naming_the_variable_and_the_value(value: str) -> None:
    from loopsq.errors import ValidationError

    with pytest.raises(ValidationError) as caught:
        configured_name({"LOOPSQ_MIRROR_NAME": value})
    assert caught.value.message == f"{BAD_NAME}, got '{value}'"
    assert caught.value.exit_code == 2


def test_an_empty_mirror_name_counts_as_unset() -> None:
    assert configured_name({"LOOPSQ_MIRROR_NAME": ""}) is None and configured_name({}) is None


@pytest.mark.parametrize("command", [["mirror"], ["mirror", "--once"], ["web", "--port", "1"], ["up"]])
def test_the_commands_that_follow_refuse_a_malformed_mirror_name_with_one_line_and_exit_2(
    command: list[str], tmp_path: Path
) -> None:
    env = {"LOOPSQ_MIRROR_NAME": "my mirror", "LOOPSQ_REDIS_URL": "redis://nothing.invalid:1/0",
           "LOOPSQ_DATA_DIR": str(tmp_path / "data"), "LOOPSQ_API_TOKEN": "t" * 32}
    result = CliRunner().invoke(cli, command, env=env)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {BAD_NAME}, got 'my mirror'\n")
    assert not (tmp_path / "data").exists()


def test_a_data_dir_keeps_the_name_it_was_given_first_across_rebuilds(client: redis.Redis, tmp_path: Path) -> None:
    path = tmp_path / "loops.db"
    conn = open_db(path)
    group = mirror_group(client, KEYS, conn, str(path), env={})
    assert group.startswith("mirror:") and len(group) == len("mirror:") + 12
    assert group != f"mirror:{legacy_name(str(path))}"  # no such group on the stream: a new id, not the host's
    _make(client, "a")
    rebuild(client, KEYS, conn)  # merges, and replaces the other meta
    reset(conn)
    reopened = open_db(path)
    assert mirror_group(client, KEYS, reopened, str(path), env={}) == group
    # Another data dir (an ephemeral disk that came back empty) gets another name.
    other = tmp_path / "other" / "loops.db"
    assert mirror_group(client, KEYS, open_db(other), str(other), env={}) != group
    # LOOPSQ_MIRROR_NAME wins while it is set, and the kept name is back when it is not.
    assert mirror_group(client, KEYS, reopened, str(path), env={"LOOPSQ_MIRROR_NAME": "archive"}) == "mirror:archive"
    assert mirror_group(client, KEYS, reopened, str(path), env={}) == group


def test_a_mirror_that_followed_before_names_were_kept_adopts_its_old_group(
    client: redis.Redis, tmp_path: Path
) -> None:
    path = tmp_path / "loops.db"
    old = f"mirror:{legacy_name(str(path))}"
    client.xgroup_create(KEYS.changes, old, id="0-0", mkstream=True)
    conn = open_db(path)
    assert mirror_group(client, KEYS, conn, str(path), env={}) == old
    assert get_meta(conn, MIRROR_NAME_KEY) == old.removeprefix("mirror:")
    assert [g["name"] for g in client.xinfo_groups(KEYS.changes)] == [old]
