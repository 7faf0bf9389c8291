"""Every assumption loopsq makes about RQ's and rq-scheduler's internals, each under a name, and nowhere else.

RQ changes its internals at most minor releases (1.13, 1.14, 2.0, 2.11, 3.0), and rq-scheduler is near its end:
so everything loopsq relies on beyond their documented API lives in this package, one name per assumption with a
docstring saying what RQ does, and ``tests/contract/test_rq_assumptions.py`` checks each against the installed
version (a new release that changes one fails one named test). The differences between the RQ lines loopsq runs
on (2.12 and 3.x) are handled here only. An import-linter contract (pyproject) keeps ``rq`` and ``rq_scheduler``
imported by this package alone.

- ``names``: key names, hash fields, registries' layout, RQ's time format, the version in use.
- ``scripts``: Lua scripts that do RQ's or rq-scheduler's bookkeeping in one round trip.
- ``jobs``: RQ's queues and jobs, rq-scheduler's timer store (``MsScheduler``), a failed job as RQ records it.
- ``worker``: the RQ worker class loopsq's worker builds on (``CompatWorker``); ``worker_parts``: its job heartbeats,
  its lean job delete, the log texts of RQ's it filters.
"""
