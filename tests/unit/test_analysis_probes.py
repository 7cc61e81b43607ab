"""Probe sets: parsing and its errors, the resolver of track URLs, the pure accuracy verdict."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kvpilot.operator.analysis.probes import (
    ACCURACY_CHECK,
    ClusterDns,
    GatewayPins,
    ProbeSetError,
    ScoringError,
    StaticUrls,
    accuracy_from_scores,
    mean_loglik,
    parse_probes,
    probes_from_configmap,
    track_urls,
)
from kvpilot.operator.routing import RouteTarget
from kvpilot.operator.routing.httproute import build_httproute, route_path

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "probe-set.yaml"


def _cm(data: dict | None) -> dict:
    return {"metadata": {"namespace": "team-a", "name": "probes"}, "data": data}


def test_the_documented_example_parses() -> None:
    probes = probes_from_configmap(yaml.safe_load(EXAMPLE.read_text()))
    assert len(probes) == 8 and all(p.prompt and p.continuation for p in probes)


def test_blank_lines_are_skipped() -> None:
    text = "\n" + json.dumps({"prompt": "a", "continuation": "b"}) + "\n\n"
    assert [(p.prompt, p.continuation) for p in parse_probes(text)] == [("a", "b")]


@pytest.mark.parametrize("data, message", [
    (None, r"ConfigMap team-a/probes has no data key 'probes.jsonl' \(keys: none\)"),
    ({"probes.json": "{}"}, r"no data key 'probes.jsonl' \(keys: probes.json\)"),
    ({"probes.jsonl": ""}, "holds no probes; expected one JSON object per line"),
    ({"probes.jsonl": '{"prompt": "a", "continuation": "b"}\n{"prompt": "a",'}, r"line 2 is not JSON"),
    ({"probes.jsonl": '["a", "b"]'}, "line 1 is a list; expected one JSON object per line"),
    ({"probes.jsonl": '{"prompt": "a"}'}, "line 1: 'continuation' must be a non-empty string"),
    ({"probes.jsonl": '{"prompt": "", "continuation": "b"}'}, "line 1: 'prompt' must be a non-empty string"),
    ({"probes.jsonl": '{"prompt": "a", "continuation": "b"}\n' * 501}, "holds 501 probes; the limit is 500"),
])
def test_bad_probe_sets_say_what_is_wrong(data: dict | None, message: str) -> None:
    with pytest.raises(ProbeSetError, match=message):
        probes_from_configmap(_cm(data))


def test_mean_loglik_is_token_weighted() -> None:
    assert mean_loglik([(-2.0, 1), (-6.0, 3)]) == -2.0
    with pytest.raises(ValueError, match="no continuation tokens"):
        mean_loglik([])


@pytest.mark.parametrize("canary, stable, ok", [(-2.00, -2.00, True), (-2.05, -2.00, True), (-2.06, -2.00, False),
                                                (-1.50, -2.00, True)])
def test_accuracy_verdict(canary: float, stable: float, ok: bool) -> None:
    check = accuracy_from_scores(canary, stable, 0.05 + 1e-9, 8)
    assert check.name == ACCURACY_CHECK == "accuracyDelta"
    assert check.ok is ok and check.canary == canary and check.stable == stable
    assert ("<=" if ok else ">") in check.message and "over 8 probes" in check.message


class _Routes:
    """Serves one HTTPRoute as the API server stores it (GET path -> object)."""

    def __init__(self, route: dict | None) -> None:
        self.route = route

    def get(self, path: str) -> dict | None:
        return self.route if self.route and path == route_path("team-a", "llm") else None


def test_cluster_dns_names_the_track_services() -> None:
    assert ClusterDns().endpoint(None, "team-a", "llm", "stable").url == "http://llm.team-a.svc:8000"
    assert ClusterDns().endpoint(None, "team-a", "llm", "canary").url == "http://llm-canary.team-a.svc:8000"


def test_gateway_pins_come_from_the_route() -> None:
    owner = {"metadata": {"name": "llm", "namespace": "team-a", "uid": "u"}}
    target = RouteTarget("gw", "infra", "llm", "llm-canary", canary_header_value="int8", stable_header_value="bf16")
    kube = _Routes(build_httproute(owner, target, 5))
    pins = GatewayPins("http://127.0.1.1:80")
    assert pins.endpoint(kube, "team-a", "llm", "canary").headers == {"X-Model-Strategy": "int8"}
    assert pins.endpoint(kube, "team-a", "llm", "stable").headers == {"X-Model-Strategy": "bf16"}
    unpinned = _Routes(build_httproute(owner, RouteTarget("gw", "infra", "llm", "llm-canary"), 5))
    with pytest.raises(ScoringError, match="has no header pin for the canary track"):
        pins.endpoint(unpinned, "team-a", "llm", "canary")
    with pytest.raises(ScoringError, match="no HTTPRoute team-a/llm"):
        pins.endpoint(_Routes(None), "team-a", "llm", "canary")


def test_track_urls_from_options() -> None:
    static = {("team-a", "llm", "canary"): "http://127.0.0.1:8101/"}
    urls = track_urls(SimpleNamespace(gateway_url="", track_urls=static))
    assert urls.endpoint(None, "team-a", "llm", "canary").url == "http://127.0.0.1:8101"
    assert urls.endpoint(None, "team-a", "llm", "stable").url == "http://llm.team-a.svc:8000"
    assert isinstance(track_urls(SimpleNamespace(gateway_url="http://gw", track_urls={})), GatewayPins)
    with pytest.raises(ScoringError, match="no --track-url for team-a/llm/stable"):
        StaticUrls(static).endpoint(None, "team-a", "llm", "stable")
