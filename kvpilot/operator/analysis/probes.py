"""The accuracy gate: a probe set scored on both tracks, with `POST /v1/score` where both tracks
have it (kvpilot's engine), else with `/v1/completions` echo + logprobs on both (any
OpenAI-compatible server: vLLM, SGLang, ...; echo_scoring.py).

Probe-set format (docs/rollout.md): a ConfigMap in the InferenceService's namespace, named by
`spec.canary.analysis.probeSet`, whose data key `probes.jsonl` holds one JSON object per line,
`{"prompt": "...", "continuation": "..."}` (blank lines are skipped; at most MAX_PROBES lines).
Each track's figure is the mean log-likelihood per continuation token over the whole set (the
sum of every probe's log p over the total number of continuation tokens, in nats); the check
fails when stable - canary exceeds `maxAccuracyDelta`.

The tracks are reached through a `TrackUrls` resolver: the track Services' cluster DNS by default
(`<name>` for stable, `<name>-canary` for canary, port 8000), `--gateway-url` with the route's
header pins, or static `--track-url NS/NAME/TRACK=URL` entries (local runs and tests).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from kvpilot.operator.analysis.api_key import read_api_key
from kvpilot.operator.analysis.echo_scoring import EchoScoringError, echo_score
from kvpilot.operator.analysis.result import Check

ACCURACY_CHECK = "accuracyDelta"
DATA_KEY = "probes.jsonl"
MAX_PROBES = 500
ENGINE_PORT = 8000
SCORE_TIMEOUT_S = 60.0
FORMAT = 'one JSON object per line: {"prompt": "...", "continuation": "..."}'
SCORE = "score"  # POST /v1/score (kvpilot)
ECHO = "echo"  # POST /v1/completions with echo + logprobs (any OpenAI-compatible server)


class ProbeSetError(ValueError):
    """The probe set is missing or malformed; the message says where and what is expected."""


class ScoringError(RuntimeError):
    """A track could not score the probes (unreachable, or an HTTP error)."""


@dataclass(frozen=True)
class Probe:
    prompt: str
    continuation: str


def parse_probes(text: str, where: str = DATA_KEY) -> list[Probe]:
    """Probes from the JSONL text; every error names the line and the expected form."""
    probes: list[Probe] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProbeSetError(f"{where} line {number} is not JSON ({exc.msg}); expected {FORMAT}") from None
        if not isinstance(item, dict):
            raise ProbeSetError(f"{where} line {number} is a {type(item).__name__}; expected {FORMAT}")
        for key in ("prompt", "continuation"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise ProbeSetError(f"{where} line {number}: {key!r} must be a non-empty string; expected {FORMAT}")
        probes.append(Probe(item["prompt"], item["continuation"]))
    if not probes:
        raise ProbeSetError(f"{where} holds no probes; expected {FORMAT}")
    if len(probes) > MAX_PROBES:
        raise ProbeSetError(f"{where} holds {len(probes)} probes; the limit is {MAX_PROBES} (each is scored "
                            "on both tracks at every analysis)")
    return probes


def probes_from_configmap(configmap: Mapping[str, Any]) -> list[Probe]:
    meta = configmap.get("metadata", {})
    where = f"ConfigMap {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    data = configmap.get("data") or {}
    if DATA_KEY not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise ProbeSetError(f"{where} has no data key {DATA_KEY!r} (keys: {keys}); put the probes there, {FORMAT}")
    return parse_probes(data[DATA_KEY], f"{where} key {DATA_KEY}")


def load_probe_set(kube: Any, namespace: str, name: str) -> list[Probe]:
    configmap = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    if configmap is None:
        raise ProbeSetError(f"probe set ConfigMap {namespace}/{name} (spec.canary.analysis.probeSet) does not "
                            f"exist; create it with a {DATA_KEY!r} key, {FORMAT}")
    return probes_from_configmap(configmap)


# ---- where each track answers -------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    """A base URL and the headers that reach one track there."""

    url: str
    headers: Mapping[str, str]


class TrackUrls(Protocol):
    def endpoint(self, kube: Any, namespace: str, service: str, track: str) -> Endpoint: ...


@dataclass(frozen=True)
class ClusterDns:
    """The track Services inside the cluster: `<name>` (stable) and `<name>-canary`."""

    port: int = ENGINE_PORT
    domain: str = "svc"

    def endpoint(self, kube: Any, namespace: str, service: str, track: str) -> Endpoint:
        host = service if track == "stable" else f"{service}-{track}"
        return Endpoint(f"http://{host}.{namespace}.{self.domain}:{self.port}", {})


@dataclass(frozen=True)
class GatewayPins:
    """One Gateway address; the track is chosen by the header pin the HTTPRoute holds for it."""

    url: str

    def endpoint(self, kube: Any, namespace: str, service: str, track: str) -> Endpoint:
        from kvpilot.operator.routing.httproute import route_name, route_path

        route = kube.get(route_path(namespace, route_name(service)))
        if route is None:
            raise ScoringError(f"no HTTPRoute {namespace}/{route_name(service)} to read the {track} pin from")
        backend = service if track == "stable" else f"{service}-{track}"
        pins = []  # (header count, headers) of single-backend rules to this track: the pin has the most
        for rule in route.get("spec", {}).get("rules", []):
            refs = rule.get("backendRefs", [])
            for match in rule.get("matches", []):
                headers = {h["name"]: h["value"] for h in match.get("headers") or []}
                if headers and len(refs) == 1 and refs[0].get("name") == backend:
                    pins.append((len(headers), headers))
        hosts = route.get("spec", {}).get("hostnames") or []
        if pins:  # a shared Gateway's route also needs its model header (in the pin) and one of its hosts
            headers = max(pins, key=lambda p: p[0])[1]
            if hosts and not hosts[0].startswith("*."):
                headers = {**headers, "Host": hosts[0]}
            return Endpoint(self.url, headers)
        raise ScoringError(f"HTTPRoute {namespace}/{route_name(service)} has no header pin for the {track} track "
                           f"(Service {backend}); probes through the Gateway need one")


@dataclass(frozen=True)
class StaticUrls:
    """Fixed URLs per (namespace, service, track); others fall through to `fallback`."""

    urls: Mapping[tuple[str, str, str], str]
    fallback: TrackUrls | None = None

    def endpoint(self, kube: Any, namespace: str, service: str, track: str) -> Endpoint:
        url = self.urls.get((namespace, service, track))
        if url is not None:
            return Endpoint(url.rstrip("/"), {})
        if self.fallback is None:
            raise ScoringError(f"no --track-url for {namespace}/{service}/{track}")
        return self.fallback.endpoint(kube, namespace, service, track)


def track_urls(options: Any) -> TrackUrls:
    """From the operator's options: --track-url entries first, then --gateway-url pins, else cluster DNS."""
    base: TrackUrls = GatewayPins(options.gateway_url) if getattr(options, "gateway_url", "") else ClusterDns()
    static = getattr(options, "track_urls", None) or {}
    return StaticUrls(dict(static), base) if static else base


