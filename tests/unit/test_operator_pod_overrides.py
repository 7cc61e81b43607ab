"""spec.pod, spec.resources.requests/limits, the GPU product label, PDBs and canary sizing (pure)."""

from __future__ import annotations

import pytest
from operator_fakes import service

from kvpilot.operator import constants as c
from kvpilot.operator import options
from kvpilot.operator.builders import build_deployment
from kvpilot.operator.builders.pdb import build_pdb
from kvpilot.operator.reconcile.preflight import StrategyRefused, preflight
from kvpilot.operator.reconcile.tracks import canary_spec
from kvpilot.operator.rollout.replicas import canary_replicas, canary_size, peak_canary_size
from kvpilot.operator.spec import ServiceSpec, canary_hash

pytestmark = pytest.mark.unit

POD = {
    "labels": {"team": "llm", "cost-center": "42"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "nodeSelector": {"pool": "gpu-a"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway"}],
    "imagePullSecrets": [{"name": "registry"}],
    "runtimeClassName": "nvidia",
    "priorityClassName": "llm-high",
    "serviceAccountName": "chat-engine",
    "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "HF_HOME", "value": "/mnt/hf"}],
    "volumes": [{"name": "hf", "emptyDir": {}}],
    "volumeMounts": [{"name": "hf", "mountPath": "/mnt/hf"}],
}
RESOURCES = {"gpus": 1, "gpuProduct": "NVIDIA-H200", "requests": {"cpu": "8", "memory": "64Gi"},
             "limits": {"memory": "96Gi"}}


def built(body: dict, track: str = "stable") -> tuple[dict, dict]:
    spec = ServiceSpec.from_dict(body["spec"])
    dep = build_deployment(body, spec, preflight(spec, body["spec"]["model"]["config"]), track=track)
    return dep, dep["spec"]["template"]


def test_pod_overrides_reach_the_pod_template_and_the_operators_own_fields_win() -> None:
    _dep, template = built(service(pod=POD, resources=RESOURCES))
    meta, pod = template["metadata"], template["spec"]
    assert meta["labels"]["team"] == "llm" and meta["labels"][c.LABEL_TRACK] == "stable"
    assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["nodeSelector"] == {"pool": "gpu-a", "nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["affinity"] == POD["affinity"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  POD["tolerations"][0]]
    (spread,) = pod["topologySpreadConstraints"]  # no labelSelector given: spreads this track's pods
    assert spread["labelSelector"] == {"matchLabels": {c.LABEL_SERVICE: "chat", c.LABEL_TRACK: "stable"}}
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert (pod["runtimeClassName"], pod["priorityClassName"], pod["serviceAccountName"]) == (
        "nvidia", "llm-high", "chat-engine")
    assert pod["automountServiceAccountToken"] is False
    engine, sidecar = pod["containers"]
    assert engine["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}
    assert engine["resources"]["limits"] == {"memory": "96Gi", "nvidia.com/gpu": "1"}
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == "/mnt/hf"  # replaces the operator's value
    assert [e["name"] for e in engine["env"]].count("HF_HOME") == 1  # SSA refuses duplicate list-map keys
    assert {"name": "hf", "mountPath": "/mnt/hf"} in engine["volumeMounts"]
    assert {"name": "hf", "emptyDir": {}} in pod["volumes"]
    assert "hf" not in [m["name"] for m in sidecar["volumeMounts"]]


def test_without_overrides_the_pod_is_as_before() -> None:
    _dep, template = built(service())
    pod = template["spec"]
    for key in ("affinity", "topologySpreadConstraints", "imagePullSecrets", "runtimeClassName",
                "priorityClassName", "serviceAccountName"):
        assert key not in pod
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["containers"][0]["resources"] == {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}


def test_the_canary_gets_the_same_overrides() -> None:
    body = service(pod=POD, resources=RESOURCES, canary={"strategy": {"kvCacheDtype": "fp8"}})
    spec = canary_spec(body["spec"], None, "ns")
    assert spec is not None
    dep = build_deployment(body, spec, preflight(spec, body["spec"]["model"]["config"]), track="canary")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "chat-engine" and pod["nodeSelector"]["pool"] == "gpu-a"
    assert pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"][c.LABEL_TRACK] == "canary"


@pytest.mark.parametrize(("label", "value"), [("cloud.google.com/gke-accelerator", "nvidia-h100-80gb"),
                                              ("karpenter.k8s.aws/instance-gpu-name", "h100")])
def test_gpu_product_label_of_other_providers(label: str, value: str) -> None:
    _dep, template = built(service(resources={"gpuProduct": value, "gpuProductLabel": label}))
    assert template["spec"]["nodeSelector"] == {label: value}


def test_gpu_product_label_from_the_operator_flag() -> None:
    before = options.current()
    options.configure(options.Options(gpu_product_label="cloud.google.com/gke-accelerator"))
    try:
        _dep, template = built(service(resources={"gpuProduct": "nvidia-h100-80gb"}))
        assert template["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        _dep, template = built(service(resources={"gpuProduct": "h100", "gpuProductLabel": "x.io/gpu"}))
        assert template["spec"]["nodeSelector"] == {"x.io/gpu": "h100"}  # the spec's wins
    finally:
        options.configure(before)


@pytest.mark.parametrize(("pod", "message"), [
    ({"labels": {"kvpilot.io/track": "x"}}, "spec.pod.labels['kvpilot.io/track']"),
    ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "spec.pod.volumes[0].name 'dshm'"),
    ({"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": "/tmp/x"}]},
     "spec.pod.volumeMounts[0].mountPath '/tmp/x' overlaps"),
    ({"volumeMounts": [{"name": "nope", "mountPath": "/mnt/x"}]}, "spec.pod.volumeMounts[0] mounts 'nope'"),
])
def test_overrides_that_collide_with_the_operators_are_refused_by_field(pod: dict, message: str) -> None:
    body = service(pod=pod)
    spec = ServiceSpec.from_dict(body["spec"])
    with pytest.raises(StrategyRefused) as err:
        preflight(spec, body["spec"]["model"]["config"])
    assert message in str(err.value)


def test_pdb_per_track_selects_that_tracks_pods() -> None:
    body = service()
    spec = ServiceSpec.from_dict(body["spec"])
    for track in ("stable", "canary"):
        pdb = build_pdb(body, spec, track)
        assert pdb["apiVersion"] == "policy/v1" and pdb["metadata"]["name"] == f"chat-{track}"
        assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
        assert pdb["spec"]["selector"] == {"matchLabels": {c.LABEL_SERVICE: "chat", c.LABEL_TRACK: track}}
        assert pdb["metadata"]["ownerReferences"][0]["uid"] == "uid-chat"
    spec = ServiceSpec.from_dict(service(disruptionBudget={"minAvailable": "50%"})["spec"])
    assert build_pdb(body, spec)["spec"]["minAvailable"] == "50%" and "maxUnavailable" not in build_pdb(body, spec)["spec"]


@pytest.mark.parametrize(("stable", "weight", "expected"), [
    (4, 1, 1), (4, 5, 1), (4, 25, 1), (4, 26, 2), (4, 50, 2), (10, 5, 1), (10, 50, 5), (10, 100, 10),
    (0, 5, 1), (1000, 1, 10),
])
def test_canary_size_is_derived_from_the_weight(stable: int, weight: int, expected: int) -> None:
    spec = ServiceSpec.from_dict(service(replicas=stable, canary={"steps": [weight]})["spec"])
    assert canary_replicas(spec, weight) == expected
    assert "stable replicas" in canary_size(spec, weight).how


def test_canary_replicas_fixed_and_the_peak_step() -> None:
    spec = ServiceSpec.from_dict(service(replicas=10, canary={"steps": [1, 20, 50, 100]})["spec"])
    peak = peak_canary_size(spec)
    assert (peak.replicas, peak.weight) == (5, 50)  # the 100 step is the promotion, not a step
    spec = ServiceSpec.from_dict(service(replicas=10, canary={"steps": [1, 5, 100], "replicas": 3})["spec"])
    assert canary_replicas(spec, 1) == canary_replicas(spec, 100) == 3 == peak_canary_size(spec).replicas
    assert canary_size(spec, 5).how == "fixed by spec.canary.replicas"


def test_resizing_or_pausing_a_canary_is_not_a_new_rollout() -> None:
    raw = {"strategy": {"kvCacheDtype": "fp8"}, "steps": [1, 5, 100]}
    assert canary_hash(raw) == canary_hash({**raw, "replicas": 3}) == canary_hash({**raw, "paused": True})
    assert canary_hash(raw) != canary_hash({**raw, "steps": [1, 100]})


@pytest.mark.parametrize(("value", "product"), [
    ("nvidia-h200-141gb", "NVIDIA-H200"), ("nvidia-h100-80gb", "NVIDIA-H100-80GB-HBM3"),
    ("nvidia-h100-mega-80gb", "NVIDIA-H100-80GB-HBM3"), ("nvidia-tesla-a100", "NVIDIA-A100-SXM4-40GB"),
    ("nvidia-a100-80gb", "NVIDIA-A100-SXM4-80GB"), ("nvidia-l4", "NVIDIA-L4"), ("nvidia-tesla-t4", "Tesla-T4"),
    ("h100", "NVIDIA-H100-80GB-HBM3"), ("h200", "NVIDIA-H200"), ("a10g", "NVIDIA-A10G"), ("l40s", "NVIDIA-L40S"),
])
def test_the_planner_knows_gke_and_karpenter_gpu_names(value: str, product: str) -> None:
    from kvpilot.planner import gpu_spec

    assert gpu_spec(value).product == product


def test_every_volume_and_engine_mount_the_operator_builds_is_reserved_in_spec_pod_and_the_crd() -> None:
    """A new operator volume (model delivery, API key, calibration, ...) must be refused in spec.pod too."""
    import yaml

    from kvpilot.operator.pod_overrides import RESERVED_MOUNT_PATHS, RESERVED_VOLUMES
    from tests.unit.operator_fakes import SHA

    bodies = [
        service(),
        service(model={"uri": "s3://bucket/llama", "sha256": SHA, "config": service()["spec"]["model"]["config"],
                       "credentialsSecretRef": {"name": "s3-login"}},
                engine={"image": "kvpilot:test", "apiKeySecretRef": {"name": "key"}},
                strategy={"attention": "gqa", "kvHeadGroups": 4, "calibration": {"configMap": "text"}}),
    ]
    names, paths = set(), set()
    for body in bodies:
        _dep, template = built(body)
        names |= {v["name"] for v in template["spec"]["volumes"]}
        engine = template["spec"]["containers"][0]
        paths |= {m["mountPath"] for m in engine["volumeMounts"]}
    assert {"model-credentials", "api-key", "calibration", "model"} <= names
    assert names <= set(RESERVED_VOLUMES), names - set(RESERVED_VOLUMES)
    assert all(any(p == r or p.startswith(r + "/") for r in RESERVED_MOUNT_PATHS) for p in paths), paths
    from pathlib import Path

    crd = yaml.safe_load((Path(__file__).parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml").read_text())
    pod = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["pod"]
    rule = pod["properties"]["volumes"]["x-kubernetes-validations"][0]["rule"]
    assert all(f"'{name}'" in rule for name in RESERVED_VOLUMES)
    mount_rule = pod["properties"]["volumeMounts"]["items"]["x-kubernetes-validations"][0]["rule"]
    assert all(f"'{path}'" in mount_rule for path in RESERVED_MOUNT_PATHS)
