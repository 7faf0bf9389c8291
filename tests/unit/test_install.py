"""``loopsq install systemd|launchd``: the files it writes, their quoting and modes, what it prints, ``--enable``."""

from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from loopsq.cli import cli
from loopsq.ops import install

UNITS = ("loopsq-scheduler.service", "loopsq-worker.service", "loopsq-web.service")
PLISTS = ("com.loopsq.scheduler.plist", "com.loopsq.worker.plist", "com.loopsq.web.plist")


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("LOOPSQ_REDIS_URL", "REDIS_URL", "LOOPSQ_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")


def service_path(tmp_path: Path) -> str:
    """The PATH the service files carry: the installing shell's, with the common bin dirs appended (0.3.1)."""
    home = tmp_path / "home"
    return (f"/usr/local/bin:/usr/bin:/bin:{home}/.local/bin:{home}/.bun/bin:{home}/.cargo/bin:{home}/.npm-global/bin:"
            f"{home}/bin:/opt/homebrew/bin:/usr/sbin:/sbin")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def fake_tool(bin_dir: Path, name: str, status: int) -> Path:
    """A stand-in for systemctl/launchctl that appends its argv to ``<name>.calls`` and exits ``status``."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\necho "$@" >> "{bin_dir}/{name}.calls"\necho "{name} says hi"\nexit {status}\n')
    script.chmod(0o755)
    return script


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_install_systemd_writes_three_private_units_and_prints_how_to_enable_them(tmp_path: Path) -> None:
    out = tmp_path / "units"
    result = run("--redis-url", "redis://:s3cret@db.example:6379/0", "--data-dir", str(tmp_path / "data"),
                 "install", "systemd", "--dir", str(out))
    assert result.exit_code == 0, result.stderr
    paths = [out / name for name in UNITS]
    assert result.stdout == "".join(f"wrote {p}\n" for p in paths) + (
        f"web API token: in {tmp_path / 'data' / 'api.token'}\n"
        "systemctl --user daemon-reload\n"
        f"systemctl --user enable --now {paths[0]} {paths[1]} {paths[2]}\n"
        "loginctl enable-linger $USER\n"
    )
    assert [mode(p) for p in paths] == [0o600, 0o600, 0o600]
    assert paths[0].read_text() == (
        "# Written by `loopsq install systemd`.\n"
        "[Unit]\n"
        "Description=loopsq scheduler\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={sys.executable} -m loopsq scheduler\n"
        "Restart=always\n"
        "RestartSec=5\n"
        "KillMode=mixed\n"
        "TimeoutStopSec=30\n"
        f"Environment=PATH={service_path(tmp_path)}\n"
        "Environment=LOOPSQ_REDIS_URL=redis://:s3cret@db.example:6379/0\n"
        f"Environment=LOOPSQ_DATA_DIR={tmp_path / 'data'}\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def test_the_web_unit_carries_the_api_token_that_up_keeps_in_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = run("--data-dir", str(data), "install", "systemd", "--dir", str(tmp_path / "u"))
    assert result.exit_code == 0, result.stderr
    token = (data / "api.token").read_text().strip()
    assert len(token) >= 32
    assert stat.S_IMODE((data / "api.token").stat().st_mode) == 0o600
    assert f"Environment=LOOPSQ_API_TOKEN={token}\n" in (tmp_path / "u" / "loopsq-web.service").read_text()
    assert "LOOPSQ_API_TOKEN" not in (tmp_path / "u" / "loopsq-worker.service").read_text()
    again = run("--data-dir", str(data), "install", "systemd", "--dir", str(tmp_path / "u"))
    assert again.exit_code == 0, again.stderr
    assert f"Environment=LOOPSQ_API_TOKEN={token}\n" in (tmp_path / "u" / "loopsq-web.service").read_text()


def test_a_token_in_the_environment_is_the_one_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "from-the-environment-0123456789")
    result = run("--data-dir", str(tmp_path / "data"), "install", "systemd", "--dir", str(tmp_path / "u"))
    assert result.exit_code == 0, result.stderr
    assert "web API token: LOOPSQ_API_TOKEN from the environment\n" in result.stdout
    unit = (tmp_path / "u" / "loopsq-web.service").read_text()
    assert "Environment=LOOPSQ_API_TOKEN=from-the-environment-0123456789\n" in unit
    assert not (tmp_path / "data" / "api.token").exists()


def test_units_in_the_default_directory_are_enabled_by_name() -> None:
    result = run("--redis-url", "redis://127.0.0.1:6379/0", "install", "systemd")
    assert result.exit_code == 0, result.stderr
    unit_dir = Path(os.environ["HOME"]) / ".config/systemd/user"
    assert sorted(p.name for p in unit_dir.iterdir()) == sorted(UNITS)
    assert result.stdout.splitlines()[3:] == [
        f"web API token: in {Path(os.environ['HOME']) / '.loopsq' / 'api.token'}",
        "systemctl --user daemon-reload",
        "systemctl --user enable --now loopsq-scheduler.service loopsq-worker.service loopsq-web.service",
        "loginctl enable-linger $USER",
    ]


def test_without_a_configured_redis_the_output_warns_and_no_url_is_written(tmp_path: Path) -> None:
    result = run("install", "systemd", "--dir", str(tmp_path / "u"))
    assert result.exit_code == 0, result.stderr
    assert ("warning: no Redis URL configured: the services will use redis://127.0.0.1:6379/0 (pass --redis-url "
            "or set LOOPSQ_REDIS_URL, then install again)") in result.stdout.splitlines()
    text = (tmp_path / "u" / UNITS[1]).read_text()
    assert "LOOPSQ_REDIS_URL" not in text
    assert "LOOPSQ_DATA_DIR" not in text


def test_exec_start_quotes_words_with_spaces_percents_dollars_and_quotes_as_systemd_unquotes_them() -> None:
    argv = ["/opt/my tools/python3", "-m", "loopsq", "worker", "100%", "$HOME", 'say "hi"', "a\\b"]
    unit = install.systemd_unit("worker", argv, {"LOOPSQ_REDIS_URL": "redis://:p%40ss word@h:1/0"})
    assert 'ExecStart="/opt/my tools/python3" -m loopsq worker 100%% $$HOME "say \\"hi\\"" "a\\\\b"\n' in unit
    assert 'Environment="LOOPSQ_REDIS_URL=redis://:p%%40ss word@h:1/0"\n' in unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_a_unit_whose_interpreter_path_has_a_space(tmp_path: Path) -> None:
    spaced = tmp_path / "my tools" / "python3"
    spaced.parent.mkdir()
    spaced.symlink_to(sys.executable)
    units = tmp_path / "units"
    done = install.write_services("systemd", units, {"PATH": "/usr/bin:/bin", "LOOPSQ_REDIS_URL": "redis://:a b@h/0"},
                                  tmp_path / "logs", python=str(spaced), default_location=False)
    checked = subprocess.run(["systemd-analyze", "verify", *map(str, done.files)], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert f'ExecStart="{spaced}" -m loopsq worker\n' in (units / UNITS[1]).read_text()


def test_install_launchd_writes_private_plists_that_keep_each_service_alive(tmp_path: Path) -> None:
    out = tmp_path / "agents"
    data = tmp_path / "data"
    result = run("--redis-url", "redis://:s3cret@db.example:6379/0", "--data-dir", str(data),
                 "install", "launchd", "--dir", str(out))
    assert result.exit_code == 0, result.stderr
    paths = [out / name for name in PLISTS]
    assert result.stdout == "".join(f"wrote {p}\n" for p in paths) + f"web API token: in {data / 'api.token'}\n" + "".join(
        f"launchctl load -w {p}\n" for p in paths
    )
    assert [mode(p) for p in paths] == [0o600, 0o600, 0o600]
    assert plistlib.loads(paths[1].read_bytes()) == {
        "Label": "com.loopsq.worker",
        "ProgramArguments": [sys.executable, "-m", "loopsq", "worker"],
        "EnvironmentVariables": {
            "PATH": service_path(tmp_path),
            "LOOPSQ_REDIS_URL": "redis://:s3cret@db.example:6379/0",
            "LOOPSQ_DATA_DIR": str(data),
        },
        "RunAtLoad": True,
        "KeepAlive": True,
        "StandardOutPath": str(data / "logs" / "worker.log"),
        "StandardErrorPath": str(data / "logs" / "worker.log"),
    }
    assert (data / "logs").is_dir()


def test_enable_runs_the_systemctl_commands_and_prints_each_as_ok(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "systemctl", 0)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    out = tmp_path / "u"
    result = run("--redis-url", "redis://h:6379/0", "install", "systemd", "--dir", str(out), "--enable")
    assert result.exit_code == 0, result.stderr
    units = " ".join(str(out / u) for u in UNITS)
    assert result.stdout.splitlines()[-2:] == [
        "systemctl --user daemon-reload -> ok",
        f"systemctl --user enable --now {units} -> ok",
    ]
    assert (bin_dir / "systemctl.calls").read_text() == f"--user daemon-reload\n--user enable --now {units}\n"


def test_a_failing_enable_command_prints_its_exit_status_and_the_command_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "launchctl", 5)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    out = tmp_path / "a"
    result = run("--redis-url", "redis://h:6379/0", "install", "launchd", "--dir", str(out), "--enable")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-3:] == [f"launchctl load -w {out / p} -> exit 5" for p in PLISTS]
    assert result.stderr == f"error: 3 of 3 enable commands failed: launchctl load -w {out / PLISTS[0]} -> exit 5\n"


def test_enable_reports_a_missing_program_as_exit_127(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = run("--redis-url", "redis://h:6379/0", "install", "systemd", "--dir", str(tmp_path / "u"), "--enable")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-2] == "systemctl --user daemon-reload -> exit 127"


def test_json_output_lists_the_files_the_commands_and_the_enable_results(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    bin_dir = tmp_path / "bin"
    fake_tool(bin_dir, "systemctl", 0)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    out = tmp_path / "u"
    result = run("--redis-url", "redis://h:6379/0", "install", "systemd", "--dir", str(out), "--enable", "--json")
    assert result.exit_code == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["files"] == [str(out / u) for u in UNITS]
    assert payload["commands"][0] == "systemctl --user daemon-reload"
    assert payload["enabled"][0] == {"command": ["systemctl", "--user", "daemon-reload"], "status": 0,
                                     "stdout": "systemctl says hi\n", "stderr": ""}


def test_an_unknown_install_target_is_refused_with_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run("install", "upstart", "--dir", str(tmp_path / "u"))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "error: install target must be systemd or launchd, got 'upstart'\n"
    assert not (tmp_path / "u").exists()
