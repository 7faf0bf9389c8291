"""What a worker publishes it can run: the PATH its targets really get (the common bin dirs appended), so a
provider CLI in ``~/.local/bin`` is seen by ``doctor``, ``create --preflight`` and agent placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopsq.engine.routing import worker_labels
from loopsq.executor.capabilities import CAN, judge, probe


def fake_claude(home: Path) -> Path:
    bin_dir = home / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "claude"
    exe.write_text("#!/bin/sh\necho 'claude 9.9.9'\n")
    exe.chmod(0o755)
    return exe


def test_a_worker_publishes_a_provider_cli_in_home_local_bin_and_gets_its_provider_label(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = fake_claude(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # a service manager's bare PATH, without ~/.local/bin
    can = probe(versions=True)
    assert can["path"].split(":")[:2] == [str(tmp_path / "empty"), str(tmp_path / ".local" / "bin")]
    assert can["tools"]["claude"] == {"path": str(exe), "version": "claude 9.9.9"}
    assert "provider:claude" in worker_labels(can, "box", ())


def test_doctor_judges_an_agent_in_home_local_bin_runnable_on_a_worker_that_published_it(tmp_path: Path) -> None:
    fake_claude(tmp_path)
    can = probe({"HOME": str(tmp_path), "PATH": "/nonexistent"}, versions=False)
    target = {"type": "agent", "provider": "claude", "prompt": "hi"}
    assert judge(target, can, same_host=True).status == CAN
    assert judge(target, can, same_host=False).status == CAN
