"""Free GPUs on the nodes a track's pods may land on: allocatable minus what running pods request.

A node counts when it carries every label of the pod's node selector, satisfies its required node
affinity (matchExpressions), is schedulable and Ready, and has no NoSchedule/NoExecute taint the
pod does not tolerate. Pods not yet bound to a node are not counted; neither are GPUs a node
autoscaler could add (use --canary-gpu-check warn there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.operator import constants as c

_DONE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class GpuCapacity:
    """GPUs on matching nodes, and how many pods of `gpus_per_pod` fit in what is free."""

    nodes: int
    allocatable: int
    requested: int
    free: int
    pods_that_fit: int  # each pod needs all its GPUs on one node

    def describe(self, selector: Mapping[str, str]) -> str:
        where = ",".join(f"{k}={v}" for k, v in selector.items())
        return (f"{self.free} {c.GPU_RESOURCE} free on {self.nodes} matching node(s) ({where}): "
                f"{self.allocatable} allocatable, {self.requested} requested by running pods")


def gpu_capacity(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], *,
                 node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]],
                 affinity: Mapping[str, Any] | None, gpus_per_pod: int) -> GpuCapacity:
    """Pure: the nodes and pods as the API lists them."""
    matching = [n for n in nodes if _eligible(n, node_selector, tolerations, affinity or {})]
    names = {n["metadata"]["name"] for n in matching}
    used: dict[str, int] = dict.fromkeys(names, 0)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in used and (pod.get("status") or {}).get("phase") not in _DONE_PHASES:
            used[node] += pod_gpus(pod)
    allocatable = {n["metadata"]["name"]: _quantity((n.get("status") or {}).get("allocatable", {}).get(c.GPU_RESOURCE))
                   for n in matching}
    free = {name: max(0, allocatable[name] - used[name]) for name in names}
    per_pod = max(1, gpus_per_pod)
    return GpuCapacity(nodes=len(matching), allocatable=sum(allocatable.values()), requested=sum(used.values()),
                       free=sum(free.values()), pods_that_fit=sum(f // per_pod for f in free.values()))


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """A pod's effective GPU request: the larger of its containers' sum and its largest init container."""
    spec = pod.get("spec") or {}

    def request(ctr: Mapping[str, Any]) -> int:
        res = ctr.get("resources") or {}
        return _quantity((res.get("requests") or {}).get(c.GPU_RESOURCE) or (res.get("limits") or {}).get(c.GPU_RESOURCE))

    main = sum(request(ctr) for ctr in spec.get("containers") or ())
    init = max((request(ctr) for ctr in spec.get("initContainers") or ()), default=0)
    return max(main, init)


def _eligible(node: Mapping[str, Any], selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]],
              affinity: Mapping[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if any(labels.get(k) != v for k, v in selector.items()) or spec.get("unschedulable"):
        return False
    ready = next((cond for cond in status.get("conditions") or () if cond.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        return False
    for taint in spec.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in tolerations):
            return False
    required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or ()
    return not terms or any(_term_matches(term, labels) for term in terms)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for expr in term.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or ())
        value = labels.get(key)
        ok = {
            "In": value is not None and value in values,
            "NotIn": value is None or value not in values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
            "Gt": value is not None and _int(value) is not None and values and _int(value) > int(values[0]),
            "Lt": value is not None and _int(value) is not None and values and _int(value) < int(values[0]),
        }.get(str(op), False)
        if not ok:
            return False
    return True


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _quantity(value: Any) -> int:
    """An extended resource's quantity: whole numbers only ('8', 8)."""
    if value is None:
        return 0
    try:
        return int(str(value))
    except ValueError:
        return 0
