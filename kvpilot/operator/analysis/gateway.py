"""The gateway's side of a canary: requests the Gateway answered for each track's Service, and how
many of them were 5xx. A 502/503/504 the gateway returns itself (a crashed pod, no ready endpoint,
an upstream timeout) never reaches the engine, so the engine's own error rate cannot see it.

Which metric holds those counts depends on the Gateway implementation, so the two PromQL
queries are templates (`string.Template`: `$namespace`, `$service` the InferenceService,
`$backend` the track's Service `<name>` or `<name>-canary`, `$track`, `$window`), chosen by
`--gateway-metrics NAME` or given with `--gateway-requests-query` / `--gateway-errors-query`.
Each must return one number: requests (all, or 5xx) in the window.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

PLACEHOLDERS = ("namespace", "service", "backend", "track", "window")


@dataclass(frozen=True)
class GatewayQueries:
    """Two PromQL templates: every request the gateway answered for a backend, and its 5xx."""

    requests: str
    errors: str
    source: str = "custom"  # the preset's name, for messages

    def __post_init__(self) -> None:
        for label, text in (("requests", self.requests), ("errors", self.errors)):
            try:
                string.Template(text).substitute({k: "x" for k in PLACEHOLDERS})
            except (KeyError, ValueError) as exc:
                raise ValueError(f"gateway {label} query {text!r}: unknown or malformed placeholder {exc}; "
                                 f"use ${', $'.join(PLACEHOLDERS)}") from None

    def render(self, namespace: str, service: str, track: str, window: str) -> tuple[str, str]:
        values = {"namespace": namespace, "service": service, "track": track, "window": window,
                  "backend": service if track == "stable" else f"{service}-{track}"}
        return (string.Template(self.requests).substitute(values), string.Template(self.errors).substitute(values))


def _pair(metric: str, selector: str, code: str) -> tuple[str, str]:
    requests = f"sum(increase({metric}{{{selector}}}[$window]))"
    return requests, f"sum(increase({metric}{{{selector},{code}}}[$window]))"


PRESETS = {
    # kvpilot's local gateway stand-in (kvpilot/cluster/gateway/metrics.py)
    "kvpilot-local": GatewayQueries(*_pair("kvpilot_gateway_requests_total",
                                           'namespace="$namespace",service="$backend"', 'code=~"5.."'),
                                    source="kvpilot-local"),
    # Istio's standard metric as its ingress gateway reports it (reporter="source": a client proxy or
    # a gateway), by destination Service
    "istio": GatewayQueries(*_pair("istio_requests_total",
                                   'reporter="source",destination_service_namespace="$namespace",'
                                   'destination_service_name="$backend"', 'response_code=~"5.."'),
                            source="istio"),
}


def gateway_queries(preset: str = "", requests: str = "", errors: str = "") -> GatewayQueries | None:
    """From the operator's flags: a preset, or both templates, or nothing (the check is off)."""
    if preset and (requests or errors):
        raise ValueError("--gateway-metrics and --gateway-requests-query/--gateway-errors-query exclude each other")
    if preset:
        if preset not in PRESETS:
            raise ValueError(f"--gateway-metrics {preset!r}: known are {', '.join(sorted(PRESETS))} (or give "
                             "--gateway-requests-query and --gateway-errors-query)")
        return PRESETS[preset]
    if bool(requests) != bool(errors):
        raise ValueError("--gateway-requests-query and --gateway-errors-query go together: give both")
    return GatewayQueries(requests, errors) if requests else None
