"""Pod template overrides, PodDisruptionBudgets, canary sizing with its GPU preflight, and the CRD's
refusals, on a real control plane (issue 27; issue 33 item 14).

The GPU tests run on KWOK nodes of their own: a node label key unique to the run
(spec.resources.gpuProductLabel) and a taint only these services tolerate, so other tests' pods
never land there and the free-GPU counts are exactly what the test put there.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kvpilot.cluster import nodes as fake_nodes
from tests.harness.cluster import wait_for
from tests.harness.operator import manifest, operator_env

pytestmark = pytest.mark.cluster
RUN = uuid.uuid4().hex[:6]
LABEL = f"test.kvpilot.io/gpu-{RUN}"
TAINT = {"key": f"test.kvpilot.io/isolated-{RUN}", "value": "yes", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": "yes", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def env(k8s_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    with operator_env(k8s_cluster, tmp_path_factory, "ovr") as env:
        yield env


@pytest.fixture
def gpu_nodes(env) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """add(name, gpus): an isolated KWOK node with that many GPUs; all removed afterwards."""
    made: list[str] = []

    def add(suffix: str, gpus: int) -> str:
        name = f"ovr-{RUN}-{suffix}"
        node = fake_nodes.gpu_node(name, fake_nodes.GpuNodeSpec(gpus=gpus))
        node["metadata"]["labels"].pop(fake_nodes.PRODUCT_LABEL)  # only this run's label names the product
        node["metadata"]["labels"][LABEL] = "NVIDIA-H200"
        node["spec"] = {"taints": [TAINT]}
        env["core"].create_node(node)
        made.append(name)
        wait_for(lambda: _ready(env["core"].read_node(name)), f"node {name} Ready", 60)
        return name

    yield add
    for name in made:
        env["core"].delete_node(name)


def _ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())


def isolated(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    pod = spec.pop("pod", {})
    return manifest(name, ns, resources={"gpus": 1, "gpuProduct": "NVIDIA-H200", "gpuProductLabel": LABEL,
                                         **spec.pop("resources", {})},
                    pod={**pod, "tolerations": [TOLERATION, *pod.get("tolerations", [])]}, **spec)


def service(env: dict, name: str) -> dict[str, Any]:
    return env["custom"].get_namespaced_custom_object("kvpilot.io", "v1alpha1", env["ns"], "inferenceservices", name)


def condition(env: dict, name: str, type_: str) -> dict[str, Any]:
    return next((c for c in service(env, name).get("status", {}).get("conditions", []) if c["type"] == type_), {})


def running(env: dict, selector: str) -> list[Any]:
    found = env["core"].list_namespaced_pod(env["ns"], label_selector=selector).items
    return [p for p in found if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def test_pod_overrides_reach_the_admitted_pods_and_the_pdb_guards_evictions(env, gpu_nodes) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    ns, core = env["ns"], env["core"]
    node = gpu_nodes("a", 2)
    api = core.api_client
    client.SchedulingV1Api(api).create_priority_class(
        {"metadata": {"name": f"llm-{RUN}"}, "value": 100000, "globalDefault": False})
    client.NodeV1Api(api).create_runtime_class({"metadata": {"name": f"gpu-{RUN}"}, "handler": "runc"})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "chat-engine"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "extra"}, "data": {"a.txt": "x"}})
    try:
        pod = {
            "labels": {"team": "llm"}, "annotations": {"example.com/owner": "platform"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "type", "operator": "In", "values": ["kwok"]}]}]}}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "ScheduleAnyway"}],
            "imagePullSecrets": [{"name": "registry"}], "runtimeClassName": f"gpu-{RUN}",
            "priorityClassName": f"llm-{RUN}", "serviceAccountName": "chat-engine",
            "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
            "volumes": [{"name": "extra", "configMap": {"name": "extra"}}],
            "volumeMounts": [{"name": "extra", "mountPath": "/mnt/extra", "readOnly": True}],
        }
        env["kubectl"].apply(isolated("pt", ns, pod=pod, resources={"requests": {"cpu": "2", "memory": "8Gi"},
                                                                   "limits": {"memory": "16Gi"}}))
        wait_for(lambda: len(running(env, "kvpilot.io/service=pt")) == 2, "2 pt pods running", 90)
        for admitted in running(env, "kvpilot.io/service=pt"):
            spec = admitted.spec
            assert spec.node_name == node  # the only node with this run's label
            assert spec.node_selector == {"kubernetes.io/os": "linux", LABEL: "NVIDIA-H200"}
            assert spec.runtime_class_name == f"gpu-{RUN}" and spec.service_account_name == "chat-engine"
            assert spec.priority_class_name == f"llm-{RUN}" and spec.priority == 100000
            assert [s.name for s in spec.image_pull_secrets] == ["registry"]
            assert admitted.metadata.labels["team"] == "llm"
            assert admitted.metadata.annotations["example.com/owner"] == "platform"
            assert {(t.key, t.value) for t in spec.tolerations} >= {(TAINT["key"], "yes"), ("nvidia.com/gpu", None)}
            engine = spec.containers[0]
            assert engine.resources.requests == {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}
            assert engine.resources.limits == {"memory": "16Gi", "nvidia.com/gpu": "1"}
            assert {"HF_HUB_OFFLINE": "1"}.items() <= {e.name: e.value for e in engine.env}.items()
            assert ("extra", "/mnt/extra") in {(m.name, m.mount_path) for m in engine.volume_mounts}
            (spread,) = spec.topology_spread_constraints
            assert spread.label_selector.match_labels == {"kvpilot.io/service": "pt", "kvpilot.io/track": "stable"}

        policy = client.PolicyV1Api(api)

        def pdb_healthy(allowed: int) -> bool:
            pdb = policy.read_namespaced_pod_disruption_budget("pt-stable", ns)
            return (pdb.status.expected_pods, pdb.status.current_healthy, pdb.status.disruptions_allowed) == (2, 2, allowed)

        wait_for(lambda: pdb_healthy(1), "PDB pt-stable: 2 expected, 2 healthy, 1 disruption allowed", 60)
        assert policy.read_namespaced_pod_disruption_budget("pt-stable", ns).spec.max_unavailable == 1
        env["kubectl"]("patch", "kvis", "pt", "-n", ns, "--type=merge", "-p",
                       '{"spec": {"disruptionBudget": {"maxUnavailable": 0}}}')
        wait_for(lambda: pdb_healthy(0), "PDB pt-stable with maxUnavailable 0", 60)
        victim = running(env, "kvpilot.io/service=pt")[0].metadata.name
        with pytest.raises(client.ApiException) as refused:  # a node drain's eviction, refused by the budget
            core.create_namespaced_pod_eviction(victim, ns, {"metadata": {"name": victim, "namespace": ns}})
        assert refused.value.status == 429 and "disruption budget" in refused.value.body
        env["kubectl"]("patch", "kvis", "pt", "-n", ns, "--type=merge", "-p",
                       '{"spec": {"disruptionBudget": {"maxUnavailable": null, "enabled": false}}}')
        wait_for(lambda: not policy.list_namespaced_pod_disruption_budget(
            ns, label_selector="kvpilot.io/service=pt").items, "PDB removed with enabled: false", 60)
    finally:
        env["kubectl"]("delete", "kvis", "pt", "-n", ns, "--ignore-not-found", "--wait=true")
        client.SchedulingV1Api(api).delete_priority_class(f"llm-{RUN}")
        client.NodeV1Api(api).delete_runtime_class(f"gpu-{RUN}")


def test_canary_waits_for_free_gpus_says_how_many_and_is_sized_from_the_weight(env, gpu_nodes) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    ns, apps = env["ns"], env["apps"]
    policy = client.PolicyV1Api(env["core"].api_client)
    gpu_nodes("b", 2)
    try:
        env["kubectl"].apply(isolated("gc", ns, replicas=2))
        wait_for(lambda: len(running(env, "kvpilot.io/service=gc,kvpilot.io/track=stable")) == 2, "2 gc pods", 90)
        canary = {"strategy": {"kvCacheDtype": "int8"}, "steps": [50, 100], "interval": "1h"}
        env["kubectl"].apply(isolated("gc", ns, replicas=2, canary=canary))
        wait_for(lambda: condition(env, "gc", "CanaryGPUs").get("reason") == "InsufficientGPUs",
                 "CanaryGPUs=False/InsufficientGPUs", 60)
        message = condition(env, "gc", "CanaryGPUs")["message"]
        assert "needs 1 pod(s) x 1 GPU = 1 nvidia.com/gpu at its largest step (50%: ceil(50% x 2 stable" in message
        assert f"0 nvidia.com/gpu free on 1 matching node(s) ({LABEL}=NVIDIA-H200): 2 allocatable, 2 requested" in message
        assert not apps.list_namespaced_deployment(ns, label_selector="kvpilot.io/service=gc,kvpilot.io/track=canary").items
        seen = env["core"].list_namespaced_event(ns, field_selector="involvedObject.name=gc").items
        assert ("Warning", "InsufficientGPUs") in {(e.type, e.reason) for e in seen}
        assert not [e.message for e in seen if e.type == "Error"]  # waiting is no handler failure
        gpu_nodes("c", 2)  # capacity arrives: the canary follows within the recheck interval
        wait_for(lambda: condition(env, "gc", "CanaryGPUs").get("status") == "True", "CanaryGPUs=True", 90)
        assert "2 nvidia.com/gpu free on 2 matching node(s)" in condition(env, "gc", "CanaryGPUs")["message"]
        wait_for(lambda: len(running(env, "kvpilot.io/service=gc,kvpilot.io/track=canary")) == 1,
                 "one canary pod (ceil(50% x 2)), not two", 90)
        assert apps.read_namespaced_deployment("gc-canary", ns).spec.replicas == 1
        assert policy.read_namespaced_pod_disruption_budget("gc-canary", ns).spec.max_unavailable == 1
        env["kubectl"].apply(isolated("gc", ns, replicas=2))  # spec.canary removed: the track goes, PDB too
        wait_for(lambda: not policy.list_namespaced_pod_disruption_budget(
            ns, label_selector="kvpilot.io/service=gc,kvpilot.io/track=canary").items, "canary PDB removed", 60)
        assert policy.read_namespaced_pod_disruption_budget("gc-stable", ns) is not None
    finally:
        env["kubectl"]("delete", "kvis", "gc", "-n", ns, "--ignore-not-found", "--wait=true")


CANARY = {"strategy": {"kvCacheDtype": "int8"}}


@pytest.mark.parametrize(("change", "message"), [
    ({"canary": {**CANARY, "steps": [5, 1, 100]}}, r"spec\.canary\.steps: Invalid value.*must rise strictly"),
    ({"canary": {**CANARY, "steps": [1, 5, 5, 100]}}, r"spec\.canary\.steps: Invalid value.*must rise strictly"),
    ({"canary": {**CANARY, "model": {"uri": "http://example.com/m"}}}, r"spec\.canary\.model\.uri: Invalid value.*must be pvc://<claim>/<dir>, .*hf://"),
    ({"canary": {**CANARY, "header": "X Model: Strategy"}},
     r"spec\.canary\.header: Invalid value.*must be an HTTP header name"),
    ({"canary": {**CANARY, "replicas": 0}}, r"spec\.canary\.replicas: Invalid value: 0"),
    ({"resources": {"gpuProduct": "N" * 64}}, r"spec\.resources\.gpuProduct: Too long"),
    ({"resources": {"gpuProduct": "NVIDIA H200"}}, r"spec\.resources\.gpuProduct: Invalid value.*label value"),
    ({"resources": {"gpuProduct": "h200", "gpuProductLabel": "bad key/with/slashes"}},
     r"spec\.resources\.gpuProductLabel: Invalid value.*must be a label key"),
    ({"resources": {"gpuProduct": "h200", "requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}},
     r"spec\.resources: Invalid value.*requests may not exceed spec\.resources\.limits"),
    ({"resources": {"gpuProduct": "h200", "requests": {"cpu": "lots"}}}, r"spec\.resources\.requests\.cpu: Invalid value"),
    ({"engine": {"args": ["--fault-error-rate", "0.5"]}}, r"spec\.engine\.args: Invalid value.*test-only --fault-\*"),
    ({"engine": {"args": ["--fault-e=0.5"]}}, r"spec\.engine\.args: Invalid value.*test-only --fault-\*"),
    ({"engine": {"args": ["--stats-host", "0.0.0.0"]}}, r"spec\.engine\.args: Invalid value.*--stats-host may only be loopback"),
    ({"engine": {"args": ["--stats-host=0.0.0.0"]}}, r"spec\.engine\.args: Invalid value.*--stats-host may only be loopback"),
    ({"engine": {"args": ["--stats-h", "10.0.0.1"]}}, r"spec\.engine\.args: Invalid value.*--stats-host may only be loopback"),
    ({"engine": {"args": ["--stats-host"]}}, r"spec\.engine\.args: Invalid value.*--stats-host may only be loopback"),
    ({"pod": {"labels": {"kvpilot.io/track": "x"}}}, r"spec\.pod\.labels: Invalid value.*keys under kvpilot\.io/"),
    ({"pod": {"annotations": {"prometheus.io/port": "1"}}}, r"spec\.pod\.annotations: Invalid value.*prometheus\.io/"),
    ({"pod": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, r"spec\.pod\.volumes: Invalid value.*are the operator's"),
    ({"pod": {"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/tmp"}]}},
     r"spec\.pod\.volumeMounts\[0\]: Invalid value.*may not overlap the operator's mounts"),
    ({"pod": {"volumeMounts": [{"name": "x", "mountPath": "/mnt/x"}]}},
     r"spec\.pod\.volumeMounts: Invalid value.*only volumes declared in spec\.pod\.volumes"),
    ({"pod": {"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}},
     r"spec\.pod\.tolerations\[0\]: Invalid value.*operator Exists takes no value"),
    ({"pod": {"serviceAccountName": "Not_A_Name"}}, r"spec\.pod\.serviceAccountName: Invalid value"),
    ({"pod": {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}},
     r"spec\.pod\.env\[0\]: Invalid value.*value or valueFrom, not both"),
    ({"pod": {"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}},
     r"spec\.pod\.topologySpreadConstraints\[0\]\.maxSkew: Invalid value: 0"),
    ({"pod": {"affinity": {"nodeAfinity": {}}}}, r'unknown field "spec\.pod\.affinity\.nodeAfinity"'),
    ({"pod": {"env": [{"name": f"V{i}", "value": "1"} for i in range(65)]}}, r"spec\.pod\.env: Too many"),
    ({"disruptionBudget": {"maxUnavailable": "150%"}}, r"spec\.disruptionBudget\.maxUnavailable: Invalid value.*0%\.\.100%"),
    ({"disruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}}, r"spec\.disruptionBudget: Invalid value.*not both"),
])
def test_the_api_server_refuses_bad_specs_naming_the_field(env, change, message) -> None:  # type: ignore[no-untyped-def]
    result = env["kubectl"].apply(manifest("bad", env["ns"], **change), check=False)
    assert result.returncode != 0, f"accepted: {change}"
    assert re.search(message, result.stderr), result.stderr


@pytest.mark.parametrize("change", [
    {"canary": {**CANARY, "steps": [1, 5, 100], "header": "X-Model-Strategy", "replicas": 2,
                "model": {"uri": "pvc://models/llama-3-8b-v2"}}},
    {"canary": {**CANARY, "model": {"uri": "oci://registry.local:5000/models/llama:v2"}}},
    {"engine": {"args": ["--stats-host", "127.0.0.1", "--log-level", "info"]}},
    {"engine": {"args": ["--stats-host=::1"]}},
    {"resources": {"gpuProduct": "nvidia-h100-80gb", "gpuProductLabel": "cloud.google.com/gke-accelerator",
                   "requests": {"cpu": "500m", "memory": "64Gi"}, "limits": {"cpu": "8", "memory": "64Gi"}}},
    {"disruptionBudget": {"minAvailable": "50%"}},
])
def test_the_api_server_accepts_good_specs(env, change) -> None:  # type: ignore[no-untyped-def]
    import yaml

    result = env["kubectl"]("apply", "--dry-run=server", "-f", "-",
                            stdin=yaml.safe_dump(manifest("good", env["ns"], **change)))
    assert "inferenceservice.kvpilot.io/good" in result.stdout and "(server dry run)" in result.stdout, result.stdout
