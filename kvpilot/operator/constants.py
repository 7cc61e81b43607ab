"""Names shared by the CRD, the builders and the handlers."""

from __future__ import annotations

GROUP = "kvpilot.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"

FIELD_MANAGER = "kvpilot"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_SERVICE = "kvpilot.io/service"
LABEL_TRACK = "kvpilot.io/track"
LABEL_STRATEGY = "kvpilot.io/strategy"

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

ENGINE_PORT = 8000
STATS_PORT = 8001  # loopback only, read by the sidecar
METRICS_PORT = 9400
MODEL_MOUNT = "/models"

PODMONITOR_CRD = "podmonitors.monitoring.coreos.com"
