"""SQL for tag filters (``domain.tags``): a loop matches when its ``tags_json`` has every pair (AND); a run, when
its loop does. Keys are of ``TAG_CHARS`` (no quote), so each is a safe quoted JSON path, passed as a parameter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def loop_tag_where(tags: Mapping[str, str] | None) -> tuple[list[str], list[Any]]:
    """The WHERE terms (on ``loops``) and their parameters for loops carrying every pair of ``tags``."""
    where: list[str] = []
    params: list[Any] = []
    for key, value in sorted((tags or {}).items()):
        where.append("json_extract(tags_json, ?) = ?")
        params += [f'$."{key}"', value]
    return where, params


def run_tag_where(tags: Mapping[str, str] | None) -> tuple[list[str], list[Any]]:
    """The WHERE term (on ``loop_runs``) for runs of the loops carrying every pair of ``tags``: by the loop ids
    whose tags match (a removed loop's runs have no tags left to match)."""
    where, params = loop_tag_where(tags)
    if not where:
        return [], []
    return [f"loop_id IN (SELECT id FROM loops WHERE {' AND '.join(where)})"], params
