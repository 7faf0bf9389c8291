"""PATH normalisation (reference 0.3.1): the common bin dirs appended without duplicates, the not-found message,
and the same PATH in the executor, preflight and doctor."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopsq.errors import ExecutionError
from loopsq.executor import RunMetadata, execute_target, preflight_target
from loopsq.ops.doctor import check_tools
from loopsq.system.exec_path import common_executable_dirs, normalize_execution_path, not_found_message

SYSTEM = ["/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]


def home_dirs(home: str) -> list[str]:
    return [f"{home}/.local/bin", f"{home}/.bun/bin", f"{home}/.cargo/bin", f"{home}/.npm-global/bin", f"{home}/bin"]


def test_the_listed_dirs_are_appended_in_the_reference_order() -> None:
    env = {"HOME": "/h", "PATH": "/custom/bin", "BUN_INSTALL": "/bun", "PNPM_HOME": "/pnpm",
           "NPM_CONFIG_PREFIX": "/npm"}
    assert common_executable_dirs(env) == [*home_dirs("/h"), "/bun/bin", "/pnpm", "/npm/bin", *SYSTEM]
    assert normalize_execution_path(env).split(":") == ["/custom/bin", *home_dirs("/h"), "/bun/bin", "/pnpm",
                                                         "/npm/bin", *SYSTEM]


def test_duplicates_and_empty_entries_are_dropped_and_the_inherited_order_kept() -> None:
    env = {"HOME": "/h", "PATH": "/usr/bin::/x: /usr/bin :/h/bin:/x"}
    assert normalize_execution_path(env).split(":") == ["/usr/bin", "/x", "/h/bin", "/h/.local/bin", "/h/.bun/bin",
                                                         "/h/.cargo/bin", "/h/.npm-global/bin", "/opt/homebrew/bin",
                                                         "/usr/local/bin", "/bin", "/usr/sbin", "/sbin"]


def test_normalising_twice_changes_nothing() -> None:
    env = {"HOME": "/h", "PATH": "/a:/b"}
    once = normalize_execution_path(env)
    assert normalize_execution_path({**env, "PATH": once}) == once


def test_the_not_found_message_shows_the_effective_path_or_empty() -> None:
    assert not_found_message("claude", {"PATH": "/a:/b"}) == "Executable not found in PATH: claude. Effective PATH=/a:/b"
    assert not_found_message("claude", {}) == "Executable not found in PATH: claude. Effective PATH=(empty)"


@pytest.fixture
def home_tool(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A ``mytool`` only in ``$HOME/.local/bin``, and an env whose PATH does not list that directory."""
    local_bin = tmp_path / "home" / ".local" / "bin"
    local_bin.mkdir(parents=True)
    tool = local_bin / "mytool"
    tool.write_text("#!/bin/sh\necho found-by-normalised-path\n")
    tool.chmod(0o755)
    return {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}, tool


def test_a_target_finds_an_executable_in_a_home_bin_dir_its_path_lacks(home_tool: tuple[dict[str, str], Path]) -> None:
    env, _tool = home_tool
    result = execute_target({"type": "command", "command": "mytool"}, RunMetadata(), env=env)
    assert (result.status, result.stdout) == ("succeeded", "found-by-normalised-path\n")
    assert preflight_target({"type": "command", "command": "mytool"}, RunMetadata(), env=env) == {"command": "mytool"}
    child = execute_target({"type": "command", "command": "sh", "args": ["-c", "echo $PATH"]}, RunMetadata(), env=env)
    assert child.stdout.strip() == normalize_execution_path(env)


def test_preflight_reports_the_effective_path_when_the_executable_is_missing(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/nonexistent"}
    with pytest.raises(ExecutionError) as info:
        preflight_target({"type": "command", "command": "no-such-tool-x"}, RunMetadata(), env=env)
    assert info.value.message == f"Executable not found in PATH: no-such-tool-x. Effective PATH={normalize_execution_path(env)}"


def test_doctor_looks_for_provider_clis_on_the_same_path(tmp_path: Path) -> None:
    local_bin = tmp_path / ".local" / "bin"
    local_bin.mkdir(parents=True)
    (local_bin / "claude").write_text("#!/bin/sh\n")
    (local_bin / "claude").chmod(0o755)
    checks = {c.id: c for c in check_tools({"HOME": str(tmp_path), "PATH": "/nonexistent"})}
    assert (checks["provider:claude"].status, checks["provider:claude"].detail) == ("ok", str(local_bin / "claude"))
    assert "provider:agent" in checks  # Cursor's CLI as 0.3.60 runs it
