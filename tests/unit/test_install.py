"""``loopsq install systemd|launchd``: the files it writes, their quoting and modes, what it prints, ``--enable``."""

from __future__ import annotations

import fcntl
import os
import plistlib
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from loopsq.cli import cli
from loopsq.ops import install
from tests.tools import needs_tool

#: An explicit URL: install never connects, and no command falls back to a default Redis.
URL = "redis://redis.example:6379/0"
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
    data = tmp_path / "data"
    result = run("--redis-url", "redis://:s3cret@db.example:6379/0", "--data-dir", str(data),
                 "install", "systemd", "--dir", str(out))
    assert result.exit_code == 0, result.stderr
    paths = [out / name for name in UNITS]
    secret_files = [out / f"loopsq-{name}.redis-url" for name in ("scheduler", "worker", "web")]
    token_file = out / "loopsq-web.api-token"
    assert result.stdout == "".join(f"wrote {p}\nwrote {e}\n" for p, e in zip(paths, secret_files, strict=True)) + (
        f"wrote {token_file}\n"
        f"web API token: in {data / 'api.token'}\n"
        "systemctl --user daemon-reload\n"
        f"systemctl --user enable --now {paths[0]} {paths[1]} {paths[2]}\n"
        "loginctl enable-linger $USER\n"
    )
    assert [mode(p) for p in (*paths, *secret_files, token_file)] == [0o600] * 7
    assert mode(out) == 0o700
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
        # A credential: the service reads its own copy, through the file variable (no secret in any environment).
        f"LoadCredential=redis-url:{secret_files[0]}\n"
        "Environment=LOOPSQ_REDIS_URL_FILE=%d/redis-url\n"
        f"Environment=PATH={service_path(tmp_path)}\n"
        f"Environment=LOOPSQ_DATA_DIR={data}\n"
        + "".join(f"{line}\n" for line in install.SANDBOX_HARDENING)
        + f"ReadWritePaths={data}\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )
    assert secret_files[0].read_text() == "redis://:s3cret@db.example:6379/0\n"
    worker = paths[1].read_text()
    assert "Environment=LOOPSQ_KILL_TIMEOUT=30s\n" in worker  # its grace ends before systemd's SIGKILL
    assert "".join(f"{line}\n" for line in install.WORKER_HARDENING) in worker
    assert "ProtectHome" not in worker and "NoNewPrivileges" not in worker
    for unit in paths:
        assert "s3cret" not in unit.read_text()


def test_a_namespace_is_passed_to_every_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_NAMESPACE", "")  # restored after the test: the flag sets it in this process
    out = tmp_path / "units"
    result = run("--namespace", "team-a", "--redis-url", URL, "install", "systemd", "--dir", str(out))
    assert result.exit_code == 0, result.stderr
    for name in UNITS:
        assert "Environment=LOOPSQ_NAMESPACE=team-a\n" in (out / name).read_text(), name


def test_the_web_credential_is_the_api_token_that_up_keeps_in_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = run("--redis-url", URL, "--data-dir", str(data), "install", "systemd", "--dir", str(tmp_path / "u"))
    assert result.exit_code == 0, result.stderr
    token = (data / "api.token").read_text().strip()
    assert len(token) >= 32
    assert stat.S_IMODE((data / "api.token").stat().st_mode) == 0o600
    web_token = tmp_path / "u" / "loopsq-web.api-token"
    assert web_token.read_text() == f"{token}\n"
    web_unit = (tmp_path / "u" / "loopsq-web.service").read_text()
    assert token not in web_unit
    assert f"LoadCredential=api-token:{web_token}\nEnvironment=LOOPSQ_API_TOKEN_FILE=%d/api-token\n" in web_unit
    assert not (tmp_path / "u" / "loopsq-worker.api-token").exists()  # the worker's secret is the URL only
    assert "LOOPSQ_API_TOKEN" not in (tmp_path / "u" / "loopsq-worker.service").read_text()
    again = run("--redis-url", URL, "--data-dir", str(data), "install", "systemd", "--dir", str(tmp_path / "u"))
    assert again.exit_code == 0, again.stderr
    assert web_token.read_text() == f"{token}\n"


def test_a_token_in_the_environment_is_the_one_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "from-the-environment-0123456789")
    result = run("--redis-url", URL, "--data-dir", str(tmp_path / "data"), "install", "systemd", "--dir",
                 str(tmp_path / "u"))
    assert result.exit_code == 0, result.stderr
    assert "web API token: LOOPSQ_API_TOKEN from the environment\n" in result.stdout
    assert (tmp_path / "u" / "loopsq-web.api-token").read_text() == "from-the-environment-0123456789\n"
    assert not (tmp_path / "data" / "api.token").exists()


