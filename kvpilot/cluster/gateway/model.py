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
    """One match of one rule for one of the route's hostnames: exact headers (all must match; none:
    the catch-all) and a Host (None: any) -> weighted backends."""

    headers: tuple[tuple[str, str], ...]
    backends: tuple[Backend, ...]
    route: str  # namespace/name, for messages and ordering
    host: str | None = None  # an exact hostname or a wildcard "*.example.com"

    @property
    def header(self) -> tuple[str, str] | None:
        """The first header match (None: none), for entries with at most one."""
        return self.headers[0] if self.headers else None

    @property
    def marker(self) -> tuple[str | None, tuple[tuple[str, str], ...]]:
        """What the entry matches on: two entries with one marker are duplicates (the later loses)."""
        return self.host, tuple(sorted((name.lower(), value) for name, value in self.headers))


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
