"""A full snapshot of every entity in Redis, by mirror table: what a mirror rebuild writes."""

from __future__ import annotations

import json
from typing import Any

import redis

from loopsq.state import run_codec
from loopsq.state.keys import Keys


def _ids(client: redis.Redis, key: str) -> list[str]:
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    members = client.zrange(key, 0, -1) if kind == "zset" else client.smembers(key)
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)


def _load_all(client: redis.Redis, set_key: str, entity_key: Any) -> list[dict[str, Any]]:
    ids = _ids(client, set_key)
    out: list[dict[str, Any]] = []
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        for raw in client.mget([entity_key(i) for i in chunk]):
            if raw:
                out.append(dict(json.loads(str(raw))))
    return out


def _load_runs(client: redis.Redis, keys: Keys) -> list[dict[str, Any]]:
    """Every loop run, either stored form (``run_codec``)."""
    ids = _ids(client, keys.runs)
    return [run.to_dict() for start in range(0, len(ids), 500)
            for run in run_codec.load_many(client, [keys.run(i) for i in ids[start:start + 500]])]


def snapshot_tables(client: redis.Redis, keys: Keys) -> dict[str, list[dict[str, Any]]]:
    """Every loop and workflow spec (and, as they are added, runs, steps and events), keyed by mirror table."""
    return {
        "loops": _load_all(client, keys.loops, keys.loop),
        "workflow_specs": _load_all(client, keys.workflows, keys.workflow),
        "loop_runs": _load_runs(client, keys),
        **_workflow_runs(client, keys),
    }


def _workflow_runs(client: redis.Redis, keys: Keys) -> dict[str, list[dict[str, Any]]]:
    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    ids = _ids(client, keys.wf_runs)
    for start in range(0, len(ids), 200):
        pipe = client.pipeline(transaction=False)
        for run_id in ids[start : start + 200]:
            pipe.get(keys.wf_run(run_id))
            pipe.hvals(keys.wf_steps(run_id))
            pipe.lrange(keys.wf_events(run_id), 0, -1)
        replies = pipe.execute()
        for i in range(0, len(replies), 3):
            raw, step_raws, event_raws = replies[i : i + 3]
            if not raw:
                continue
            runs.append(json.loads(raw))
            steps.extend(json.loads(v) for v in step_raws)
            events.extend(json.loads(v) for v in event_raws)
    return {"workflow_runs": runs, "workflow_step_runs": steps, "workflow_events": events}
