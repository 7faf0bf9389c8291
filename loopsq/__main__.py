"""``python -m loopsq``: the CLI."""

from loopsq.cli import main

main()
