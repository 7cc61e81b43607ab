"""Runtime validation: the cosine test and fallback decision (cosine.py), and the runner that captures a served layer and asks each ApproximationCheck for the exact side (runner.py)."""
