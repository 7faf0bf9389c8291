"""The engine: timers (``timers``, the one module importing rq-scheduler), claiming and executing runs
(``runner``, ``workflow_runner``), triggers, recovery and maintenance, and the scheduler and worker processes.

May import the executor, the mirror, state, system and domain; only the engine and ``worker/`` import RQ.
"""
