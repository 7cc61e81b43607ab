"""Before the canary's first pod: are its GPUs free? Says so in status (condition CanaryGPUs) with the numbers.

The check sizes the canary at its largest step (kvpilot.operator.rollout.replicas) and counts free GPUs on
the nodes its pods may land on (kvpilot.operator.rollout.gpu_capacity). `--canary-gpu-check`: `require`
waits (no canary Deployment until they are free, re-checked every RECHECK_S), `warn` reports and
creates it anyway (a node autoscaler adds nodes only for pending pods), `off` skips it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.builders.pod_template import gpu_node_selector, gpu_tolerations
from kvpilot.operator.kube import Kube, KubeError
from kvpilot.operator.rollout.gpu_capacity import gpu_capacity
from kvpilot.operator.rollout.replicas import peak_canary_size
from kvpilot.operator.spec import ServiceSpec
from kvpilot.operator.status.conditions import Condition, get_condition
from kvpilot.operator.status.document import with_conditions
from kvpilot.operator.status.writer import write_status

CANARY_GPUS = "CanaryGPUs"
RECHECK_S = 15.0  # a waiting canary lists nodes and pods at most this often

_last_refusal: dict[tuple[str, str], tuple[float, str]] = {}
_guard = threading.Lock()


class GpusUnavailable(RuntimeError):
    """Too few free GPUs for the canary (mode require): retry later, nothing was created."""


def check_canary_gpus(kube: Kube, body: Mapping[str, Any], canary: ServiceSpec, mode: str,
                      emit: Any = None, now: str = "") -> Condition | None:
    """The CanaryGPUs condition, written to status; raises GpusUnavailable when mode is require and
    the canary's pods do not fit."""
    if mode == "off":
        return None
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    with _guard:
        recent = _last_refusal.get(key)
    if mode == "require" and recent and time.monotonic() - recent[0] < RECHECK_S:
        raise GpusUnavailable(recent[1])
    condition = _condition(kube, canary, mode)
    _record(kube, body, condition, emit, now)
    with _guard:
        if condition.status == "False" and mode == "require":
            _last_refusal[key] = (time.monotonic(), condition.message)
        else:
            _last_refusal.pop(key, None)
    if condition.status == "False" and mode == "require":
        raise GpusUnavailable(condition.message)
    return condition


def _condition(kube: Kube, canary: ServiceSpec, mode: str) -> Condition:
    size = peak_canary_size(canary)
    need = size.replicas * canary.gpus
    selector = gpu_node_selector(canary)
    wants = (f"the canary needs {size.replicas} pod(s) x {canary.gpus} GPU = {need} {c.GPU_RESOURCE} at its largest "
             f"step ({size.weight}%: {size.how})")
    try:
        label_selector = ",".join(f"{k}={v}" for k, v in selector.items())
        nodes = kube.request("GET", "/api/v1/nodes", params={"labelSelector": label_selector}).get("items") or []
        pods: list[dict[str, Any]] = []
        for node in nodes:
            found = kube.request("GET", "/api/v1/pods", params={
                "fieldSelector": f"spec.nodeName={node['metadata']['name']},status.phase!=Succeeded,"
                                 "status.phase!=Failed"})
            pods += found.get("items") or []
    except KubeError as exc:  # fail open, visibly: a check that cannot run must not stall every rollout
        hint = ("grant list on nodes and pods (chart value canaryGpuCheck) or run --canary-gpu-check off"
                if exc.status in (401, 403) else "the API server's answer follows")
        return Condition(CANARY_GPUS, "Unknown", "CannotCountGPUs",
                         f"{wants}; the operator could not list nodes and pods ({hint}): {str(exc)[:300]}; "
                         "creating the canary unchecked")
    capacity = gpu_capacity(nodes, pods, node_selector=selector, tolerations=gpu_tolerations(canary),
                            affinity=canary.pod.affinity, gpus_per_pod=canary.gpus)
    found = f"{capacity.describe(selector)}; {capacity.pods_that_fit} such pod(s) fit"
    if capacity.pods_that_fit >= size.replicas:
        return Condition(CANARY_GPUS, "True", "GPUsAvailable", f"{wants}; {found}")
    then = ("waiting before creating it (re-checked every 15 s; --canary-gpu-check warn creates it anyway)"
            if mode == "require" else "creating it anyway (--canary-gpu-check warn)")
    return Condition(CANARY_GPUS, "False", "InsufficientGPUs", f"{wants}; {found}: {then}")


def _record(kube: Kube, body: Mapping[str, Any], condition: Condition, emit: Any, now: str) -> None:
    meta = body["metadata"]

    def update(_live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        return with_conditions(old, [condition], now=now or _utc_now(), generation=old.get("observedGeneration"))

    result = write_status(kube, meta["namespace"], meta["name"], update)
    if result is None or emit is None:
        return
    before = get_condition(result[0].get("conditions"), CANARY_GPUS) or {}
    if (before.get("status"), before.get("message")) != (condition.status, condition.message):
        emit("Normal" if condition.status == "True" else "Warning", condition.reason, condition.message)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
