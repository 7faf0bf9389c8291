"""How well the OpenAPI document's create schema fits the server: the share of schemathesis-generated positive
``POST /api/loops`` bodies that get a 201 (goal: at least 80%), by target and schedule type.

Run: ``flock /work/bench.lock .venv/bin/python bench/schema_fit.py [--examples N]``. It starts its own Redis, builds
the web app in-process (no HTTP server) and removes each created loop again so names stay free. The only bodies
the server can refuse are those naming a workflow that does not exist (the document cannot know which do); the
script prints how many those were, and the share without them.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from _harness import Harness  # sets up sys.path for the repository

GOAL = 0.80
TOKEN = "bench-token-0123456789abcdef"
UNRESOLVED_WORKFLOW = "target.workflowId must name a stored workflow"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="generated bodies (default 500)")
    args = parser.parse_args()
    os.environ["TZ"] = "UTC"

    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode

    from loopsq.domain import timeutil
    from loopsq.state.loops import LoopStore
    from loopsq.web import WebSettings, create_app

    harness = Harness("schema-fit", time_bound_s=600)
    try:
        server = harness.redis()
        client = server.client()
        app = create_app(WebSettings(redis_url=server.url, data_dir=Path(tempfile.mkdtemp(dir=harness.dir)),
                                     token=TOKEN, follow_mirror=False, rq_dashboard=False))
        operation = schemathesis.openapi.from_asgi("/api/openapi.json", app)["/api/loops"]["POST"]
        by_kind: dict[tuple[str, str], collections.Counter[int]] = collections.defaultdict(collections.Counter)
        reasons: collections.Counter[str] = collections.Counter()

        @given(case=operation.as_strategy(GenerationMode.POSITIVE))
        @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def create(case: Any) -> None:
            response = case.call(app=app, headers={"Authorization": f"Bearer {TOKEN}"})
            body = case.body if isinstance(case.body, dict) else {}
            kind = (str((body.get("target") or {}).get("type")), str((body.get("schedule") or {}).get("type")))
            by_kind[kind][response.status_code] += 1
            if response.status_code == 201:
                LoopStore(client).remove(response.json()["id"], timeutil.now())
            else:
                reasons[response.json()["error"]["message"][:60]] += 1

        create()
    finally:
        harness.close()
    total = sum(sum(c.values()) for c in by_kind.values())
    created = sum(c[201] for c in by_kind.values())
    unresolved = sum(n for reason, n in reasons.items() if reason.startswith(UNRESOLVED_WORKFLOW))
    print(f"generated positive bodies: {total}")
    for kind, counts in sorted(by_kind.items()):
        print(f"  target={kind[0]:<8} schedule={kind[1]:<8} " + " ".join(f"{s}:{n}" for s, n in sorted(counts.items())))
    for reason, n in reasons.most_common(5):
        print(f"  refused {n}: {reason}")
    ratio = created / total if total else 0.0
    print(f"created (201): {created}/{total} = {ratio:.1%}  (goal >= {GOAL:.0%}: {'met' if ratio >= GOAL else 'MISSED'})")
    rest = total - unresolved
    print(f"without bodies naming a workflow that does not exist: {created}/{rest} = "
          f"{created / rest if rest else 0.0:.1%}")
    sys.exit(0 if ratio >= GOAL else 1)


if __name__ == "__main__":
    main()
