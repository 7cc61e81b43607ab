"""The Deployment of one track: the engine, its metrics sidecar, GPUs, probes, shared memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kvpilot.operator.builders.model_init as model_init
import kvpilot.operator.builders.security as security
from kvpilot.operator import constants as c
from kvpilot.operator.builders.calibration import calibration_mount, calibration_volume
from kvpilot.operator.builders.common import deployment_name, labels, metadata
from kvpilot.operator.builders.engine_args import engine_args, pvc_claim
from kvpilot.operator.builders.pod_template import apply_pod_overrides, gpu_node_selector, gpu_tolerations
from kvpilot.operator.builders.startup_budget import progress_deadline_seconds
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import CapacityPlan

STARTUP_PROBE_SECONDS = 1800  # weights load + warm-up + Triton autotuning before /health answers


def build_deployment(owner: Mapping[str, Any], spec: ServiceSpec, plan: CapacityPlan,
                     track: str = "stable") -> dict[str, Any]:
    """`<name>-<track>`: surge one pod at a time so serving capacity never drops during a rollout."""
    name = owner["metadata"]["name"]
    pod_labels = {**labels(name, "engine", track), c.LABEL_STRATEGY: plan.strategy}
    selector = {c.LABEL_SERVICE: name, c.LABEL_TRACK: track}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, deployment_name(name, track), "engine", track),
        "spec": {
            "replicas": spec.replicas,
            "progressDeadlineSeconds": progress_deadline_seconds(plan, STARTUP_PROBE_SECONDS + model_init.fetch_seconds(spec, plan)),
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": apply_pod_overrides({  # spec.pod, spec.resources.requests/limits (pod_template.py)
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(c.METRICS_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": _pod_spec(spec, plan, name),
            }, spec, selector),
        },
    }


def _pod_spec(spec: ServiceSpec, plan: CapacityPlan, served_name: str) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    claim = pvc_claim(spec.model.uri)
    if claim:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    volumes += security.writable_volumes("engine") + security.writable_volumes("sidecar")
    volumes += model_init.pod_volumes(spec)  # oci://, s3://, hf://: the fetched model's volume (cache or emptyDir)
    if spec.engine.api_key_secret:
        volumes.append(security.api_key_volume(spec.engine.api_key_secret))
    if spec.strategy.active_calibration:
        volumes.append(calibration_volume(spec.strategy.active_calibration))
    return {
        "securityContext": security.pod_security_context(),
        "automountServiceAccountToken": False,  # neither container talks to the API server
        "nodeSelector": gpu_node_selector(spec),  # the GPU product label (configurable) and spec.pod's
        "tolerations": gpu_tolerations(spec),
        # the engine stops admitting on SIGTERM and finishes its streams within this window
        "terminationGracePeriodSeconds": spec.engine.termination_grace_period_seconds,
        **model_init.init_containers(spec),  # storage-init: fetch + verify the lineage digest before the engine
        "containers": [_engine(spec, plan, bool(claim), served_name), _sidecar(spec)],
        "volumes": volumes,
    }


def _engine(spec: ServiceSpec, plan: CapacityPlan, with_model_volume: bool, served_name: str) -> dict[str, Any]:
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, *security.writable_mounts("engine")]
    if with_model_volume:
        mounts.append({"name": "model", "mountPath": c.MODEL_MOUNT, "readOnly": True})
    mounts += model_init.engine_mounts(spec)
    if spec.engine.api_key_secret:
        mounts.append(security.api_key_mount())
    if spec.strategy.active_calibration:
        mounts.append(calibration_mount())
    gpus = {c.GPU_RESOURCE: str(spec.gpus)}
    return {
        "name": "engine",
        "image": spec.engine.image,
        "command": ["kvpilot", "serve"],
        "args": engine_args(spec, plan, served_name),
        "env": security.cache_env("engine"),
        "ports": [{"name": "http", "containerPort": c.ENGINE_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(gpus), "limits": dict(gpus)},
        "startupProbe": _http_probe("/health", c.ENGINE_PORT, period=10, failures=STARTUP_PROBE_SECONDS // 10),
        "readinessProbe": _http_probe("/ready", c.ENGINE_PORT, period=5, failures=3),
        "livenessProbe": _http_probe("/health", c.ENGINE_PORT, period=10, failures=3),
        "volumeMounts": mounts,
        "securityContext": security.container_security_context(),
    }


def _sidecar(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "name": "sidecar",
        "image": spec.engine.image,
        "command": ["kvpilot", "sidecar"],
        # The pod's own IP, not 0.0.0.0: Prometheus and the kubelet reach it there, nothing else.
        "args": ["--engine-url", f"http://127.0.0.1:{c.STATS_PORT}", "--host", "$(POD_IP)",
                 "--port", str(c.METRICS_PORT)],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                *security.cache_env("sidecar")],
        "ports": [{"name": "metrics", "containerPort": c.METRICS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "readinessProbe": _http_probe("/metrics", c.METRICS_PORT, period=10, failures=3),
        "volumeMounts": security.writable_mounts("sidecar"),
        "securityContext": security.container_security_context(),
    }


def _http_probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 5}
