"""Eviction for long context: sinks + window or ladder (policy.py) and its runtime check (check.py)."""
