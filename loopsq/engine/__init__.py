"""The engine: executing claimed runs, firing loop timers, maintenance, and the scheduler and worker processes."""
