"""State in Redis, the source of truth: atomic transitions, each with exactly one change-stream entry."""
