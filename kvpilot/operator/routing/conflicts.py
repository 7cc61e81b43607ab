"""Two HTTPRoutes on one Gateway that match the same requests (pure): the older takes them all.

A route's *signature* is what every request it takes must carry: its Gateway, its hostnames (none:
any host) and the header matches every one of its rules shares (the shared-Gateway model header).
Two kvpilot routes with one signature cannot both be reached (Gateway API precedence gives ties to
the older route), which is what happened to the second service on a shared Gateway before
spec.route existed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Signature = tuple[str, frozenset[str], frozenset[tuple[str, str]]]


def signatures(route: Mapping[str, Any]) -> set[Signature]:
    """One signature per parent Gateway of `route`."""
    meta, spec = route.get("metadata") or {}, route.get("spec") or {}
    hosts = frozenset(h.lower() for h in spec.get("hostnames") or ())
    shared: set[tuple[str, str]] | None = None
    for rule in spec.get("rules") or ():
        for match in rule.get("matches") or ({},):
            headers = {(str(h.get("name", "")).lower(), str(h.get("value", ""))) for h in match.get("headers") or ()}
            shared = headers if shared is None else shared & headers
    common = frozenset(shared or ())
    out = set()
    for ref in spec.get("parentRefs") or ():
        if ref.get("kind", "Gateway") == "Gateway":
            out.add((f"{ref.get('namespace') or meta.get('namespace', '')}/{ref.get('name')}", hosts, common))
    return out


def conflicting_route(route: Mapping[str, Any], others: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The oldest other route with one of `route`'s signatures, when it is older than `route`."""
    mine, key = signatures(route), _key(route)
    rivals = [o for o in others if _key(o) != key and signatures(o) & mine]
    older = [o for o in rivals if _age(o) < _age(route)]
    return min(older, key=_age) if older else None


def _key(route: Mapping[str, Any]) -> tuple[str, str]:
    meta = route.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _age(route: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = route.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or "9999"), *_key(route))
