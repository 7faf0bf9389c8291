"""One mirror follower per data dir: ``<data-dir>/mirror.lock``, held with ``flock``, names who holds it."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from loopsq.mirror.follower_lock import FollowerLock, Holder, busy_message, probe


def test_a_second_follower_of_a_data_dir_is_told_who_follows_it_until_the_first_lets_go(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first, second = FollowerLock(data, "loopsq web"), FollowerLock(data, "loopsq mirror")
    assert first.acquire() is None and first.held
    assert (data / "mirror.lock").read_text() == f"{os.getpid()} loopsq web\n"
    assert oct((data / "mirror.lock").stat().st_mode & 0o777) == "0o600"
    holder = second.acquire(wait_s=0.1)
    assert holder == Holder(os.getpid(), "loopsq web") and not second.held
    assert probe(data) == holder
    assert busy_message(data, holder) == (f"another mirror follows {data} (pid {os.getpid()}, loopsq web); "
                                          "stop it or restart it with --no-mirror, or use another --data-dir")
    first.release()
    assert probe(data) is None
    assert second.acquire() is None and second.held
    assert busy_message(data, Holder(7, "loopsq mirror")) == (
        f"another mirror follows {data} (pid 7, loopsq mirror); stop it, or use another --data-dir")
    second.release()


def test_the_follower_lock_waits_out_a_probe_that_holds_it_for_an_instant(tmp_path: Path) -> None:
    lock = FollowerLock(tmp_path, "loopsq mirror")
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    threading.Timer(0.1, os.close, (fd,)).start()
    assert lock.acquire(wait_s=2.0) is None
    lock.release()


def test_a_data_dir_nobody_follows_has_no_holder(tmp_path: Path) -> None:
    assert probe(tmp_path / "never") is None
