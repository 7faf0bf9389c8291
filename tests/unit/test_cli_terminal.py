"""Run output reaches the operator's terminal neutralised: ESC and the other C0 controls (but newline and tab), DEL
and the C1 controls are shown escaped by ``logs``, ``runs --show-output`` and ``run-now --show-output``, so an OSC 52
sequence in a target's output (``\\x1b]52;c;<base64>\\x07``: write the clipboard) does nothing; JSON output keeps
the value, escaped. The output a run stores is scrubbed of secrets first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopsq.domain.text import json_terminal_safe, terminal_safe
from loopsq.state.keys import Keys
from loopsq.state.runs import RunStore
from tests.unit.cli_helpers import Cli, make_cli

KEYS = Keys()
KEY = "sk-proj-" + "xY9zQ2wE4rT6" * 4
PASSWORD = "hunter2-correct-horse"
# OSC 52 (clipboard), a CSI that clears the screen, the C1 CSI, a carriage return, a bell, and two secrets
SCRIPT = (r"printf 'copy\033]52;c;ZXZpbA==\007 then\033[2J clear\302\2331m c1\r\tover\n'; "
          f"printf 'key={KEY} pass=%s\\n' \"$DB_PASSWORD\"")
SHOWN = ("copy\\x1b]52;c;ZXZpbA==\\x07 then\\x1b[2J clear\\x9b1m c1\\x0d\tover\n"
         "key=[SCRUBBED] pass=[SCRUBBED]\n")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def test_terminal_safe_escapes_every_control_but_newline_and_tab() -> None:
    controls = "".join(map(chr, (*range(0x20), 0x7F, *range(0x80, 0xA0))))
    shown = terminal_safe(controls + "é漢\u200b")
    assert shown == "".join("\t" if c == "\t" else "\n" if c == "\n" else f"\\x{ord(c):02x}" for c in controls) + \
        "é漢\u200b"
    dumped = json.dumps({"t": controls}, ensure_ascii=False)
    assert json.loads(json_terminal_safe(dumped)) == {"t": controls}
    assert not any(0x7F <= ord(c) < 0xA0 or (ord(c) < 0x20 and c != "\n") for c in json_terminal_safe(dumped))


def test_logs_runs_and_run_now_show_escape_sequences_escaped_and_the_stored_output_scrubbed(cli: Cli) -> None:
    cli.ok("create", "command", "noisy", "--every", "1h", "--cmd", SCRIPT, "--env", f"DB_PASSWORD={PASSWORD}")
    now_out = cli.ok("run-now", "noisy", "--local", "--show-output")
    run_id = now_out.split()[0]
    stored = RunStore(cli.redis, KEYS).get(run_id)
    assert stored is not None and stored.stdout == SHOWN.replace("\\x1b", "\x1b").replace("\\x07", "\x07").replace(
        "\\x9b", "\x9b").replace("\\x0d", "\r")  # stored as printed, secrets scrubbed
    assert "stdout:\n" + SHOWN.rstrip("\n") in now_out

    logs = cli.ok("logs", run_id)
    assert logs == SHOWN
    assert not any(c in logs for c in "\x1b\x07\x9b\r")
    runs = cli.ok("runs", "noisy", "--show-output")
    assert SHOWN.rstrip("\n") in runs and "\x1b" not in runs

    lines = [json.loads(line) for line in cli.ok("logs", run_id, "--json").splitlines()]
    assert "".join(row["line"] + "\n" for row in lines) == stored.stdout  # the value, escaped as JSON
    raw_json = cli.ok("--json", "runs", "noisy", "--show-output")
    assert "\x9b" not in raw_json and "\x1b" not in raw_json
    assert json.loads(raw_json)[0]["stdout"] == stored.stdout
