"""The engine behind the API: its life cycle, the thread or process that steps it, admission and results."""