# ---- scoring ------------------------------------------------------------------------------

def mean_loglik(scores: Sequence[tuple[float, int]]) -> float:
    """Token-weighted mean log-likelihood from (sum of log p, tokens) per probe."""
    tokens = sum(n for _, n in scores)
    if tokens <= 0:
        raise ValueError("no continuation tokens were scored")
    return math.fsum(s for s, _ in scores) / tokens


class ScoreRouteMissing(ScoringError):
    """The track has no /v1/score (not a kvpilot engine, or its score route is off): use echo."""


def score_track(endpoint: Endpoint, probes: Sequence[Probe], timeout_s: float = SCORE_TIMEOUT_S,
                api_key: str | None = None, method: str = SCORE) -> float:
    """Mean log-likelihood per token of the probes on one track (its served model name from /v1/models),
    by `method`: SCORE (raises ScoreRouteMissing on a 404 or 405) or ECHO."""
    headers = dict(endpoint.headers)
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    with httpx.Client(base_url=endpoint.url, headers=headers, timeout=timeout_s, trust_env=False) as client:
        try:
            models = client.get("/v1/models")
            if models.status_code == 401:
                raise ScoringError(f"{endpoint.url} wants an API key ({'the one sent was refused' if api_key else 'none was sent'}): "
                                   "name the Secret holding the engine's key in spec.engine.apiKeySecretRef")
            models.raise_for_status()
            model = models.json()["data"][0]["id"]
            scores = []
            for probe in probes:
                if method == ECHO:
                    try:
                        scores.append(echo_score(client, model, probe.prompt, probe.continuation))
                    except EchoScoringError as exc:
                        raise ScoringError(f"{endpoint.url}: {exc}") from None
                    continue
                response = client.post("/v1/score", json={"model": model, "prompt": probe.prompt,
                                                          "continuation": probe.continuation})
                if response.status_code in (404, 405):
                    raise ScoreRouteMissing(f"{endpoint.url} has no /v1/score (HTTP {response.status_code})")
                if response.status_code != 200:
                    raise ScoringError(f"{endpoint.url}/v1/score answered HTTP {response.status_code}: "
                                       f"{response.text[:300]}")
                body = response.json()
                scores.append((float(body["sum_logprob"]), len(body["token_logprobs"])))
        except httpx.HTTPError as exc:
            raise ScoringError(f"{endpoint.url} could not score the probe set: {type(exc).__name__}: {exc}") from exc
    return mean_loglik(scores)


