"""loopsq: recurring jobs, coding-agent runs and workflows on Redis workers."""

__version__ = "0.2.0"
