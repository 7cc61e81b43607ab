"""spec.autoscaling: who sizes the tracks when an autoscaler does, and on which signal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# signal -> (the per-pod figure the HPA averages, what `target` means)
METRICS: dict[str, tuple[str, str]] = {
    "queueDepth": ("kvpilot_requests_waiting", "requests waiting per pod"),
    "kvCacheUsage": ("kvpilot_kv_cache_usage_ratio", "KV blocks used / pool per pod, 0-1"),
    "concurrency": ("kvpilot_requests_running", "share of the capacity plan's max concurrency per pod, 0-1"),
}
RATIO_METRICS = ("kvCacheUsage", "concurrency")
DENSER = ("off", "propose", "start")


class AutoscalingError(ValueError):
    """spec.autoscaling cannot be served as written."""


@dataclass(frozen=True)
class AutoscalingSpec:
    """Bounds and target of the HorizontalPodAutoscaler the operator writes per track."""

    min_replicas: int = 1
    max_replicas: int = 1
    metric: str = "queueDepth"
    target: float = 4.0
    scale_down_window_seconds: int = 300
    denser_strategy: str = "propose"  # off | propose | start (denser.py)
    probe_set: str = ""  # the canary's probe set when denser_strategy is start

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> AutoscalingSpec | None:
        """None when spec.autoscaling is absent or `enabled: false` (the operator sizes the tracks)."""
        if not raw or raw.get("enabled") is False:
            return None
        try:
            low = int(raw.get("minReplicas", 1))
            high = int(raw["maxReplicas"])
            target = float(raw.get("target", 4.0 if raw.get("metric", "queueDepth") == "queueDepth" else 0.8))
            window = int(raw.get("scaleDownStabilizationSeconds", 300))
        except KeyError:
            raise AutoscalingError("spec.autoscaling.maxReplicas is required (the most pods a track may get)") from None
        except (TypeError, ValueError) as exc:
            raise AutoscalingError(f"spec.autoscaling: minReplicas, maxReplicas and "
                                   f"scaleDownStabilizationSeconds are integers, target a number ({exc})") from None
        metric = str(raw.get("metric", "queueDepth"))
        if metric not in METRICS:
            raise AutoscalingError(f"spec.autoscaling.metric {metric!r} is not one of {', '.join(METRICS)}")
        if not 1 <= low <= high:
            raise AutoscalingError(f"spec.autoscaling needs 1 <= minReplicas <= maxReplicas, got {low} and {high}")
        if target <= 0 or (metric in RATIO_METRICS and target > 1):
            allowed = "in (0, 1]" if metric in RATIO_METRICS else "above 0"
            raise AutoscalingError(f"spec.autoscaling.target for {metric} ({METRICS[metric][1]}) must be "
                                   f"{allowed}, got {target:g}")
        if window < 0:
            raise AutoscalingError(f"spec.autoscaling.scaleDownStabilizationSeconds must be >= 0, got {window}")
        denser = str(raw.get("denserStrategy", "propose"))
        if denser not in DENSER:
            raise AutoscalingError(f"spec.autoscaling.denserStrategy {denser!r} is not one of {', '.join(DENSER)}")
        return cls(low, high, metric, target, window, denser, str(raw.get("probeSet") or ""))

    @property
    def metric_name(self) -> str:
        return METRICS[self.metric][0]

    def average_value(self, max_concurrency: int) -> float:
        """The per-pod figure the HPA holds each track to."""
        if self.metric == "concurrency":
            return max(1.0, self.target * max_concurrency)
        return self.target
