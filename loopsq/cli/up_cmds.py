"""``loopsq up`` (everything on one machine, supervised) and ``loopsq install`` (systemd or launchd services)."""

from __future__ import annotations

import os
import shlex
import signal
import threading
from pathlib import Path

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.options import duration_flag, positive_int_flag
from loopsq.domain.namespaces import DEFAULT_NAMESPACE
from loopsq.engine.slots import DEFAULT_CONCURRENCY
from loopsq.errors import LoopsqError, RedisNotConfiguredError, ValidationError
from loopsq.mirror.identity import configured_name
from loopsq.ops import install
from loopsq.ops.fleet_config import worker_concurrency
from loopsq.ops.up import API_TOKEN_ENV, UpConfig, api_token_setting, run_up
from loopsq.system import config, limits, tracing
from loopsq.system.config import NAMESPACE_ENV
from loopsq.system.exec_path import normalize_execution_path
from loopsq.system.secrets import secret_from_env
from loopsq.system.signals import SignalPipe


def _root_param(name: str) -> str | None:
    value = click.get_current_context().find_root().params.get(name)
    return str(value) if value else None


@click.command("up")
@click.option("--workers", default="1", show_default=True, metavar="N",
              help="How many worker processes to run (one holds several runs: --concurrency).")
@click.option("--concurrency", default=str(DEFAULT_CONCURRENCY), show_default=True, metavar="N",
              help="How many runs each worker holds at once.")
@click.option("--demo", is_flag=True,
              help="Create demo-hello (every 10s), demo-workflow and demo-workflow-loop (every 30s) and "
                   "demo-steering (a fake agent: no_op twice, each asking for its next run in 5s, then done, which "
                   "stops its loop) if absent.")
@click.option("--stop-timeout", default="10s", show_default=True, metavar="DURATION",
              help="On stop, how long each process has after SIGTERM before SIGKILL.")
@click.option("--web-port", default="8080", show_default=True, metavar="PORT", help="The web app's port (loopback).")
@click.option("--no-web", is_flag=True, help="Do not run the web app.")
def up(workers: str, concurrency: str, demo: bool, stop_timeout: str, web_port: str, no_web: bool) -> None:
    """Run everything on this machine: Redis, a scheduler, workers, a mirror and the web app, restarted if they crash.

    With no Redis configured (--redis-url, LOOPSQ_REDIS_URL, REDIS_URL), an embedded redis-server keeps its
    data in <data-dir>/redis (AOF) and its URL in <data-dir>/redis.url, where other loopsq commands find it.
    Ctrl-C or SIGTERM stops everything.
    """
    count = positive_int_flag("--workers", workers)
    slots = worker_concurrency(concurrency, {})  # (up's flag has a default: the variable is not read)
    grace_ms = duration_flag("--stop-timeout", stop_timeout)
    port = positive_int_flag("--web-port", web_port)
    if port > 65535:
        raise ValidationError(f"--web-port must be a TCP port (1-65535), got '{web_port}'")
    app = get_app()
    configured_name()  # what the mirror would refuse (a malformed LOOPSQ_MIRROR_NAME)
    limits.keep_runs(), limits.keep_workflow_runs(), limits.mirror_idle_ms()  # what the scheduler would refuse
    tracing.wanted()  # a bad LOOPSQ_TRACING, which the worker and the scheduler would refuse
    root = click.get_current_context().find_root().command
    has_web = isinstance(root, click.Group) and "web" in root.commands
    if has_web and not no_web:
        # What the web app would refuse: say so now, not in a restart loop.
        from loopsq.cli.web_cmd import resolve_token
        from loopsq.mcp.server import allowed_tools_from_env
        from loopsq.web.metrics import per_loop_from_env

        per_loop_from_env()
        allowed_tools_from_env()
        if secret_from_env(API_TOKEN_ENV) is not None:
            resolve_token(False)
    configured = config.configured_redis(app.redis_flag)
    cfg = UpConfig(
        data_dir=app.data_dir,
        redis_url=configured.url if configured is not None else None,
        redis_url_file=os.environ["LOOPSQ_REDIS_URL_FILE"].strip()
        if configured is not None and configured.source == "LOOPSQ_REDIS_URL_FILE" else None,
        workers=count,
        concurrency=slots,
        demo=demo,
        web=has_web and not no_web,
        web_port=port,
        stop_grace_s=(grace_ms or 0) / 1000.0,
    )
    stop, force = threading.Event(), threading.Event()

    def _on_signal(_signum: int) -> None:
        (force if stop.is_set() else stop).set()

    # (acted on by a thread of its own: the handler itself takes no lock, not even an Event's)
    SignalPipe(_on_signal).install(
        sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        # under nohup: keep running when the terminal goes
        if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN))
    run_up(cfg, stop, force)


