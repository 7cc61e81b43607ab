"""The HorizontalPodAutoscaler (autoscaling/v2) the operator writes for one track's Deployment.

Each track gets its own HPA on the same per-pod target. The router splits traffic by weight, so
holding every pod of both tracks to the same figure sizes each track in proportion to the
traffic it carries: canary and stable scale together during a rollout, and neither starves.
The signal is an External metric (a per-track sum the HPA divides by its pods) served by a
metrics adapter from Prometheus, e.g. prometheus-adapter with `adapter_rule()` below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.autoscaling.spec import METRICS, AutoscalingSpec
from kvpilot.operator.builders.common import deployment_name, metadata

API_VERSION = "autoscaling/v2"
KIND = "HorizontalPodAutoscaler"


def hpa_name(service: str, track: str) -> str:
    return deployment_name(service, track)


def quantity(value: float) -> str:
    """A Kubernetes quantity for a target: whole numbers as such, others in thousandths (0.8 -> 800m)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def build_hpa(owner: Mapping[str, Any], track: str, scaling: AutoscalingSpec, *, min_replicas: int,
              max_replicas: int, max_concurrency: int) -> dict[str, Any]:
    """The HPA that sizes `track`'s Deployment between the given bounds on spec.autoscaling's signal."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(owner, hpa_name(name, track), "autoscaler", track),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment_name(name, track)},
            "minReplicas": min_replicas,
            "maxReplicas": max(min_replicas, max_replicas),
            "metrics": [{
                "type": "External",
                "external": {
                    "metric": {"name": scaling.metric_name,
                               "selector": {"matchLabels": {"service": name, "track": track}}},
                    "target": {"type": "AverageValue", "averageValue": quantity(scaling.average_value(max_concurrency))},
                },
            }],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": scaling.scale_down_window_seconds}},
        },
    }


def adapter_rule() -> dict[str, Any]:
    """A prometheus-adapter `externalRules` entry serving the three signals per namespace, summed
    over the series the HPA's selector picks (the PodMonitor's service and track labels)."""
    names = "|".join(metric for metric, _ in METRICS.values())
    return {
        "seriesQuery": f'{{__name__=~"^({names})$",namespace!="",service!="",track!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "name": {"matches": "^(.*)$", "as": "$1"},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>})",
    }


