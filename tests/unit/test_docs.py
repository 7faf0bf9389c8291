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
