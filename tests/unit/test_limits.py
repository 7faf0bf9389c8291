"""The documented bounds (``loopsq/domain/limits.py``): their values, and the one error each gives in the domain
validators that the SDK, the HTTP API and spec files go through; the README lists every one."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from loopsq.domain import limits
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.workflow_spec import load_workflow_file, workflow_body_from_json
from loopsq.engine.runtime import BEAT_S, Runtime
from loopsq.errors import ConflictError, ValidationError
from loopsq.sdk import LoopsClient

NOW = datetime(2026, 1, 1, tzinfo=UTC)
README = (Path(__file__).parents[2] / "README.md").read_text()


def body(**fields: Any) -> dict[str, Any]:
    given = fields.pop("target", {})
    target = given if given.get("type", "command") != "command" else {"type": "command", "command": "true", **given}
    return {"name": "n", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 60_000}, "target": target,
            **fields}


def error(value: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        new_loop(value, NOW)
    return caught.value.message


def test_the_bounds_have_their_documented_values() -> None:
    assert (limits.MAX_BODY_BYTES, limits.MAX_SPEC_FILE_BYTES) == (1_048_576, 1_048_576)
    assert (limits.MAX_NAME_LENGTH, limits.MAX_DESCRIPTION_LENGTH, limits.MAX_TIMEZONE_LENGTH) == (200, 4096, 64)
    assert (limits.MAX_TIME_LENGTH, limits.MAX_CRON_LENGTH, limits.MAX_COMMAND_LENGTH) == (64, 256, 16_384)
    assert (limits.MAX_ARGS, limits.MAX_ARG_LENGTH, limits.MAX_CWD_LENGTH, limits.MAX_PROMPT_LENGTH) == (
        256, 4096, 4096, 32_000)
    assert (limits.MAX_WORD_LENGTH, limits.MAX_ENV_ENTRIES, limits.MAX_ENV_KEY_LENGTH,
            limits.MAX_ENV_VALUE_LENGTH) == (200, 128, 256, 16_384)
    assert limits.ENV_KEY_PATTERN == "[A-Za-z_][A-Za-z0-9_]*"
    assert (limits.MAX_STEPS, limits.MAX_STEP_ID_LENGTH, limits.STEP_ID_PATTERN) == (
        100, 64, "[A-Za-z0-9_][A-Za-z0-9_.-]*")
    assert (limits.MAX_IDEMPOTENCY_KEY_LENGTH, limits.MAX_REASON_LENGTH, limits.MAX_COUNT) == (200, 500, 10_000)
    assert (limits.MIN_EVERY_MS, limits.MIN_LEASE_MS, limits.MIN_SESSION_TTL_MS) == (1000, 5000, 60_000)
    assert (limits.MAX_PAGE_LIMIT, limits.MAX_EVENT_PAGE_LIMIT, limits.MAX_LIST_LIMIT, limits.MAX_OFFSET) == (
        1000, 10_000, 1000, 100_000)


@pytest.mark.parametrize("name", [n for n in dir(limits) if n.isupper()])
def test_every_bound_is_documented_in_the_readme(name: str) -> None:
    assert f"`{name}`" in README, f"README does not document {name}"


def test_a_prompt_of_the_longest_length_fits_one_argv_argument_in_any_encoding() -> None:
    assert limits.MAX_PROMPT_LENGTH * 4 < 128 * 1024  # MAX_ARG_STRLEN, NUL included


def test_the_shortest_lease_spans_several_renewals_and_many_beats() -> None:
    renew_every_s = Runtime._renew_every(limits.MIN_LEASE_MS)
    assert 3 * renew_every_s <= limits.MIN_LEASE_MS / 1000
    assert limits.MIN_LEASE_MS / 1000 >= 25 * BEAT_S


# -- fields: the last allowed value passes, one more is the one error, quoting a short escaped prefix ----------
FIELDS = [
    ({"name": "x" * 201}, f'name must be at most 200 characters, got "{"x" * 64}… (137 more characters)"'),
    ({"description": "d" * 4097}, f'description must be at most 4096 characters, got "{"d" * 64}… (4033 more characters)"'),
    ({"timezone": "Z" * 65}, f'timezone must be at most 64 characters, got "{"Z" * 64}… (1 more characters)"'),
    ({"expiresAt": "2" * 65}, f'expiresAt must be at most 64 characters, got "{"2" * 64}… (1 more characters)"'),
    ({"target": {"command": "c" * 16_385}},
     f'target.command must be at most 16384 characters, got "{"c" * 64}… (16321 more characters)"'),
    ({"target": {"args": ["a"] * 257}}, "target.args must be an array of at most 256 strings, got "
     + '["a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a"…'),
    ({"target": {"args": ["a" * 4097]}},
     f'target.args[0] must be at most 4096 characters, got "{"a" * 64}… (4033 more characters)"'),
    ({"target": {"cwd": "/" * 4097}},
     f'target.cwd must be at most 4096 characters, got "{"/" * 64}… (4033 more characters)"'),
    ({"target": {"env": {f"K{i}": "v" for i in range(129)}}},
     'target.env must be an object of at most 128 entries, got {"K0": "v", "K1": "v", "K2": "v", "K3": "v", '
     '"K4": "v", "K5": "v…'),
    ({"target": {"env": {"K": "v" * 16_385}}},
     f'target.env.K must be at most 16384 characters, got "{"v" * 64}… (16321 more characters)"'),
    ({"target": {"timeoutMs": limits.MAX_MS + 1}},
     f"target.timeoutMs must be at most {limits.MAX_MS} (100 years), got {limits.MAX_MS + 1}"),
    ({"catchUpLimit": 10_001}, "catchUpLimit must be at most 10000, got 10001"),
    ({"maxAttempts": 10_001}, "maxAttempts must be at most 10000, got 10001"),
    ({"pauseAfterFailures": 10**20}, f"pauseAfterFailures must be at most 10000, got {10**20}"),
    ({"retryDelayMs": limits.MAX_MS + 1}, f"retryDelayMs must be at most {limits.MAX_MS}, got {limits.MAX_MS + 1}"),
    ({"leaseMs": 4999}, "leaseMs must be at least 5000 (5s), got 4999"),
    ({"leaseMs": 1}, "leaseMs must be at least 5000 (5s), got 1"),
    ({"schedule": {"type": "interval", "everyMs": 999}}, "interval everyMs must be at least 1000 (1s), got 999"),
    ({"schedule": {"type": "interval", "everyMs": 10}}, "interval everyMs must be at least 1000 (1s), got 10"),
    ({"schedule": {"type": "dynamic", "minIntervalMs": 1}}, "dynamic minIntervalMs must be at least 1000 (1s), got 1"),
    ({"schedule": {"type": "cron", "expression": "* " * 200}},
     f'cron expression must be at most 256 characters, got "{"* " * 32}… (336 more characters)"'),
]


@pytest.mark.parametrize(("fields", "message"), FIELDS, ids=[str(list(f))[:40] for f, _ in FIELDS])
def test_a_value_over_its_bound_gets_one_error_naming_the_field_and_a_short_prefix(
        fields: dict[str, Any], message: str) -> None:
    assert error(body(**fields)) == message


def test_values_at_their_bounds_are_accepted() -> None:
    loop = new_loop(body(name="x" * 200, description="d" * 4096, leaseMs=5000, catchUpLimit=10_000,
                         schedule={"type": "interval", "everyMs": 1000},
                         target={"command": "c" * 16_384, "args": ["a" * 4096] * 256, "cwd": "/" * 4096,
                                 "env": {f"K{i}": "v" * 100 for i in range(128)}, "timeoutMs": limits.MAX_MS}), NOW)
    assert (len(loop.name), loop.lease_ms, loop.schedule.every_ms) == (200, 5000, 1000)
    agent = new_loop(body(target={"type": "agent", "provider": "claude", "prompt": "p" * 32_000, "model": "m" * 200}),
                     NOW)
    assert len(agent.target["prompt"]) == 32_000
    with pytest.raises(ValidationError, match=r"^target.prompt must be at most 32000 characters, got "):
        new_loop(body(target={"type": "agent", "provider": "claude", "prompt": "p" * 32_001}), NOW)


# -- names ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "code", "position", "escaped"), [
    ("ok1\u200b", "U+200B", 4, "ok1\\u200b"),          # zero-width space
    ("a\u202eb", "U+202E", 2, "a\\u202eb"),            # right-to-left override
    ("a\x7fb", "U+007F", 2, "a\\x7fb"),                # DEL
    ("a\x9bb", "U+009B", 2, "a\\x9bb"),                # C1 control (CSI)
    ("a\nb", "U+000A", 2, "a\\x0ab"),                  # a line break inside
    ("a\u2066b", "U+2066", 2, "a\\u2066b"),            # left-to-right isolate
    ("\ufeffa", "U+FEFF", 1, "\\ufeffa"),              # byte order mark / zero-width no-break space
    ("a\u2028b", "U+2028", 2, "a\\u2028b"),            # line separator
])
def test_a_name_with_a_control_format_bidi_or_zero_width_character_is_refused(
        name: str, code: str, position: int, escaped: str) -> None:
    assert error(body(name=name)) == (
        f"name must not contain control, format, bidi or zero-width characters ({code} at position {position}), "
        f'got "{escaped}"')


def test_names_keep_spaces_letters_and_marks_and_are_trimmed() -> None:
    assert new_loop(body(name="  café déjà vu  "), NOW).name == "café déjà vu"
    # A combining mark is kept, composed (NFC); \n trims (a no-break space inside is refused: test_loop_name_forms).
    assert new_loop(body(name="e\u0301 x\n"), NOW).name == "\u00e9 x"


def test_a_name_equal_to_another_loops_id_is_refused_and_ids_are_never_shadowed() -> None:
    client = LoopsClient(client=fakeredis.FakeRedis(decode_responses=True))
    first = client.create(body(name="first"))
    with pytest.raises(ConflictError, match=rf"^loop name is another loop's id: {first.id}$"):
        client.create(body(name=first.id))
    assert [loop.name for loop in client.list()] == ["first"]
    assert client.get(first.id).name == "first"


# -- env keys and values (API, SDK and spec files; the CLI's --env uses the same check) ------------------------------
@pytest.mark.parametrize(("env", "message"), [
    ({"A=B": "x"}, 'target.env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "A=B"'),
    ({"": "x"}, 'target.env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got ""'),
    ({"1A": "x"}, 'target.env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "1A"'),
    ({"A\nB": "x"}, 'target.env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "A\\x0aB"'),
    ({"Ä": "x"}, 'target.env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "Ä"'),
    ({"K" * 257: "x"}, "target.env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "
     f'"{"K" * 64}… (193 more characters)"'),
    ({"PATH": "a\x00b"}, 'target.env.PATH must not contain NUL characters, got "a\\x00b"'),
])
def test_env_keys_must_be_shell_names_and_values_must_not_hold_nul(env: dict[str, str], message: str) -> None:
    assert error(body(target={"env": env})) == message
    spec = {"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "true", "env": env}}]}
    with pytest.raises(ValidationError) as caught:
        workflow_body_from_json(spec)
    assert caught.value.message == message.replace("target.", "workflow.steps[0].target.", 1)


def test_nul_is_refused_wherever_it_would_reach_argv_a_path_or_an_account() -> None:
    for fields, where in (({"command": "a\x00"}, "target.command"), ({"args": ["\x00"]}, "target.args[0]"),
                          ({"cwd": "/tmp\x00"}, "target.cwd"),
                          ({"account": {"profile": "p\x00"}}, "target.account.profile")):
        assert error(body(target=fields)).startswith(f"{where} must not contain NUL characters, got ")


def test_the_sdk_bounds_its_inputs_like_the_api() -> None:
    client = LoopsClient(client=fakeredis.FakeRedis(decode_responses=True))
    with pytest.raises(ValidationError, match=r"^target.env key must match"):
        client.create(body(target={"env": {"A=B": "1"}}))
    client.create(body(name="l"))
    with pytest.raises(ValidationError, match=r"^idempotency key must be at most 200 characters, got "):
        client.trigger("l", idempotency_key="k" * 201)
    with pytest.raises(ValidationError, match=r"^idempotency key must not contain control, format, bidi or "
                                              r"zero-width characters \(U\+000A at position 2\), got \"k\\x0a\"$"):
        client.trigger("l", idempotency_key="k\n")
    for limit in (0, 1001, 10**20, True):
        with pytest.raises(ValidationError, match=r"^limit must be an integer from 1 to 1000, got "):
            client.runs(limit=limit)
    assert client.runs(limit=500) == []
    assert client.client.keys("loopsq:idem:*") == []


# -- workflow specs --------------------------------------------------------------------------------------------
def spec_error(value: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        workflow_body_from_json(value)
    return caught.value.message


STEP = {"id": "a", "target": {"type": "command", "command": "true"}}


@pytest.mark.parametrize(("step_id", "shown"), [
    ("a b", '"a b"'), ("a\nb", '"a\\x0ab"'), ("a:b", '"a:b"'), ("-a", '"-a"'), (".a", '".a"'), ("ä", '"ä"'),
    ("a/b", '"a/b"'), ("s" * 65, f'"{"s" * 64}… (1 more characters)"'),
])
def test_step_ids_come_from_the_documented_character_set(step_id: str, shown: str) -> None:
    assert spec_error({"name": "w", "steps": [{**STEP, "id": step_id}]}) == (
        f"workflow.steps[0].id must match [A-Za-z0-9_][A-Za-z0-9_.-]* (at most 64 characters), got {shown}")


def test_step_ids_of_the_character_set_are_accepted() -> None:
    ids = ["a", "A9", "_x", "build-1", "v1.2_b", "9", "s" * 64]
    steps = [{**STEP, "id": i} for i in ids]
    assert [s["id"] for s in workflow_body_from_json({"name": "w", "steps": steps})["steps"]] == ids


def test_spec_fields_over_their_bounds_get_one_error() -> None:
    assert spec_error({"name": "w" * 201, "steps": [STEP]}).startswith(
        "workflow.name must be at most 200 characters, got ")
    assert spec_error({"name": "w\u200b", "steps": [STEP]}) == (
        "workflow.name must not contain control, format, bidi or zero-width characters (U+200B at position 2), "
        'got "w\\u200b"')
    assert spec_error({"name": "w", "description": "d" * 4097, "steps": [STEP]}).startswith(
        "workflow.description must be at most 4096 characters")
    assert spec_error({"name": "w", "maxParallel": 101, "steps": [STEP]}) == (
        "workflow.maxParallel must be at most 100, got 101")
    assert spec_error({"name": "w", "version": 2**60, "steps": [STEP]}) == (
        f"workflow.version must be at most {2**53 - 1} in absolute value, got {2**60}")
    assert spec_error({"name": "w", "steps": [{**STEP, "dependsOn": ["x" * 100]}]}) == (
        f"step a depends on missing step {'x' * 64}… (36 more characters)")


# -- spec files are read with a bound --------------------------------------------------------------------------
def test_dev_zero_is_refused_unread_as_it_is_not_a_regular_file(monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    with pytest.raises(ValidationError) as caught:
        load_workflow_file("/dev/zero")
    assert caught.value.message == "workflow file is not a regular file: /dev/zero (a character device)"
    assert time.monotonic() - started < 5  # the bound: refused quickly, not after GBs


def test_a_100_mb_file_is_refused_without_being_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as handle:
        handle.truncate(100 * 1024 * 1024)  # sparse: 100 MB long, nothing on disk
    reads: list[int] = []
    real_open = open

    def spying_open(*args: Any, **kwargs: Any) -> Any:
        handle = real_open(*args, **kwargs)
        original = handle.read
        handle.read = lambda n=-1: reads.append(n) or original(n)  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr("builtins.open", spying_open)
    with pytest.raises(ValidationError, match=r"^workflow file is larger than 1048576 bytes: .*big.json$"):
        load_workflow_file(str(path))
    assert reads == []


def test_a_file_of_exactly_the_bound_is_read(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    text = '{"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}'
    path.write_text(text + " " * (limits.MAX_SPEC_FILE_BYTES - len(text)))
    assert os.path.getsize(path) == limits.MAX_SPEC_FILE_BYTES
    assert load_workflow_file(str(path))["name"] == "w"
    path.write_text(text + " " * (limits.MAX_SPEC_FILE_BYTES - len(text) + 1))
    with pytest.raises(ValidationError, match=r"^workflow file is larger than 1048576 bytes: "):
        load_workflow_file(str(path))
