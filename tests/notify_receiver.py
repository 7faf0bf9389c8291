"""A real webhook receiver for notification tests: an ``http.server`` on a free loopback port, in a thread, that
checks each POST's Standard Webhooks signature with the endpoint's secret and records what it accepted.

``down()`` closes the port (a sender meets a refused connection) and ``up()`` opens the same port again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks' check, written independently of loopsq's ``sign``."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(sig.split(",", 1)[1], expected)
               for sig in headers.get("webhook-signature", "").split() if sig.startswith("v1,"))


@dataclass
class Delivery:
    """One accepted POST: its webhook id, timestamp and JSON body."""

    id: str
    timestamp: int
    body: dict[str, Any]


@dataclass
class Receiver:
    """The receiver; ``secret`` must be set before events arrive (a POST failing the check gets 401)."""

    secret: str = ""
    port: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    rejected: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                ok = bool(receiver.secret) and "webhook-id" in headers and verify(receiver.secret, headers, body)
                with receiver._lock:
                    if ok:
                        receiver.deliveries.append(Delivery(headers["webhook-id"],
                                                            int(headers["webhook-timestamp"]), json.loads(body)))
                    else:
                        receiver.rejected += 1
                self.send_response(204 if ok else 401)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def types(self) -> list[str]:
        with self._lock:
            return [d.body["type"] for d in self.deliveries]

    def received(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)
