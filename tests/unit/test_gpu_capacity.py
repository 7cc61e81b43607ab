"""Free GPUs on the nodes a pod may land on (pure), as the canary's preflight counts them."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.operator.rollout.gpu_capacity import gpu_capacity, pod_gpus

pytestmark = pytest.mark.unit
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H200"}


def node(name: str, gpus: int, *, product: str = "NVIDIA-H200", ready: bool = True, cordoned: bool = False,
         taints: list[dict[str, str]] | None = None, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, **labels}},
            "spec": {"unschedulable": cordoned, "taints": taints or [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(on: str, gpus: int, phase: str = "Running", init: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": on, "containers": [
        {"name": "a", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}, {"name": "b"}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": str(init)}}}]
    return {"spec": spec, "status": {"phase": phase}}


def count(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], per_pod: int = 1, **kw: Any):  # type: ignore[no-untyped-def]
    return gpu_capacity(nodes, pods, node_selector=kw.get("selector", SELECTOR),
                        tolerations=kw.get("tolerations", GPU_TOLERATION), affinity=kw.get("affinity"),
                        gpus_per_pod=per_pod)


def test_allocatable_minus_requested_on_matching_nodes() -> None:
    nodes = [node("a", 8), node("b", 8), node("c", 8, product="NVIDIA-A100-SXM4-80GB")]
    pods = [pod("a", 5), pod("b", 2), pod("b", 4, phase="Succeeded"), pod("c", 8), pod("x", 3)]
    cap = count(nodes, pods)
    assert (cap.nodes, cap.allocatable, cap.requested, cap.free, cap.pods_that_fit) == (2, 16, 7, 9, 9)
    assert "9 nvidia.com/gpu free on 2 matching node(s) (nvidia.com/gpu.product=NVIDIA-H200)" in cap.describe(SELECTOR)


def test_a_pod_needs_all_its_gpus_on_one_node() -> None:
    cap = count([node("a", 8), node("b", 8)], [pod("a", 5), pod("b", 5)], per_pod=4)
    assert cap.free == 6 and cap.pods_that_fit == 0
    assert count([node("a", 8), node("b", 8)], [pod("a", 4)], per_pod=4).pods_that_fit == 3


def test_unusable_nodes_do_not_count() -> None:
    nodes = [node("down", 8, ready=False), node("cordoned", 8, cordoned=True),
             node("tainted", 8, taints=[{"key": "dedicated", "value": "other", "effect": "NoSchedule"}]),
             node("ok", 8)]
    assert count(nodes, []).free == 8
    tolerated = [*GPU_TOLERATION, {"key": "dedicated", "operator": "Equal", "value": "other", "effect": "NoSchedule"}]
    assert count(nodes, [], tolerations=tolerated).free == 16


def test_node_selector_and_required_affinity_narrow_the_nodes() -> None:
    nodes = [node("a", 8, zone="a", pool="x"), node("b", 8, zone="b", pool="x"), node("c", 8, zone="c")]
    assert count(nodes, [], selector={**SELECTOR, "pool": "x"}).nodes == 2
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "c"]},
                              {"key": "pool", "operator": "DoesNotExist"}]}]}}}
    cap = count(nodes, [], affinity=affinity)
    assert (cap.nodes, cap.free) == (1, 8)


def test_effective_gpu_request_of_a_pod() -> None:
    assert pod_gpus(pod("a", 2)) == 2
    assert pod_gpus(pod("a", 2, init=4)) == 4  # init containers run before, one at a time
    assert pod_gpus({"spec": {"containers": [{"name": "x"}]}}) == 0
