"""Every command example in README.md and docs/*.md is a command loopsq has, with options it has.

The examples are the ``loopsq …`` lines of fenced shell blocks, the inline code spans that start with
``loopsq `` or with a command name and an option (``runs --status failed``), and the synopses in the first column
of the README's command table (``backfill ID_OR_NAME --from TIME --to TIME [--overlap skip|allow] …``). Each is
parsed by click as the CLI would parse it (``make_context`` down the command path, ``resilient_parsing=False``:
an unknown command or option, a missing or ill-typed value, an extra argument fails), without running it;
placeholders (``NAME``, ``N``, ``DURATION``) get a value of the type their option takes, and ``a|b``
alternatives are each tried. The examples that only read or make harmless changes then run for real, in
process, against the session's private redis-server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import redis
from click.testing import CliRunner

from loopsq.cli import cli
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "shell", "console", ""}
#: A value for each placeholder the docs use, by what it stands for (an option's value, or an argument).
SAMPLES = {
    "N": "3", "S": "5", "MS": "1000", "PORT": "8080", "T": "2026-01-01T00:00:00Z", "TIME": "2026-01-01T00:00:00Z",
    "DURATION": "5m", "FILE": "spec.json", "DIR": "services", "PATH": "prompt.txt", "LABEL": "gpu", "H": "127.0.0.1",
    "KEY=VALUE": "A=1", "CMD": "true", "TEXT": "hello", "P": "claude", "K": "order-42", "R": "because",
    "O": "done", "M": "opus", "A": "build", "V": "high", "URL": "redis://127.0.0.1:6390/0", "ID": "build",
    "ID_OR_NAME": "demo-hello", "NAME": "team-a",
}
#: What a reference may leave out: ``logs --step`` names the option, ``install`` the command, without the rest.
INCOMPLETE = (click.exceptions.MissingParameter, click.exceptions.NoArgsIsHelpError)
ARGUMENT = "demo-hello"  # a placeholder that is an argument (NAME, ID_OR_NAME, RUN) names a loop, but files:
FILE_ARGUMENTS = ("FILE", "PATH", "DIR")


def top_commands() -> set[str]:
    assert isinstance(cli, click.Group)
    return set(cli.commands)


def _spans(text: str) -> Iterator[str]:
    """Inline code spans outside fenced blocks."""
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    yield from re.findall(r"`([^`\n]+)`", outside)


def _fenced(text: str) -> Iterator[str]:
    """``loopsq …`` commands of fenced shell blocks (each ``&&``/``;``/``|`` part, comments left out)."""
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang not in SHELL_LANGS:
            continue
        for line in block.splitlines():
            for part in re.split(r"&&|;|\|\|?", line.split(" #")[0]):
                if part.strip().startswith("loopsq "):
                    yield part.strip()


def _table_synopses(text: str) -> Iterator[str]:
    """The first column of the README's command table."""
    table = text[text.index("| command | what it does"):]
    for line in table.splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cell = line.split(" | ")[0][2:]
        # "`list` (`ls`) `[--status S]`": the spans joined, the alias in parentheses left out; "`pause` / `resume` /
        # `stop ID_OR_NAME`": each command.
        for part in re.sub(r"\(`[^`]+`\)", "", cell).split("` / `"):
            yield " ".join(re.findall(r"`?([^`]+)`?", part.strip())).replace("\\|", "|")


def examples() -> list[tuple[str, str]]:
    """(command line without ``loopsq``, where) of every example, deduplicated; ``where`` ends in
    ``(command table)`` for a synopsis."""
    found: dict[str, str] = {}
    commands = top_commands()
    for path in DOC_FILES:
        text = path.read_text()
        where = path.relative_to(ROOT).as_posix()
        for line in _fenced(text):
            found.setdefault(line.removeprefix("loopsq "), f"{where} (block)")
        for span in _spans(text):
            words = span.split()
            if span.startswith("loopsq "):
                found.setdefault(span.removeprefix("loopsq "), where)
            elif words and words[0] in commands and any(w.startswith("-") for w in words[1:]):
                found.setdefault(span, where)
        if path.name == "README.md":
            for synopsis in _table_synopses(text):
                found.setdefault(synopsis, f"{where} (command table)")
    return sorted((line, where) for line, where in found.items())


