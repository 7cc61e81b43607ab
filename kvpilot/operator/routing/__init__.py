"""Traffic routers behind one small interface (`Router`), chosen by name with `router_for`."""

from __future__ import annotations

from kvpilot.operator.routing import (
    httproute,  # noqa: F401  (registers "gateway-api")
    inferencepool,  # noqa: F401  (registers "inference-pool")
)
from kvpilot.operator.routing.base import (
    DEFAULT_ROUTER,
    Router,
    RouterUnavailable,
    RouteTarget,
    register,
    router_for,
    router_names,
)

__all__ = ["DEFAULT_ROUTER", "RouteTarget", "Router", "RouterUnavailable", "register", "router_for", "router_names"]
