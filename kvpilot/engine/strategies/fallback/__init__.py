"""The fallback reserve: bounded exact-path blocks that a sequence failing runtime validation moves to (reserve.py)."""
