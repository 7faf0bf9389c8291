"""The ``loopsq`` command line: the reference's command surface on Redis, with one error line per failure.

Exit codes: 0 success; 1 not found or failed; 2 bad input (flags, spec files, schedules); 3 Redis unreachable.
The top interface: may import every layer (the web app too, which ``loopsq web`` serves); only ``worker/`` is above.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import click
import redis

from loopsq import __version__
from loopsq.cli import (
    apply_cmds,
    backfill_cmd,
    create,
    health_cmds,
    logs_cmd,
    loops_cmds,
    mcp_cmd,
    migrate_cmd,
    mirror_cmd,
    next_cmd,
    notify_cmds,
    pool_cmds,
    process_cmds,
    prune_cmd,
    run_cmds,
    up_cmds,
    update_cmd,
    web_cmd,
    workflow_run_cmds,  # noqa: F401  (registers `workflows run|runs|events|inspect|cancel|recover`)
    workflows_cmds,
)
from loopsq.cli.app import App, echo_err
from loopsq.domain.text import json_terminal_safe
from loopsq.errors import LoopsqError
from loopsq.mirror.damage import malformed_cause, malformed_error
from loopsq.state.connection import unavailable
from loopsq.state.keys import Keys
from loopsq.system import config

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_REDIS = 0, 1, 2, 3

#: The App of the invocation under way (for the error path, which runs after click's context has closed).
_invocation: dict[str, App] = {}


class RootGroup(workflows_cmds.AliasGroup):
    """The root group: maps every error to one ``error: ...`` line on stderr and a documented exit code."""

    aliases: ClassVar[dict[str, str]] = {"ls": "list", "rm": "remove", "workflow": "workflows", "restore": "unarchive"}

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except redis.RedisError as exc:
            app = ctx.find_object(App)
            raise unavailable(app.redis_url if app else "", exc) from exc
        except (sqlite3.Error, LoopsqError) as exc:
            app = ctx.find_object(App)
            where = config.mirror_path(app.data_dir) if app else "the mirror"
            damage = malformed_cause(exc)
            if damage is not None:
                raise malformed_error(where, damage) from exc
            if isinstance(exc, LoopsqError):
                raise
            raise LoopsqError(f"mirror database {where}: {exc}") from exc

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        _invocation.clear()

        def fail(kind: str, message: str, exit_code: int) -> None:
            # Once the command line was parsed, the App knows whether -j/--json was given (before or after the
            # subcommand); a usage error comes before that, so the arguments are scanned instead.
            app = _invocation.get("app")
            wanted = app.json if app is not None and kind != "UsageError" else _wants_json(argv)
            (_json_failure if wanted else _line_failure)(kind, message, exit_code)

        not_utf8 = _not_utf8(argv)
        if not_utf8 is not None:
            fail("UsageError", not_utf8, EXIT_BAD_INPUT)
        try:
            rv = super().main(args=argv, prog_name=prog_name or "loopsq", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            # A group without its subcommand: the usage and help as click formats them, on real lines, exit 2.
            exc.show()
            sys.exit(EXIT_BAD_INPUT)
        except LoopsqError as exc:
            fail(type(exc).__name__, exc.message, exc.exit_code)
        except click.UsageError as exc:
            fail("UsageError", exc.format_message(), EXIT_BAD_INPUT)
        except click.ClickException as exc:
            fail("ClickException", exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("Abort", "aborted", 130)
        except PermissionError as exc:
            fail("PermissionError", f"permission denied: {exc.filename or exc}", EXIT_FAILED)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


@click.group("loopsq", cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--json", "json_", is_flag=True, help="Print JSON (also accepted after the subcommand).")
@click.option("--redis-url", metavar="URL", help="Redis URL: redis://, rediss://, unix:// or redis+sentinel:// "
              "[env LOOPSQ_REDIS_URL, then REDIS_URL; else the Redis of a running `loopsq up`; no default].")
@click.option("--data-dir", metavar="DIR", help="Data directory for the SQLite mirror [env LOOPSQ_DATA_DIR; "
              "default ~/.loopsq].")
@click.option("--namespace", metavar="NAME", help="Prefix of every key this deployment writes and name of its RQ "
              "queues, so several deployments share one Redis database [env LOOPSQ_NAMESPACE; default loopsq].")
@click.version_option(__version__, "--version", prog_name="loopsq", message="%(version)s")
@click.pass_context
def cli(ctx: click.Context, json_: bool, redis_url: str | None, data_dir: str | None,
        namespace: str | None) -> None:
    """loopsq: recurring commands, coding agents and workflows on Redis workers."""
    # Validated before anything else (a bad one: one error line, exit 2). A flag is put in the environment, as
    # LOOPSQ_NAMESPACE would be, so that every Runtime of this process and every child (up's, an installed
    # service's) uses the same one.
    chosen = config.configured_namespace(namespace)
    if namespace is not None:
        os.environ[config.NAMESPACE_ENV] = chosen
    resolved_dir = config.resolve_data_dir(data_dir)
    # Resolved and validated on first use, before anything connects; a command that needs Redis and has none
    # refuses (``RedisNotConfiguredError``).
    app = App(redis_flag=redis_url, data_dir=resolved_dir, json=json_, keys=Keys(chosen))
    ctx.obj = _invocation["app"] = app
    ctx.call_on_close(app.close)


cli.add_command(create.create)
cli.add_command(update_cmd.update)
cli.add_command(apply_cmds.apply)
cli.add_command(apply_cmds.export)
for _command in (loops_cmds.list_loops, loops_cmds.show, loops_cmds.pause, loops_cmds.resume, loops_cmds.stop,
                 loops_cmds.remove, loops_cmds.archive, loops_cmds.unarchive, loops_cmds.rename,
                 workflows_cmds.workflows, mirror_cmd.mirror, run_cmds.run_now, run_cmds.tick, run_cmds.cancel,
                 run_cmds.runs, run_cmds.trigger, process_cmds.scheduler, process_cmds.worker,
                 health_cmds.doctor, health_cmds.status, up_cmds.up, up_cmds.install_services, logs_cmd.logs,
                 web_cmd.web, mcp_cmd.mcp, prune_cmd.prune, migrate_cmd.migrate, next_cmd.next_times,
                 backfill_cmd.backfill, pool_cmds.pool, notify_cmds.notify):
    cli.add_command(_command)


#: The ``code`` of a JSON error (``--json``) per error class; anything else is named by its exit code.
_ERROR_CODES = {"ValidationError": "bad_input", "UsageError": "bad_input", "NotFoundError": "not_found",
                "ConflictError": "conflict", "RedisUnavailableError": "redis_unavailable", "Abort": "aborted"}
_EXIT_NAMES = {EXIT_FAILED: "failed", EXIT_BAD_INPUT: "bad_input", EXIT_REDIS: "redis_unavailable"}


def _wants_json(argv: Sequence[str]) -> bool:
    """``-j``/``--json`` anywhere before a ``--`` (the flag is accepted before and after the subcommand)."""
    for token in argv:
        if token == "--":
            return False
        if token in ("-j", "--json"):
            return True
    return False


def _not_utf8(argv: Sequence[str]) -> str | None:
    """The error for the first argument that is not valid UTF-8, or None.

    Python decodes ``sys.argv`` with ``surrogateescape``, so an undecodable byte arrives as a lone surrogate;
    left alone it fails deep inside a command (a traceback on printing, encoding or storing it). The message shows
    the bytes escaped (``'caf\\xe9'``) and, for a value, the option it follows.
    """
    for index, token in enumerate(argv):
        if not _has_surrogate(token):
            continue
        name, eq, value = token.partition("=")
        if token.startswith("--") and eq and not _has_surrogate(name):
            return f"{name} value {_escaped(value)} is not valid UTF-8; pass UTF-8 text"
        before = argv[index - 1] if index else ""
        if before.startswith("-") and before != "--" and "=" not in before and not token.startswith("-"):
            return f"argument {_escaped(token)} (after {before}) is not valid UTF-8; pass UTF-8 text"
        return f"argument {_escaped(token)} is not valid UTF-8; pass UTF-8 text"
    return None


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def _escaped(text: str) -> str:
    """``text`` quoted, its undecodable bytes as ``\\xNN``."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no byte became (from an API caller, not an OS argv)
        raw = text.encode("utf-8", "surrogatepass")
    return "'" + raw.decode("utf-8", "backslashreplace").replace("'", "\\'") + "'"


def _line_failure(kind: str, message: str, exit_code: int) -> None:
    echo_err(f"error: {message}")
    sys.exit(exit_code)


def _json_failure(kind: str, message: str, exit_code: int) -> None:
    """With ``--json``, an error is one JSON object on stderr: ``{"error": {"code", "exitCode", "message"}}``."""
    code = _ERROR_CODES.get(kind) or _EXIT_NAMES.get(exit_code, "failed")
    body = {"error": {"code": code, "exitCode": exit_code, "message": message}}
    click.echo(json_terminal_safe(json.dumps(body, ensure_ascii=False)), err=True)
    sys.exit(exit_code)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="loopsq")
