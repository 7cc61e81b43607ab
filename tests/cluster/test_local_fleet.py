"""The local fleet end to end on the session's control plane: KWOK pods run as real engines in
network namespaces (pod runner) and nginx serves the HTTPRoute (gateway stand-in).

Shares are counted from each engine's own counter (kvpilot_requests_finished_total on its sidecar),
not from the gateway.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpilot.cluster.api import ApiClient
from kvpilot.cluster.gateway import CONTROLLER_NAME, GROUP
from kvpilot.cluster.gateway.objects import gateway, gateway_url, route_conditions
from kvpilot.cluster.local import LocalCluster
from kvpilot.loadgen import LoadGenerator, summarise
from tests.harness.local_fleet import (
    delete_namespace,
    engine_deployment,
    finished_requests,
    ready_addresses,
    run_pods_namespace,
    service,
    wait,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROUTES = f"/apis/{GROUP}/v1/namespaces/{{ns}}/httproutes"


@dataclass
class TwoTracks:
    api: ApiClient
    namespace: str
    url: str
    stable_ip: str
    canary_ip: str

    def counts(self) -> tuple[float, float]:
        return finished_requests(self.stable_ip), finished_requests(self.canary_ip)


def route(ns: str, name: str, rules: list, parent: str = "gw") -> dict:
    return {"apiVersion": f"{GROUP}/v1", "kind": "HTTPRoute", "metadata": {"name": name, "namespace": ns},
            "spec": {"parentRefs": [{"name": parent}], "rules": rules}}


def weighted(stable: int, canary: int) -> dict:
    return {"backendRefs": [{"name": "chat-stable", "port": 8000, "weight": stable},
                            {"name": "chat-canary", "port": 8000, "weight": canary}]}


def pinned(value: str, to: str) -> dict:
    return {"matches": [{"headers": [{"name": "X-Model-Strategy", "value": value}]}],
            "backendRefs": [{"name": to, "port": 8000}]}


def _served(url: str, pin: str | None) -> bool:
    """One request through the gateway (pinned to a strategy, or by the route's weights) succeeded."""
    gen = LoadGenerator(url, rate_per_s=10, max_tokens=1, pin=pin)
    return all(o.ok for o in asyncio.run(gen.run(requests=1)))


def conditions_of(api: ApiClient, ns: str, name: str) -> dict:
    return route_conditions(api.request("GET", f"{ROUTES.format(ns=ns)}/{name}"), CONTROLLER_NAME)


@pytest.fixture(scope="module")
def two_tracks(local_fleet: LocalCluster, fleet_model: Path) -> Iterator[TwoTracks]:
    api = local_fleet.api()
    ns = run_pods_namespace(api)
    try:
        for track in ("stable", "canary"):
            api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                        engine_deployment(ns, "chat", track, fleet_model))
            api.request("POST", f"/api/v1/namespaces/{ns}/services",
                        service(ns, f"chat-{track}", {"kvpilot.io/service": "chat", "kvpilot.io/track": track}))
        api.request("POST", f"/apis/{GROUP}/v1/namespaces/{ns}/gateways", gateway(ns, "gw"))
        api.request("POST", ROUTES.format(ns=ns), route(ns, "chat", [
            pinned("canary", "chat-canary"), weighted(95, 5)]))
        url = gateway_url(api, ns, "gw")
        wait(lambda: ready_addresses(api, ns, "chat-stable") and ready_addresses(api, ns, "chat-canary"),
             "both engines ready behind their Services", 240)
        wait(lambda: conditions_of(api, ns, "chat").get("Accepted", {}).get("status") == "True", "route accepted")
        # Accepted may predate the ready endpoints; nginx has both upstreams once a request to each succeeds
        wait(lambda: _served(url, "canary") and _served(url, None), "the gateway to serve both tracks", 60)
        (stable_ip,) = ready_addresses(api, ns, "chat-stable")
        (canary_ip,) = ready_addresses(api, ns, "chat-canary")
        yield TwoTracks(api, ns, url, stable_ip, canary_ip)
    finally:
        delete_namespace(api, ns)


def test_unpinned_requests_split_by_the_route_weights(two_tracks: TwoTracks) -> None:
    n, p = 2000, 0.05
    before = two_tracks.counts()
    gen = LoadGenerator(two_tracks.url, rate_per_s=400, stream_share=0.2, max_tokens=1, max_in_flight=16)
    outcomes = asyncio.run(gen.run(requests=n))
    after = two_tracks.counts()
    summary = summarise(outcomes)
    assert summary["failed"] == 0, [o.error for o in outcomes if not o.ok][:5]
    stable, canary = after[0] - before[0], after[1] - before[1]
    assert stable + canary == n
    tolerance = 4.5 * math.sqrt(n * p * (1 - p))  # 4.5 standard deviations: a false alarm ~1 in 150,000
    assert abs(canary - n * p) <= tolerance, f"canary served {canary} of {n}, expected {n * p} +- {tolerance:.0f}"
    # the gateway's upstream header names the same engines the counters do
    assert summary["by_upstream"] == {f"{two_tracks.stable_ip}:8000": stable, f"{two_tracks.canary_ip}:8000": canary}


