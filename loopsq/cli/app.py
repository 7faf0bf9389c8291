"""The CLI's per-invocation context: configuration, lazily opened Redis and mirror, and output."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import redis

from loopsq.domain import timeutil
from loopsq.domain.text import QUOTE_LIMIT, json_terminal_safe, shown, terminal_safe
from loopsq.errors import RedisNotConfiguredError
from loopsq.mirror.follow import catch_up
from loopsq.mirror.schema import open_db
from loopsq.state import layout
from loopsq.state.clock import RedisClock
from loopsq.state.connection import connect
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system import config


@dataclass
class App:
    """Everything a command needs; Redis and the mirror are opened on first use only."""

    redis_flag: str | None
    data_dir: Path
    json: bool = False
    keys: Keys = field(default_factory=Keys)
    _client: redis.Redis | None = None
    _mirror: sqlite3.Connection | None = None
    _redis: config.RedisSetting | None = None
    _resolved: bool = False

    @property
    def redis_setting(self) -> config.RedisSetting | None:
        """The Redis of this invocation (``config.resolve_redis``), resolved on first use, so that commands which
        need no Redis run whatever it is set to; None when none is configured.

        Raises:
            RedisUrlError: when the configured URL is malformed.
        """
        if not self._resolved:
            self._redis = config.resolve_redis(self.redis_flag, self.data_dir)
            self._resolved = True
        return self._redis

    @property
    def redis_url(self) -> str:
        """The Redis URL of this invocation.

        Raises:
            RedisNotConfiguredError: when none is configured (before anything connects anywhere).
            RedisUrlError: when the configured URL is malformed.
        """
        setting = self.redis_setting
        if setting is None:
            raise RedisNotConfiguredError()
        return setting.url

    def client(self, *, checked: bool = True) -> redis.Redis:
        """The Redis client (connects and pings on first use; RedisUnavailableError when unreachable). On connecting,
        the offset to Redis's clock is measured (``state.clock``), so that the times this command writes (a
        resume's next slot, a trigger's creation) are on Redis's clock as every other process's.

        ``checked``: refuse a state whose layout this release does not know (``state.layout.check``, exit 2);
        only ``migrate`` looks at any state. A command stamps nothing (a refused one writes nothing at all): an
        unstamped state of the current layout reads as such, and the scheduler and workers stamp it at start.
        """
        if self._client is None:
            self._client = connect(self.redis_url)
            if checked:
                layout.check(self._client, self.keys)
            with contextlib.suppress(redis.RedisError):
                RedisClock().measure(self._client)
        return self._client

    def loops(self) -> LoopStore:
        """The loop store on this app's Redis."""
        return LoopStore(self.client(), self.keys)

    def workflows(self) -> WorkflowStore:
        """The workflow spec store on this app's Redis."""
        return WorkflowStore(self.client(), self.keys)

    def mirror(self) -> sqlite3.Connection:
        """The query mirror, caught up with every change acknowledged before this call (read-your-writes)."""
        if self._mirror is None:
            self._mirror = open_db(config.mirror_path(self.data_dir))
        catch_up(self.client(), self.keys, self._mirror)
        return self._mirror

    def now(self) -> datetime:
        """The current time (one clock for the whole command: Redis's, once ``client`` has connected)."""
        return timeutil.now()

    def emit(self, payload: Any, human: str | Callable[[], str] | None = None) -> None:
        """Print ``payload`` as JSON in JSON mode, else the human text (``payload`` as JSON when there is none)."""
        if self.json or human is None:
            click.echo(json_terminal_safe(json.dumps(payload, indent=2, ensure_ascii=False)))
            return
        text = human() if callable(human) else human
        if text:
            # Run output and errors are in there: no escape sequence of theirs reaches the terminal.
            click.echo(terminal_safe(text))

    def close(self) -> None:
        """Release connections."""
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None
        if self._client is not None:
            self._client.close()
            self._client = None


def get_app() -> App:
    """The App of the current click context."""
    ctx = click.get_current_context()
    app = ctx.find_object(App)
    if app is None:  # pragma: no cover - only when a command is invoked outside the root group
        raise click.UsageError("internal: no application context")
    return app


def json_flag(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Let ``--json``/``-j`` follow the subcommand as well as precede it."""

    def _set(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            app = ctx.find_object(App)
            if app is not None:
                app.json = True

    return click.option(
        "-j", "--json", "json_", is_flag=True, expose_value=False, callback=_set, help="Print JSON."
    )(fn)


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped, so an error is always one line."""
    return "".join(ch if ch.isprintable() or ch == "\t" else repr(ch)[1:-1] for ch in text)


#: A quoted value longer than this in an error line (click's usage errors quote whole values) is cut to a prefix.
_QUOTED_RE = re.compile("'([^']{" + str(QUOTE_LIMIT + 40) + ",})'")
#: The longest error line: a message that is still longer is cut, so no value can flood a terminal or a log.
MAX_ERROR_LINE = 1000


def short_error(message: str) -> str:
    """``message`` with every long single-quoted value cut to a short escaped prefix, and at most
    ``MAX_ERROR_LINE`` characters in all (loopsq's own messages quote values that way already)."""
    message = _QUOTED_RE.sub(lambda match: f"'{shown(match.group(1))}'", message)
    return message if len(message) <= MAX_ERROR_LINE else shown(message, MAX_ERROR_LINE)


def echo_err(message: str) -> None:
    """One line on stderr (control characters in quoted user values are escaped, long values cut)."""
    click.echo(one_line(short_error(message)), err=True)
    sys.stderr.flush()
