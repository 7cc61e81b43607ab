"""spec.pod and spec.resources.requests/limits applied to one track's pod template (pure).

The operator's own fields win where both set one: its labels and annotations (selectors, metric
labels, scrape hints), the GPU product node selector, the GPU toleration (the user's are added),
the nvidia.com/gpu request. The user's env replaces an operator variable of the same name.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.options import current as current_options
from kvpilot.operator.spec import ServiceSpec


def gpu_product_label(spec: ServiceSpec) -> str:
    """The node label that holds spec.resources.gpuProduct: the spec's, else the operator's flag."""
    return spec.gpu_product_label or current_options().gpu_product_label or c.GPU_PRODUCT_LABEL


def gpu_node_selector(spec: ServiceSpec) -> dict[str, str]:
    """Every node label the pods require: spec.pod.nodeSelector plus the GPU product label."""
    return {**spec.pod.node_selector, gpu_product_label(spec): spec.gpu_product}


def gpu_tolerations(spec: ServiceSpec) -> list[dict[str, Any]]:
    """The operator's toleration of the nvidia.com/gpu taint, then spec.pod.tolerations."""
    out: list[dict[str, Any]] = [{"key": c.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    for toleration in spec.pod.tolerations:
        if dict(toleration) not in out:
            out.append(dict(toleration))
    return out


def apply_pod_overrides(template: dict[str, Any], spec: ServiceSpec, selector: Mapping[str, str]) -> dict[str, Any]:
    """A copy of the pod `template` ({metadata, spec}) with spec.pod and the engine's cpu/memory applied.

    `selector` is the track's pod selector: a topology spread constraint without a labelSelector
    spreads those pods.
    """
    out = copy.deepcopy(template)
    pod, meta, pod_spec = spec.pod, out.setdefault("metadata", {}), out["spec"]
    meta["labels"] = {**pod.labels, **(meta.get("labels") or {})}
    if pod.annotations or meta.get("annotations"):
        meta["annotations"] = {**pod.annotations, **(meta.get("annotations") or {})}
    pod_spec["nodeSelector"] = gpu_node_selector(spec)
    pod_spec["tolerations"] = gpu_tolerations(spec)
    if pod.affinity:
        pod_spec["affinity"] = copy.deepcopy(dict(pod.affinity))
    if pod.topology_spread_constraints:
        pod_spec["topologySpreadConstraints"] = [_spread(t, selector) for t in pod.topology_spread_constraints]
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in pod.image_pull_secrets]
    for key, value in (("runtimeClassName", pod.runtime_class_name), ("priorityClassName", pod.priority_class_name),
                       ("serviceAccountName", pod.service_account_name)):
        if value:
            pod_spec[key] = value
    if pod.volumes:
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), *(copy.deepcopy(dict(v)) for v in pod.volumes)]
    engine = next(ctr for ctr in pod_spec["containers"] if ctr["name"] == "engine")
    _engine_overrides(engine, spec)
    return out


def _engine_overrides(engine: dict[str, Any], spec: ServiceSpec) -> None:
    resources = engine.setdefault("resources", {})
    extra = spec.container_resources
    if extra.requests:
        resources["requests"] = {**extra.requests, **resources.get("requests", {})}
    if extra.limits:
        resources["limits"] = {**extra.limits, **resources.get("limits", {})}
    if spec.pod.env:
        mine = {e["name"]: dict(e) for e in spec.pod.env}
        kept = [mine.pop(e["name"]) if e["name"] in mine else e for e in engine.get("env", [])]
        engine["env"] = kept + list(mine.values())
    if spec.pod.volume_mounts:
        engine["volumeMounts"] = [*engine.get("volumeMounts", []), *(dict(m) for m in spec.pod.volume_mounts)]


def _spread(constraint: Mapping[str, Any], selector: Mapping[str, str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(constraint))
    if "labelSelector" not in out:
        out["labelSelector"] = {"matchLabels": dict(selector)}
    return out
