"""What the gateway serves, as plain data: listeners, match entries and weighted backends."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backend:
    """One weighted backendRef; `error` names the status code it answers with when unresolvable."""

    namespace: str
    name: str
    port: int
    weight: int = 1
    error: int | None = None  # 500: invalid reference (Gateway API), 503: no ready endpoint


@dataclass(frozen=True)
class MatchEntry:
    """One match of one rule: an exact header (or none: the catch-all) -> weighted backends."""

    header: tuple[str, str] | None
    backends: tuple[Backend, ...]
    route: str  # namespace/name, for messages and ordering


@dataclass(frozen=True)
class Listener:
    """One HTTP listener of one Gateway, bound to the Gateway's loopback address."""

    gateway: str  # namespace/name
    name: str
    address: str
    port: int
    entries: tuple[MatchEntry, ...] = ()


@dataclass(frozen=True)
class Upstream:
    """The ready endpoints (ip:port) of one Service port."""

    namespace: str
    service: str
    port: int
    servers: tuple[str, ...] = field(default=())
