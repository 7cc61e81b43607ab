"""spec.autoscaling and low-traffic rollouts on a real control plane, one environment for the module.

Every component is the real one: kube-controller-manager's HPA controller, prometheus-adapter
(built from sigs.k8s.io/prometheus-adapter) serving external.metrics.k8s.io through the API
server's aggregation layer, Debian's Prometheus scraping real `kvpilot serve` + `kvpilot sidecar`
pairs labelled as the services' tracks (the KWOK pods run no process; an engine stands in for a
track as the PodMonitor's series would), and `kvpilot operator` with short ticks.

The engines: `busy` (one running slot, 20 ms per step, six clients: ~5 requests waiting, KV in
use all the time) is the stable track of `llm` and `dense` and the canary track of `roll`;
`moderate` (one slot, three clients: at most 2 waiting) is `roll`'s stable track; `quiet-stable`
(bf16) and `quiet-canary` (int8 KV) serve `quiet`, which gets 2 requests/s split by its canary
weight. `roll`, `dense` and `quiet` are created by the fixture, so their HPAs and first rollout
run while the first test does; each test waits for its outcome, checks it and deletes its service.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvpilot.cluster.metrics_adapter import MetricsAdapter, binary_path, build_adapter
from kvpilot.operator.autoscaling.hpa import adapter_rule
from kvpilot.operator.autoscaling.policy import HANDOFF_MANAGER
from kvpilot.operator.kube import object_path
from tests.harness.cluster import k8s_api_client, unique_namespace, wait_for
from tests.harness.fleet import EngineSpec, Fleet
from tests.harness.gateway import apply_gateway, kube_client
from tests.harness.operator import Kubectl, OperatorProcess, manifest, probe_configmap
from tests.harness.prometheus import LabelledTarget, PrometheusServer, prometheus_missing
from tests.harness.sharp_model import sharpen

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DONE = ("Promoted", "RolledBack", "Failed")
SLOW_STEPS = ("--max-num-seqs", "1", "--fault-latency-ms", "20")  # queues build without burning CPU
ENGINES = {  # engine -> (served model name, `kvpilot serve` flags)
    "busy": ("tiny-llama", SLOW_STEPS),
    "moderate": ("tiny-llama", SLOW_STEPS),
    "quiet-stable": ("quiet", ("--kv-cache-dtype", "bfloat16")),
    "quiet-canary": ("quiet", ("--kv-cache-dtype", "int8")),
}
TRACKS = {  # (service, track) -> engine
    ("llm", "stable"): "busy", ("dense", "stable"): "busy", ("roll", "canary"): "busy",
    ("roll", "stable"): "moderate", ("quiet", "stable"): "quiet-stable", ("quiet", "canary"): "quiet-canary",
}
CLIENTS = {"busy": 6, "moderate": 3}  # requests in flight against one running slot
# Loose on latency (CPU engines share two cores with everything else), strict on errors.
ANALYSIS = {"minRequests": 2, "maxTtftP95Ratio": 20, "maxTpotP95Ratio": 20, "maxErrorRate": 0.05,
            "maxFallbackRate": 100, "minKvCacheEfficiency": 0, "maxPreemptionRate": 100, "maxRestarts": 0}
ROLL_SCALING = {"minReplicas": 1, "maxReplicas": 6, "metric": "queueDepth", "target": 1,
                "scaleDownStabilizationSeconds": 120}
ROLL_CANARY = {"strategy": {"kvCacheDtype": "int8"}, "steps": [25, 50, 100], "interval": "30s",
               "analysis": {**ANALYSIS, "failureLimit": 2}}
DENSE_SCALING = {"minReplicas": 1, "maxReplicas": 3, "metric": "kvCacheUsage", "target": 0.001,
                 "scaleDownStabilizationSeconds": 10, "denserStrategy": "start", "probeSet": "probes"}
QUIET_RATE = 2.0  # requests/s the quiet service gets, split by its canary's weight
QUIET_CANARY = {"strategy": {"kvCacheDtype": "int8"}, "steps": [1, 100], "interval": "15s",
                "analysis": {**ANALYSIS, "minRequests": 5, "failureLimit": 2, "probeSet": "probes"}}
SYNTHETIC = {"requestsPerMinute": 120, "maxTokens": 8}


class Operator(OperatorProcess):
    def __init__(self, kubeconfig: Path, namespace: str, log: Path, args: list[str]) -> None:
        super().__init__(kubeconfig, namespace, log)
        self.args = args

    def command(self, liveness: str) -> list[str]:
        return [*super().command(liveness), *self.args]


class Load:
    """`clients` threads per engine, each posting a 48-token completion as soon as the last ended."""

    def __init__(self, urls: dict[str, int]) -> None:
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(url,), daemon=True)
                        for url, clients in urls.items() for _ in range(clients)]

    def _run(self, url: str) -> None:
        body = {"model": "tiny-llama", "prompt": "def main():\n", "max_tokens": 48, "temperature": 0,
                "ignore_eos": True}
        with httpx.Client(timeout=120.0, trust_env=False) as client:
            while not self.stop_event.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    client.post(f"{url}/v1/completions", json=body)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(30)


class SplitTraffic:
    """QUIET_RATE requests/s to the quiet service, each to its canary with the probability of the
    canary's weight in status (what its HTTPRoute would split; no gateway serves this cluster)."""

    def __init__(self, env: dict[str, Any], stable_url: str, canary_url: str) -> None:
        self.env, self.urls = env, {"stable": stable_url, "canary": canary_url}
        self.sent = {"stable": 0, "canary": 0}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng, weight, polled = random.Random(1), 0, 0.0
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            start, i = time.monotonic(), 0
            while not self.stop_event.is_set():
                if time.monotonic() - polled >= 1.0:
                    with contextlib.suppress(Exception):  # an API hiccup: keep the last weight
                        weight = int(canary_status(self.env, "quiet").get("weight") or 0)
                    polled = time.monotonic()
                track = "canary" if rng.random() * 100 < weight else "stable"
                body = {"model": "quiet", "prompt": f"Count with me: {i} {i + 1}", "max_tokens": 8, "temperature": 0}
                with contextlib.suppress(httpx.HTTPError):
                    client.post(f"{self.urls[track]}/v1/completions", json=body)
                self.sent[track] += 1
                i += 1
                self.stop_event.wait(max(0.0, start + i / QUIET_RATE - time.monotonic()))

    def __enter__(self) -> SplitTraffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(30)