def test_pinned_requests_all_reach_the_canary(two_tracks: TwoTracks) -> None:
    before = two_tracks.counts()
    gen = LoadGenerator(two_tracks.url, rate_per_s=100, max_tokens=1, pin="canary")
    outcomes = asyncio.run(gen.run(requests=50))
    after = two_tracks.counts()
    assert all(o.ok for o in outcomes)
    assert (after[0] - before[0], after[1] - before[1]) == (0, 50)
    assert {o.strategy for o in outcomes} == {"canary"}


def test_unsupported_route_features_are_reported_in_status(two_tracks: TwoTracks) -> None:
    api, ns = two_tracks.api, two_tracks.namespace
    mirror = {**weighted(1, 1), "filters": [{"type": "RequestMirror", "requestMirror": {
        "backendRef": {"name": "chat-canary", "port": 8000}}}]}
    api.request("POST", ROUTES.format(ns=ns), route(ns, "mirrored", [mirror]))
    api.request("POST", ROUTES.format(ns=ns), route(ns, "dangling", [
        {"matches": [{"headers": [{"name": "X-Model-Strategy", "value": "ghost"}]}],
         "backendRefs": [{"name": "no-such-service", "port": 8000}]}]))
    wait(lambda: conditions_of(api, ns, "mirrored").get("Accepted", {}).get("status") == "False", "mirrored rejected")
    accepted = conditions_of(api, ns, "mirrored")["Accepted"]
    assert accepted["reason"] == "UnsupportedValue" and "spec.rules[0].filters" in accepted["message"]
    wait(lambda: conditions_of(api, ns, "dangling").get("ResolvedRefs", {}).get("status") == "False",
         "dangling unresolved")
    dangling = conditions_of(api, ns, "dangling")
    assert dangling["Accepted"]["status"] == "True"
    assert dangling["ResolvedRefs"]["reason"] == "BackendNotFound"
    assert "no-such-service" in dangling["ResolvedRefs"]["message"]
    # the accepted-but-unresolved rule answers 500 (Gateway API), the rejected route changed nothing
    gen = LoadGenerator(two_tracks.url, rate_per_s=50, max_tokens=1, pin="ghost", model="any")
    wait(lambda: [o.status for o in asyncio.run(LoadGenerator(two_tracks.url, max_tokens=1, pin="ghost",
                                                              model="any").run(requests=1))] == [500],
         "the dangling rule served")
    outcomes = asyncio.run(gen.run(requests=5))
    assert {o.status for o in outcomes} == {500}
    for name in ("mirrored", "dangling"):
        api.request("DELETE", f"{ROUTES.format(ns=ns)}/{name}")


def test_a_configmap_volume_reaches_the_engine(local_fleet: LocalCluster, fleet_model: Path) -> None:
    """A calibrated GQA conversion as the operator builds it: the calibration text is a ConfigMap
    mounted into the engine. The pod waits (and says why) until the ConfigMap exists, then the
    engine reads the projected file, calibrates and becomes ready."""
    api = local_fleet.api()
    ns = run_pods_namespace(api)
    mount = "/etc/kvpilot/calibration"
    try:
        body = engine_deployment(ns, "cal", "stable", fleet_model, flags=(
            "--attention", "gqa", "--kv-head-groups", "1", "--conversion-calibration", f"{mount}/text.txt",
            "--calibration-tokens", "64"))  # fmt: skip
        pod = body["spec"]["template"]["spec"]
        pod["volumes"] = [{"name": "calibration", "configMap": {"name": "cal-text", "defaultMode": 0o444,
                                                                "items": [{"key": "text.txt", "path": "text.txt"}]}}]
        pod["containers"][0]["volumeMounts"] = [{"name": "calibration", "mountPath": mount, "readOnly": True}]
        api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
        api.request("POST", f"/api/v1/namespaces/{ns}/services",
                    service(ns, "cal-stable", {"kvpilot.io/service": "cal", "kvpilot.io/track": "stable"}))

        def waiting_for_the_configmap() -> bool:
            pods = api.request("GET", f"/api/v1/namespaces/{ns}/pods").get("items", [])
            conds = [c for p in pods for c in (p.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
            return any(c.get("reason") == "CreateContainerConfigError" and "cal-text" in c.get("message", "")
                       for c in conds)  # fmt: skip

        wait(waiting_for_the_configmap, "the pod to wait for its ConfigMap", 90)
        text = "\n".join(f"def f{i}(x):\n    return x * {i}  # calibration text" for i in range(40))
        api.request("POST", f"/api/v1/namespaces/{ns}/configmaps",
                    {"metadata": {"name": "cal-text"}, "data": {"text.txt": text}, "immutable": True})
        wait(lambda: bool(ready_addresses(api, ns, "cal-stable")), "the calibrated engine ready", 240)
        (pod_name,) = [p["metadata"]["name"] for p in api.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]]
        log = (local_fleet.state_dir / "pods" / f"{ns}_{pod_name}" / "engine.log").read_text()
        assert "merge cost" in log and "by similarity" in log, log[-2000:]  # calibrate_gqa ran on the text
    finally:
        delete_namespace(api, ns)
