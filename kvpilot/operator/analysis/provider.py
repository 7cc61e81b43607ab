"""The `MetricProvider` interface the rollout sees, and the provider registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class ProviderUnavailable(RuntimeError):
    """The metrics backend could not be asked (unreachable, timed out, overloaded): no data, not zero."""


class QueryError(ValueError):
    """The backend refused the query itself (a bug in the query, not an outage)."""


class MetricProvider(Protocol):
    """Answers one instant query with one number."""

    name: str

    def query(self, promql: str, at: float | None = None) -> float | None:
        """The single value of `promql` at Unix time `at` (default: now); None when there is no data
        (no series, or NaN such as 0/0). Raises ProviderUnavailable when the backend cannot answer."""
        ...


_REGISTRY: dict[str, Callable[..., MetricProvider]] = {}


def register(name: str) -> Callable[[Callable[..., MetricProvider]], Callable[..., MetricProvider]]:
    def add(factory: Callable[..., MetricProvider]) -> Callable[..., MetricProvider]:
        _REGISTRY[name] = factory
        return factory
    return add


def provider_names() -> list[str]:
    return sorted(_REGISTRY)


def provider_for(name: str, **opts: Any) -> MetricProvider:
    """A provider by name, e.g. provider_for("prometheus", url="http://prometheus:9090")."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown metric provider {name!r}; available: {', '.join(provider_names())}") from None
    return factory(**opts)
