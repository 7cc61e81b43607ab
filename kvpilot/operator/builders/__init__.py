"""Pure builders: an InferenceService's spec (and its capacity plan) in, child objects (dicts) out."""

from kvpilot.operator.builders.deployment import build_deployment
from kvpilot.operator.builders.lineage import build_lineage_configmap, read_lineage
from kvpilot.operator.builders.podmonitor import build_podmonitor
from kvpilot.operator.builders.services import build_api_service, build_metrics_service, build_track_service

__all__ = [
    "build_api_service",
    "build_deployment",
    "build_lineage_configmap",
    "build_metrics_service",
    "build_podmonitor",
    "build_track_service",
    "read_lineage",
]
