"""``loopsq doctor`` and ``loopsq status``."""

from __future__ import annotations

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
    """Live schedulers and workers (host, pid, current runs), queue depth, mirror lag, Redis memory, loops and runs
    by status."""
    from loopsq.ops.health import memory_line, status_report

    app = get_app()
    report = status_report(app.client(), app.keys, app.mirror())

    def human() -> str:
        lines = [f"schedulers: {len(report['schedulers'])}"]
        lines += [f"  {p['id']}  host={p['host']} pid={p['pid']}" for p in report["schedulers"]]
        lines.append(f"workers: {len(report['workers'])}")
        for p in report["workers"]:
            runs = ",".join(p.get("runs") or []) or "-"
            lines.append(f"  {p['id']}  host={p['host']} pid={p['pid']} runs={runs}")
        lines.append(f"queue: {report['queueDepth']}  timers: {report['timersArmed']}  mirror lag: {report['mirrorLag']}")
        lines.append(f"redis memory: {memory_line(report['redisMemory'])}")
        lines.append("loops: " + (" ".join(f"{k}={v}" for k, v in sorted(report["loops"].items())) or "none"))
        lines.append("runs: " + (" ".join(f"{k}={v}" for k, v in sorted(report["runs"].items())) or "none"))
        return "\n".join(lines)

    app.emit(report, human)
