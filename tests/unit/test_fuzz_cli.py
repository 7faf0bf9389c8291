"""Fuzzing ``loopsq create``'s arguments: any input gives success or one ``error:`` line with exit 2 — never a
traceback — and a refused input writes nothing.

CI runs a few hundred examples; ``LOOPSQ_FUZZ_EXAMPLES=10000`` is the nightly-style mode.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import fakeredis
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loopsq.cli import cli
from tests.unit.cli_helpers import FAKE_URL

EXAMPLES = int(os.environ.get("LOOPSQ_FUZZ_EXAMPLES", "300"))

WORDS = st.one_of(
    st.sampled_from(["1s", "0", "10x", "-1", "1h30m", "2.5ms", "* * * * *", "@daily", "61 * * * *", "none",
                     "latest", "all", "skip", "allow", "replace", "exponential", "UTC", "Mars/Base", "",
                     "2026-01-01T00:00", "tomorrow", "safe", "stdin", "claude", "gpt", "true", "echo hi",
                     "0 0 31 2 *", "9" * 30, "\x00", "é", "$(rm -rf /)"]),
    st.text(max_size=12),
)
FLAGS = ["--every", "--cron", "--at", "--dynamic", "--timezone", "--catch-up", "--catch-up-limit", "--overlap",
         "--attempts", "--retry-delay", "--retry-backoff", "--retry-max-delay", "--lease", "--expires-at",
         "--pause-after-failures", "-d", "--cwd", "--timeout", "--idle-timeout", "--no-shell", "--shell",
         "--account", "--account-tool", "--json", "--bogus"]
BOOL_FLAGS = {"--dynamic", "--no-shell", "--shell", "--json"}


@st.composite
def create_args(draw: st.DrawFn) -> list[str]:
    args = ["create", "command", draw(WORDS)]
    if draw(st.booleans()):
        args += ["--cmd", draw(WORDS)]
    for flag in draw(st.lists(st.sampled_from(FLAGS), max_size=6)):
        args.append(flag)
        if flag not in BOOL_FLAGS:
            args.append(draw(WORDS))
    return args


def _state(client: fakeredis.FakeRedis) -> dict[str, object]:
    return {key: client.dump(key) for key in sorted(client.keys("*"))}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          database=None)
@given(args=create_args())
def test_any_create_arguments_succeed_or_fail_with_one_line_and_write_nothing(
    args: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    data = tmp_path_factory.mktemp("fuzz")
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr("loopsq.cli.app.connect", lambda *_a, **_k: fakeredis.FakeRedis(server=server,
                                                                                  decode_responses=True))
        mp.setenv("LOOPSQ_DATA_DIR", str(Path(data) / "d"))
        mp.setenv("LOOPSQ_REDIS_URL", FAKE_URL)  # never connected to: fakeredis stands in
        mp.setenv("TZ", "UTC")
        before = _state(client)
        result = CliRunner().invoke(cli, args, catch_exceptions=True)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert result.exit_code in (0, 2), (args, result.exit_code, result.stderr)
        event(f"exit {result.exit_code}")
        if result.exit_code == 2:
            assert result.stderr.count("\n") == 1, (args, result.stderr)
            # One ``error:`` line, or with -j/--json among the arguments one JSON error object.
            assert result.stderr.startswith("error: ") or "message" in json.loads(result.stderr)["error"], args
            assert result.stdout == ""
            assert _state(client) == before, args
        else:
            assert client.scard("loopsq:loops") == 1
    finally:
        mp.undo()
