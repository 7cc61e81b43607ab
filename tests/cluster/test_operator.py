"""The operator on a real control plane with KWOK GPU nodes: kubectl in, children and pods out.

One operator subprocess serves the module (its own namespace); each test uses its own
InferenceService. The API server validates manifests against crds/, the controller-manager
rolls Deployments and garbage-collects owned objects, KWOK runs the pods.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.harness.cluster import wait_for
from tests.harness.operator import manifest, operator_env
from tests.helpers.model_configs import DEEPSEEK_V3, LLAMA3_8B

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def env(k8s_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    with operator_env(k8s_cluster, tmp_path_factory, "op") as env:
        yield env


def service(env: dict, name: str) -> dict[str, Any]:
    return env["custom"].get_namespaced_custom_object("kvpilot.io", "v1alpha1", env["ns"], "inferenceservices", name)


def condition(obj: dict, type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def wait_phase(env: dict, name: str, phase: str, timeout_s: float = 90) -> dict[str, Any]:
    wait_for(lambda: service(env, name).get("status", {}).get("phase") == phase, f"{name} phase {phase}", timeout_s)
    return service(env, name)


def pods(env: dict, name: str) -> list:
    return env["core"].list_namespaced_pod(env["ns"], label_selector=f"kvpilot.io/service={name}").items


def events(env: dict, name: str) -> list[tuple[str, str, str]]:
    found = env["core"].list_namespaced_event(env["ns"], field_selector=f"involvedObject.name={name}").items
    return [(e.type, e.reason, e.message) for e in found if e.involved_object.kind == "InferenceService"]


def children_versions(env: dict, name: str) -> dict[str, str]:
    ns, core, apps = env["ns"], env["core"], env["apps"]
    selector = f"kvpilot.io/service={name}"
    out = {f"deployment/{d.metadata.name}": d.metadata.resource_version
           for d in apps.list_namespaced_deployment(ns, label_selector=selector).items}
    out |= {f"replicaset/{r.metadata.name}": r.metadata.resource_version
            for r in apps.list_namespaced_replica_set(ns, label_selector=selector).items}
    out |= {f"service/{s.metadata.name}": s.metadata.resource_version
            for s in core.list_namespaced_service(ns, label_selector=selector).items}
    out |= {f"configmap/{c.metadata.name}": c.metadata.resource_version
            for c in core.list_namespaced_config_map(ns, label_selector=selector).items}
    out["inferenceservice"] = service(env, name)["metadata"]["resourceVersion"]
    return out


def test_apply_creates_children_and_pods_run_on_gpu_nodes(env) -> None:  # type: ignore[no-untyped-def]
    env["kubectl"].apply(manifest("chat", env["ns"]))
    obj = wait_phase(env, "chat", "Ready")
    assert obj["status"]["ready"] == "2/2" and obj["status"]["strategy"] == "gqa4-bf16"
    assert condition(obj, "CapacityPlanned")["status"] == "True"
    assert condition(obj, "Ready")["status"] == "True"
    assert condition(obj, "Monitoring")["reason"] == "PrometheusOperatorMissing"
    capacity = obj["status"]["capacity"]
    assert capacity["bytesPerToken"] == 32 * 2 * 4 * 128 * 2 and capacity["maxConcurrency"] > 1
    dep = env["apps"].read_namespaced_deployment("chat-stable", env["ns"])
    assert dep.metadata.owner_references[0].kind == "InferenceService"
    engine = dep.spec.template.spec.containers[0]
    assert engine.args[engine.args.index("--max-num-seqs") + 1] == str(capacity["maxConcurrency"])
    assert {s.metadata.name for s in env["core"].list_namespaced_service(env["ns"]).items} >= {"chat", "chat-metrics"}
    lineage = env["core"].read_namespaced_config_map("chat-lineage", env["ns"])
    assert json.loads(lineage.data["stable"])["current"]["sha256"] == "ab" * 32
    running = pods(env, "chat")
    assert len(running) == 2
    for pod in running:
        assert pod.status.phase == "Running"
        assert pod.spec.node_name in env["nodes"]
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    wait_for(lambda: {"CapacityPlanned", "RolloutStarted", "Ready"} <= {e[1] for e in events(env, "chat")},
             "events CapacityPlanned, RolloutStarted, Ready", 30)
    printed = env["kubectl"]("get", "kvis", "chat", "-n", env["ns"]).stdout
    assert re.search(r"chat\s+Ready\s+gqa4-bf16\s+(<none>\s+)?2/2\s", printed), printed


def test_strategy_change_is_one_rolling_update(env) -> None:  # type: ignore[no-untyped-def]
    env["kubectl"].apply(manifest("roll", env["ns"], replicas=1))
    wait_phase(env, "roll", "Ready")
    sets = env["apps"].list_namespaced_replica_set(env["ns"], label_selector="kvpilot.io/service=roll").items
    assert len(sets) == 1
    env["kubectl"]("patch", "kvis", "roll", "-n", env["ns"], "--type=merge", "-p",
                   json.dumps({"spec": {"strategy": {"kvCacheDtype": "int8"}}}))
    wait_for(lambda: service(env, "roll").get("status", {}).get("strategy") == "gqa4-int8", "new strategy", 60)
    obj = wait_phase(env, "roll", "Ready")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 2
    dep = env["apps"].read_namespaced_deployment("roll-stable", env["ns"])
    assert dep.metadata.generation == 2
    sets = env["apps"].list_namespaced_replica_set(env["ns"], label_selector="kvpilot.io/service=roll").items
    assert len(sets) == 2  # exactly one new ReplicaSet
    assert sorted(rs.spec.replicas for rs in sets) == [0, 1]
    wait_for(lambda: [p.metadata.labels["kvpilot.io/strategy"] for p in pods(env, "roll")
                      if p.metadata.deletion_timestamp is None] == ["gqa4-int8"], "one int8 pod", 60)


def test_operator_restart_rewrites_nothing(env) -> None:  # type: ignore[no-untyped-def]
    env["kubectl"].apply(manifest("calm", env["ns"]))
    wait_phase(env, "calm", "Ready")
    time.sleep(2)  # let the last Deployment/ReplicaSet status updates land
    before = children_versions(env, "calm")
    operator = env["operator"]
    seen = operator.reconciled("calm")
    operator.stop()
    operator.start()
    wait_for(lambda: operator.reconciled("calm") > seen, "resume of calm", 60)
    time.sleep(3)
    assert children_versions(env, "calm") == before


def test_delete_garbage_collects_everything(env) -> None:  # type: ignore[no-untyped-def]
    env["kubectl"].apply(manifest("gone", env["ns"], replicas=1))
    wait_phase(env, "gone", "Ready")

    def children() -> dict[str, int]:
        selector = "kvpilot.io/service=gone"
        return {
            "deployments": len(env["apps"].list_namespaced_deployment(env["ns"], label_selector=selector).items),
            "replicasets": len(env["apps"].list_namespaced_replica_set(env["ns"], label_selector=selector).items),
            "pods": len(pods(env, "gone")),
            "services": len(env["core"].list_namespaced_service(env["ns"], label_selector=selector).items),
            "configmaps": len(env["core"].list_namespaced_config_map(env["ns"], label_selector=selector).items),
        }

    before = children()
    assert all(before.values()), f"a kind of child is missing before the delete (the selector would prove nothing): {before}"
    env["kubectl"]("delete", "kvis", "gone", "-n", env["ns"], "--wait=true")
    wait_for(lambda: not any(children().values()), "garbage collection of gone's children", 90)
    assert not any(children().values())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"strategy": {"attention": "sparse"}}, r'spec\.strategy\.attention: Unsupported value: "sparse"'),
        ({"strategy": {"kvCacheDtype": "int4"}}, r"spec\.strategy\.kvCacheDtype: Unsupported value"),
        ({"strategy": {"attention": "gqa"}}, r"kvHeadGroups is required when strategy\.attention is gqa"),
        ({"strategy": {"kvCacheDtype": "int8", "kvQuantAutoThreshold": 8}},
         r"kvQuantAutoThreshold applies to kvCacheDtype auto only"),
        ({"strategy": {"fallbackReserve": 0.95}}, r"spec\.strategy\.fallbackReserve: Invalid value"),
        ({"strategy": {"maxSeqLen": 4}}, r"spec\.strategy\.maxSeqLen: Invalid value: 4"),
        ({"replicas": -1}, r"spec\.replicas: Invalid value: -1"),
        ({"resources": {"gpus": 1}}, r"spec\.resources\.gpuProduct: Required value"),
        ({"model": {"uri": "gs://bucket/model", "config": LLAMA3_8B}}, r"spec\.model\.uri: Invalid value.*must be pvc://"),
        ({"strategy": {"attention": "mla", "latentRank": 512, "mlaRopeDims": 15}},
         r"spec\.strategy\.mlaRopeDims: Invalid value.*must be even"),
        ({"strategy": {"attention": "mla", "latentRank": 512, "mlaRopeDims": 0}},
         r"spec\.strategy\.mlaRopeDims: Invalid value: 0"),
        ({"strategy": {"attention": "gqa", "kvHeadGroups": 4, "mlaRopeDims": 16}},
         r"spec\.strategy\.mlaRopeDims: Invalid value.*applies to attention mla only"),
        ({"strategy": {"attention": "mla", "latentRank": 512, "mlaRopeDims": 16, "mlaRopePairs": "norm"}},
         r"spec\.strategy\.mlaRopePairs: Invalid value.*set strategy\.calibration"),
        ({"strategy": {"attention": "native", "calibration": {"configMap": "text"}}},
         r"spec\.strategy\.calibration: Invalid value.*gqa and mla conversions only"),
        ({"strategy": {"attention": "gqa", "kvHeadGroups": 4, "calibration": {"key": "t.txt"}}},
         r"spec\.strategy\.calibration\.configMap: Required value"),
        ({"strategy": {"attention": "gqa", "kvHeadGroups": 4, "calibration": {"configMap": "t", "tokens": 8}}},
         r"spec\.strategy\.calibration\.tokens: Invalid value: 8"),
        ({"strategy": {"attention": "gqa", "kvHeadGroups": 4, "calibration": {"configMap": "probes"}},
          "canary": {"strategy": {"kvCacheDtype": "int8"}, "analysis": {"probeSet": "probes"}}},
         r"calibration\.configMap may not be the canary's probe set"),
    ],
)
def test_invalid_manifest_is_rejected_naming_the_field(env, change, message) -> None:  # type: ignore[no-untyped-def]
    result = env["kubectl"].apply(manifest("bad", env["ns"], **change), check=False)
    assert result.returncode != 0
    assert re.search(message, result.stderr), result.stderr


def test_oversized_model_is_infeasible_and_gets_no_pods(env) -> None:  # type: ignore[no-untyped-def]
    env["kubectl"].apply(manifest("huge", env["ns"], config=DEEPSEEK_V3,
                                  strategy={"attention": "native", "maxSeqLen": 32768}))
    obj = wait_phase(env, "huge", "Infeasible")
    planned = condition(obj, "CapacityPlanned")
    assert planned["status"] == "False" and planned["reason"] == "Infeasible"
    assert "exceed 1 x NVIDIA-H200" in planned["message"] and "GiB" in planned["message"]
    wait_for(lambda: any(e[:2] == ("Warning", "CapacityInfeasible") for e in events(env, "huge")),
             "Warning event CapacityInfeasible", 30)
    time.sleep(2)
    assert env["apps"].list_namespaced_deployment(env["ns"], label_selector="kvpilot.io/service=huge").items == []
    assert pods(env, "huge") == []


def test_calibrated_conversion_mounts_its_configmap_and_rope_dims_beyond_head_dim_are_refused(env) -> None:  # type: ignore[no-untyped-def]
    ns = env["ns"]
    env["core"].create_namespaced_config_map(ns, {"metadata": {"name": "cal-text"}, "immutable": True,
                                                  "data": {"traffic.txt": "def main():\n    return 0\n"}})
    strategy = {"attention": "mla", "latentRank": 512, "mlaRopeDims": 16, "mlaRopePairs": "turn",
                "kvCacheDtype": "bf16", "maxSeqLen": 8192,
                "calibration": {"configMap": "cal-text", "key": "traffic.txt", "tokens": 512}}
    env["kubectl"].apply(manifest("calib", ns, replicas=1, strategy=strategy))
    env["kubectl"].apply(manifest("ropewide", ns, replicas=1, strategy={**strategy, "mlaRopeDims": 256}))
    wait_for(lambda: env["apps"].list_namespaced_deployment(ns, label_selector="kvpilot.io/service=calib").items,
             "calib's Deployment", 60)
    pod = env["apps"].read_namespaced_deployment("calib-stable", ns).spec.template.spec
    (volume,) = [v for v in pod.volumes if v.name == "calibration"]
    assert volume.config_map.name == "cal-text"
    assert [(i.key, i.path) for i in volume.config_map.items] == [("traffic.txt", "traffic.txt")]
    engine, sidecar = pod.containers
    (mount,) = [m for m in engine.volume_mounts if m.name == "calibration"]
    assert mount.mount_path == "/etc/kvpilot/calibration" and mount.read_only is True
    assert all(m.name != "calibration" for m in sidecar.volume_mounts)
    args = engine.args
    assert args[args.index("--conversion-calibration") + 1] == "/etc/kvpilot/calibration/traffic.txt"
    assert args[args.index("--calibration-tokens") + 1] == "512"
    assert args[args.index("--mla-rope-dims") + 1] == "16" and args[args.index("--mla-rope-pairs") + 1] == "turn"
    wait_for(lambda: service(env, "calib").get("status", {}).get("strategy") == "mla512rope16-bf16",
             "calib's status.strategy", 30)
    obj = service(env, "calib")
    assert obj["status"]["capacity"]["bytesPerToken"] == 32 * (512 + 8 * 16) * 2
    wide = wait_phase(env, "ropewide", "Failed", 60)
    planned = condition(wide, "CapacityPlanned")
    assert planned["reason"] == "InvalidSpec" and "mlaRopeDims" in planned["message"]
    assert "head_dim 128" in planned["message"]
    assert env["apps"].list_namespaced_deployment(ns, label_selector="kvpilot.io/service=ropewide").items == []
