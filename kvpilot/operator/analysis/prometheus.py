"""The Prometheus HTTP API (`GET /api/v1/query`) as a MetricProvider."""

from __future__ import annotations

import math
from typing import Any

import httpx

from kvpilot.operator.analysis.provider import ProviderUnavailable, QueryError, register

DEFAULT_TIMEOUT_S = 5.0


@register("prometheus")
class PrometheusProvider:
    """One instant query per call; unreachable, timed out or 5xx -> ProviderUnavailable."""

    name = "prometheus"

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, headers: dict[str, str] | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s, headers=headers or {}, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def query(self, promql: str, at: float | None = None) -> float | None:
        params: dict[str, Any] = {"query": promql, "timeout": f"{max(1, round(self.timeout_s * 1000))}ms"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            response = self._client.get(f"{self.url}/api/v1/query", params=params)
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(f"Prometheus at {self.url} did not answer: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise ProviderUnavailable(f"Prometheus at {self.url} answered HTTP {response.status_code}: "
                                      f"{response.text[:300]}")
        try:
            body = response.json()
        except ValueError as exc:
            raise ProviderUnavailable(f"Prometheus at {self.url} answered HTTP {response.status_code} with "
                                      f"something that is not JSON: {response.text[:200]!r}") from exc
        if response.status_code != 200 or body.get("status") != "success":
            raise QueryError(f"Prometheus refused {promql!r}: {body.get('errorType')}: {body.get('error')}")
        return _single_value(promql, body["data"])


def _single_value(promql: str, data: dict[str, Any]) -> float | None:
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        raw = result[1]
    elif kind == "vector":
        if not result:
            return None
        if len(result) > 1:
            raise QueryError(f"{promql!r} returned {len(result)} series; the analysis needs one (aggregate it)")
        raw = result[0]["value"][1]
    else:
        raise QueryError(f"{promql!r} returned a {kind}; the analysis needs an instant vector or scalar")
    value = float(raw)
    return None if math.isnan(value) else value