def test_units_in_the_default_directory_are_enabled_by_name() -> None:
    result = run("--redis-url", URL, "install", "systemd")
    assert result.exit_code == 0, result.stderr
    unit_dir = Path(os.environ["HOME"]) / ".config/systemd/user"
    secret_files = ("loopsq-scheduler.redis-url", "loopsq-worker.redis-url", "loopsq-web.redis-url",
                    "loopsq-web.api-token")
    assert sorted(p.name for p in unit_dir.iterdir()) == sorted((*UNITS, *secret_files))
    assert mode(unit_dir) == 0o700
    assert result.stdout.splitlines()[7:] == [
        f"web API token: in {Path(os.environ['HOME']) / '.loopsq' / 'api.token'}",
        "systemctl --user daemon-reload",
        "systemctl --user enable --now loopsq-scheduler.service loopsq-worker.service loopsq-web.service",
        "loginctl enable-linger $USER",
    ]


def test_a_secret_file_reads_back_exactly_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopsq.system.secrets import secret_from_env

    value = 'redis://:p$a`s"s\\w\'o rd%@h:1/0'
    path = tmp_path / "x.redis-url"
    path.write_text(install.secret_text("LOOPSQ_REDIS_URL", value))
    assert secret_from_env("LOOPSQ_REDIS_URL", {"LOOPSQ_REDIS_URL_FILE": str(path)}) == (value,
                                                                                       "LOOPSQ_REDIS_URL_FILE")


def test_a_secret_with_a_line_break_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    result = run("--redis-url", "redis://:a\nb@h:1/0", "install", "systemd", "--dir", str(tmp_path / "u"))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == ("error: invalid Redis URL 'redis://:***@h:1/0' (from --redis-url): it contains spaces or "
                             "control characters\n")


def test_a_secret_with_a_line_break_is_refused_unshown_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "first-half-of-it\nsecond-half-of-it")
    result = run("--redis-url", URL, "--data-dir", str(tmp_path / "data"), "install", "systemd", "--dir",
                 str(tmp_path / "u"))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == ("error: LOOPSQ_API_TOKEN must not contain a line break or NUL (its value is not "
                             "shown: a secret)\n")
    assert not (tmp_path / "u").exists()


def test_without_any_redis_install_refuses_and_writes_nothing(tmp_path: Path) -> None:
    result = run("--data-dir", str(tmp_path / "data"), "install", "systemd", "--dir", str(tmp_path / "u"))
    assert (result.exit_code, result.stdout, result.stderr) == (
        3, "", "error: no Redis configured: start 'loopsq up' or set LOOPSQ_REDIS_URL\n")
    assert not (tmp_path / "u").exists()
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("url", "reason"), [
    ("redis://127.0.0.1:/0", "the port is empty in '127.0.0.1:'"),
    ("http://:pw@db.example:6379", "unknown scheme 'http' (use redis://, rediss://, unix:// or redis+sentinel://)"),
])
def test_a_malformed_url_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               url: str, reason: str) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", url)
    result = run("--data-dir", str(tmp_path / "data"), "install", "systemd", "--dir", str(tmp_path / "u"))
    shown = url.replace(":pw@", ":***@")
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", f"error: invalid Redis URL '{shown}' (from LOOPSQ_REDIS_URL): {reason}\n")
    assert not (tmp_path / "u").exists()
    assert not (tmp_path / "data").exists()


def test_with_only_a_running_up_the_services_find_its_redis_through_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "redis.url").write_text("redis://:s3cret@127.0.0.1:40001/0\n")
    fd = os.open(data / "up.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        result = run("--data-dir", str(data), "install", "systemd", "--dir", str(tmp_path / "u"))
    finally:
        os.close(fd)
    assert result.exit_code == 0, result.stderr
    assert (f"warning: no Redis URL configured: the services will use the Redis of the loopsq up running on {data}, "
            "and refuse to start while it does not run (pass --redis-url or set LOOPSQ_REDIS_URL, then install "
            "again)") in result.stdout.splitlines()
    text = (tmp_path / "u" / UNITS[1]).read_text()
    assert "LOOPSQ_REDIS_URL" not in text
    assert "s3cret" not in text
    assert f"Environment=LOOPSQ_DATA_DIR={data}\n" in text


def test_exec_start_quotes_words_with_spaces_percents_dollars_and_quotes_as_systemd_unquotes_them() -> None:
    argv = ["/opt/my tools/python3", "-m", "loopsq", "worker", "100%", "$HOME", 'say "hi"', "a\\b"]
    unit = install.systemd_unit("worker", argv, {"LOOPSQ_REDIS_URL": "redis://:p%40ss word@h:1/0"})
    assert 'ExecStart="/opt/my tools/python3" -m loopsq worker 100%% $$HOME "say \\"hi\\"" "a\\\\b"\n' in unit
    assert 'Environment="LOOPSQ_REDIS_URL=redis://:p%%40ss word@h:1/0"\n' in unit


NEEDS_SYSTEMD = needs_tool("systemd-analyze", "systemd")


@NEEDS_SYSTEMD
def test_systemd_accepts_a_unit_whose_interpreter_path_has_a_space(tmp_path: Path) -> None:
    spaced = tmp_path / "my tools" / "python3"
    spaced.parent.mkdir()
    spaced.symlink_to(sys.executable)
    units = tmp_path / "units"
    done = install.write_services("systemd", units, {"PATH": "/usr/bin:/bin", "LOOPSQ_REDIS_URL": "redis://:a b@h/0"},
                                  tmp_path / "logs", python=str(spaced), default_location=False)
    unit_files = [str(p) for p in done.files if p.suffix == ".service"]
    checked = subprocess.run(["systemd-analyze", "verify", *unit_files], capture_output=True, text=True, timeout=60)
    assert (checked.returncode, checked.stderr) == (0, "")
    assert f'ExecStart="{spaced}" -m loopsq worker\n' in (units / UNITS[1]).read_text()


def exposure(unit: Path) -> float:
    """``systemd-analyze security``'s overall exposure level of a unit file (0 safe .. 10 unsafe)."""
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True,
                          text=True, timeout=120)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d)", done.stdout)
    assert found, done.stdout + done.stderr
    return float(found[1])


