"""A worker's fleet flags: ``--concurrency`` (``LOOPSQ_WORKER_CONCURRENCY``) and ``--label``
(``LOOPSQ_WORKER_LABELS``). Bad values stop the worker before it starts, with one line naming the flag (or the
variable) and the value, exit 2; ``up --concurrency`` likewise."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.engine.slots import DEFAULT_CONCURRENCY
from loopsq.ops.fleet_config import worker_concurrency, worker_declared_labels

LABEL_RULE = "[a-z0-9][a-z0-9._:/-]{0,63}"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--concurrency", "0"], {}, "--concurrency must be a whole number from 1 to 1000, got '0'"),
        (["--concurrency", "-1"], {}, "--concurrency must be a whole number from 1 to 1000, got '-1'"),
        (["--concurrency", "four"], {}, "--concurrency must be a whole number from 1 to 1000, got 'four'"),
        (["--concurrency", "1001"], {}, "--concurrency must be a whole number from 1 to 1000, got '1001'"),
        (["--concurrency", "2.5"], {}, "--concurrency must be a whole number from 1 to 1000, got '2.5'"),
        ([], {"LOOPSQ_WORKER_CONCURRENCY": "0"},
         "LOOPSQ_WORKER_CONCURRENCY must be a whole number from 1 to 1000, got '0'"),
        (["--label", "GPU!"], {}, f"--label must be a label ({LABEL_RULE}), got 'GPU!'"),
        (["--label", "gpu", "--label", "-x"], {}, f"--label must be a label ({LABEL_RULE}), got '-x'"),
        ([], {"LOOPSQ_WORKER_LABELS": "gpu, Big Disk"},
         f"LOOPSQ_WORKER_LABELS must be a label ({LABEL_RULE}), got 'Big Disk'"),
    ],
)
def test_bad_fleet_flags_stop_the_worker_before_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          args: list[str], env: dict[str, str], message: str) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://127.0.0.1:9/0")  # never reached
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(cli, ["worker", *args], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {message}\n")
    assert not (tmp_path / "data").exists()


def test_up_refuses_a_bad_concurrency_before_starting_anything(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(cli, ["up", "--concurrency", "0"], catch_exceptions=False)
    assert (result.exit_code, result.stderr) == (
        2, "error: --concurrency must be a whole number from 1 to 1000, got '0'\n")


def test_the_flag_wins_over_the_variable_and_the_default_is_four() -> None:
    assert DEFAULT_CONCURRENCY == 4
    assert worker_concurrency(None, {}) == 4
    assert worker_concurrency(None, {"LOOPSQ_WORKER_CONCURRENCY": " 8 "}) == 8
    assert worker_concurrency("2", {"LOOPSQ_WORKER_CONCURRENCY": "8"}) == 2
    assert worker_declared_labels([], {"LOOPSQ_WORKER_LABELS": "repo:web, gpu,,gpu"}) == ["gpu", "repo:web"]
    assert worker_declared_labels(["gpu"], {"LOOPSQ_WORKER_LABELS": "other"}) == ["gpu"]
