"""The pure domain: loops, schedules, cron, durations, runs and their rules, workflow specs, targets, redaction.

No I/O: nothing here imports redis, sqlite3, subprocess or rq, and the time is passed in. May import only
``loopsq.errors`` and the standard library (plus croniter and zoneinfo for cron maths).
"""
