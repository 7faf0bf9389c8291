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
from tests.fuzz_values import HOSTILE
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


# -- hostile values for every flag: over-long, control- and separator-laden --------------------------------------
COMMAND_TEXT_FLAGS = ["--cmd", "--cwd", "--timezone", "--at", "--every", "--cron", "--expires-at", "-d",
                      "--account", "--account-tool", "--lease", "--retry-delay", "--timeout", "--attempts"]
AGENT_TEXT_FLAGS = ["--provider", "--prompt", "--cwd", "--model", "--agent", "--extra-arg", "--config-isolation",
                    "--prompt-via", "--timeout", "--idle-timeout", "--account"]
VALID = {"--cmd": "true", "--every": "1m", "--provider": "claude", "--prompt": "hi"}


@st.composite
def hostile_create_args(draw: st.DrawFn) -> list[str]:
    """A create command that would succeed, with hostile values in its name and some of its flags."""
    kind = draw(st.sampled_from(["command", "agent"]))
    flags = COMMAND_TEXT_FLAGS if kind == "command" else AGENT_TEXT_FLAGS
    name = draw(HOSTILE) if draw(st.booleans()) else "fuzzed"
    chosen = draw(st.lists(st.sampled_from(flags), min_size=0 if name != "fuzzed" else 1, max_size=3, unique=True))
    values = {flag: draw(HOSTILE) for flag in chosen}
    base = {"--cmd": VALID["--cmd"]} if kind == "command" else {"--provider": "claude", "--prompt": "hi"}
    args = ["create", kind, name]
    for flag, value in {**base, **values}.items():
        args += [flag, value]
    if not any(flag in values for flag in ("--at", "--every", "--cron")):
        args += ["--every", "1m"]
    return args


def _stored_loops(client: fakeredis.FakeRedis) -> list[dict[str, object]]:
    import json

    return [json.loads(client.get(f"loopsq:loop:{i}") or "{}") for i in client.smembers("loopsq:loops")]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(args=hostile_create_args())
def test_hostile_values_in_any_flag_get_one_error_and_write_nothing_or_are_stored_within_bounds(
    args: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    from loopsq.domain import limits
    from loopsq.domain.checks import first_invisible

    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr("loopsq.cli.app.connect", lambda *_a, **_k: fakeredis.FakeRedis(server=server,
                                                                                  decode_responses=True))
        mp.setenv("LOOPSQ_DATA_DIR", str(Path(tmp_path_factory.mktemp("hostile")) / "d"))
        mp.setenv("LOOPSQ_REDIS_URL", FAKE_URL)  # never connected to: fakeredis stands in
        mp.setenv("TZ", "UTC")
        result = CliRunner().invoke(cli, args, catch_exceptions=True)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert result.exit_code in (0, 2), (args[:6], result.exit_code, result.stderr[:300])
        event(f"exit {result.exit_code}")
        if result.exit_code == 2:
            assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
            assert len(result.stderr) < 1000, result.stderr[:300]  # a short escaped prefix, never the value
            assert first_invisible(result.stderr[:-1]) is None
            assert client.keys("*") == []
            return
        (loop,) = _stored_loops(client)
        target = loop["target"]
        assert isinstance(target, dict)
        assert len(str(loop["name"])) <= limits.MAX_NAME_LENGTH and first_invisible(str(loop["name"])) is None
        for field, bound in (("command", limits.MAX_COMMAND_LENGTH), ("cwd", limits.MAX_CWD_LENGTH),
                             ("prompt", limits.MAX_PROMPT_LENGTH), ("model", limits.MAX_WORD_LENGTH)):
            assert len(str(target.get(field, ""))) <= bound and "\x00" not in str(target.get(field, ""))
    finally:
        mp.undo()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(command=st.sampled_from([("trigger", "l", "--key"), ("runs", "--limit"), ("workflows", "runs", "--limit"),
                                ("workflows", "events", "r", "--limit"), ("workflows", "cancel", "r", "--reason"),
                                ("show",), ("pause",), ("workflows", "show",)]), value=HOSTILE)
def test_hostile_values_in_other_commands_get_one_error_and_change_nothing(
    command: tuple[str, ...], value: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = fakeredis.FakeServer()
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr("loopsq.cli.app.connect", lambda *_a, **_k: fakeredis.FakeRedis(server=server,
                                                                                  decode_responses=True))
        mp.setenv("LOOPSQ_DATA_DIR", str(Path(tmp_path_factory.mktemp("hostile")) / "d"))
        mp.setenv("LOOPSQ_REDIS_URL", FAKE_URL)  # never connected to: fakeredis stands in
        runner = CliRunner()
        assert runner.invoke(cli, ["create", "command", "l", "--cmd", "true", "--every", "1m"]).exit_code == 0
        client = fakeredis.FakeRedis(server=server, decode_responses=True)
        before = _state(client)
        result = runner.invoke(cli, [*command, value], catch_exceptions=True)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert result.exit_code in (0, 1, 2), (command, result.exit_code, result.stderr[:300])
        if result.exit_code:
            assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
            assert len(result.stderr) < 1000, result.stderr[:300]
            assert _state(client) == before
    finally:
        mp.undo()
