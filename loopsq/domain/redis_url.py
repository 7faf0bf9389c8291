"""Redis URLs: parse and validate one before anything connects, and mask its passwords for every message.

Accepted forms (query options are listed in ``OPTIONS``; anything else is refused by name):

- ``redis://[[user]:password@]host[:port][/db]`` and ``rediss://…`` (TLS); the port defaults to 6379.
- ``unix://[[user]:password@]/path/to/redis.sock[?db=N]``.
- ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service_name[/db]``: the sentinels (port 26379 when
  omitted) are asked for the master of ``service_name``; the userinfo authenticates to the master and replicas,
  ``sentinel_username``/``sentinel_password`` to the sentinels.

Pure: no I/O. ``RedisUrlError`` names the value, always masked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, unquote

from loopsq.errors import ValidationError

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
MASK = "***"
CERT_REQS = ("none", "optional", "required")


class RedisUrlError(ValidationError):
    """Raised when a Redis URL is malformed: the message quotes it (passwords masked) and names its source."""


def _text(value: str) -> str:
    return value


def _nonneg_int(value: str) -> int:
    if not value.isdigit():
        raise ValueError("must be a whole number >= 0")
    return int(value)


def _pos_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    if not number > 0 or number != number or number == float("inf"):
        raise ValueError("must be a number of seconds > 0")
    return number


def _flag(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _cert_reqs(value: str) -> str:
    if value.lower() not in CERT_REQS:
        raise ValueError(f"must be one of {', '.join(CERT_REQS)}")
    return value.lower()


_Parser = Callable[[str], Any]

#: Query options by the schemes that take them. ``socket_*`` options apply to the sentinels too.
COMMON_OPTIONS: dict[str, _Parser] = {
    "db": _nonneg_int,
    "username": _text,
    "password": _text,
    "socket_timeout": _pos_float,
    "socket_connect_timeout": _pos_float,
    "health_check_interval": _nonneg_int,
    "client_name": _text,
}
TLS_OPTIONS: dict[str, _Parser] = {
    "ssl_cert_reqs": _cert_reqs,
    "ssl_ca_certs": _text,
    "ssl_check_hostname": _flag,
    "ssl_certfile": _text,
    "ssl_keyfile": _text,
}
SENTINEL_OPTIONS: dict[str, _Parser] = {
    "sentinel_username": _text,
    "sentinel_password": _text,
    "min_other_sentinels": _nonneg_int,
}
OPTIONS: dict[str, dict[str, _Parser]] = {
    "redis": COMMON_OPTIONS,
    "rediss": {**COMMON_OPTIONS, **TLS_OPTIONS},
    "unix": COMMON_OPTIONS,
    "redis+sentinel": {**COMMON_OPTIONS, **SENTINEL_OPTIONS},
}


@dataclass(frozen=True)
class RedisUrl:
    """A validated Redis URL. ``options`` holds the typed query options (``db`` and credentials excluded)."""

    url: str
    scheme: str
    hosts: tuple[tuple[str, int], ...] = ()
    socket_path: str | None = None
    service_name: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"RedisUrl({self.masked!r})"

    @property
    def masked(self) -> str:
        """The URL with every password shown as ``***``."""
        return mask_url(self.url)

    @property
    def is_sentinel(self) -> bool:
        """Whether the master is found through sentinels."""
        return self.scheme == "redis+sentinel"

    @property
    def is_tls(self) -> bool:
        """Whether the connection to Redis uses TLS."""
        return self.scheme == "rediss"

    def with_option_default(self, name: str, value: Any) -> RedisUrl:
        """This URL with option ``name`` set to ``value`` unless the URL sets it itself."""
        if name in self.options:
            return self
        return replace(self, options={**self.options, name: value})


#: Environment variable giving ``ssl_cert_reqs`` to ``rediss://`` URLs that do not set it themselves (a platform's
#: ``REDIS_URL`` cannot be edited, and its credentials rotate).
CERT_REQS_ENV = "LOOPSQ_REDIS_SSL_CERT_REQS"


def apply_cert_reqs_default(target: RedisUrl, value: str | None) -> RedisUrl:
    """``target`` with ``ssl_cert_reqs`` from ``value`` (the ``LOOPSQ_REDIS_SSL_CERT_REQS`` setting) when it is a
    TLS URL without its own; unchanged otherwise.

    Raises:
        ValidationError: when ``value`` is not none, optional or required.
    """
    if not value:
        return target
    if value.lower() not in CERT_REQS:
        raise ValidationError(f"{CERT_REQS_ENV} must be one of {', '.join(CERT_REQS)}, got '{value}'")
    return target.with_option_default("ssl_cert_reqs", value.lower()) if target.is_tls else target


# -- masking ------------------------------------------------------------------------------------------------------

_QUERY_PARAM = re.compile(r"([?&;]([^=&;#]*)=)([^&;#]*)")
#: Options whose values are shown; every other value (a password, a misspelt option that may hold one) is masked.
_PLAIN_OPTIONS = frozenset(name for opts in OPTIONS.values() for name in opts if not name.endswith("password"))


def _is_secret_param(name: str) -> bool:
    return unquote(name) not in _PLAIN_OPTIONS


def _mask_param(match: re.Match[str]) -> str:
    return match.group(1) + (MASK if _is_secret_param(match.group(2)) else match.group(3))


def mask_url(url: str) -> str:
    """``url`` with every password shown as ``***``: the userinfo's, and the value of every query parameter but the
    known options that hold no secret (so ``password=``, ``sentinel_password=`` and a misspelt ``pasword=``).

    Works on malformed URLs too (a bad port, a stray ``@``): everything up to the last ``@`` after ``://`` is
    userinfo, so an unescaped ``@``, ``/`` or ``?`` in a password can only widen what is masked.
    """
    head, sep, rest = url.partition("://")
    if not sep:
        return _QUERY_PARAM.sub(_mask_param, url)
    at = rest.rfind("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1:]
        user, colon, _password = userinfo.partition(":")
        shown = f"{user}:{MASK}" if colon and not set(user) & set("/?#") else MASK
        rest = f"{shown}@{rest}"
    return f"{head}://{_QUERY_PARAM.sub(_mask_param, rest)}"


def mask_in(text: str, url: str) -> str:
    """``text`` (an error message from a library, say) with ``url`` and its password replaced by masked forms."""
    masked = text.replace(url, mask_url(url)) if url else text
    for secret in _secrets(url):
        if len(secret) >= 3:  # never blank out every "a" of a message for a one-letter password
            masked = masked.replace(secret, MASK)
    return masked


def _secrets(url: str) -> list[str]:
    found: list[str] = []
    _head, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo = rest[: rest.rfind("@")]
        _user, colon, password = userinfo.partition(":")
        value = password if colon else userinfo
        found += [value, unquote(value)]
    params = [m.group(3) for m in _QUERY_PARAM.finditer(url) if _is_secret_param(m.group(2))]
    found += [*params, *(unquote(value) for value in params)]
    return sorted({s for s in found if s}, key=len, reverse=True)


# -- parsing ------------------------------------------------------------------------------------------------------

_SCHEME_LIST = "redis://, rediss://, unix:// or redis+sentinel://"


def parse_redis_url(url: str, source: str | None = None) -> RedisUrl:
    """Validate ``url`` and return its parts; ``source`` (``--redis-url``, ``LOOPSQ_REDIS_URL``…) is named in
    errors.

    Raises:
        RedisUrlError: one line quoting the masked URL and saying what is wrong.
    """

    def fail(reason: str) -> RedisUrlError:
        where = f" (from {source})" if source else ""
        return RedisUrlError(f"invalid Redis URL '{mask_url(url)}'{where}: {reason}")

    if not url.strip():
        raise fail("it is empty")
    if url != url.strip() or any(not ch.isprintable() for ch in url):
        raise fail("it contains spaces or control characters")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise fail(f"not a URL (use {_SCHEME_LIST})")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise fail(f"unknown scheme '{scheme}' (use {_SCHEME_LIST})")
    if "@" in "".join(re.split(r"[?#]", rest, maxsplit=1)[1:]):
        # Most likely a password holding '?' or '#' unescaped: what follows it would be taken for the query (and
        # quoted in a message), so it is refused without quoting any part of it.
        raise fail("an '@' after a '?' or '#': percent-encode '?', '#', '/' and '@' in a password (%3F, %23, %2F, "
                   "%40)")
    rest, _hash, fragment = rest.partition("#")
    if fragment:
        raise fail("a fragment ('#…') is not allowed")
    rest, _q, query = rest.partition("?")
    at = rest.rfind("@")
    userinfo, hostpart = (rest[:at], rest[at + 1:]) if at >= 0 else (None, rest)
    netloc, slash, path = hostpart.partition("/")
    path = slash + path
    username = password = None
    if userinfo is not None:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon and user:
            raise fail("a user without a password (use user:password@ or :password@)")
    try:
        options = _parse_query(query, scheme)
    except ValueError as exc:
        raise fail(str(exc)) from None
    username = options.pop("username", username)
    password = options.pop("password", password)
    db = options.pop("db", None)

    if scheme == "unix":
        if netloc:
            raise fail(f"a unix:// URL takes a socket path, not a host ('{netloc}'): unix:///path/to/redis.sock")
        if not path.strip("/"):
            raise fail("the socket path is empty")
        return RedisUrl(url, scheme, socket_path=unquote(path), db=db or 0, username=username, password=password,
                        options=options)

    sentinel = scheme == "redis+sentinel"
    try:
        hosts = tuple(_parse_host(entry, DEFAULT_SENTINEL_PORT if sentinel else DEFAULT_PORT)
                      for entry in (netloc.split(",") if sentinel else [netloc]))
    except ValueError as exc:
        raise fail(str(exc)) from None
    segments = [unquote(s) for s in path.split("/")[1:]] if path else []
    if segments and segments[-1] == "":
        segments.pop()  # a trailing slash
    service = None
    if sentinel:
        if not segments or not segments[0]:
            raise fail("the service name is missing (redis+sentinel://host:port[,host:port…]/service_name[/db])")
        service, segments = segments[0], segments[1:]
    if len(segments) > 1:
        raise fail(f"unexpected path '{path}' (only /db{' after the service name' if sentinel else ''})")
    if segments:
        if not segments[0].isdigit():
            raise fail(f"the database '{segments[0]}' is not a whole number >= 0")
        if db is None:
            db = int(segments[0])
    return RedisUrl(url, scheme, hosts=hosts, service_name=service, db=db or 0, username=username,
                    password=password, options=options)


def _parse_host(entry: str, default_port: int) -> tuple[str, int]:
    if not entry:
        raise ValueError("the host is empty")
    if entry.startswith("["):
        host, bracket, after = entry[1:].partition("]")
        if not bracket or not host:
            raise ValueError(f"the host '{entry}' is not a valid IPv6 address in brackets")
        if after and not after.startswith(":"):
            raise ValueError(f"unexpected '{after}' after the host '[{host}]'")
        port_text = after[1:] if after else None
    else:
        if entry.count(":") > 1:
            raise ValueError(f"the host '{entry}' has more than one ':' (an IPv6 address goes in brackets)")
        host, colon, port_text_raw = entry.partition(":")
        port_text = port_text_raw if colon else None
        if not host:
            raise ValueError(f"the host is empty in '{entry}'")
    if port_text is None:
        return unquote(host), default_port
    if port_text == "":
        raise ValueError(f"the port is empty in '{entry}'")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"the port '{port_text}' is not a TCP port (1-65535)")
    return unquote(host), int(port_text)


def _parse_query(query: str, scheme: str) -> dict[str, Any]:
    allowed = OPTIONS[scheme]
    options: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"the query '{mask_url('?' + query)[1:]}' is malformed (name=value&…)") from None
    for name, value in pairs:
        if name in options:
            raise ValueError(f"the option '{name}' is given twice")
        parser = allowed.get(name)
        if parser is None:
            elsewhere = [s for s, opts in OPTIONS.items() if name in opts]
            hint = f" (only for {' and '.join(s + '://' for s in elsewhere)})" if elsewhere else ""
            raise ValueError(f"unknown option '{name}'{hint}; known: {', '.join(sorted(allowed))}")
        try:
            options[name] = parser(value)
        except ValueError as exc:
            shown = MASK if name.endswith("password") else value
            raise ValueError(f"the option {name}='{shown}' {exc}") from None
    return options
