"""Synthetic load for low-traffic services (Flagger's load tester, inside the operator).

At 1% of 2 requests/s a canary sees about one request a minute: every analysis is inconclusive
(fewer than minRequests) and the rollout rolls back having learned nothing. With
`spec.canary.analysis.syntheticLoad: {requestsPerMinute: N}` the operator sends the probe set's
prompts as short completions to both tracks while a step's window runs, N a minute to each, so
the window holds enough requests to judge latency, errors and KV figures on the engines. The
requests go where the accuracy gate's probes go (TrackUrls: the track Services, the Gateway
with its header pins, or --track-url), so a Gateway-side request count sees them only when the
operator probes through the Gateway (--gateway-url).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from kvpilot.operator.analysis.api_key import read_api_key
from kvpilot.operator.analysis.probes import Endpoint, Probe, TrackUrls, load_probe_set
from kvpilot.operator.spec import SecretKeyRef

MAX_PER_MINUTE = 600
REQUEST_TIMEOUT_S = 20.0
_cursor = itertools.count()  # which probe comes next, across ticks: the set is cycled, not its head repeated


class SyntheticLoadError(ValueError):
    """spec.canary.analysis.syntheticLoad cannot be served as written."""


@dataclass(frozen=True)
class SyntheticLoad:
    requests_per_minute: int
    max_tokens: int = 8

    @classmethod
    def from_analysis(cls, analysis: Mapping[str, Any]) -> SyntheticLoad | None:
        raw = analysis.get("syntheticLoad")
        if not raw:
            return None
        rpm, max_tokens = int(raw.get("requestsPerMinute", 0)), int(raw.get("maxTokens", 8))
        if not 1 <= rpm <= MAX_PER_MINUTE:
            raise SyntheticLoadError(f"syntheticLoad.requestsPerMinute must be 1-{MAX_PER_MINUTE}, got {rpm}")
        if not 1 <= max_tokens <= 256:
            raise SyntheticLoadError(f"syntheticLoad.maxTokens must be 1-256, got {max_tokens}")
        if not analysis.get("probeSet"):
            raise SyntheticLoadError("syntheticLoad sends the probe set's prompts: set spec.canary.analysis.probeSet")
        return cls(rpm, max_tokens)

    def per_tick(self, tick_s: float) -> int:
        """Requests per track for one timer tick of `tick_s` seconds (at least one)."""
        return max(1, math.ceil(self.requests_per_minute * tick_s / 60.0))


def send(endpoint: Endpoint, probes: Sequence[Probe], count: int, max_tokens: int, model: str,
         api_key: str | None = None) -> list[int]:
    """`count` completions of the next probes' prompts to one track; their HTTP statuses (0: no answer)."""
    headers = dict(endpoint.headers)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    chosen = [probes[next(_cursor) % len(probes)] for _ in range(count)]

    def one(probe: Probe) -> int:
        body = {"model": model, "prompt": probe.prompt, "max_tokens": max_tokens, "temperature": 0}
        try:
            with httpx.Client(base_url=endpoint.url, headers=headers, timeout=REQUEST_TIMEOUT_S, trust_env=False) as c:
                return c.post("/v1/completions", json=body).status_code
        except httpx.HTTPError:
            return 0

    with ThreadPoolExecutor(max(1, min(count, 8))) as pool:
        return list(pool.map(one, chosen))


def during_step(kube: Any, body: Mapping[str, Any], urls: TrackUrls, tick_s: float) -> dict[str, list[int]]:
    """One tick's synthetic load to both tracks; {} when syntheticLoad is not set."""
    spec = body.get("spec") or {}
    analysis = (spec.get("canary") or {}).get("analysis") or {}
    load = SyntheticLoad.from_analysis(analysis)
    if load is None:
        return {}
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    probes = load_probe_set(kube, namespace, str(analysis["probeSet"]))
    secret = (spec.get("engine") or {}).get("apiKeySecretRef") or {}
    ref = SecretKeyRef(name=str(secret["name"]), key=str(secret.get("key") or SecretKeyRef.key)) if secret.get("name") else None
    api_key = read_api_key(kube, namespace, ref) if ref else None
    count = load.per_tick(tick_s)
    return {track: send(urls.endpoint(kube, namespace, name, track), probes, count, load.max_tokens, name, api_key)
            for track in ("canary", "stable")}
