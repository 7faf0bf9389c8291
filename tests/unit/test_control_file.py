"""Reading and removing a run's control file (``engine.steering.ControlFile``) whatever a target left at its path:
only a regular file is read; a FIFO, a symlink, a directory, a socket or a device is a warning, never a hang and
never an exception; removal never follows a symlink."""

from __future__ import annotations

import os
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loopsq.domain.control import MAX_CONTROL_BYTES
from loopsq.engine import steering
from loopsq.engine.steering import ControlFile


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlFile]:
    """A control file path in a directory of its own, as the worker hands one to a target."""
    yield ControlFile(str(tmp_path / "run-1.json"))


def make_socket(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()  # the socket file stays


NOT_REGULAR: list[tuple[str, Callable[[str, Path], None]]] = [
    ("fifo", lambda path, _tmp: os.mkfifo(path)),
    ("symlink", lambda path, tmp: os.symlink(tmp / "target.json", path)),
    ("directory", lambda path, _tmp: os.mkdir(path)),
    ("socket", lambda path, _tmp: make_socket(path)),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("kind", "make"), NOT_REGULAR, ids=[k for k, _ in NOT_REGULAR])
def test_a_path_that_is_not_a_regular_file_is_a_warning_and_is_removed(
        control: ControlFile, tmp_path: Path, kind: str, make: Callable[[str, Path], None]) -> None:
    (tmp_path / "target.json").write_text('{"outcome": "done"}')  # what a symlink points at: never read
    make(control.path, tmp_path)
    read = control.read()
    assert read.warning == f"control file ignored: not a regular file ({kind})"
    assert read.empty
    control.remove()
    assert not os.path.lexists(control.path)
    assert (tmp_path / "target.json").read_text() == '{"outcome": "done"}'  # removing a symlink spares its target


@pytest.mark.timeout(10)
@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_device_is_never_opened_and_is_a_warning(control: ControlFile) -> None:
    os.mknod(control.path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    assert control.read().warning == "control file ignored: not a regular file (character device)"
    control.remove()
    assert not os.path.lexists(control.path)


@pytest.mark.timeout(10)
def test_a_fifo_with_a_writer_waiting_is_not_read_either(control: ControlFile) -> None:
    os.mkfifo(control.path)
    # A writer blocked in open(O_WRONLY) would meet a reader that opened: we never open, so it stays blocked; a
    # non-blocking writer sees no reader at all.
    with pytest.raises(OSError):
        os.open(control.path, os.O_WRONLY | os.O_NONBLOCK)
    assert control.read().warning == "control file ignored: not a regular file (fifo)"


def test_a_directory_is_removed_with_its_contents_but_not_through_a_symlink_inside_it(
        control: ControlFile, tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    os.mkdir(control.path)
    os.symlink(keep, os.path.join(control.path, "link"))
    (Path(control.path) / "file").write_text("y")
    assert control.read().warning == "control file ignored: not a regular file (directory)"
    control.remove()
    assert not os.path.lexists(control.path)
    assert (keep / "precious").read_text() == "x"
    assert shutil.rmtree.avoids_symlink_attacks


def test_a_symlink_to_a_directory_is_unlinked_and_the_directory_kept(control: ControlFile, tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    os.symlink(keep, control.path)
    assert control.read().warning == "control file ignored: not a regular file (symlink)"
    control.remove()
    assert not os.path.lexists(control.path)
    assert (keep / "precious").read_text() == "x"


def test_a_regular_file_is_read_and_removed(control: ControlFile) -> None:
    Path(control.path).write_text('{"outcome": "no_op", "note": "nothing new"}')
    assert control.read().to_dict() == {"outcome": "no_op", "note": "nothing new"}
    control.remove()
    assert not os.path.lexists(control.path)


def test_no_file_is_no_control_and_removing_nothing_is_fine(control: ControlFile) -> None:
    read = control.read()
    assert read.empty and read.warning is None
    control.remove()


def test_a_file_past_the_bound_is_read_only_up_to_it(control: ControlFile, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(control.path).write_bytes(b" " * (10 * MAX_CONTROL_BYTES))
    asked: list[int] = []
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        asked.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(steering.os, "read", read)
    assert control.read().warning == f"control file ignored: larger than {MAX_CONTROL_BYTES} bytes"
    assert sum(asked) == MAX_CONTROL_BYTES + 1


def test_a_read_that_outlasts_its_time_is_a_warning(control: ControlFile, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(control.path).write_bytes(b"{}" * 20_000)
    clock = iter(range(1000))  # each look at the clock is a second later: the third chunk comes too late
    monkeypatch.setattr(steering, "_clock", lambda: float(next(clock)))
    assert control.read().warning == "control file ignored: not read within 2 s"


def test_binary_garbage_is_a_warning(control: ControlFile) -> None:
    Path(control.path).write_bytes(b"\xff\xfe")
    assert control.read().warning == "control file ignored: not UTF-8"


def test_an_unreadable_file_is_a_warning(control: ControlFile, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(control.path).write_text("{}")

    def refuse(*_args: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(steering.os, "open", refuse)
    assert control.read().warning == "control file ignored: cannot read it (Permission denied)"


def test_a_symlink_made_between_the_look_and_the_open_is_refused(control: ControlFile, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    Path(control.path).write_text("{}")
    (tmp_path / "elsewhere.json").write_text('{"outcome": "done"}')
    real_open = os.open

    def swap_then_open(path: str, flags: int, *args: int) -> int:
        os.unlink(path)
        os.symlink(tmp_path / "elsewhere.json", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(steering.os, "open", swap_then_open)
    assert control.read().warning == "control file ignored: not a regular file (symlink)"


@pytest.mark.timeout(10)
def test_a_fifo_made_between_the_look_and_the_open_is_refused_without_blocking(
        control: ControlFile, monkeypatch: pytest.MonkeyPatch) -> None:
    Path(control.path).write_text("{}")
    real_open = os.open

    def swap_then_open(path: str, flags: int, *args: int) -> int:
        os.unlink(path)
        os.mkfifo(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(steering.os, "open", swap_then_open)
    assert control.read().warning == "control file ignored: not a regular file (fifo)"


def test_the_private_directory_is_made_again_when_a_symlink_took_its_place(tmp_path: Path) -> None:
    first = steering._directory()
    shutil.rmtree(first)
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.symlink(other, first)
    try:
        second = steering._directory()
        assert second != first and stat.S_ISDIR(os.lstat(second).st_mode)
        assert stat.S_IMODE(os.lstat(second).st_mode) == 0o700
    finally:
        os.unlink(first)