@click.command("install")
@click.argument("target", metavar="systemd|launchd")
@click.option("--enable", is_flag=True, help="Also run the commands that enable and start the services.")
@click.option("--dir", "directory", metavar="DIR",
              help="Write the files here [~/.config/systemd/user or ~/Library/LaunchAgents].")
@json_flag
def install_services(target: str, enable: bool, directory: str | None) -> None:
    """Write service files for the scheduler, a worker and the web app, and print how to enable them."""
    install.validate_target(target)
    app = get_app()
    # The services' Redis, validated before anything is written: a configured URL, else that of the `loopsq up`
    # running on the data dir (the services then find it as every command does, while it runs), else a refusal.
    setting = app.redis_setting
    if setting is None:
        raise RedisNotConfiguredError()
    configured = config.configured_redis(app.redis_flag)
    env = {"PATH": normalize_execution_path(os.environ)}  # the PATH every target runs with (0.3.1)
    if configured is not None:
        env["LOOPSQ_REDIS_URL"] = configured.url
    if configured is None or _root_param("data_dir") or os.environ.get("LOOPSQ_DATA_DIR"):
        env["LOOPSQ_DATA_DIR"] = str(app.data_dir)
    if app.keys.namespace != DEFAULT_NAMESPACE:  # each service works in this deployment's namespace
        env[NAMESPACE_ENV] = app.keys.namespace
    default = install.default_dir(target)
    where = Path(directory).expanduser().absolute() if directory else default
    app.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    token, token_file = api_token_setting(app.data_dir)
    token_from_env = token_file is None
    web_env = {"web": {API_TOKEN_ENV: token}}
    done = install.write_services(target, where, env, app.data_dir / "logs", default_location=where == default,
                                  service_env=web_env, data_dir=app.data_dir)
    warnings = [] if configured is not None else [
        f"no Redis URL configured: the services will use the Redis of the loopsq up running on {app.data_dir}, "
        "and refuse to start while it does not run (pass --redis-url or set LOOPSQ_REDIS_URL, then install again)"
    ]
    results = install.run_commands(done.commands) if enable else []
    payload = {
        "target": target,
        "files": [str(p) for p in done.files],
        "commands": [*(shlex.join(c) for c in done.commands), *done.notes],
        "warnings": warnings,
        "tokenFile": token_file,
        "enabled": [{"command": r.command, "status": r.status, "stdout": r.stdout, "stderr": r.stderr}
                    for r in results],
    }
    token_note = (f"web API token: {API_TOKEN_ENV} from the environment" if token_from_env
                  else f"web API token: in {token_file}")
    lines = [f"wrote {p}" for p in done.files] + [token_note]
    lines += [f"warning: {w}" for w in warnings]
    lines += [shlex.join(c) for c in done.commands] + done.notes
    lines += [r.line for r in results]
    app.emit(payload, "\n".join(lines))
    failed = [r for r in results if r.status != 0]
    if failed:
        raise LoopsqError(f"{len(failed)} of {len(results)} enable commands failed: {failed[0].line}")
