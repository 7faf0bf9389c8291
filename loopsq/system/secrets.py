"""Secrets given by file: the ``*_FILE`` convention of Docker secrets and systemd credentials.

``LOOPSQ_REDIS_URL_FILE`` and ``LOOPSQ_API_TOKEN_FILE`` name a file that holds the value of ``LOOPSQ_REDIS_URL``
and ``LOOPSQ_API_TOKEN``. A process configured this way holds the secret in its memory only: it is in no process's
environment (``/proc/<pid>/environ`` is readable by the same user, and a variable is inherited by every child), and
loopsq passes the file's path on to its own children (``loopsq up``), never the value.

The file is read once, at start: opened without blocking (a FIFO cannot hang the process), only if it is a regular
file (a symlink to one is fine: Kubernetes mounts secrets that way), at most ``MAX_SECRET_BYTES``, as UTF-8; the
value is stripped of surrounding white space (the newline an editor or ``echo`` leaves).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from loopsq.errors import ValidationError

#: The suffix of the variable that names a secret's file.
FILE_SUFFIX = "_FILE"
#: The largest secret file read (a Redis URL or a token is far smaller; anything bigger is not one).
MAX_SECRET_BYTES = 64 * 1024


def secret_from_env(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(value, source)`` of ``name`` in the environment, else of the file ``<name>_FILE`` names; None when
    neither is set (an empty variable counts as unset). ``source`` is ``name`` or ``<name>_FILE``.

    Raises:
        ValidationError: both are set; the file cannot be read, is not a regular file, is empty, is larger than
            ``MAX_SECRET_BYTES`` or is not UTF-8 (the message names the variable and the path, never the value).
    """
    env = os.environ if environ is None else environ
    file_var = name + FILE_SUFFIX
    value, path = env.get(name, "").strip(), env.get(file_var, "").strip()
    if value and path:
        raise ValidationError(f"{name} and {file_var} are both set: set one of them")
    if value:
        return value, name
    if not path:
        return None
    return read_secret_file(file_var, path), file_var


def read_secret_file(file_var: str, path: str) -> str:
    """The stripped text of the secret file ``path`` (named by ``file_var`` in errors).

    Raises:
        ValidationError: as ``secret_from_env`` says.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValidationError(f"{file_var}: cannot read {path!r}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValidationError(f"{file_var}: {path!r} is not a regular file")
        data = b""
        while len(data) <= MAX_SECRET_BYTES and (chunk := os.read(fd, MAX_SECRET_BYTES + 1 - len(data))):
            data += chunk
    except OSError as exc:
        raise ValidationError(f"{file_var}: cannot read {path!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise ValidationError(f"{file_var}: {path!r} is larger than {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValidationError(f"{file_var}: {path!r} is not UTF-8") from None
    if not text:
        raise ValidationError(f"{file_var}: {path!r} is empty")
    return text