@pytest.fixture(scope="module")
def env(k8s_cluster, gateway_api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    try:
        build_adapter()
    except RuntimeError as exc:
        pytest.skip(f"prometheus-adapter cannot be built here ({exc}); {binary_path()} is missing")
    from kubernetes import client

    kubectl = Kubectl(k8s_cluster.kubeconfig)
    kubectl.install_crd()
    api_client = k8s_api_client(k8s_cluster)
    core = client.CoreV1Api(api_client)
    ns = unique_namespace(core, "hpa")
    work = tmp_path_factory.mktemp("hpa")
    fleets: list[Fleet] = []
    prom: PrometheusServer | None = None
    adapter: MetricsAdapter | None = None
    operator: Operator | None = None
    api = k8s_cluster.api()
    try:
        kube = kube_client(k8s_cluster)
        apply_gateway(kube, ns, "gw")
        made = subprocess.run([sys.executable, "-m", "kvpilot.cli", "make-model", str(work / "random"), "--family",
                               "llama", "--size", "tiny"], capture_output=True, text=True, timeout=300)
        assert made.returncode == 0, made.stderr
        model = sharpen(work / "random", work / "tiny")  # int8 KV scores as bf16 on it (accuracy gate)
        engines = {}
        for served in ("tiny-llama", "quiet"):  # one Fleet per served model name
            fleets.append(Fleet(model, work / f"fleet-{served}", served_model_name=served))
            names = [n for n, (engine_served, _) in ENGINES.items() if engine_served == served]
            started = fleets[-1].start([EngineSpec(ns, "all", n, ENGINES[n][1]) for n in names])
            engines.update(zip(names, started, strict=True))
        targets = [LabelledTarget(engines[engine].target.address, {"namespace": ns, "service": service, "track": track})
                   for (service, track), engine in TRACKS.items()]
        prom = PrometheusServer({"kvpilot-engines": targets}, work / "prometheus").start()
        prom.wait_for("count(kvpilot_requests_waiting)", lambda r: bool(r) and r[0].value == len(TRACKS), timeout=30)
        adapter = MetricsAdapter(k8s_cluster.kubeconfig, prom.url, [adapter_rule()], work / "adapter")
        adapter.start(api)
        track_urls = [arg for track in ("stable", "canary")
                      for arg in ("--track-url", f"{ns}/quiet/{track}={engines[f'quiet-{track}'].api_url}")]
        operator = Operator(k8s_cluster.kubeconfig, ns, work / "operator.log", [
            "--prometheus-url", prom.url, "--gateway", f"gw/{ns}", "--rollout-tick", "1",
            "--autoscaling-interval", "2", *track_urls])
        context = {"kubectl": kubectl, "ns": ns, "core": core, "apps": client.AppsV1Api(api_client),
                   "custom": client.CustomObjectsApi(api_client), "kube": kube, "operator": operator, "prom": prom}
        with Load({engines[name].api_url: clients for name, clients in CLIENTS.items()}), \
                SplitTraffic(context, engines["quiet-stable"].api_url, engines["quiet-canary"].api_url) as traffic:
            kube.apply(probe_configmap(ns, engines["quiet-stable"].api_url, model="quiet"))
            operator.start()
            # Started now, checked by their tests: their HPAs and first rollout run meanwhile.
            kubectl.apply(manifest("roll", ns, replicas=1, autoscaling=ROLL_SCALING))
            kubectl.apply(manifest("dense", ns, replicas=1, autoscaling=DENSE_SCALING))
            kubectl.apply(manifest("quiet", ns, replicas=1, canary=QUIET_CANARY))
            yield {**context, "traffic": traffic}
    finally:
        if operator is not None:
            operator.stop()
            lines = [ln for ln in operator.text().splitlines() if not ln.endswith(" succeeded.")]
            print("---- operator log (tail, without handler successes) ----\n" + "\n".join(lines[-120:]))
        if adapter is not None:
            adapter.stop(api)
            print("---- prometheus-adapter log (tail) ----\n" + adapter.log_tail(2000))
        if prom is not None:
            prom.stop()
        for fleet in fleets:
            fleet.stop()
        core.delete_namespace(ns)


def kvis(env: dict[str, Any], name: str) -> dict[str, Any]:
    return env["custom"].get_namespaced_custom_object("kvpilot.io", "v1alpha1", env["ns"], "inferenceservices", name)


def patch(env: dict[str, Any], name: str, body: dict[str, Any]) -> None:
    env["custom"].patch_namespaced_custom_object("kvpilot.io", "v1alpha1", env["ns"], "inferenceservices", name, body)


@contextlib.contextmanager
def deleted_after(env: dict[str, Any], name: str) -> Iterator[None]:
    """Delete the InferenceService when the test ends (its children go with it), also on failure."""
    try:
        yield
    finally:
        env["kubectl"]("delete", "kvis", name, "-n", env["ns"], "--ignore-not-found", "--wait=false", check=False)


def canary_status(env: dict[str, Any], name: str) -> dict[str, Any]:
    return (kvis(env, name).get("status") or {}).get("canary") or {}


def hpa(env: dict[str, Any], name: str, track: str) -> dict[str, Any] | None:
    return env["kube"].get(object_path("autoscaling/v2", "HorizontalPodAutoscaler", env["ns"], f"{name}-{track}"))


def deployment(env: dict[str, Any], name: str, track: str) -> dict[str, Any] | None:
    return env["kube"].get(object_path("apps/v1", "Deployment", env["ns"], f"{name}-{track}"))


def replicas(env: dict[str, Any], name: str, track: str = "stable") -> int | None:
    dep = deployment(env, name, track)
    return None if dep is None else int(dep["spec"].get("replicas") or 0)


def replica_owners(env: dict[str, Any], name: str, track: str = "stable") -> list[str]:
    dep = deployment(env, name, track) or {}
    return [entry["manager"] for entry in dep.get("metadata", {}).get("managedFields") or ()
            if "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})]


def engine_args(dep: dict[str, Any]) -> list[str]:
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")["args"]


def events(env: dict[str, Any], name: str) -> list[tuple[str, str]]:
    found = env["core"].list_namespaced_event(env["ns"], field_selector=f"involvedObject.name={name}").items
    return [(e.reason, e.message) for e in found if e.involved_object.kind == "InferenceService"]


def deployment_events(env: dict[str, Any], name: str) -> list[tuple[str, str]]:
    found = env["core"].list_namespaced_event(env["ns"], field_selector=f"involvedObject.name={name}").items
    return [(e.reason, e.message) for e in found if e.involved_object.kind == "Deployment"]


def wait_canary(env: dict[str, Any], name: str, check: Any, what: str, timeout_s: float) -> dict[str, Any]:
    wait_for(lambda: check(canary_status(env, name)), f"{name}: {what} (now {canary_status(env, name)})", timeout_s)
    return canary_status(env, name)


def test_the_real_hpa_scales_the_stable_track_and_a_reconcile_keeps_its_count(env: dict[str, Any]) -> None:
    ns, kubectl, name = env["ns"], env["kubectl"], "llm"
    with deleted_after(env, name):
        kubectl.apply(manifest(name, ns, replicas=1, autoscaling={
            "minReplicas": 1, "maxReplicas": 3, "metric": "queueDepth", "target": 1}))
        wait_for(lambda: hpa(env, name, "stable") is not None, "the operator's HPA", 60)
        spec = hpa(env, name, "stable")["spec"]  # type: ignore[index]
        assert spec["scaleTargetRef"]["name"] == f"{name}-stable" and spec["maxReplicas"] == 3
        wait_for(lambda: (replicas(env, name) or 0) >= 2, "the HPA controller to scale llm-stable past spec.replicas 1",
                 180)
        wait_for(lambda: (hpa(env, name, "stable") or {}).get("status", {}).get("currentMetrics"),
                 "the HPA's status with the metric it scaled on", 30)  # written after the scale
        status = hpa(env, name, "stable")["status"]  # type: ignore[index]
        current = status["currentMetrics"][0]["external"]
        print(f"HPA: {current['metric']['name']} {current['current']}, desired {status['desiredReplicas']}")
        assert current["metric"]["name"] == "kvpilot_requests_waiting"
        owners = replica_owners(env, name)
        assert "kube-controller-manager" in " ".join(owners) or HANDOFF_MANAGER in owners
        scaled = replicas(env, name)
        generation = kvis(env, name)["metadata"]["generation"]
        # A spec edit: the operator reconciles and applies the Deployment again (before
        # spec.autoscaling it would have put spec.replicas 1 back here).
        patch(env, name, {"spec": {"autoscaling": {"scaleDownStabilizationSeconds": 600}}})
        wait_for(lambda: kvis(env, name).get("status", {}).get("observedGeneration", 0) > generation,
                 "the operator to reconcile the edit", 60)
        wait_for(lambda: hpa(env, name, "stable")["spec"]["behavior"]["scaleDown"]  # type: ignore[index]
                 ["stabilizationWindowSeconds"] == 600, "the HPA updated by the reconcile", 30)
        time.sleep(3)  # the reconcile's writes have landed; nothing may put 1 back
        assert (replicas(env, name) or 0) >= (scaled or 0) >= 2
        assert "kvpilot" not in replica_owners(env, name)  # the operator's field manager let go of replicas
        assert kvis(env, name)["status"]["selector"] == f"kvpilot.io/service={name},kvpilot.io/track=stable"


class Recorder:
    """Every 0.2 s: the rollout's phase and weight, both HPAs' bounds and both Deployments' replicas."""

    def __init__(self, env: dict[str, Any], name: str) -> None:
        self.env, self.name = env, name
        self.seen: list[tuple[Any, ...]] = []  # (phase, weight, canary HPA (min, max) | None, canary, stable)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                status = canary_status(self.env, self.name)
                canary_hpa = hpa(self.env, self.name, "canary")
                bounds = None if canary_hpa is None else (canary_hpa["spec"]["minReplicas"],
                                                          canary_hpa["spec"]["maxReplicas"])
                snap = (status.get("phase"), status.get("weight"), bounds, replicas(self.env, self.name, "canary"),
                        replicas(self.env, self.name, "stable"))
            except Exception:  # the API server answers slowly now and then; the next poll catches up
                continue
            if not self.seen or self.seen[-1] != snap:
                self.seen.append(snap)
            self.stop_event.wait(0.2)

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)


def canary_bounds(weight: int, stable: int, max_replicas: int) -> tuple[int, int]:
    """docs/autoscaling.md: at least its share of stable's pods (ceil, >= 1), at most its share of maxReplicas."""
    low = max(1, math.ceil(weight * stable / 100))
    return low, max(low, math.ceil(weight * max_replicas / 100))


def test_canary_and_stable_hpas_scale_consistently_through_a_whole_rollout(env: dict[str, Any]) -> None:
    """`roll` (created by the fixture): its stable HPA holds 2 pods (~2 waiting, target 1); a canary
    on the busy engine (~5 waiting) is scaled by its own HPA up to its weight's share of
    maxReplicas at each step, no reconcile puts the operator's count back, and after the promotion
    the canary's HPA is gone while stable keeps its HPA and its 2 pods."""
    name, most = "roll", ROLL_SCALING["maxReplicas"]
    with deleted_after(env, name):
        wait_for(lambda: replicas(env, name) == 2, f"the stable HPA to scale {name}-stable to 2 (now "
                 f"{replicas(env, name)})", 120)
        started = time.monotonic()
        with Recorder(env, name) as rec:
            patch(env, name, {"spec": {"canary": ROLL_CANARY}})
            wait_canary(env, name, lambda s: s.get("weight") == 50, "50%", 120)
            wait_for(lambda: replicas(env, name, "canary") == 3, f"the canary HPA to scale {name}-canary to 3", 40)
            assert "kvpilot" not in replica_owners(env, name, "canary")  # the HPA owns the canary's count
            # A spec edit mid-step: the stable reconcile and a rollout tick apply again; both counts stay.
            generation = kvis(env, name)["metadata"]["generation"]
            patch(env, name, {"spec": {"autoscaling": {"scaleDownStabilizationSeconds": 121}}})
            wait_for(lambda: kvis(env, name).get("status", {}).get("observedGeneration", 0) > generation,
                     "the operator to reconcile the edit", 30)
            done = wait_canary(env, name, lambda s: s.get("phase") in DONE, "done", 120)
            wait_for(lambda: hpa(env, name, "canary") is None, "the canary's HPA deleted", 30)
        print(f"\nrollout 25/50/100 with both tracks autoscaled: {time.monotonic() - started:.1f} s; seen:\n"
              + "\n".join(map(str, rec.seen)))
        assert done["phase"] == "Promoted", done
        assert all(s[4] == 2 for s in rec.seen), rec.seen  # stable's HPA count, never reset by the rollout
        at25, at50 = canary_bounds(25, 2, most), canary_bounds(50, 2, most)  # (1, 2), (1, 3)
        bounds = [s[2] for s in rec.seen if s[2]]
        assert [b for i, b in enumerate(bounds) if i == 0 or bounds[i - 1] != b] == [at25, at50], rec.seen
        # The bounds move before the route (status.canary.weight is written after the step's actions).
        assert {s[1] for s in rec.seen if s[2] == at25} <= {None, 0, 25}, rec.seen
        # (A snapshot between DeleteCanary and the Promoted status write shows weight 50 with no HPA.)
        assert {s[2] for s in rec.seen if s[1] == 50 and s[2]} == {at50}, rec.seen
        for low_high in (at25, at50):  # the HPA controller takes the canary to its weight's maximum
            counts = [s[3] for s in rec.seen if s[2] == low_high and s[3] is not None]
            assert max(counts) == low_high[1] and counts == sorted(counts), (low_high, rec.seen)
        # No reconcile put the operator's count back (step 50 alone would be ceil(50% x replicas 1) = 1):
        # the Deployment controller only ever scaled the canary up.
        scaled = [m for r, m in deployment_events(env, f"{name}-canary") if r == "ScalingReplicaSet"]
        print(f"canary Deployment events: {scaled}")
        assert scaled and not [m for m in scaled if "Scaled down" in m], scaled
        assert deployment(env, name, "canary") is None
        stable_hpa = hpa(env, name, "stable")
        assert stable_hpa is not None and (stable_hpa["spec"]["minReplicas"], stable_hpa["spec"]["maxReplicas"]) == (1, most)
        assert stable_hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 121
        wait_for(lambda: "int8" in engine_args(deployment(env, name, "stable") or {}), "stable runs int8", 30)
        time.sleep(3)
        assert replicas(env, name) == 2 and "kvpilot" not in replica_owners(env, name)


def test_sustained_kv_pressure_proposes_and_starts_a_denser_canary(env: dict[str, Any]) -> None:
    """`dense` (created by the fixture): kvCacheUsage target 0.001 with KV in use all the time holds
    its stable HPA at maxReplicas 3 (ScalingLimited/TooManyReplicas); past the 10 s window the
    proposal names int8 with the planner's figures and, with `denserStrategy: start`, the operator
    writes spec.canary and the rollout begins. A rollback then leaves stable with its HPA and pods."""
    name = "dense"
    with deleted_after(env, name):
        wait_for(lambda: (kvis(env, name).get("status") or {}).get("autoscaling", {}).get("proposal"),
                 f"status.autoscaling.proposal (now {(kvis(env, name).get('status') or {}).get('autoscaling')})", 150)
        body = kvis(env, name)
        status, stable_hpa = body["status"], hpa(env, name, "stable")
        assert stable_hpa is not None
        limited = [c for c in stable_hpa["status"]["conditions"] if c["type"] == "ScalingLimited"]
        print(f"\nstable HPA: {stable_hpa['status']}\nstatus.autoscaling: {json.dumps(status['autoscaling'])}")
        assert limited[0]["status"] == "True" and limited[0]["reason"] == "TooManyReplicas", limited
        assert stable_hpa["status"]["currentReplicas"] == 3 and status["autoscaling"]["kvPressure"] is True
        proposal = status["autoscaling"]["proposal"]
        assert proposal["strategy"] == {"kvCacheDtype": "int8"}, proposal
        current = status["capacity"]["maxConcurrency"]  # the stable plan's figure, as the reconcile wrote it
        assert proposal["maxConcurrency"]["current"] == current
        assert proposal["maxConcurrency"]["proposed"] >= 1.2 * current
        assert proposal["bytesPerToken"]["proposed"] < proposal["bytesPerToken"]["current"]
        assert proposal["gain"] == round(proposal["maxConcurrency"]["proposed"] / current, 3)
        assert proposal["replicas"] == {"now": 3, "sameConcurrencyWith": math.ceil(3 / proposal["gain"])}
        wait_for(lambda: kvis(env, name)["spec"].get("canary"), "spec.canary written by the operator", 30)
        canary_spec = kvis(env, name)["spec"]["canary"]  # with the CRD's defaults filled in
        assert canary_spec["strategy"] == {"kvCacheDtype": "int8"} and canary_spec["analysis"]["probeSet"] == "probes"
        reasons = [r for r, _ in events(env, name)]
        assert "DenserStrategyProposed" in reasons and "DenserStrategyStarted" in reasons, reasons
        wait_canary(env, name, lambda s: s.get("phase") in ("Progressing", "Analysing") and s.get("weight") == 1,
                    "the denser canary at its first step", 60)
        canary = deployment(env, name, "canary")
        assert canary is not None and "int8" in engine_args(canary)
        canary_hpa = hpa(env, name, "canary")
        assert canary_hpa is not None and (canary_hpa["spec"]["minReplicas"], canary_hpa["spec"]["maxReplicas"]) == (1, 1)
        assert (kvis(env, name)["status"]["autoscaling"]["proposal"]["started"]).startswith("yes")
        patch(env, name, {"spec": {"rollback": True}})
        wait_canary(env, name, lambda s: s.get("phase") == "RolledBack", "RolledBack", 30)
        wait_for(lambda: hpa(env, name, "canary") is None and replicas(env, name, "canary") == 0,
                 "the canary at 0 pods without its HPA", 30)
        time.sleep(3)
        assert hpa(env, name, "stable") is not None and replicas(env, name) == 3


def test_synthetic_load_turns_a_low_traffic_rollback_into_a_promotion(env: dict[str, Any]) -> None:
    """`quiet` (created by the fixture with a canary, no synthetic load) gets 2 requests/s split by
    weight: at 1% each analysis sees too few canary requests, and the rollout rolls back after two
    inconclusive ones. The same canary with `syntheticLoad` (the probe set's prompts, 120 a minute
    to each track) passes its analysis on those requests and is promoted."""
    name = "quiet"
    with deleted_after(env, name):
        started = time.monotonic()
        first = wait_canary(env, name, lambda s: s.get("phase") in DONE, "the first rollout done", 150)
        print(f"\nwithout synthetic load: {first['phase']} after {time.monotonic() - started:.1f} s (waited); "
              f"analyses {[(a['verdict'], a['reason'], a['message']) for a in first['analyses']]}")
        assert first["phase"] == "RolledBack" and first["reason"] == "FailureLimitReached", first
        assert [a["verdict"] for a in first["analyses"]] == ["inconclusive", "inconclusive"], first["analyses"]
        assert {a["reason"] for a in first["analyses"]} == {"TooFewRequests"}, first["analyses"]
        for analysis in first["analyses"]:
            requests = next(c for c in analysis["checks"] if c["name"] == "requests")
            assert (requests["canary"] or 0) < 5 <= (requests["stable"] or 0), analysis
        previous = first["specHash"]
        started = time.monotonic()
        patch(env, name, {"spec": {"canary": {"analysis": {"syntheticLoad": SYNTHETIC}}}})
        second = wait_canary(env, name, lambda s: s.get("specHash") != previous and s.get("phase") in DONE,
                             "the second rollout done", 120)
        print(f"with synthetic load: {second['phase']} in {time.monotonic() - started:.1f} s; "
              f"analyses {[(a['verdict'], a['reason'], a['message']) for a in second['analyses']]}; "
              f"split traffic sent {env['traffic'].sent}")
        assert second["phase"] == "Promoted", second
        [analysis] = [a for a in second["analyses"] if a["verdict"] == "pass"]
        requests = next(c for c in analysis["checks"] if c["name"] == "requests")
        assert (requests["canary"] or 0) >= 5, analysis
        # More canary requests in one window than the split traffic ever sent it: the synthetic ones.
        assert requests["canary"] > env["traffic"].sent["canary"], (analysis, env["traffic"].sent)
        assert next(c for c in analysis["checks"] if c["name"] == "accuracyDelta")["ok"] is True, analysis