@needs_tool("systemd-analyze", "systemd")
@pytest.mark.parametrize("data_dir", ["/srv/loopsq data", "under tmp"])
def test_systemd_verifies_the_units_and_rates_the_web_app_and_scheduler_ok(tmp_path: Path, data_dir: str) -> None:
    data = tmp_path / "data" if data_dir == "under tmp" else Path(data_dir)
    units = tmp_path / "units"
    done = install.write_services("systemd", units, {"PATH": "/usr/bin:/bin", "LOOPSQ_DATA_DIR": str(data),
                                                     "LOOPSQ_REDIS_URL": "redis://:pw@h:6379/0"},
                                  tmp_path / "logs", default_location=False, data_dir=data,
                                  service_env={"web": {"LOOPSQ_API_TOKEN": "t" * 32}})
    unit_files = [p for p in done.files if p.suffix == ".service"]
    checked = subprocess.run(["systemd-analyze", "verify", *map(str, unit_files)], capture_output=True, text=True,
                             timeout=60)
    assert (checked.returncode, checked.stderr) == (0, "")
    scores = {p.name: exposure(p) for p in unit_files}
    assert scores["loopsq-web.service"] <= 5.0, scores
    assert scores["loopsq-scheduler.service"] <= 5.0, scores
    # The worker runs the user's commands: hardened as far as that allows, measurably less exposed than a bare unit.
    bare = tmp_path / "bare" / "loopsq-worker.service"
    bare.parent.mkdir()
    bare.write_text("[Service]\nType=simple\nExecStart=" + " ".join(install.service_argv("worker")) + "\n")
    assert scores["loopsq-worker.service"] < exposure(bare) - 1.0, (scores, exposure(bare))


def test_install_launchd_writes_private_plists_that_keep_each_service_alive(tmp_path: Path) -> None:
    out = tmp_path / "agents"
    data = tmp_path / "data"
    result = run("--redis-url", "redis://:s3cret@db.example:6379/0", "--data-dir", str(data),
                 "install", "launchd", "--dir", str(out))
    assert result.exit_code == 0, result.stderr
    paths = [out / name for name in PLISTS]
    secret_files = [out / f"loopsq-{name}.redis-url" for name in ("scheduler", "worker", "web")]
    token_file = out / "loopsq-web.api-token"
    assert result.stdout == "".join(f"wrote {p}\nwrote {e}\n" for p, e in zip(paths, secret_files, strict=True)) + (
        f"wrote {token_file}\nweb API token: in {data / 'api.token'}\n") + "".join(
        f"launchctl load -w {p}\n" for p in paths)
    assert [mode(p) for p in (*paths, *secret_files, token_file)] == [0o600] * 7
    assert mode(out) == 0o700
    assert plistlib.loads(paths[1].read_bytes()) == {
        "Label": "com.loopsq.worker",
        "ProgramArguments": [sys.executable, "-m", "loopsq", "worker"],
        # launchd has no credentials: the worker is given the secret's file, not its value.
        "EnvironmentVariables": {
            "PATH": service_path(tmp_path),
            "LOOPSQ_DATA_DIR": str(data),
            "LOOPSQ_KILL_TIMEOUT": "20s",
            "LOOPSQ_REDIS_URL_FILE": str(secret_files[1]),
        },
        "RunAtLoad": True,
        "KeepAlive": True,
        "ExitTimeOut": 20,
        "StandardOutPath": str(data / "logs" / "worker.log"),
        "StandardErrorPath": str(data / "logs" / "worker.log"),
    }
    assert "s3cret" not in paths[1].read_text(errors="replace")
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
    assert payload["files"] == [*(str(out / f) for u in UNITS for f in (u, u.replace(".service", ".redis-url"))),
                                str(out / "loopsq-web.api-token")]
    assert payload["commands"][0] == "systemctl --user daemon-reload"
    assert payload["enabled"][0] == {"command": ["systemctl", "--user", "daemon-reload"], "status": 0,
                                     "stdout": "systemctl says hi\n", "stderr": ""}


def test_an_unknown_install_target_is_refused_with_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run("install", "upstart", "--dir", str(tmp_path / "u"))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "error: install target must be systemd or launchd, got 'upstart'\n"
    assert not (tmp_path / "u").exists()
