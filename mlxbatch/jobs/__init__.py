"""File jobs: plan, execute into a journal or stream, verify; and the same over ranks."""
