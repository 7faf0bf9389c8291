"""The HTTP API for issue 19's features: create bodies take them, loops and runs show them, runs filter by
outcome, and bad fields get the one error body naming the field and the value."""

from __future__ import annotations

import pytest

from tests.integration.test_web_api import Web, assert_error, loop_body, put_run, web  # noqa: F401

pytestmark = pytest.mark.integration


def test_a_loop_is_created_with_steering_gate_workspace_budgets_and_jitter(web: Web) -> None:  # noqa: F811
    body = loop_body(steerable=True, minIntervalMs=2000, maxIntervalMs=3_600_000,
                     gate={"command": "git diff --quiet || exit 0", "timeoutMs": 5000}, workspace="repo",
                     overlap="allow", workspaceWaitMs=60_000, budgetRuns={"limit": 10, "per": "day"},
                     budgetCost={"limit": 2.5, "per": "week"}, jitterMs=600_000)
    created = web.client.post("/api/loops", json=body)
    assert created.status_code == 201, created.text
    loop = created.json()
    assert {k: loop[k] for k in ("steerable", "minIntervalMs", "maxIntervalMs", "gate", "workspace",
                                 "workspaceWaitMs", "budgetRuns", "budgetCost", "jitterMs")} == {
        k: body[k] for k in ("steerable", "minIntervalMs", "maxIntervalMs", "gate", "workspace", "workspaceWaitMs",
                             "budgetRuns", "budgetCost", "jitterMs")}
    assert 0 <= loop["schedule"].get("offsetMs", 0) < 600_000
    assert web.client.get("/api/loops/hello").json()["gate"] == body["gate"]  # through the mirror


def test_runs_filter_by_outcome_and_show_usage(web: Web) -> None:  # noqa: F811
    loop_id = web.client.post("/api/loops", json=loop_body()).json()["id"]
    put_run(web.redis, "r0", loop_id, "2026-01-01T00:00:00.000Z", loopName="hello", outcome="no_op",
            control={"outcome": "no_op"}, inputTokens=10, outputTokens=2, costUsd=0.01)
    put_run(web.redis, "r1", loop_id, "2026-01-01T00:00:01.000Z", loopName="hello", outcome="done",
            control={"outcome": "done", "note": "ok"})
    no_op = web.client.get("/api/runs?outcome=no_op").json()["items"]
    assert [(r["id"], r["costUsd"], r["inputTokens"]) for r in no_op] == [("r0", 0.01, 10)]
    assert [r["id"] for r in web.client.get(f"/api/runs?loop={loop_id}&outcome=done").json()["items"]] == ["r1"]
    bad = web.client.get("/api/runs?outcome=maybe")
    assert bad.status_code == 400


@pytest.mark.parametrize(("extra", "message"), [
    ({"minIntervalMs": 5000}, "minIntervalMs requires steerable: true, got 5000"),
    ({"gate": {"command": " "}}, 'gate.command must be a non-empty command, got " "'),
    ({"workspaceWaitMs": 1000}, "workspaceWaitMs requires a workspace, got 1000"),
    ({"budgetCost": {"limit": 0, "per": "day"}}, "budgetCost.limit must be a positive number (USD), got 0"),
    ({"jitterMs": 10_000_000_000}, "jitterMs must be at most 604800000 (7d), got 10000000000"),
])
def test_bad_feature_fields_are_400_with_the_field_and_the_value(web: Web, extra: dict[str, object],  # noqa: F811
                                                                 message: str) -> None:
    assert_error(web.client.post("/api/loops", json=loop_body(**extra)), 400, message)
