"""The indexes the keyset pages of ``mirror/pages.py`` walk (added by their own migration in ``schema.migrate``)."""

MIGRATION = "0102_keyset_page_indexes"
DDL = (
    "CREATE INDEX IF NOT EXISTS idx_runs_created_id ON loop_runs(created_at DESC, id DESC)",
    "CREATE INDEX IF NOT EXISTS idx_runs_loop_created_id ON loop_runs(loop_id, created_at DESC, id DESC)",
    "CREATE INDEX IF NOT EXISTS idx_runs_status_created_id ON loop_runs(status, created_at DESC, id DESC)",
    "CREATE INDEX IF NOT EXISTS idx_loops_name_id ON loops(name, id)",
)
