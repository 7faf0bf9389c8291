"""Where loopsq finds Redis and its data directory: flags, environment, a running ``loopsq up``.

There is no default Redis: with nothing configured a command refuses (``RedisNotConfiguredError``) rather than
guess ``127.0.0.1:6379``, which may well be somebody else's. Every URL is validated before anything connects.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from loopsq.domain.namespaces import DEFAULT_NAMESPACE, check_namespace
from loopsq.domain.redis_url import CERT_REQS_ENV, RedisUrl, apply_cert_reqs_default, parse_redis_url
from loopsq.errors import RedisNotConfiguredError
from loopsq.system.secrets import secret_from_env

MIRROR_FILENAME = "loops.db"
#: Written by ``loopsq up`` (mode 0600) while its embedded Redis runs: the URL, password included.
REDIS_URL_FILENAME = "redis.url"
#: Held (``flock``) by a running ``loopsq up`` for as long as it runs; holds its pid.
UP_LOCK_FILENAME = "up.lock"
#: Held (``flock``) by the one process that follows the change stream into the data dir's mirror; holds its pid.
MIRROR_LOCK_FILENAME = "mirror.lock"


#: The environment variable that names a deployment's namespace (``--namespace`` sets it for the process and its
#: children: ``up``'s, an installed service's, an RQ job's runtime).
NAMESPACE_ENV = "LOOPSQ_NAMESPACE"


def configured_namespace(flag: str | None = None) -> str:
    """``--namespace``, else ``LOOPSQ_NAMESPACE`` (empty counts as unset), else ``loopsq``, validated.

    Raises:
        ValidationError: naming ``--namespace`` or ``LOOPSQ_NAMESPACE`` and the value when it may not be one
            (``domain.namespaces.check_namespace``).
    """
    if flag is not None:
        return check_namespace(flag, "--namespace")
    value = os.environ.get(NAMESPACE_ENV)
    return check_namespace(value, NAMESPACE_ENV) if value else DEFAULT_NAMESPACE


#: Where a Redis URL can come from, in order; the first one set wins. ``LOOPSQ_REDIS_URL_FILE`` (a file holding
#: the URL: Docker secrets, systemd credentials) stands for ``LOOPSQ_REDIS_URL`` (``system.secrets``).


@dataclass(frozen=True)
class RedisSetting:
    """A validated Redis URL and where it came from (``--redis-url``, an environment variable, a running ``up``)."""

    target: RedisUrl
    source: str

    @property
    def url(self) -> str:
        """The URL as given (password included: pass it on, never print it; ``masked`` is for messages)."""
        return self.target.url

    @property
    def masked(self) -> str:
        """The URL with its passwords masked."""
        return self.target.masked


def configured_redis(flag: str | None = None) -> RedisSetting | None:
    """``--redis-url``, else ``LOOPSQ_REDIS_URL`` (or the file ``LOOPSQ_REDIS_URL_FILE`` names), else
    ``REDIS_URL``, validated; None when none is set.

    An empty environment variable counts as unset (an empty ``--redis-url`` is an error).

    Raises:
        RedisUrlError: when the URL that wins is malformed (it names its source; the password is masked).
        ValidationError: when ``LOOPSQ_REDIS_SSL_CERT_REQS`` is not none, optional or required; when
            ``LOOPSQ_REDIS_URL_FILE`` cannot be read, or is set beside ``LOOPSQ_REDIS_URL``.
    """
    if flag is not None:
        return _setting(flag, "--redis-url")
    found = secret_from_env("LOOPSQ_REDIS_URL")
    if found is not None:
        return _setting(*found)
    value = os.environ.get("REDIS_URL")
    return _setting(value, "REDIS_URL") if value else None


def configured_redis_url(flag: str | None = None) -> str | None:
    """The URL of ``configured_redis(flag)``; None when none is set."""
    setting = configured_redis(flag)
    return setting.url if setting else None


def resolve_redis(flag: str | None = None, data_dir: Path | None = None) -> RedisSetting | None:
    """The Redis a command uses: ``configured_redis(flag)``, else the embedded Redis of a ``loopsq up`` running on
    ``data_dir`` (``<data-dir>/redis.url``; ``data_dir`` defaults to ``resolve_data_dir()``), else None."""
    configured = configured_redis(flag)
    if configured is not None:
        return configured
    where = data_dir if data_dir is not None else resolve_data_dir()
    embedded = embedded_redis_url(where)
    return _setting(embedded, str(where / REDIS_URL_FILENAME)) if embedded else None


def resolve_redis_url(flag: str | None = None, data_dir: Path | None = None) -> str:
    """The URL of ``resolve_redis``.

    Raises:
        RedisNotConfiguredError: when nothing is configured and no ``loopsq up`` runs on the data dir.
    """
    setting = resolve_redis(flag, data_dir)
    if setting is None:
        raise RedisNotConfiguredError()
    return setting.url


def _setting(url: str, source: str) -> RedisSetting:
    target = apply_cert_reqs_default(parse_redis_url(url, source), os.environ.get(CERT_REQS_ENV))
    return RedisSetting(target, source)


def embedded_redis_url(data_dir: Path) -> str | None:
    """The URL in ``<data-dir>/redis.url`` while a ``loopsq up`` runs there; None otherwise.

    A file left behind by an ``up`` that was killed is ignored: the URL counts only while ``up.lock`` is held.
    """
    try:
        url = (data_dir / REDIS_URL_FILENAME).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not url or not up_is_running(data_dir):
        return None
    return url


def up_is_running(data_dir: Path) -> bool:
    """Whether a ``loopsq up`` holds the lock of ``data_dir`` (a shared, non-blocking probe of ``up.lock``)."""
    try:
        fd = os.open(data_dir / UP_LOCK_FILENAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def resolve_data_dir(flag: str | None = None) -> Path:
    """``--data-dir``, else ``LOOPSQ_DATA_DIR``, else ``~/.loopsq``. Not created here."""
    value = flag or os.environ.get("LOOPSQ_DATA_DIR") or "~/.loopsq"
    return Path(value).expanduser().absolute()


def mirror_path(data_dir: Path) -> Path:
    """The SQLite query mirror inside ``data_dir``."""
    return data_dir / MIRROR_FILENAME
