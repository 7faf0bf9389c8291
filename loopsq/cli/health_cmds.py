"""``loopsq doctor`` and ``loopsq status``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from loopsq.cli.app import get_app, json_flag


@click.command("doctor")
@json_flag
def doctor() -> None:
    """Check Redis, the data dir, the mirror, schedulers, workers, provider CLIs and every active loop.

    Exit status 1 when a check fails (warnings do not fail).
    """
    from loopsq.ops.doctor import run_doctor

    app = get_app()
    ok, checks = run_doctor(app.redis_url, app.data_dir, app.keys)
    app.emit({"ok": ok, "checks": [c.to_dict() for c in checks]}, "\n".join(c.line() for c in checks))
    if not ok:
        raise click.exceptions.Exit(1)


@click.command("status")
@json_flag
def status() -> None:
    """Live schedulers and workers (host, pid, clock offset to Redis's, current runs), queue depth, mirror lag, Redis memory, loops and runs
    by status, and the fleet: each worker's labels and busy slots, each queue's waiting runs (those no live worker
    can take marked unserved), timers overdue."""
    from loopsq.ops.health import clock_text, memory_line, status_report

    app = get_app()
    report = status_report(app.client(), app.keys, app.mirror())

    def human() -> str:
        lines = [f"schedulers: {len(report['schedulers'])}"]
        lines += [f"  {p['id']}  host={p['host']} pid={p['pid']} clock={clock_text(p)}" for p in report["schedulers"]]
        lines.append(f"workers: {len(report['workers'])}")
        for p in report["workers"]:
            runs = ",".join(p.get("runs") or []) or "-"
            lines.append(f"  {p['id']}  host={p['host']} pid={p['pid']} clock={clock_text(p)} runs={runs}")
        lines.append(f"queue: {report['queueDepth']}  timers: {report['timersArmed']}  mirror lag: {report['mirrorLag']}")
        lines.append(f"redis memory: {memory_line(report['redisMemory'])}")
        lines.append("loops: " + (" ".join(f"{k}={v}" for k, v in sorted(report["loops"].items())) or "none"))
        lines.append("runs: " + (" ".join(f"{k}={v}" for k, v in sorted(report["runs"].items())) or "none"))
        return "\n".join(lines + fleet_lines(report["fleet"]))

    app.emit(report, human)


def fleet_lines(fleet: Mapping[str, Any]) -> list[str]:
    """``status``'s fleet part, from ``FleetSnapshot.to_dict()``: the slots, a line per worker and per queue
    (``unserved: <why>`` when no live worker can take its runs), then the timers overdue."""
    from loopsq.engine.fleet import age_text, unserved_reason

    workers = fleet["workers"]
    lines = [f"fleet: {len(workers)} worker(s), {fleet['busy']}/{fleet['capacity']} slots busy"]
    for w in workers:
        lines.append(f"  worker {w['id']}  busy={w['busy']}/{w['slots']}  labels={','.join(w['labels']) or '-'}")
    for q in fleet["queues"]:
        line = f"  queue {q['name']}  depth={q['depth']}"
        if q["oldestAgeMs"] is not None:
            line += f"  oldest={age_text(q['oldestAgeMs'])}"
        if q["unserved"]:
            line += f"  unserved: {unserved_reason(q['missing'])}"
        lines.append(line)
    timers = fleet["timers"]
    late = f" (oldest {age_text(timers['oldestLateMs'])} late)" if timers["overdue"] else ""
    lines.append(f"timers overdue: {timers['overdue']}{late}")
    for p in fleet.get("pools", []):
        lines.append(f"  pool {p['name']}  in-use={len(p['holders'])}/{p['limit']}  waiting={len(p['waiters'])}")
    return lines
