"""The dashboard's DAG layout: columns by dependency depth, rows by barycentre, edges left to right."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from loopsq.web import dag
from loopsq.web.dag import COLUMN_GAP, MARGIN, NODE_HEIGHT, NODE_WIDTH, ROW_GAP


def steps(*specs: tuple[str, list[str]]) -> list[dict[str, Any]]:
    return [{"id": step_id, "dependsOn": deps} for step_id, deps in specs]


def test_steps_sit_in_the_column_of_their_dependency_depth() -> None:
    graph = dag.layout(steps(("build", []), ("lint", []), ("test", ["build"]), ("ship", ["test", "lint"])))
    columns = {n.step_id: n.column for n in graph.nodes}
    assert columns == {"build": 0, "lint": 0, "test": 1, "ship": 2}
    assert dag.depths(steps(("a", []), ("b", ["a"]), ("c", ["a", "b"]))) == {"a": 0, "b": 1, "c": 2}


def test_node_coordinates_follow_columns_and_rows() -> None:
    graph = dag.layout(steps(("a", []), ("b", []), ("c", ["a"])))
    by_id = {n.step_id: n for n in graph.nodes}
    assert (by_id["a"].x, by_id["a"].y) == (MARGIN, MARGIN)
    assert (by_id["b"].x, by_id["b"].y) == (MARGIN, MARGIN + NODE_HEIGHT + ROW_GAP)
    assert (by_id["c"].x, by_id["c"].y) == (MARGIN + NODE_WIDTH + COLUMN_GAP, MARGIN)
    assert graph.width == 2 * MARGIN + 2 * NODE_WIDTH + COLUMN_GAP
    assert graph.height == 2 * MARGIN + 2 * NODE_HEIGHT + ROW_GAP


def test_a_step_is_placed_next_to_its_dependencies_to_avoid_crossings() -> None:
    graph = dag.layout(steps(("a", []), ("b", []), ("after_b", ["b"]), ("after_a", ["a"])))
    rows = {n.step_id: n.row for n in graph.nodes}
    assert rows["after_a"] == rows["a"] == 0
    assert rows["after_b"] == rows["b"] == 1


def test_edges_run_from_the_right_of_the_dependency_to_the_left_of_the_dependent() -> None:
    graph = dag.layout(steps(("a", []), ("b", ["a"])))
    (edge,) = graph.edges
    a, b = graph.nodes
    assert (edge.source, edge.target) == ("a", "b")
    assert (edge.x1, edge.y1, edge.x2, edge.y2) == (a.x + NODE_WIDTH, a.y + NODE_HEIGHT // 2, b.x, b.y + NODE_HEIGHT // 2)
    mid = (edge.x1 + edge.x2) // 2
    assert edge.path == f"M{edge.x1},{edge.y1} C{mid},{edge.y1} {mid},{edge.y2} {edge.x2},{edge.y2}"


def test_statuses_and_errors_are_carried_and_missing_statuses_are_pending() -> None:
    graph = dag.layout(steps(("a", []), ("b", ["a"])), {"a": "failed"}, {"a": "exit 3"})
    assert [(n.step_id, n.status, n.error) for n in graph.nodes] == [("a", "failed", "exit 3"), ("b", "pending", None)]


def test_long_step_ids_are_shortened_in_the_label_only() -> None:
    node = dag.layout(steps(("a-very-long-step-identifier", [])), {}).nodes[0]
    assert node.step_id == "a-very-long-step-identifier"
    assert node.label == "a-very-long-step-id…"


def test_unknown_and_duplicate_dependencies_are_ignored() -> None:
    graph = dag.layout(steps(("a", []), ("b", ["a", "a", "ghost", "b"])))
    assert [(e.source, e.target) for e in graph.edges] == [("a", "b")]


def test_a_cycle_does_not_hang_and_drops_the_edge_that_closes_it() -> None:
    graph = dag.layout(steps(("a", ["b"]), ("b", ["a"])))
    assert {n.step_id: n.column for n in graph.nodes} == {"b": 0, "a": 1}
    assert [(e.source, e.target) for e in graph.edges] == [("b", "a")]


def test_an_empty_workflow_has_an_empty_drawing() -> None:
    assert dag.layout([]) == dag.Layout((), (), 2 * MARGIN, 2 * MARGIN)


@given(st.lists(st.lists(st.integers(min_value=0, max_value=11), max_size=4), min_size=1, max_size=12))
def test_every_edge_points_right_and_no_two_nodes_overlap(deps_by_index: list[list[int]]) -> None:
    # Step i may depend on any earlier step: a DAG, as validated specs are.
    spec = [{"id": f"s{i}", "dependsOn": [f"s{d}" for d in deps if d < i]} for i, deps in enumerate(deps_by_index)]
    graph = dag.layout(spec)
    assert len(graph.nodes) == len(spec)
    assert all(e.x1 < e.x2 for e in graph.edges)
    assert len({(n.x, n.y) for n in graph.nodes}) == len(graph.nodes)
    assert all(n.x + NODE_WIDTH <= graph.width and n.y + NODE_HEIGHT <= graph.height for n in graph.nodes)
    expected_edges = sum(len(set(s["dependsOn"])) for s in spec)
    assert len(graph.edges) == expected_edges
