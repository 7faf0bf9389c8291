"""``python -m worker``: start a loopsq worker (same as ``loopsq worker``)."""

import sys

from loopsq.cli import main

main(["worker", *sys.argv[1:]])
