"""What loopsq adds to FastAPI's OpenAPI document so that it is exact: the create-body schemas, every 400 and 413
an operation can answer, and the links a stateful tester follows (create -> show -> trigger -> runs; set pool -> show,
delete).

The 400 is documented on every operation that takes a query, a header or a body (each can be malformed), the 413
on every operation with a body (``limits.MAX_BODY_BYTES``). Links name their target operations by path and
method (``operationRef``), so they hold whatever ids FastAPI generates.
"""

from __future__ import annotations

from typing import Any

from loopsq.web import body_schemas

_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_DESCRIPTIONS = {
    "400": "Bad input: the message names the field and quotes the value; nothing was changed.",
    "413": "The request body is larger than the bound (1 MiB); it was not read; nothing was changed.",
}


def _op(path: str, method: str) -> str:
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def _link(path: str, method: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    return {"operationRef": _op(path, method), "description": description, "parameters": parameters}


_NEW_LOOP = {"path.loop": "$response.body#/id"}
_LOOP_RUNS = {"query.loop": "$response.body#/id"}

#: (path, method, status) -> the links of that response.
LINKS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {
    ("/api/loops", "post", "201"): {
        "ShowLoop": _link("/api/loops/{loop}", "get", "The created loop.", _NEW_LOOP),
        "TriggerLoop": _link("/api/loops/{loop}/trigger", "post", "Start a run of it.", _NEW_LOOP),
        "ListLoopRuns": _link("/api/runs", "get", "Its runs.", _LOOP_RUNS),
        "PauseLoop": _link("/api/loops/{loop}/pause", "post", "Pause it.", _NEW_LOOP),
    },
    ("/api/loops/{loop}", "get", "200"): {
        "TriggerLoop": _link("/api/loops/{loop}/trigger", "post", "Start a run of it.", _NEW_LOOP),
        "ListLoopRuns": _link("/api/runs", "get", "Its runs.", _LOOP_RUNS),
    },
    ("/api/loops/{loop}/trigger", "post", "201"): {
        "ShowRun": _link("/api/runs/{run_id}", "get", "The triggered run (404 until a worker claims it).",
                         {"path.run_id": "$response.body#/runId"}),
        "ListLoopRuns": _link("/api/runs", "get", "The loop's runs.", {"query.loop": "$request.path.loop"}),
    },
    ("/api/workflows", "post", "201"): {
        "ShowWorkflow": _link("/api/workflows/{workflow}", "get", "The created spec.",
                              {"path.workflow": "$response.body#/id"}),
        "RunWorkflow": _link("/api/workflows/{workflow}/runs", "post", "Run it.",
                             {"path.workflow": "$response.body#/id"}),
    },
    ("/api/pools/{name}", "put", "200"): {
        "ShowPool": _link("/api/pools/{name}", "get", "The pool.", {"path.name": "$request.path.name"}),
        "DeletePool": _link("/api/pools/{name}", "delete", "Remove it.", {"path.name": "$request.path.name"}),
    },
    ("/api/workflows/{workflow}/runs", "post", "202"): {
        "ShowWorkflowRun": _link("/api/workflow-runs/{run_id}", "get", "The run (404 until a worker picks it up).",
                                 {"path.run_id": "$response.body#/runId"}),
    },
}


def refine(doc: dict[str, Any]) -> dict[str, Any]:
    """Add the create-body schemas, the 400/413 responses and the links to ``doc`` (in place); returns it."""
    doc.setdefault("components", {}).setdefault("schemas", {}).update(body_schemas.components())
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            takes_input = bool(operation.get("parameters")) or "requestBody" in operation
            for status, needed in (("400", takes_input), ("413", "requestBody" in operation)):
                if needed and status not in responses:
                    responses[status] = {"description": _DESCRIPTIONS[status],
                                         "content": {"application/json": {"schema": _ERROR_REF}}}
            for status, links in ((s, LINKS.get((path, method, s))) for s in list(responses)):
                if links:
                    responses[status]["links"] = links
    return doc
