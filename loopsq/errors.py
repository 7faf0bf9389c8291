"""The project's error types: one base class and a few subclasses, each mapped once at a boundary.

The CLI maps them to exit codes (see ``EXIT_CODES``); the HTTP API maps them to statuses. Library code raises only
these, wrapping third-party errors with ``raise ... from exc``. Expected outcomes ("slot already claimed",
"nothing due") are return values, not exceptions.
"""

from __future__ import annotations


class LoopsqError(Exception):
    """Base class of every error loopsq raises on purpose."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ValidationError(LoopsqError):
    """Raised when input (a flag, a spec file, a schedule, a duration, an API body) is invalid.

    The message names the field and quotes the offending value. Nothing has been written when it is raised.
    """

    exit_code = 2


class NotFoundError(LoopsqError):
    """Raised when a loop, workflow or run named by the caller does not exist."""

    exit_code = 1


class ConflictError(LoopsqError):
    """Raised when a write is refused because of the current state (a name already taken, a run not claimable)."""

    exit_code = 2


class RedisUnavailableError(LoopsqError):
    """Raised when Redis cannot be reached; the message shows the URL with any password masked."""

    exit_code = 3


class RedisNotConfiguredError(LoopsqError):
    """Raised when a command needs Redis and none is configured: no ``--redis-url``, no ``LOOPSQ_REDIS_URL`` or
    ``REDIS_URL``, and no ``loopsq up`` running on the data dir. Nothing has connected anywhere."""

    exit_code = 3
    MESSAGE = "no Redis configured: start 'loopsq up' or set LOOPSQ_REDIS_URL"

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)


class ExecutionError(LoopsqError):
    """Raised when a target cannot be prepared or started (account resolution, preflight)."""

    exit_code = 1
