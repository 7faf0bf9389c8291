"""Every command has help text and is documented in the README."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from loopsq.cli import cli

README = (Path(__file__).parents[2] / "README.md").read_text()


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, path)


COMMANDS = list(_commands(cli))


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_has_help(path: tuple[str, ...], command: click.Command) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert command.help, f"{' '.join(path)} has no docstring"
    assert result.output.startswith(f"Usage: loopsq {' '.join(path)}")


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_is_documented_in_the_readme(path: tuple[str, ...], command: click.Command) -> None:
    if isinstance(command, click.Group):
        return
    assert f"`{' '.join(path)}" in README, f"README does not document `{' '.join(path)}`"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _help(*path: str) -> str:
    return " ".join(CliRunner().invoke(cli, [*path, "--help"], terminal_width=10_000).output.split())


def test_the_readme_and_show_help_say_what_redaction_does_to_a_prompt() -> None:
    from loopsq.domain.redaction import PROMPT_VISIBLE_CHARS, redact

    assert redact("p" * 100, PROMPT_VISIBLE_CHARS) == "p" * 80 + "... [redacted 20 chars]"
    flat = _flat(README)
    assert "prompts and env redacted" not in flat and "agent prompts redacted" not in flat
    assert ("an agent prompt keeps its first 80 characters, the rest shown as `... [redacted N chars]`, so a prompt "
            "of 80 characters or fewer is shown in full") in flat
    assert ("A target's env is shown as '[redacted]'; an agent prompt keeps its first 80 characters, the rest shown "
            "as '... [redacted N chars]' (a prompt of 80 characters or fewer is shown in full).") in _help("show")


def test_the_quick_start_and_up_help_mention_demo_steering() -> None:
    from loopsq.ops.demo import STEERING_LOOP

    quick_start = _flat(README[README.index("## Quick start"):README.index("## Running the tests")])
    assert f"`{STEERING_LOOP}`" in quick_start and "as `stopped`, as it should" in quick_start
    assert (f"{STEERING_LOOP} (a fake agent: no_op twice, each asking for its next run in 5s, then done, which stops "
            "its loop)") in _help("up")


def test_the_readme_says_what_the_sdk_returns() -> None:
    from loopsq.sdk import LoopsClient

    section = _flat(README[README.index("## Triggering runs from other services"):README.index("## Benchmarks")])
    methods = [name for name in vars(LoopsClient) if not name.startswith("_") and name != "close"]
    assert all(f"`{name}" in section for name in methods), [m for m in methods if f"`{m}" not in section]
    for words in ("frozen dataclasses with **snake_case** attributes, while `create` takes the API's **camelCase**",
                  "`Loop` (`loopsq.domain.models`)", "`LoopRun` (`loopsq.domain.run_rules`)", "`PoolState`",
                  "`to_dict()` gives the camelCase dict"):
        assert words in section, words


def test_the_readme_gives_runs_limit_the_codes_bound() -> None:
    from loopsq.domain.limits import MAX_PAGE_LIMIT

    assert f"(1 to {MAX_PAGE_LIMIT})" in _help("runs")
    row = next(line for line in README.splitlines() if line.startswith("| `runs [ID_OR_NAME] [--limit N]"))
    assert f"`--limit` 1 to {MAX_PAGE_LIMIT:,}, default 50" in row
    assert f"| `MAX_PAGE_LIMIT` | {MAX_PAGE_LIMIT:,} |" in README


def test_the_readme_says_where_web_listens_under_honcho() -> None:
    procfile = (Path(__file__).parents[2] / "Procfile").read_text().splitlines()
    offset = 100 * [line.split(":")[0] for line in procfile].index("web")  # honcho: 100 apart, in file order
    deploying = _flat(README[README.index("## Deploying"):])
    assert f"listens on the base + {offset}: `0.0.0.0:{5000 + offset}` by default" in deploying
