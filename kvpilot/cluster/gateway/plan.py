"""Pure: the cluster's Gateways, HTTPRoutes, Services and EndpointSlices -> what nginx serves and
what status each Gateway and route gets."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpilot.cluster.gateway import GATEWAY_CLASS, GROUP
from kvpilot.cluster.gateway.model import Listener, MatchEntry, Upstream
from kvpilot.cluster.gateway.route_check import Condition, check_rules, route_conditions

ADDRESS_POOL = ipaddress.ip_network("127.0.1.0/24")  # one loopback address per Gateway


@dataclass(frozen=True)
class ParentStatus:
    """The conditions of one route for one of its parentRefs that points at a local Gateway."""

    parent_ref: dict[str, Any]
    conditions: tuple[Condition, ...]


@dataclass
class Plan:
    listeners: list[Listener] = field(default_factory=list)
    upstreams: dict[tuple[str, str, int], Upstream] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)  # gateway key -> loopback address
    gateway_conditions: dict[str, list[Condition]] = field(default_factory=dict)
    listener_status: dict[str, list[tuple[dict, int, list[Condition]]]] = field(default_factory=dict)
    route_parents: dict[str, list[ParentStatus]] = field(default_factory=dict)


def key(obj: Mapping[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def _age(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["metadata"].get("creationTimestamp", ""), key(obj)


def allocate_addresses(gateways: Sequence[Mapping[str, Any]], previous: Mapping[str, str]) -> dict[str, str]:
    """A stable loopback address per Gateway: spec.addresses if it asks for a 127/8 IP, else the one
    it had (previous run or its status), else the next free one in 127.0.1.0/24."""
    out: dict[str, str] = {}
    for gw in sorted(gateways, key=_age):
        wanted = [a.get("value") for a in gw.get("spec", {}).get("addresses") or []
                  if a.get("type", "IPAddress") == "IPAddress"]
        had = [a.get("value") for a in (gw.get("status") or {}).get("addresses") or []]
        for candidate in [*wanted, previous.get(key(gw)), *had]:
            if candidate and _loopback(candidate) and candidate not in out.values():
                out[key(gw)] = candidate
                break
        else:
            free = next(str(ip) for ip in ADDRESS_POOL.hosts() if str(ip) not in out.values())
            out[key(gw)] = free
    return out


def _loopback(value: str) -> bool:
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def _namespace_allowed(listener: Mapping[str, Any], gw_ns: str, route_ns: str,
                       namespaces: Mapping[str, Mapping[str, str]]) -> bool:
    allowed = (listener.get("allowedRoutes") or {}).get("namespaces") or {}
    source = allowed.get("from", "Same")
    if source == "All":
        return True
    if source == "Selector":
        wanted = (allowed.get("selector") or {}).get("matchLabels") or {}
        labels = namespaces.get(route_ns, {})
        return all(labels.get(k) == v for k, v in wanted.items())
    return gw_ns == route_ns


def _ours(gateways: Sequence[dict], classes: Sequence[dict], controller: str) -> list[dict]:
    names = {c["metadata"]["name"] for c in classes if c.get("spec", {}).get("controllerName") == controller}
    return [g for g in gateways if g.get("spec", {}).get("gatewayClassName") in names]


def _host_rank(host: str | None) -> tuple[int, int]:
    """Gateway API hostname precedence: the longest exact hostname, then the longest wildcard, then none."""
    if host is None:
        return 2, 0
    return (1 if host.startswith("*.") else 0), -len(host)


def _order(entries: list[tuple[tuple, MatchEntry]]) -> tuple[MatchEntry, ...]:
    """Gateway API precedence: the most specific hostname, then the most header matches, then the
    oldest route, then rule order; a later entry matching on the same host and headers loses."""
    seen: set[tuple] = set()
    out = []
    for _, entry in sorted(entries, key=lambda e: (_host_rank(e[1].host), -len(e[1].headers), e[0])):
        if entry.marker not in seen:
            seen.add(entry.marker)
            out.append(entry)
    return tuple(out)


def build_plan(*, classes: Sequence[dict], gateways: Sequence[dict], routes: Sequence[dict],
               services: Mapping[tuple[str, str], dict], slices: Mapping[tuple[str, str], list[dict]],
               namespaces: Mapping[str, Mapping[str, str]], previous_addresses: Mapping[str, str],
               controller: str) -> Plan:
    plan = Plan()
    mine = {key(g): g for g in _ours(gateways, classes, controller)}
    plan.addresses = allocate_addresses(list(mine.values()), previous_addresses)
    served: dict[tuple[str, str], list[tuple[tuple, MatchEntry]]] = {}
    attached: dict[tuple[str, str], int] = {}
    for route in sorted(routes, key=_age):
        check = check_rules(route, services)
        route_ns = route["metadata"]["namespace"]
        parents = []
        for ref in route.get("spec", {}).get("parentRefs") or []:
            if (ref.get("group", GROUP), ref.get("kind", "Gateway")) != (GROUP, "Gateway"):
                continue
            gw_key = f"{ref.get('namespace') or route_ns}/{ref.get('name')}"
            gw = mine.get(gw_key)
            if gw is None:
                continue
            listeners = [lst for lst in gw["spec"].get("listeners", [])
                         if ref.get("sectionName") in (None, lst.get("name"))
                         and ref.get("port") in (None, lst.get("port"))]
            allowed = [lst for lst in listeners if lst.get("protocol") == "HTTP"
                       and _namespace_allowed(lst, gw["metadata"]["namespace"], route_ns, namespaces)]
            problem = None
            if not listeners:
                problem = ("NoMatchingParent", f"Gateway {gw_key} has no listener matching sectionName="
                           f"{ref.get('sectionName')} port={ref.get('port')}")
            elif not allowed:
                problem = ("NotAllowedByListeners", f"no HTTP listener of Gateway {gw_key} admits routes from "
                           f"namespace {route_ns} (allowedRoutes.namespaces)")
            accepted, resolved = route_conditions(check, problem)
            parents.append(ParentStatus(dict(ref), (accepted, resolved)))
            if accepted.status != "True":
                continue
            for lst in allowed:
                lkey = (gw_key, lst["name"])
                attached[lkey] = attached.get(lkey, 0) + 1
                for i, entry in enumerate(check.entries):
                    served.setdefault(lkey, []).append(((*_age(route), i), entry))
        if parents:
            plan.route_parents[key(route)] = parents
    for gw_key, gw in sorted(mine.items()):
        address = plan.addresses[gw_key]
        statuses = []
        for lst in gw["spec"].get("listeners", []):
            lkey = (gw_key, lst["name"])
            kinds = [{"group": GROUP, "kind": "HTTPRoute"}]
            if lst.get("protocol") != "HTTP":
                conds = [Condition("Accepted", "False", "UnsupportedProtocol",
                                   f"protocol {lst.get('protocol')} is not supported by the local gateway (HTTP only)"),
                         Condition("Programmed", "False", "Invalid", "listener not served")]
                statuses.append(({"name": lst["name"], "supportedKinds": []}, 0, conds))
                continue
            entries = _order(served.get(lkey, []))
            plan.listeners.append(Listener(gw_key, lst["name"], address, int(lst["port"]), entries))
            conds = [Condition("Accepted", "True", "Accepted", "listener accepted"),
                     Condition("ResolvedRefs", "True", "ResolvedRefs", "no references to resolve"),
                     Condition("Programmed", "True", "Programmed", f"nginx listens on {address}:{lst['port']}")]
            statuses.append(({"name": lst["name"], "supportedKinds": kinds}, attached.get(lkey, 0), conds))
        plan.listener_status[gw_key] = statuses
        plan.gateway_conditions[gw_key] = [
            Condition("Accepted", "True", "Accepted", f"served by {controller} (class {GATEWAY_CLASS} or another "
                      "of its classes)"),
            Condition("Programmed", "True", "Programmed", f"address {address}")]
    plan.upstreams = resolve_upstreams(plan.listeners, services, slices)
    return plan


def resolve_upstreams(listeners: Sequence[Listener], services: Mapping[tuple[str, str], dict],
                      slices: Mapping[tuple[str, str], list[dict]]) -> dict[tuple[str, str, int], Upstream]:
    """Ready endpoint addresses of every Service port a served entry names (EndpointSlices)."""
    out: dict[tuple[str, str, int], Upstream] = {}
    for lst in listeners:
        for entry in lst.entries:
            for b in entry.backends:
                ukey = (b.namespace, b.name, b.port)
                if b.error is not None or ukey in out:
                    continue
                service = services.get((b.namespace, b.name), {})
                port_name = next((p.get("name", "") for p in service.get("spec", {}).get("ports", [])
                                  if int(p.get("port", 0)) == b.port), "")
                servers = set()
                for sl in slices.get((b.namespace, b.name), []):
                    number = next((p.get("port") for p in sl.get("ports") or [] if p.get("name", "") == port_name),
                                  None)
                    if number is None:
                        continue
                    for ep in sl.get("endpoints") or []:
                        if (ep.get("conditions") or {}).get("ready") is False:
                            continue
                        servers.update(f"{addr}:{number}" for addr in ep.get("addresses", []))
                out[ukey] = Upstream(b.namespace, b.name, b.port, tuple(sorted(servers)))
    return out
