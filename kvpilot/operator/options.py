"""Operator-wide settings from `kvpilot operator` flags, read by the rollout controller."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpilot.operator.analysis.gateway import GatewayQueries
from kvpilot.operator.spec import GatewayRef

DEFAULT_HEADER = "X-Model-Strategy"
ANNOTATION_ROLLBACK = "kvpilot.io/rollback"  # "true": same as spec.rollback
ANNOTATION_PROMOTE = "kvpilot.io/promote"  # <status.canary.specHash>: skip the remaining steps
ANNOTATION_ABORT = "kvpilot.io/abort"  # <status.canary.specHash>: roll this canary back


@dataclass(frozen=True)
class Options:
    """What the rollout needs from outside the object: metrics, routing, probe addresses, cadence."""

    prometheus_url: str = ""
    gateway: GatewayRef | None = None  # default Gateway when spec.canary.gateway is not set
    gateway_url: str = ""  # probe through the Gateway with header pins
    track_urls: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (ns, name, track) -> URL
    router: str = "gateway-api"
    provider: str = "prometheus"
    tick_s: float = 10.0  # how often each rollout is looked at (step intervals are spec.canary.interval)
    autoscaling_interval_s: float = 30.0  # how often status.autoscaling is written (--autoscaling-interval)
    gpu_product_label: str = "nvidia.com/gpu.product"  # node label of spec.resources.gpuProduct (--gpu-product-label)
    canary_gpu_check: str = "require"  # require | warn | off: free GPUs before the canary (--canary-gpu-check)
    gateway_queries: GatewayQueries | None = None  # the Gateway's per-backend 5xx (--gateway-metrics): None, off


_current = Options()


def configure(options: Options) -> None:
    global _current
    _current = options


def current() -> Options:
    return _current


def parse_gateway(text: str, default_namespace: str = "default") -> GatewayRef:
    """`NAME` or `NAME/NAMESPACE` (--gateway)."""
    name, _, namespace = text.partition("/")
    if not name or "/" in namespace:
        raise ValueError(f"--gateway {text!r}: use NAME or NAME/NAMESPACE")
    return GatewayRef(name, namespace or default_namespace)


def parse_track_url(text: str) -> tuple[tuple[str, str, str], str]:
    """`NS/NAME/TRACK=URL` (--track-url), e.g. ns/chat/canary=http://127.0.0.1:8101."""
    key, sep, url = text.partition("=")
    parts = key.split("/")
    if not sep or len(parts) != 3 or parts[2] not in ("stable", "canary") or not url.startswith("http"):
        raise ValueError(f"--track-url {text!r}: use NAMESPACE/NAME/TRACK=URL with TRACK stable or canary")
    return (parts[0], parts[1], parts[2]), url
