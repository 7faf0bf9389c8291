"""State in Redis, the source of truth: atomic transitions (one Lua script each, with exactly one change-stream
entry), every key name (``keys``) and the connection (``connection``).

May import ``loopsq.domain`` and ``loopsq.errors``; never the mirror, the engine or anything above.
"""
