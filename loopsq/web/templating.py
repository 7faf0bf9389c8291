"""The dashboard's Jinja2 environment: templates shipped as package data in ``loopsq/web/templates``.

Autoescaping is on for every template, so run output, errors and names are always escaped.
"""

from __future__ import annotations

from pathlib import Path

from fastapi.templating import Jinja2Templates

TEMPLATE_DIR = Path(__file__).parent / "templates"

templates = Jinja2Templates(directory=str(TEMPLATE_DIR))
templates.env.autoescape = True
