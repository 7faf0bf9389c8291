"""The layers of ARCHITECTURE.md hold: import-linter's contracts in pyproject.toml pass on the tree, and fail on a
copy of it with one upward import or one cycle injected (so the contracts can fail at all)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT, "--no-cache", "--config", str(tree / "pyproject.toml")], cwd=tree,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(tree), "PATH": ""})


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for name in ("loopsq", "worker"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_every_layer_contract_is_kept_on_the_tree(tree_copy: Path) -> None:
    result = _lint(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


def _inject(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def test_an_upward_import_from_state_into_the_engine_breaks_the_layers(tree_copy: Path) -> None:
    _inject(tree_copy, "loopsq.state.keys", "from loopsq.engine import timers as _upward  # noqa")
    result = _lint(tree_copy)
    assert result.returncode == 1
    assert "loopsq.state is not allowed to import loopsq.engine:" in result.stdout
    assert "- loopsq.state.keys -> loopsq.engine.timers" in result.stdout


def test_a_local_import_does_not_hide_a_cycle_between_engine_modules(tree_copy: Path) -> None:
    _inject(tree_copy, "loopsq.engine.runtime",
            "def _hidden() -> None:\n    from loopsq.engine import maintenance  # noqa: F401")
    result = _lint(tree_copy)
    assert result.returncode == 1
    assert "No import cycles between sibling modules or packages BROKEN" in result.stdout


def test_the_domain_may_not_do_io(tree_copy: Path) -> None:
    _inject(tree_copy, "loopsq.domain.models", "import sqlite3  # noqa")
    result = _lint(tree_copy)
    assert result.returncode == 1
    assert "The domain does no I/O BROKEN" in result.stdout


@pytest.mark.parametrize(("module", "line"), [
    ("loopsq.engine.runner", "import rq_scheduler  # noqa"),
    ("loopsq.engine.timers", "from rq.job import Job  # noqa"),
    ("worker.jobs", "from rq import get_current_job  # noqa"),
])
def test_only_the_rq_adapter_imports_rq_and_rq_scheduler(tree_copy: Path, module: str, line: str) -> None:
    _inject(tree_copy, module, line)
    result = _lint(tree_copy)
    assert result.returncode == 1
    assert "Only the RQ adapter (loopsq.engine.rqcompat) imports RQ and rq-scheduler BROKEN" in result.stdout


def test_the_public_entry_points_keep_their_names() -> None:
    import importlib

    from loopsq.sdk import LoopsClient

    assert LoopsClient.__module__ == "loopsq.sdk"
    jobs = importlib.import_module("worker.jobs")
    for name in ("fire", "run_now", "run_triggered", "trigger", "run_workflow"):
        assert callable(getattr(jobs, name)), name
    from loopsq.cli import main

    assert callable(main)
