"""Secrets are scrubbed where a run's output is captured and stored: the executor's capture (stdout, stderr and the
live chunks, with the target's own env values, a secret never cut in two across reads), a run's finalize (output,
error, the control file's note and warning, the loop's needs_human reason, the change stream), a workflow step's
end and its events, and the live stream's writes."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta

import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.engine.live import LiveWriter
from loopsq.executor import RunMetadata, execute_target
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.state.workflow_run_state import StepEnd
from loopsq.state.workflow_runs import WorkflowRunStore

S = "[SCRUBBED]"
KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
OPENAI = "sk-proj-" + "xY9zQ2wE4rT6" * 4
GITHUB = "ghp_" + "a1B2c3D4e5" * 4
PASSWORD = "hunter2-correct-horse"

# Writes a key, an env value and a GitHub token in pieces, with pauses, so that each is cut across reads.
PIECES = [OPENAI[:10], OPENAI[10:] + " and " + PASSWORD[:6], PASSWORD[6:] + "\n", GITHUB[:5], GITHUB[5:] + "\n",
          "last line without newline " + PASSWORD]
WRITER = ("import sys, time\n"
          f"for piece in {PIECES!r}:\n"
          "    sys.stdout.write(piece); sys.stdout.flush(); sys.stderr.write(piece); sys.stderr.flush()\n"
          "    time.sleep(0.05)\n")


def test_the_executor_scrubs_what_it_captures_and_streams_even_a_secret_cut_across_reads() -> None:
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    target = {"type": "command", "command": sys.executable, "args": ["-c", WRITER], "env": {"DB_PASSWORD": PASSWORD,
                                                                                       "SHORT": "abc"}}
    result = execute_target(target, RunMetadata(), on_output=lambda stream, chunk: chunks[stream].append(chunk))
    expected = f"{S} and {S}\n{S}\nlast line without newline {S}"
    assert (result.status, result.stdout, result.stderr) == ("succeeded", expected, expected)
    assert b"".join(chunks["stdout"]).decode() == expected  # the live chunks too
    assert len(chunks["stdout"]) > 1
    for secret in (OPENAI, GITHUB, PASSWORD, PASSWORD[:6], OPENAI[10:]):
        assert secret not in result.stdout and secret.encode() not in b"".join(chunks["stderr"])


def _loop(client: redis.Redis, env: dict[str, str]) -> str:
    body = {"name": "secretive", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true", "env": env}}
    return LoopStore(client, KEYS).create(new_loop(body, T0)).id


def test_finalize_scrubs_output_error_and_the_control_note_with_the_loops_env_before_anything_is_written(
    fake_redis: redis.Redis,
) -> None:
    loop_id = _loop(fake_redis, {"DB_PASSWORD": PASSWORD, "PORT": "5432"})
    runs = RunStore(fake_redis, KEYS)
    claim = runs.claim(loop_id, T0 + timedelta(seconds=10), Owner("worker:a", "host-a", 1), T0 + timedelta(seconds=10))
    assert isinstance(claim, Claim)
    control = {"outcome": "needs_human", "note": f"rotate {GITHUB} please"}
    done = runs.finalize(claim.run.id, claim.token, T0 + timedelta(seconds=11), status="failed", exit_code=1,
                         duration_ms=5, stdout=f"connected with {PASSWORD} on 5432\n", stderr=f"key {OPENAI}\n",
                         error=f"auth failed: Bearer {OPENAI}", pid=None,
                         fields={"control": control, "outcome": "needs_human",
                                 "control_warning": f"ignored {OPENAI}"})
    assert done is not None
    run, loop = done
    stored = runs.get(claim.run.id)
    assert stored is not None and stored == run
    assert (stored.stdout, stored.stderr, stored.error) == (f"connected with {S} on 5432\n", f"key {S}\n",
                                                            f"auth failed: Bearer {S}")
    assert (stored.control, stored.control_warning) == ({"outcome": "needs_human", "note": f"rotate {S} please"},
                                                        f"ignored {S}")
    assert loop is not None and loop.status_reason == f"needs_human: rotate {S} please"
    # the run's transition on the change stream, which carries the run and the loop (its definition holds its env)
    [(_id, change)] = fake_redis.xrevrange(KEYS.changes, count=1)
    upsert = json.loads(change["data"])["upsert"]
    assert change["type"] == "run_failed" and upsert["loops"][0]["statusReason"] == f"needs_human: rotate {S} please"
    for secret in (PASSWORD, OPENAI, GITHUB):
        assert secret not in json.dumps(upsert["loop_runs"]) and secret not in json.dumps(run.to_dict())


def test_a_workflow_steps_end_and_its_events_are_scrubbed(fake_redis: redis.Redis) -> None:
    from loopsq.domain import timeutil

    spec = {"id": "wf1", "name": "wf", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}
    store = WorkflowRunStore(fake_redis, KEYS)
    state, _ = store.create(spec, T0)
    assert store.start_step(state, "a", T0)
    end = StepEnd("a", T0 + timedelta(seconds=1), "failed", 1, 5, f"token {GITHUB}\n", f"{OPENAI}\n",
                  f"step a failed: {OPENAI}")
    assert store.end_step(state, end)
    assert store.finish_run(state, "failed", timeutil.now(), error=f"step a failed: {OPENAI}")
    loaded = store.load(state.run_id)
    assert loaded is not None
    step = loaded.steps["a"]
    assert (step["stdout"], step["stderr"], step["error"]) == (f"token {S}\n", f"{S}\n", f"step a failed: {S}")
    assert loaded.run["error"] == f"step a failed: {S}"
    events = json.dumps(store.events(state.run_id))
    assert OPENAI not in events and GITHUB not in events and f"step a failed: {S}" in events


def test_the_live_stream_is_scrubbed_as_it_is_written(fake_redis: redis.Redis) -> None:
    writer = LiveWriter(fake_redis, KEYS, "run1")
    writer._last = 0  # send at once
    writer("stdout", f"using {OPENAI}\n".encode())
    writer.close("succeeded")
    sent = [fields["d"] for _id, fields in fake_redis.xrange(KEYS.live("run1")) if fields["s"] == "stdout"]
    assert "".join(sent) == f"using {S}\n"
