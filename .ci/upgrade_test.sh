#!/usr/bin/env bash
# The upgrade test (issue #28) against the previous release installed in a venv of its own, as a deployment has
# it: the previous release's source (git archive of PREVIOUS) is pip-installed with its own dependency ranges into
# a fresh venv, and tests/integration/test_upgrade.py runs its processes with that venv's Python
# (LOOPSQ_UPGRADE_FROM_PYTHON) beside HEAD's. The suite also runs that test on HEAD's venv alone.
#
# PREVIOUS is 9923ab3 (0.1.0, state layout v1) until a release changes the layout again: then that release's tag,
# with a test of its own transition.
set -euo pipefail
cd "$(dirname "$0")/.."
PREVIOUS="${LOOPSQ_UPGRADE_FROM:-9923ab3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/loopsq-upgrade.XXXXXX")"
trap 'rm -rf "$work"' EXIT
git archive --format=tar "$PREVIOUS" | tar -x -C "$work" -f - --one-top-level=src
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
# (redis-py below 8.2, as this release pins: 0.1.0 allowed <9, and with 8.2.0 RQ's worker can wait out its pubsub
# thread's 60 s sleep on SIGTERM, which would fail this test on the old release's account, not the upgrade's)
"$work/venv/bin/python" -m pip install -q "$work/src" 'redis<8.2'
# (-m loopsq run from the repository would import HEAD's package from the working directory: ask from $work)
was="$(cd "$work" && env -u PYTHONPATH "$work/venv/bin/python" -m loopsq --version)"
echo "ci: upgrade test from $PREVIOUS ($was) to HEAD ($(.venv/bin/python -m loopsq --version))"
CI=true LOOPSQ_UPGRADE_FROM_PYTHON="$work/venv/bin/python" .venv/bin/python -m pytest -n 0 -q tests/integration/test_upgrade.py
