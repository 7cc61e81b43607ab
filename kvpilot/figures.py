"""How a rollout figure (a check's canary, stable or threshold value) is written for people."""

from __future__ import annotations

from typing import Any


def figure(value: Any) -> str:
    """'-' for no data, 4 significant digits for a float, anything else as it is."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
