"""``loopsq pool ...``: fleet-wide pools (set, list, show, rm), named limits shared by every worker.

Pools are read from Redis (their source of truth; no mirror table holds them), so every read sees every write.
"""

from __future__ import annotations

from typing import ClassVar

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.options import positive_int_flag
from loopsq.cli.workflows_cmds import AliasGroup
from loopsq.domain.limits import MAX_POOL_LIMIT
from loopsq.domain.pools import check_pool_name
from loopsq.domain.text import shown
from loopsq.errors import NotFoundError
from loopsq.state.pools import PoolState, PoolStore


class PoolGroup(AliasGroup):
    """``pool ls`` is ``pool list``; ``pool remove`` is ``pool rm``."""

    aliases: ClassVar[dict[str, str]] = {"ls": "list", "remove": "rm"}


@click.group("pool", cls=PoolGroup)
def pool() -> None:
    """Fleet-wide pools: at most LIMIT runs naming a pool hold one of its slots at once, on any worker."""


def _store() -> PoolStore:
    app = get_app()
    return PoolStore(app.client(), app.keys)


def _summary_line(state: PoolState) -> str:
    summary = state.summary()
    return f"{state.pool.name}  limit={summary['limit']}  in-use={summary['inUse']}  waiting={summary['waiting']}"


@pool.command("set")
@click.argument("name")
@click.option("--limit", "limit_text", required=True, metavar="N", help=f"Slots: 1 to {MAX_POOL_LIMIT}.")
@json_flag
def set_pool(name: str, limit_text: str) -> None:
    """Create pool NAME, or change its limit (a lowered limit lets the runs above it finish and admits none until
    under it)."""
    name = check_pool_name(name)
    limit = positive_int_flag("--limit", limit_text, MAX_POOL_LIMIT)
    saved = _store().set(name, limit)
    get_app().emit(saved.to_dict(), f"pool {saved.name} limit={saved.limit}")


@pool.command("list")
@json_flag
def list_pools() -> None:
    """List pools: name, limit, slots in use and runs waiting."""
    store = _store()
    states = [state for state in (store.state(p.name) for p in store.list()) if state is not None]
    get_app().emit([state.summary() for state in states], lambda: "\n".join(_summary_line(s) for s in states))


def _require(store: PoolStore, name: str) -> PoolState:
    state = store.state(check_pool_name(name))
    if state is None:
        raise NotFoundError(f"pool not found: {shown(name)}")
    return state


@pool.command("show")
@click.argument("name")
@json_flag
def show(name: str) -> None:
    """Show pool NAME: its limit, the holders of its slots (fence, since when) and its waiters (in queue order)."""
    state = _require(_store(), name)

    def human() -> str:
        lines = [_summary_line(state)]
        lines += [f"  holds  fence={h.fence}  since={h.since}  {h.holder}" for h in state.holders]
        lines += [f"  waits  position={w.position}  since={w.since}  {w.holder}" for w in state.waiters]
        return "\n".join(lines)

    get_app().emit(state.to_dict(), human)


@pool.command("rm")
@click.argument("name")
@json_flag
def remove(name: str) -> None:
    """Remove pool NAME. Runs holding its slots finish; runs that name it no longer wait for it."""
    name = check_pool_name(name)
    if not _store().delete(name):
        raise NotFoundError(f"pool not found: {shown(name)}")
    get_app().emit({"removed": True, "name": name}, f"{name} removed")
