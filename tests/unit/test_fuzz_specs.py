"""Fuzzing spec files (hypothesis): hostile values in every field of a spec file, and hostile files themselves,
give ``workflows validate|create`` success or one ``error:`` line with exit 2, and a refused file stores nothing.

CI runs a few hundred examples; ``LOOPSQ_FUZZ_EXAMPLES=10000`` is the nightly-style mode.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopsq.domain import limits
from loopsq.domain.checks import first_invisible
from tests.fuzz_values import HOSTILE
from tests.unit.cli_helpers import Cli, make_cli

EXAMPLES = int(os.environ.get("LOOPSQ_FUZZ_EXAMPLES", "200"))
PATHS = [("name",), ("description",), ("steps", 0, "id"), ("steps", 1, "id"), ("steps", 1, "dependsOn", 0),
         ("steps", 0, "target", "command"), ("steps", 0, "target", "args", 0), ("steps", 0, "target", "cwd"),
         ("steps", 0, "target", "env", None), ("steps", 0, "target", "env", "KEY"),
         ("steps", 0, "account", "profile"), ("steps", 1, "target", "prompt"), ("steps", 1, "target", "model"),
         ("steps", 1, "target", "extraArgs", 0), ("steps", 1, "target", "provider")]
FILES = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda n: "[" * n, st.sampled_from([10, 10_000, 200_000])),
    st.builds(lambda n: " " * n, st.sampled_from([limits.MAX_SPEC_FILE_BYTES, limits.MAX_SPEC_FILE_BYTES + 1])),
    st.builds(lambda n: '{"name": "w", "steps": [' + ",".join(['{"id": "a"}'] * n) + "]}",
              st.sampled_from([101, 20_000])),
)


def spec_with(path: tuple[Any, ...], value: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "w", "steps": [
        {"id": "a", "account": {"profile": "p"},
         "target": {"type": "command", "command": "true", "args": ["x"], "cwd": "/", "env": {}}},
        {"id": "b", "dependsOn": ["a"],
         "target": {"type": "agent", "provider": "claude", "prompt": "hi", "extraArgs": ["x"]}}]}
    holder: Any = spec
    for part in path[:-2] if path[-1] is None else path[:-1]:
        holder = holder[part]
    if path[-1] is None:
        holder[path[-2]] = {value: "v"}
    else:
        holder[path[-1]] = value
    return spec


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Any:
    mp = pytest.MonkeyPatch()
    yield make_cli(tmp_path_factory.mktemp("specs"), mp), tmp_path_factory.mktemp("files")
    mp.undo()


def check(cli: Cli, path: Path) -> None:
    before = cli.state()
    for command in ("validate", "create"):
        result = cli.run("workflows", command, str(path))
        assert result.exit_code in (0, 2), (command, result.exit_code, result.stderr[:300])
        if result.exit_code == 2:
            assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
            assert len(result.stderr) < 1000 and first_invisible(result.stderr[:-1]) is None, result.stderr[:300]
            assert cli.state() == before
        elif command == "create":
            for spec in cli.json("workflows", "list"):
                assert all(re.fullmatch(limits.STEP_ID_PATTERN, step["id"]) for step in spec["steps"])
                assert first_invisible(spec["name"]) is None and len(spec["name"]) <= limits.MAX_NAME_LENGTH
            cli.redis.flushall()  # the next example starts from nothing again
            before = cli.state()


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=HOSTILE)
def test_hostile_values_in_any_spec_field_get_one_error_and_store_nothing(
    cli: tuple[Cli, Path], path: tuple[Any, ...], value: str
) -> None:
    runner, directory = cli
    file = directory / "spec.json"
    file.write_text(json.dumps(spec_with(path, value)), encoding="utf-8")
    check(runner, file)


@settings(max_examples=max(20, EXAMPLES // 10), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(content=FILES)
def test_hostile_files_get_one_error_and_store_nothing(cli: tuple[Cli, Path], content: bytes | str) -> None:
    runner, directory = cli
    file = directory / "spec.json"
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content, encoding="utf-8")
    check(runner, file)
