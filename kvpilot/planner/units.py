"""Human-readable byte counts (binary units, as nvidia-smi and Kubernetes quantities use)."""

from __future__ import annotations


def human_bytes(n: int | float) -> str:
    """`524288` -> `512 KiB`, `-3221225472` -> `-3.00 GiB`."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B" or value == int(value):
                return f"{sign}{int(value)} {unit}"
            return f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
