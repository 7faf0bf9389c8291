"""Operations: ``loopsq up`` and its process supervisor, the embedded Redis, service files, doctor, health
reports and the demo.

May import the engine and everything below it (executor, mirror, state, system, domain); never the interfaces.
"""