EXAMPLES = examples()


def _alternatives(line: str) -> list[list[str]]:
    """The argv of each reading of an example: ``[...]`` taken, ``a|b`` each way, ``…``/``...`` dropped."""
    text = line.replace("\\|", "|").replace("…", " ").replace("...", " ").replace("[", " ").replace("]", " ")
    words = shlex.split(text)
    choices = [word.split("|") if "|" in word and not word.startswith("|") else [word] for word in words]
    return [list(argv) for argv in itertools.product(*choices)]


def _option_names(command: click.Command) -> set[str]:
    return {name for param in command.params if isinstance(param, click.Option)
            for name in (*param.opts, *param.secondary_opts)}


def check_names(line: str) -> click.Command:
    """Every command and option ``line`` names exists: an option of its command, of ``loopsq`` itself (global), or,
    after a group (``create --keep-runs``), of every command of the group. Returns the command."""
    command, _rest = _resolve(shlex.split(line.replace("\\|", "|").replace("[", " ").replace("]", " ")
                                         .replace("…", " ").replace("...", " ").split("|")[0]))
    known = _option_names(command) | _option_names(cli)
    if isinstance(command, click.Group):
        known |= set.intersection(*(_option_names(sub) for sub in command.commands.values()))
    named = {piece.split("=")[0] for word in line.replace("\\|", "|").replace("[", " ").replace("]", " ").split()
             for piece in word.split("|") if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", piece)}
    unknown = sorted(named - known)
    assert not unknown, f"`loopsq {line}` names options that `{command.name}` does not have: {unknown}"
    return command


def _resolve(argv: list[str]) -> tuple[click.Command, list[str]]:
    """The command ``argv`` names, and the words after its path (without parsing them)."""
    command: click.Command = cli
    rest = list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        assert sub is not None, f"no such command: {rest[0]!r} (in {' '.join(argv)!r})"
        command, rest = sub, rest[1:]
    return command, rest


def _fill(command: click.Command, words: list[str]) -> list[str]:
    """Placeholders replaced by values of their option's type."""
    options = {name: param for param in command.params if isinstance(param, click.Option)
               for name in (*param.opts, *param.secondary_opts)}
    filled: list[str] = []
    for index, word in enumerate(words):
        if not (word.isupper() or word in SAMPLES) or word.startswith("-"):
            filled.append(word)
            continue
        before = options.get(words[index - 1]) if index else None
        if before is not None and not before.is_flag:
            if isinstance(before.type, click.Choice):
                filled.append(str(before.type.choices[0]))
            elif isinstance(before.type, click.IntRange) and before.type.min is not None:
                filled.append(str(max(int(before.type.min), 1)))
            else:
                assert word in SAMPLES, f"no sample value for the placeholder {word!r}"
                filled.append(SAMPLES[word])
        else:
            filled.append(SAMPLES[word] if word in FILE_ARGUMENTS else ARGUMENT)
    return filled


def parse(argv: list[str]) -> click.Context:
    """Parse ``argv`` down its command path as ``loopsq`` would, without running anything."""
    ctx = cli.make_context("loopsq", list(argv), resilient_parsing=False)
    command: click.Command = cli
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, sub, args = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, args, parent=ctx, resilient_parsing=False)
        command = sub
    return ctx


