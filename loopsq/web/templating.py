"""The dashboard's Jinja2 environment: templates shipped as package data in ``loopsq/web/templates``.

Autoescaping is on for every template, so run output, errors and names are always escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates

from loopsq.domain.run_rules import USER_CANCEL_ERROR

TEMPLATE_DIR = Path(__file__).parent / "templates"

templates = Jinja2Templates(directory=str(TEMPLATE_DIR))
templates.env.autoescape = True


def run_status_shown(run: Mapping[str, Any]) -> str:
    """The word a loop run's status is shown as: ``cancelled`` for a run a user cancelled (stored ``failed`` with
    an error that starts with ``cancelled by user``, as the reference stores it), as a cancelled workflow run is
    shown; the stored status otherwise."""
    status = str(run.get("status"))
    error = run.get("error")
    if status == "failed" and isinstance(error, str) and error.startswith(USER_CANCEL_ERROR):
        return "cancelled"
    return status


templates.env.globals["run_status_shown"] = run_status_shown
