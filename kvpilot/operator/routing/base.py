"""The `Router` interface the rollout state machine sees, `RouteTarget`, and the router registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_ROUTER = "gateway-api"
DEFAULT_HEADER = "X-Model-Strategy"


class RouterUnavailable(RuntimeError):
    """Traffic cannot be split here (e.g. the Gateway API CRDs are missing); `reason` is CamelCase."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class RouteTarget:
    """Where one InferenceService's traffic goes: the Gateway it attaches to and its two tracks.

    A request whose `header_name` equals `canary_header_value` goes to canary only, one with
    `stable_header_value` to stable only (internal testers pin either track; an empty value
    means no pin for that track); every other request is split by weight. With `hostnames` and/or
    `model_header`, every rule also requires them, so several services share one Gateway.
    """

    gateway_name: str
    gateway_namespace: str
    stable_service: str
    canary_service: str
    port: int = 8000
    header_name: str = DEFAULT_HEADER
    canary_header_value: str = ""
    stable_header_value: str = ""
    # A shared Gateway: only requests for these hosts, and/or whose `model_header` names `model`.
    hostnames: tuple[str, ...] = ()
    model_header: str = ""
    model: str = ""

    def __post_init__(self) -> None:
        for field in ("gateway_name", "gateway_namespace", "stable_service", "canary_service", "header_name"):
            if not getattr(self, field):
                raise ValueError(f"RouteTarget.{field} is empty; it names a Kubernetes object or header")
        if self.stable_service == self.canary_service:
            raise ValueError(f"stable and canary Services are both {self.stable_service!r}; they must differ")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"RouteTarget.port {self.port} is not a port (1-65535)")
        if self.model_header and not self.model:
            raise ValueError(f"RouteTarget.model is empty: {self.model_header} must equal a model name")
        if self.model_header and self.model_header.lower() == self.header_name.lower():
            raise ValueError(f"the model header and the pin header are both {self.header_name!r}; they must differ")
        if self.canary_header_value and self.canary_header_value == self.stable_header_value:
            raise ValueError(f"{self.header_name}: the canary and stable pins are both {self.canary_header_value!r}; "
                             "a pinned request must name one track, so give the two strategies different values")


def check_weight(canary_weight: int) -> int:
    if isinstance(canary_weight, bool) or not isinstance(canary_weight, int) or not 0 <= canary_weight <= 100:
        raise ValueError(f"canary weight must be an integer percentage 0-100, got {canary_weight!r}")
    return canary_weight


class Router(Protocol):
    """Moves traffic between the stable and canary tracks of one InferenceService."""

    name: str

    def available(self, kube: Any) -> tuple[bool, str, str]:
        """(usable, reason, message); reason/message explain what is missing when not usable."""
        ...

    def set_weight(self, kube: Any, owner: Mapping[str, Any], target: RouteTarget, canary_weight: int) -> None:
        """Send `canary_weight`% to canary and the rest to stable, in one write."""
        ...

    def current_weight(self, kube: Any, namespace: str, name: str) -> int | None:
        """The canary weight the route holds now, or None when there is no route."""
        ...


_REGISTRY: dict[str, Callable[[], Router]] = {}


def register(name: str) -> Callable[[Callable[[], Router]], Callable[[], Router]]:
    def add(factory: Callable[[], Router]) -> Callable[[], Router]:
        _REGISTRY[name] = factory
        return factory
    return add


def router_names() -> list[str]:
    return sorted(_REGISTRY)


def router_for(name: str = DEFAULT_ROUTER) -> Router:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; available: {', '.join(router_names())}") from None
    return factory()
