"""RQ entry points of loopsq (stable dotted paths such as ``worker.jobs.fire``) and the worker process start.

The logic they call lives in ``loopsq``; these names are a public interface for services that enqueue jobs.
May import every loopsq layer; nothing in loopsq imports ``worker``.
"""
