"""The HTTP interface: JSON API, dashboard, metrics and the queue view (``loopsq web``).

``create_app(WebSettings(...))`` builds the ASGI app; ``loopsq/cli/web_cmd.py`` serves it with uvicorn.
An interface: may import every layer below it (ops, engine, executor, mirror, state, system, domain), never the CLI.
"""

from __future__ import annotations

from loopsq.web.app import create_app
from loopsq.web.context import WebSettings

__all__ = ["WebSettings", "create_app"]
