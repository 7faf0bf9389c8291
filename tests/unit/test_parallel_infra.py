"""The suite's own parallel machinery (tests/conftest.py, tests/redis_server.py): pytest-xdist workers get disjoint
port slices, no port is handed out twice, and the scheduler's groups name files that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import conftest, redis_server

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_each_xdist_worker_gets_a_slice_of_its_own_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch,
                                                                               count: int) -> None:
    slices = []
    for index in range(count):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
        slices.append(set(redis_server.port_slice()))
    assert sum(len(s) for s in slices) == len(set().union(*slices))  # disjoint
    assert all(len(s) >= 2000 and redis_server.PORT_RANGE[0] <= min(s) and max(s) < 32768 for s in slices)
    assert not any(6379 in s for s in slices)


def test_a_serial_run_uses_the_whole_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert redis_server.port_slice() == range(*redis_server.PORT_RANGE)


def test_free_port_never_hands_out_a_port_twice_and_keeps_to_its_slice() -> None:
    ports = [redis_server.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(port in redis_server.port_slice() for port in ports)


@pytest.mark.skipif(not conftest.HAS_XDIST, reason="pytest-xdist is not installed")
def test_files_run_together_exist_and_share_one_scope() -> None:
    for name, files in conftest.TOGETHER.items():
        for path in files:
            assert (ROOT / path).is_file(), f"{path} in TOGETHER[{name!r}] does not exist"
            assert conftest.FileScheduling._split_scope(None, f"{path}::test_x[1]") == name  # type: ignore[arg-type]
    assert conftest.FileScheduling._split_scope(None, "tests/unit/test_cron.py::test_x") == "tests/unit/test_cron.py"  # type: ignore[arg-type]
