"""Pure checks of one HTTPRoute: which part kvpilot's local gateway serves, and why not the rest.

Served: `hostnames` (exact or `*.` wildcards, matched on the Host header) and rules whose matches
are exact headers (any number, all must match; none: the catch-all) on the path prefix "/" (the
API server's default), with weighted `Service` backendRefs in the route's namespace. Anything else is
reported in `status.parents` the way the Gateway API prescribes: an unsupported field makes the
route `Accepted=False` (reason `UnsupportedValue`), an unresolvable backend makes it
`ResolvedRefs=False` (`InvalidKind`, `RefNotPermitted`, `BackendNotFound`) and that backend's
share of requests is answered with HTTP 500.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpilot.cluster.gateway.model import Backend, MatchEntry

HEADER_NAME = re.compile(r"^[A-Za-z0-9-]+$")
HEADER_VALUE = re.compile(r"^[A-Za-z0-9._:/+=@,-]*$")
HOSTNAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ROUTE_FIELDS = {"parentRefs", "rules", "hostnames"}
RULE_FIELDS = {"matches", "backendRefs", "name"}
MATCH_FIELDS = {"path", "headers"}
BACKEND_FIELDS = {"group", "kind", "name", "namespace", "port", "weight"}


@dataclass(frozen=True)
class Condition:
    """One status condition of a route parent (`status` is "True" or "False")."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class RuleCheck:
    """The match entries a route yields, and what in it cannot be served."""

    entries: tuple[MatchEntry, ...]
    unsupported: tuple[str, ...]
    unresolved: tuple[tuple[str, str], ...]  # (reason, message)


def _unsupported_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> list[str]:
    return [f"{where}.{key} is not supported by the local gateway (supported: {', '.join(sorted(allowed))})"
            for key in sorted(obj) if key not in allowed and obj[key] not in (None, [], {})]


def _match_headers(match: Mapping[str, Any], where: str, problems: list[str]) -> tuple[tuple[str, str], ...]:
    problems += _unsupported_keys(match, MATCH_FIELDS, where)
    path = match.get("path")
    if path and (path.get("type", "PathPrefix"), path.get("value", "/")) != ("PathPrefix", "/"):
        problems.append(f"{where}.path {path.get('type')} {path.get('value')!r} is not supported "
                        "(only the default PathPrefix \"/\")")
    out = []
    for i, header in enumerate(match.get("headers") or []):
        if header.get("type", "Exact") != "Exact":
            problems.append(f"{where}.headers[{i}].type {header.get('type')!r} is not supported (only Exact)")
        name = str(header.get("name", ""))
        if not HEADER_NAME.match(name):
            problems.append(f"{where}.headers[{i}].name {name!r}: only letters, digits and '-' are supported")
        value = str(header.get("value", ""))
        if not HEADER_VALUE.match(value):
            problems.append(f"{where}.headers[{i}].value {value!r}: only letters, digits and ._:/+=@,- are supported")
        out.append((name, value))
    if len({name.lower() for name, _ in out}) < len(out):
        problems.append(f"{where}.headers names one header twice (the Gateway API forbids it)")
    return tuple(out)


def _hostnames(spec: Mapping[str, Any], problems: list[str]) -> tuple[str | None, ...]:
    """spec.hostnames (lowercased, as nginx's $host), or (None,): every host."""
    out = []
    for i, name in enumerate(spec.get("hostnames") or []):
        host = str(name).lower()
        if not HOSTNAME.match(host):
            problems.append(f"spec.hostnames[{i}] {name!r} is not a hostname (RFC 1123, optionally '*.' first)")
        out.append(host)
    return tuple(out) or (None,)


def _backend(ref: Mapping[str, Any], namespace: str, services: Mapping[tuple[str, str], dict],
             where: str, problems: list[str], unresolved: list[tuple[str, str]]) -> Backend | None:
    problems += _unsupported_keys(ref, BACKEND_FIELDS, where)
    weight = int(ref.get("weight", 1))
    name, port = str(ref.get("name", "")), int(ref.get("port") or 0)
    group, kind = ref.get("group", ""), ref.get("kind", "Service")
    if (group or "", kind) != ("", "Service"):
        unresolved.append(("InvalidKind", f"{where}: {group or 'core'}/{kind} {name!r}: only core Services"))
        return Backend(namespace, name, port, weight, error=500)
    ref_ns = ref.get("namespace") or namespace
    if ref_ns != namespace:
        unresolved.append(("RefNotPermitted", f"{where}: Service {ref_ns}/{name} is in another namespace; the "
                           "local gateway supports no ReferenceGrant, use a Service in the route's namespace"))
        return Backend(ref_ns, name, port, weight, error=500)
    service = services.get((namespace, name))
    if service is None:
        unresolved.append(("BackendNotFound", f"{where}: Service {namespace}/{name} does not exist"))
        return Backend(namespace, name, port, weight, error=500)
    ports = [int(p.get("port", 0)) for p in service.get("spec", {}).get("ports", [])]
    if port not in ports:
        unresolved.append(("BackendNotFound", f"{where}: Service {namespace}/{name} has no port {port} "
                           f"(its ports: {ports})"))
        return Backend(namespace, name, port, weight, error=500)
    return Backend(namespace, name, port, weight)


def check_rules(route: Mapping[str, Any], services: Mapping[tuple[str, str], dict]) -> RuleCheck:
    """Every match of every rule as a `MatchEntry`, plus the unsupported and unresolvable parts."""
    meta, spec = route["metadata"], route.get("spec", {})
    namespace, key = meta["namespace"], f"{meta['namespace']}/{meta['name']}"
    problems = _unsupported_keys(spec, ROUTE_FIELDS, "spec")
    hosts = _hostnames(spec, problems)
    unresolved: list[tuple[str, str]] = []
    entries: list[MatchEntry] = []
    for i, rule in enumerate(spec.get("rules") or [{}]):
        where = f"spec.rules[{i}]"
        problems += _unsupported_keys(rule, RULE_FIELDS, where)
        backends = tuple(b for j, ref in enumerate(rule.get("backendRefs") or [])
                         if (b := _backend(ref, namespace, services, f"{where}.backendRefs[{j}]", problems,
                                           unresolved)) is not None)
        for k, match in enumerate(rule.get("matches") or [{}]):
            headers = _match_headers(match, f"{where}.matches[{k}]", problems)
            entries += [MatchEntry(headers, backends, key, host) for host in hosts]
    return RuleCheck(tuple(entries), tuple(problems), tuple(unresolved))


def route_conditions(check: RuleCheck, parent_problem: tuple[str, str] | None) -> tuple[Condition, Condition]:
    """(Accepted, ResolvedRefs) for one parent: a parent problem or an unsupported field rejects."""
    if parent_problem is not None:
        accepted = Condition("Accepted", "False", *parent_problem)
    elif check.unsupported:
        accepted = Condition("Accepted", "False", "UnsupportedValue", "; ".join(check.unsupported))
    else:
        accepted = Condition("Accepted", "True", "Accepted", "served by the local gateway (nginx)")
    if check.unresolved:
        reason = check.unresolved[0][0]
        resolved = Condition("ResolvedRefs", "False", reason, "; ".join(m for _, m in check.unresolved))
    else:
        resolved = Condition("ResolvedRefs", "True", "ResolvedRefs", "every backendRef resolved")
    return accepted, resolved