def accuracy_from_scores(canary: float, stable: float, max_delta: float, probes: int) -> Check:
    """The pure verdict: stable - canary (nats per token) against the limit."""
    delta = stable - canary
    ok = delta <= max_delta
    return Check(ACCURACY_CHECK, canary, stable, max_delta, ok,
                 f"probe-set log-likelihood per token: stable {stable:.4f}, canary {canary:.4f}, "
                 f"delta {delta:.4f} {'<=' if ok else '>'} {max_delta:g} over {probes} probes")


def accuracy_check(kube: Any, namespace: str, service: str, thresholds: Any, urls: TrackUrls,
                   api_key_secret: Any = None) -> Check:
    """Load `thresholds.probe_set`, score it on both tracks, judge the delta. Raises on missing data.

    `api_key_secret` (spec.engine.apiKeySecretRef) names the Secret whose key the engines want.
    """
    if not thresholds.probe_set:
        raise ProbeSetError("spec.canary.analysis.probeSet is not set: there is no probe set to score")
    probes = load_probe_set(kube, namespace, thresholds.probe_set)
    api_key = read_api_key(kube, namespace, api_key_secret) if api_key_secret else None
    canary, stable = score_both(urls.endpoint(kube, namespace, service, "canary"),
                                urls.endpoint(kube, namespace, service, "stable"), probes, api_key)
    return accuracy_from_scores(canary, stable, thresholds.max_accuracy_delta, len(probes))


def score_both(canary: Endpoint, stable: Endpoint, probes: Sequence[Probe],
               api_key: str | None = None) -> tuple[float, float]:
    """(canary, stable) scores by one method: /v1/score when both tracks serve it, else echo on both
    (a probe tokenised as one text may split unlike /v1/score's two parts: mixing would bias the delta)."""
    try:
        return (score_track(canary, probes, api_key=api_key, method=SCORE),
                score_track(stable, probes, api_key=api_key, method=SCORE))
    except ScoreRouteMissing:
        return (score_track(canary, probes, api_key=api_key, method=ECHO),
                score_track(stable, probes, api_key=api_key, method=ECHO))
