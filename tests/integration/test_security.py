"""Security checks: no shell injection through args, secrets redacted in public output, passwords never shown."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.domain.redaction import public_event
from loopsq.executor import RunMetadata, execute_target
from loopsq.sdk import LoopsClient
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration


def test_shell_metacharacters_in_args_of_a_non_shell_command_are_passed_literally(tmp_path: Path) -> None:
    hostile = [f"$(touch {tmp_path}/a)", f"`touch {tmp_path}/b`", f"x; touch {tmp_path}/c", "|", "&&", "$HOME"]
    result = execute_target({"type": "command", "command": "printf", "args": ["%s\\n", *hostile], "shell": False},
                            RunMetadata())
    assert result.status == "succeeded"
    assert result.stdout.splitlines() == hostile
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_env_values_and_prompts_are_redacted_in_cli_output(redis_server: RedisServer, real_redis: redis.Redis,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", redis_server.url)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "d"))
    client = LoopsClient(redis_server.url)
    client.create({"name": "c", "schedule": {"type": "interval", "everyMs": 60_000},
                   "target": {"type": "command", "command": "echo $TOKEN", "shell": True,
                              "env": {"TOKEN": "s3cr3t-value"}}})
    secret_prompt = "do the secret thing " + "x" * 100
    client.create({"name": "a", "schedule": {"type": "interval", "everyMs": 60_000},
                   "target": {"type": "agent", "provider": "claude", "prompt": secret_prompt}})
    run = CliRunner().invoke(cli, ["run-now", "c", "--local"])
    assert run.exit_code == 0, run.stderr
    outputs = [CliRunner().invoke(cli, args).stdout for args in
               (["--json", "show", "c"], ["--json", "list"], ["--json", "runs", "c"], ["runs", "c"],
                ["--json", "show", "a"])]
    joined = "\n".join(outputs)
    assert "s3cr3t-value" not in joined
    assert '"env": "[redacted]"' in outputs[0]
    assert secret_prompt not in joined
    assert json.loads(outputs[2])[0]["stdout"] == "[redacted 11 chars]"
    # Shown on request, the stored output: the loop's own env values were scrubbed when it was stored.
    shown = CliRunner().invoke(cli, ["--json", "runs", "c", "--show-output"]).stdout
    assert json.loads(shown)[0]["stdout"] == "[SCRUBBED]\n"
    client.close()


def test_earlier_attempts_output_is_redacted_like_the_runs(redis_server: RedisServer, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", redis_server.url)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "d"))
    redis_server.client().flushall()
    client = LoopsClient(redis_server.url)
    # Every attempt prints a secret and fails; the retry is due at once.
    client.create({"name": "f", "schedule": {"type": "interval", "everyMs": 1000}, "maxAttempts": 2,
                   "retryDelayMs": 1, "target": {"type": "command", "command": "echo s3cr3t-$LOOPS_ATTEMPT; exit 3",
                                                 "shell": True}})
    client.close()
    time.sleep(1.1)
    assert CliRunner().invoke(cli, ["tick"]).exit_code == 0  # the first slot: attempt 1 fails
    time.sleep(0.05)
    assert CliRunner().invoke(cli, ["tick"]).exit_code == 0  # its retry: attempt 2 fails too
    listed = json.loads(CliRunner().invoke(cli, ["--json", "runs", "f"]).stdout)
    retried = next(r for r in listed if r["attempt"] == 2)
    assert retried["stdout"] == "[redacted 9 chars]"
    assert retried["previousAttempts"][0]["stdout"] == "[redacted 9 chars]"
    assert "s3cr3t" not in CliRunner().invoke(cli, ["runs", "f"]).stdout
    shown = json.loads(CliRunner().invoke(cli, ["--json", "runs", "f", "--show-output"]).stdout)
    retried = next(r for r in shown if r["attempt"] == 2)
    assert (retried["stdout"], retried["previousAttempts"][0]["stdout"]) == ("s3cr3t-2\n", "s3cr3t-1\n")
    text = CliRunner().invoke(cli, ["runs", "f", "--show-output"]).stdout
    assert "    stdout:\n    s3cr3t-1" in text


def test_event_payloads_redact_env_prompts_and_outputs() -> None:
    event = {"id": "e", "workflowRunId": "r", "sequence": 2, "eventType": "step_failed", "createdAt": "t",
             "payload": {"error": "boom", "env": {"K": "v"}, "prompt": "secret", "stdout": "out", "nested": {"stderr": "e"}}}
    public = public_event(event)
    text = json.dumps(public)
    assert "secret" not in text and '"v"' not in text and '"out"' not in text
    assert public["payload"]["error"] == "boom"


@pytest.mark.timeout(60)
def test_a_redis_password_never_appears_in_logs_or_errors(tmp_path: Path) -> None:
    port = free_port()
    binary = shutil.which("redis-server")
    assert binary
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                               "no", "--requirepass", "hunter2-pw", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://:hunter2-pw@127.0.0.1:{port}/0"
    env = {"LOOPSQ_REDIS_URL": url, "LOOPSQ_DATA_DIR": str(tmp_path / "d"), "PATH": "/usr/bin:/bin",
           "PYTHONUNBUFFERED": "1"}
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        created = subprocess.run([sys.executable, "-m", "loopsq", "create", "command", "x", "--every", "1s",
                                  "--cmd", "true"], env=env, capture_output=True, text=True, timeout=30)
        assert created.returncode == 0, created.stderr
        log = tmp_path / "sched.log"
        with log.open("wb") as out:
            sched = subprocess.Popen([sys.executable, "-m", "loopsq", "scheduler"], env=env, stdout=out,
                                     stderr=subprocess.STDOUT)
        time.sleep(2)
        server.send_signal(signal.SIGTERM)
        server.wait(10)
        time.sleep(2)
        sched.send_signal(signal.SIGTERM)
        sched.wait(20)
        text = log.read_text()
        assert "redis unavailable" in text
        assert "hunter2" not in text
        wrong = subprocess.run([sys.executable, "-m", "loopsq", "list"], env=env, capture_output=True, text=True,
                               timeout=30)
        assert wrong.returncode == 3
        assert "hunter2" not in wrong.stderr + wrong.stdout
        assert f"redis://:***@127.0.0.1:{port}/0" in wrong.stderr
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