@pytest.mark.parametrize(("line", "where"), EXAMPLES, ids=[line for line, _ in EXAMPLES])
def test_every_command_example_in_the_docs_names_what_loopsq_has_and_parses(line: str, where: str) -> None:
    command = check_names(line)
    alternative_options = re.search(r"\|-", line.replace("\\|", "|")) is not None  # `--prompt T|--prompt-file P`
    if isinstance(command, click.Group) or where.endswith("(command table)") or alternative_options:
        return  # a group's shared options are checked by name; alternatives that span several words too
    for argv in _alternatives(line):
        command, rest = _resolve(argv)
        filled = [*argv[:len(argv) - len(rest)], *_fill(command, rest)]
        try:
            parse(filled)
        except (click.exceptions.Exit, *INCOMPLETE):  # --help; a reference without its arguments
            pass
        except click.exceptions.BadOptionUsage as exc:
            assert "requires an argument" in exc.message, f"{where}: `loopsq {line}`: {exc.format_message()}"
        except click.ClickException as exc:
            pytest.fail(f"{where}: `loopsq {line}` does not parse as {filled}: {exc.format_message()}")


def test_the_examples_are_found() -> None:
    lines = {line for line, _ in EXAMPLES}
    assert len(lines) >= 60
    for expected in ("pool set claude-acct --limit 3", "trigger nightly-report --key order-42",
                     "runs --status failed", "workflows create FILE", "up --demo",
                     "backfill ID_OR_NAME --from TIME --to TIME --overlap skip|allow --max-parallel N --force --wait S"):
        assert any(line.replace("[", "").replace("]", "") == expected for line in lines), expected


@pytest.mark.parametrize("wrong", ["pool set claude-acct --limt 3", "runs --state failed", "workflows start X",
                                   "next NAME --count many", "create --keep-run N", "list extra"])
def test_a_misspelt_command_or_option_fails_the_check(wrong: str) -> None:
    with pytest.raises((AssertionError, click.ClickException)):
        check_names(wrong)
        for argv in _alternatives(wrong):
            command, rest = _resolve(argv)
            with contextlib.suppress(*INCOMPLETE):
                parse([*argv[:len(argv) - len(rest)], *_fill(command, rest)])


# -- the harmless ones, run for real ---------------------------------------------------------------------------------
#: Examples run against a real redis-server: reads, and writes that touch only what the test made.
RUN = ["list", "runs demo-hello", "runs --status failed", "next NAME", "show", "resume demo-steering",
       "pool set claude-acct --limit 3", "pool list", "pool show NAME", "trigger nightly-report --key order-42",
       "workflows validate FILE", "workflows create FILE", "workflows list", "status"]


@pytest.fixture
def env(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)
    spec = re.findall(r"```json\n(.*?)```", (ROOT / "docs" / "workflows.md").read_text(), re.S)[0]
    (tmp_path / "spec.json").write_text(spec)
    variables = {"LOOPSQ_REDIS_URL": redis_server.url, "LOOPSQ_DATA_DIR": str(tmp_path / "data"), "TZ": "UTC"}
    for name in ("demo-hello", "demo-steering", "nightly-report"):
        made = CliRunner().invoke(cli, ["create", "command", name, "--cmd", "true", "--every", "1h"], env=variables)
        assert made.exit_code == 0, made.output
    assert CliRunner().invoke(cli, ["stop", "demo-steering"], env=variables).exit_code == 0
    return variables


def test_the_harmless_examples_run_against_a_real_redis(env: dict[str, str]) -> None:
    documented = {line.replace("[", "").replace("]", "") for line, _ in EXAMPLES}
    for example in RUN:
        assert any(line == example or line.startswith(example + " ") for line in documented), example
        argv = shlex.split(example)
        command, rest = _resolve(argv)
        argv = [*argv[:len(argv) - len(rest)], *_fill(command, rest)]
        if example == "pool show NAME":
            argv[-1] = "claude-acct"
        if argv[0] == "show":
            argv.append("demo-hello")
        result = CliRunner().invoke(cli, argv, env=env)
        assert result.exit_code == 0, (example, result.output, result.stderr if result.stderr_bytes else "")
    listed = CliRunner().invoke(cli, ["--json", "pool", "list"], env=env)
    assert [pool["name"] for pool in json.loads(listed.output)] == ["claude-acct"]
