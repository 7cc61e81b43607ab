"""What the operator's kopf-free code needs from outside: the API, an event sink and a clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvpilot.operator.kube import Kube

Emit = Callable[[str, str, str], None]  # (Normal|Warning, reason, message)


@dataclass(frozen=True)
class Context:
    """What one reconcile needs from outside: the API, an event sink and a clock."""

    kube: Kube
    emit: Emit
    now: Callable[[], str]
