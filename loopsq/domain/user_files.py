"""Reading a file a user named (a workflow spec, a prompt file): regular files only, with a bound.

The file is opened with ``O_NONBLOCK`` and checked with ``fstat`` before anything is read, so a FIFO (whose
plain ``open()`` blocks until a writer comes, hanging the CLI), a device (``/dev/zero``, a terminal) or a socket
is refused at once with one error line instead of being waited on or read without end.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(OSError):
    """Raised when a file a user named is not a regular file (a FIFO, a device, a socket)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.kind = kind


def open_regular_file(path: str) -> BinaryIO:
    """``path`` opened for reading in binary, once it is known to be a regular file (the caller closes it).

    Raises:
        IsADirectoryError: ``path`` is a directory.
        NotRegularFileError: ``path`` is a FIFO, a device or a socket (nothing is read from it).
        OSError: it cannot be opened (missing, unreadable).
        ValueError: the path holds a NUL.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(next((kind for test, kind in _KINDS if test(mode)), "not a file"))
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")
