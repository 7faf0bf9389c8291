"""The ``loopsq`` command line: the reference's command surface on Redis, with one error line per failure.

Exit codes: 0 success; 1 not found or failed; 2 bad input (flags, spec files, schedules); 3 Redis unreachable.
The top interface: may import every layer (the web app too, which ``loopsq web`` serves); only ``worker/`` is above.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import click
import redis

from loopsq import __version__
from loopsq.cli import (
    create,
    health_cmds,
    loops_cmds,
    mirror_cmd,
    process_cmds,
    run_cmds,
    up_cmds,
    web_cmd,
    workflow_run_cmds,
    workflows_cmds,
)
from loopsq.cli.app import App, echo_err
from loopsq.errors import LoopsqError
from loopsq.mirror.damage import malformed_cause, malformed_error
from loopsq.state.connection import unavailable
from loopsq.system import config

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_REDIS = 0, 1, 2, 3


class RootGroup(workflows_cmds.AliasGroup):
    """The root group: maps every error to one ``error: ...`` line on stderr and a documented exit code."""

    aliases: ClassVar[dict[str, str]] = {"ls": "list", "rm": "remove", "workflow": "workflows"}

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except redis.RedisError as exc:
            app = ctx.find_object(App)
            url = app.redis_url if app else config.resolve_redis_url()
            raise unavailable(url, exc) from exc
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
        try:
            rv = super().main(args=args, prog_name=prog_name or "loopsq", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except LoopsqError as exc:
            echo_err(f"error: {exc.message}")
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            echo_err(f"error: {exc.format_message()}")
            sys.exit(EXIT_BAD_INPUT)
        except click.ClickException as exc:
            echo_err(f"error: {exc.format_message()}")
            sys.exit(exc.exit_code)
        except click.Abort:
            echo_err("error: aborted")
            sys.exit(130)
        except PermissionError as exc:
            echo_err(f"error: permission denied: {exc.filename or exc}")
            sys.exit(EXIT_FAILED)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


@click.group("loopsq", cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--json", "json_", is_flag=True, help="Print JSON (also accepted after the subcommand).")
@click.option("--redis-url", metavar="URL", help="Redis URL [env LOOPSQ_REDIS_URL, then REDIS_URL; default "
              f"{config.DEFAULT_REDIS_URL}].")
@click.option("--data-dir", metavar="DIR", help="Data directory for the SQLite mirror [env LOOPSQ_DATA_DIR; "
              "default ~/.loopsq].")
@click.version_option(__version__, "--version", prog_name="loopsq", message="%(version)s")
@click.pass_context
def cli(ctx: click.Context, json_: bool, redis_url: str | None, data_dir: str | None) -> None:
    """loopsq: recurring commands, coding agents and workflows on Redis workers."""
    resolved_dir = config.resolve_data_dir(data_dir)
    app = App(redis_url=config.resolve_redis_url(redis_url, resolved_dir), data_dir=resolved_dir, json=json_)
    ctx.obj = app
    ctx.call_on_close(app.close)


cli.add_command(create.create)
for _command in (loops_cmds.list_loops, loops_cmds.show, loops_cmds.pause, loops_cmds.resume, loops_cmds.stop,
                 loops_cmds.remove, workflows_cmds.workflows, mirror_cmd.mirror, run_cmds.run_now, run_cmds.tick,
                 run_cmds.runs, run_cmds.trigger, process_cmds.scheduler, process_cmds.worker,
                 health_cmds.doctor, health_cmds.status, up_cmds.up, up_cmds.install_services, workflow_run_cmds.logs,
                 web_cmd.web):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="loopsq")
