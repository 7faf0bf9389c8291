"""A deployment for the MCP tests, driven with the SDK's own client: a real redis-server (the session's), a
``loopsq worker`` process, two ``loopsq web`` processes (mutations allowed, and not), and ``loopsq mcp``
subprocesses over stdio, each given the Redis URL explicitly.

``Deployment.run(transport, scenario)`` opens a client session over ``stdio`` or ``http`` and runs the async
``scenario(client)`` in it; every session is bounded by a deadline, so a hang fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import httpx2
import mcp_types as types
import redis
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from loopsq.engine import timers
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import free_port

T = TypeVar("T")

TOKEN = "mcp-test-token-0123456789abcdef"
ALLOW = {"LOOPSQ_MCP_ALLOW_MUTATIONS": "true"}
TRANSPORTS = ("stdio", "http")
#: The longest a test's client session may take.
SESSION_TIMEOUT_S = 90
#: Keys that live processes rewrite every second (liveness, heartbeats): not part of "nothing changed".
VOLATILE_PREFIXES = ("loopsq:worker:", "loopsq:hosts", "loopsq:scheduler", "loopsq:seen", "loopsq:recovery-grace",
                     "loopsq:cancel:",  # a worker deletes a run's cancel request when the run ends
                     "loopsq:live:",  # a run still going (an earlier test's, on a loaded machine) streams its output
                     "loopsq:web-session:")


@dataclass
class Deployment:
    """The processes of one test module and how to reach the MCP server over each transport."""

    cluster: Cluster
    web: str
    web_refusing: str

    @property
    def client(self) -> redis.Redis:
        return self.cluster.client

    def stdio_params(self, *, allow: bool = True, redis_url: str | None = None,
                     env: dict[str, str] | None = None) -> StdioServerParameters:
        """``loopsq --redis-url URL --data-dir DIR mcp`` with mutations allowed or not."""
        base = {k: v for k, v in self.cluster.env.items() if k != "LOOPSQ_MCP_ALLOW_MUTATIONS"}
        full = {**base, **(ALLOW if allow else {}), **(env or {})}
        data_dir = str(self.cluster.tmp / "mcp-data")
        return StdioServerParameters(
            command=sys.executable, cwd=str(self.cluster.tmp), env=full,
            args=["-m", "loopsq", "--redis-url", redis_url or self.cluster.url, "--data-dir", data_dir, "mcp"])

    @asynccontextmanager
    async def session(self, transport: str, *, allow: bool = True, token: str | None = TOKEN,
                      params: StdioServerParameters | None = None) -> AsyncIterator[Client]:
        """A client session over ``transport`` (``stdio``: a new ``loopsq mcp`` process; ``http``: a web process)."""
        if transport == "stdio":
            async with Client(params or self.stdio_params(allow=allow)) as client:
                yield client
            return
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        url = (self.web if allow else self.web_refusing) + "/mcp"
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            yield client

    def run(self, transport: str, scenario: Callable[[Client], Awaitable[T]], **options: Any) -> T:
        """Run ``scenario`` in a session over ``transport``; fails after ``SESSION_TIMEOUT_S``."""

        async def main() -> T:
            with anyio.fail_after(SESSION_TIMEOUT_S):
                async with self.session(transport, **options) as client:
                    return await scenario(client)

        return anyio.run(main)

    def state(self) -> dict[Any, Any]:
        """loopsq's keys (but the volatile ones) and RQ's queues, with their types and values: what "nothing was
        written" compares. (RQ's own job and registry keys expire on RQ's schedule, so they are left out; a job a
        tool enqueued shows in the queue, or in the run records once a worker took it.)"""
        raw = timers.raw_from(self.client)
        try:
            out: dict[Any, Any] = {}
            for key in sorted(raw.keys("*")):
                name = key.decode()
                if name.startswith(VOLATILE_PREFIXES) or (name.startswith("rq:") and
                                                          not name.startswith("rq:queue:")):
                    continue
                kind = raw.type(key).decode()
                readers: dict[str, Callable[[bytes], Any]] = {
                    "string": raw.get, "hash": raw.hgetall, "list": lambda k: raw.lrange(k, 0, -1),
                    "set": lambda k: sorted(raw.smembers(k)), "zset": lambda k: raw.zrange(k, 0, -1, withscores=True),
                    "stream": lambda k: [i for i, _ in raw.xrange(k)]}
                out[key] = (kind, readers[kind](key))
            return out
        finally:
            raw.close()


def text(result: types.CallToolResult) -> str:
    """The one text block of a tool result."""
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent), result
    return result.content[0].text


def ok(result: types.CallToolResult) -> dict[str, Any]:
    """A successful tool result's JSON (its text and its structured content agree)."""
    assert not result.is_error, text(result)
    payload = json.loads(text(result))
    assert result.structured_content == payload
    return payload  # type: ignore[no-any-return]


def error(result: types.CallToolResult) -> str:
    """A tool error's one line."""
    assert result.is_error, text(result)
    message = text(result)
    assert "\n" not in message, message
    return message


def start_web(cluster: Cluster, name: str, env: dict[str, str]) -> str:
    """A ``loopsq web`` process on a free port (waits until it answers); returns its base URL."""
    port = free_port()
    log = cluster.tmp / f"{name}.log"
    full = {k: v for k, v in cluster.env.items() if k != "LOOPSQ_MCP_ALLOW_MUTATIONS"}
    full.update(LOOPSQ_API_TOKEN=TOKEN, LOOPSQ_DATA_DIR=str(cluster.tmp / f"{name}-data"), **env)
    with log.open("wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "loopsq", "--redis-url", cluster.url, "web", "--port",
                                  str(port), "--no-rq-dashboard"], env=full, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    proc = Proc(name, popen, log)
    cluster.procs.append(proc)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.alive(), proc.text()
        try:
            return httpx.get(f"{base}/api/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    cluster.wait_until(answers, 30, f"{name} to answer")
    return base


def open_deployment(url: str, tmp: Path, setup: Callable[[Cluster], None] | None = None) -> Iterator[Deployment]:
    """A worker, the two web processes, and ``setup(cluster)`` run first; everything stopped afterwards."""
    for cluster in open_cluster(url, tmp):
        os.environ.pop("LOOPSQ_MCP_ALLOW_MUTATIONS", None)
        cluster.start("worker")
        if setup is not None:
            setup(cluster)
        yield Deployment(cluster, start_web(cluster, "web", ALLOW), start_web(cluster, "web-refusing", {}))


def wait_for(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
