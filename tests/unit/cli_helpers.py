"""Running the CLI in-process against fakeredis, with a fixed clock and a private data dir."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from click.testing import CliRunner, Result

from loopsq.cli import cli

NOW = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
#: The URL the in-process CLI is given; nothing connects to it (fakeredis stands in).
FAKE_URL = "redis://fake-redis.invalid:6379/0"


@dataclass
class Cli:
    """``run(*args)`` invokes ``loopsq``; ``redis`` is the fakeredis it writes to."""

    runner: CliRunner
    redis: fakeredis.FakeRedis
    data_dir: Path

    def run(self, *args: str) -> Result:
        return self.runner.invoke(cli, list(args), catch_exceptions=False)

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok("--json", *args))

    def _raw(self) -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=self.redis.connection_pool.connection_kwargs["server"])

    def state(self) -> dict[str, Any]:
        """Every key in Redis with its value, and the mirror's rows: what 'nothing written' compares."""
        out: dict[str, Any] = {}
        for key in sorted(self.redis.keys("*")):
            kind = self.redis.type(key)
            if kind == "string":
                out[key] = self.redis.get(key)
            elif kind == "hash":  # (read as bytes: an RQ job's hash holds its pickled call)
                out[key] = self._raw().hgetall(key)
            elif kind == "set":
                out[key] = sorted(self.redis.smembers(key))
            elif kind == "stream":
                out[key] = [i for i, _ in self.redis.xrange(key)]
            else:
                out[key] = kind
        return out


def make_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    server = fakeredis.FakeServer()

    def fake_connect(url: str, **_kw: Any) -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=server, decode_responses=True)

    monkeypatch.setattr("loopsq.cli.app.connect", fake_connect)
    monkeypatch.setattr("loopsq.domain.timeutil.now", lambda: NOW)
    data_dir = tmp_path / "data"
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(data_dir))
    monkeypatch.setenv("TZ", "UTC")
    # An explicit URL (``connect`` is replaced by fakeredis above): with none, every command refuses.
    monkeypatch.setenv("LOOPSQ_REDIS_URL", FAKE_URL)
    monkeypatch.delenv("REDIS_URL", raising=False)
    return Cli(CliRunner(), fakeredis.FakeRedis(server=server, decode_responses=True), data_dir)
