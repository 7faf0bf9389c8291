"""Layered layout of a workflow DAG for the dashboard's inline SVG: pure geometry, no I/O, no HTML.

Each step sits in the column of its dependency depth (a step without dependencies is in column 0; any other step
is one column right of its deepest dependency), so every edge points rightwards. Within a column, steps are
ordered by the mean row of their dependencies (one barycentre pass, which removes most crossings in the small
DAGs workflows have), ties broken by spec order. Unknown dependencies are ignored and a cycle (which spec
validation already rejects) cannot loop: the dependency that closes it is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NODE_WIDTH = 168
NODE_HEIGHT = 44
COLUMN_GAP = 64
ROW_GAP = 20
MARGIN = 12
#: Characters of a step id shown inside a node; the full id is in its tooltip.
LABEL_CHARS = 20


@dataclass(frozen=True)
class Node:
    """A step drawn as a box: its column (depth), row, top-left corner and status."""

    step_id: str
    status: str
    column: int
    row: int
    x: int
    y: int
    error: str | None = None

    @property
    def label(self) -> str:
        """The step id, shortened to fit the box."""
        if len(self.step_id) <= LABEL_CHARS:
            return self.step_id
        return self.step_id[: LABEL_CHARS - 1] + "…"


@dataclass(frozen=True)
class Edge:
    """A dependency, drawn from the right side of ``source`` to the left side of ``target``."""

    source: str
    target: str
    x1: int
    y1: int
    x2: int
    y2: int

    @property
    def path(self) -> str:
        """An SVG path: a horizontal cubic Bézier curve between the two anchors."""
        mid = (self.x1 + self.x2) // 2
        return f"M{self.x1},{self.y1} C{mid},{self.y1} {mid},{self.y2} {self.x2},{self.y2}"


@dataclass(frozen=True)
class Layout:
    """Nodes in spec order, edges, and the drawing's size."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


def _dependencies(steps: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Step id -> known dependency ids (in the spec's order, duplicates and unknown ids dropped)."""
    ids = [str(step["id"]) for step in steps]
    known = set(ids)
    deps: dict[str, list[str]] = {}
    for step in steps:
        raw = step.get("dependsOn") or []
        seen: list[str] = []
        for dep in raw if isinstance(raw, list | tuple) else []:
            if isinstance(dep, str) and dep in known and dep not in seen and dep != step["id"]:
                seen.append(dep)
        deps[str(step["id"])] = seen
    return deps


def depths(steps: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Each step's dependency depth: 0 without dependencies, else 1 + the deepest dependency's depth."""
    deps = _dependencies(steps)
    depth: dict[str, int] = {}
    for root in deps:
        if root in depth:
            continue
        # Iterative DFS; a dependency met again while it is on the stack closes a cycle and is left out.
        stack = [(root, iter(deps[root]))]
        on_stack = {root}
        while stack:
            node, pending = stack[-1]
            for dep in pending:
                if dep not in depth and dep not in on_stack:
                    stack.append((dep, iter(deps[dep])))
                    on_stack.add(dep)
                    break
            else:
                stack.pop()
                on_stack.discard(node)
                done = [depth[d] for d in deps[node] if d in depth]
                depth[node] = 1 + max(done) if done else 0
    return depth


def layout(steps: Sequence[Mapping[str, Any]], statuses: Mapping[str, str] | None = None,
           errors: Mapping[str, str | None] | None = None) -> Layout:
    """Place ``steps`` (spec dicts with ``id`` and ``dependsOn``) in columns by dependency depth.

    Args:
        steps: The workflow spec's steps, in spec order.
        statuses: Step id -> step run status; a step without one is ``pending``.
        errors: Step id -> the step run's error, shown in the node's tooltip.

    Returns:
        The nodes (spec order), the edges (dependency -> dependent) and the drawing's width and height.
    """
    statuses = statuses or {}
    errors = errors or {}
    deps = _dependencies(steps)
    depth = depths(steps)
    order = {step_id: index for index, step_id in enumerate(deps)}
    columns: dict[int, list[str]] = {}
    for step_id in deps:
        columns.setdefault(depth[step_id], []).append(step_id)
    row_of: dict[str, int] = {}
    for column in sorted(columns):
        members = columns[column]

        def barycentre(step_id: str) -> tuple[float, int]:
            rows = [row_of[d] for d in deps[step_id] if d in row_of]
            return (sum(rows) / len(rows) if rows else float(order[step_id]), order[step_id])

        members.sort(key=barycentre)
        for row, step_id in enumerate(members):
            row_of[step_id] = row
    nodes = {
        step_id: Node(
            step_id=step_id,
            status=statuses.get(step_id, "pending"),
            column=depth[step_id],
            row=row_of[step_id],
            x=MARGIN + depth[step_id] * (NODE_WIDTH + COLUMN_GAP),
            y=MARGIN + row_of[step_id] * (NODE_HEIGHT + ROW_GAP),
            error=errors.get(step_id),
        )
        for step_id in deps
    }
    edges = []
    for step_id, step_deps in deps.items():
        target = nodes[step_id]
        for dep in step_deps:
            source = nodes[dep]
            if source.column >= target.column:  # the edge that closed a cycle
                continue
            edges.append(Edge(dep, step_id, source.x + NODE_WIDTH, source.y + NODE_HEIGHT // 2,
                              target.x, target.y + NODE_HEIGHT // 2))
    n_columns = max(columns) + 1 if columns else 0
    n_rows = max((len(m) for m in columns.values()), default=0)
    width = 2 * MARGIN + n_columns * NODE_WIDTH + max(n_columns - 1, 0) * COLUMN_GAP
    height = 2 * MARGIN + n_rows * NODE_HEIGHT + max(n_rows - 1, 0) * ROW_GAP
    return Layout(tuple(nodes.values()), tuple(edges), width, height)
