"""Pod blockers on a real control plane: the real kube-scheduler refuses pods (no node with the GPU
product, a missing PersistentVolumeClaim), KWOK plays the kubelet for an image on the reserved
.invalid domain (ImagePullBackOff, kvpilot/cluster/kwok_stages.yaml). The operator (subprocess)
must surface each as PodsBlocked with the component's own message and a Warning Event about the
InferenceService, and clear it when the spec is fixed. The Deployment's progressDeadlineSeconds
covers the engine's start (not Kubernetes' 600 s default)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.cluster import wait_for
from tests.harness.operator import manifest, operator_env

pytestmark = pytest.mark.cluster
UNPULLABLE = "registry.invalid/kvpilot:unpullable"


@pytest.fixture(scope="module")
def env(k8s_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    with operator_env(k8s_cluster, tmp_path_factory, "pb") as env:
        yield env


def service(env: dict, name: str) -> dict[str, Any]:
    return env["custom"].get_namespaced_custom_object("kvpilot.io", "v1alpha1", env["ns"], "inferenceservices", name)


def blocked(env: dict, name: str) -> dict[str, Any]:
    conditions = service(env, name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "PodsBlocked"), {})


def warnings(env: dict, name: str) -> list[tuple[str, str]]:
    found = env["core"].list_namespaced_event(env["ns"], field_selector=f"involvedObject.name={name}").items
    return [(e.reason, e.message) for e in found if e.involved_object.kind == "InferenceService" and e.type == "Warning"]


def wait_blocked(env: dict, name: str, reason: str, timeout_s: float = 90) -> dict[str, Any]:
    wait_for(lambda: blocked(env, name).get("reason") == reason,
             f"{name}: PodsBlocked {reason} (now {blocked(env, name)})", timeout_s)
    return blocked(env, name)


@pytest.mark.parametrize(("name", "spec", "reason", "words"), [
    ("no-gpu-node", {"resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"}}, "Unschedulable",
     "didn't match Pod's node affinity/selector"),
    ("no-claim", {"model": {"uri": "pvc://no-such-claim/llama-3-8b", "config": manifest("x", "y")["spec"]["model"][
        "config"]}}, "PersistentVolumeClaimMissing", 'persistentvolumeclaim "no-such-claim" not found'),
    ("no-image", {"engine": {"image": UNPULLABLE}}, "ImagePullBackOff", f'Back-off pulling image "{UNPULLABLE}"'),
])
def test_a_blocked_pod_is_surfaced_with_its_own_message(env: dict, name: str, spec: dict, reason: str,
                                                       words: str) -> None:
    body = manifest(name, env["ns"], **spec)
    body["spec"]["replicas"] = 1
    env["kubectl"].apply(body)
    cond = wait_blocked(env, name, reason)
    assert cond["status"] == "True" and words in cond["message"], cond
    pods = service(env, name)["status"]["blockedPods"]
    # one pod; the image's two containers (engine and sidecar) each wait for it
    assert {(p["track"], p["reason"], p["pod"]) for p in pods} == {("stable", reason, pods[0]["pod"])}, pods
    assert pods[0]["pod"].startswith(f"{name}-stable-"), pods
    assert words in pods[0]["message"]
    wait_for(lambda: any(r == reason and pods[0]["pod"] in m and words in m for r, m in warnings(env, name)),
             f"a Warning Event {reason} naming the pod ({warnings(env, name)})", 30)
    deployment = env["apps"].read_namespaced_deployment(f"{name}-stable", env["ns"])
    assert deployment.spec.progress_deadline_seconds == 2400  # 1800 s startup probe + 600 s, not the 600 s default
    env["kubectl"]("delete", "kvis", name, "-n", env["ns"], "--wait=false")


def test_fixing_the_spec_clears_the_blocker(env: dict) -> None:
    name = "fixed-later"
    body = manifest(name, env["ns"], resources={"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"})
    body["spec"]["replicas"] = 1
    env["kubectl"].apply(body)
    wait_blocked(env, name, "Unschedulable")
    body["spec"]["resources"]["gpuProduct"] = "NVIDIA-H200"  # what the KWOK nodes carry
    env["kubectl"].apply(body)
    wait_blocked(env, name, "NoBlockers", 120)
    status = service(env, name)["status"]
    assert blocked(env, name)["status"] == "False" and "blockedPods" not in status, status
    wait_for(lambda: service(env, name)["status"].get("phase") == "Ready", f"{name} Ready", 90)
    events = [r for r, _ in warnings(env, name)]
    assert events.count("Unschedulable") == 1, events  # one Event per blocker, not one per pod update
