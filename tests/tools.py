"""External tools some tests need, and the one-line skip that names the Debian package to install.

``.ci/run`` installs every one of them, and under CI (``CI=true``) ``tests/conftest.py`` turns any skip into a
failure, so a test can never go quietly unrun there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def skip_reason(tool: str, package: str) -> str:
    """The one line a test skipped for want of ``tool`` prints."""
    return f"needs {tool}: apt-get install {package}"


def needs_tool(tool: str, package: str) -> pytest.MarkDecorator:
    """Skip unless ``tool`` (a command on PATH, or an absolute path) exists; the reason names ``package``."""
    present = Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None
    return pytest.mark.skipif(not present, reason=skip_reason(tool, package))
