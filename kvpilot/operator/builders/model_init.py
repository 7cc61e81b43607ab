"""The storage initializer of a track whose model.uri is oci://, s3:// or hf://: an init container
(`kvpilot storage-init`), the volume it fills, and the engine's read-only mount of the result.

The volume is spec.model.cache when set (a hostPath or a PersistentVolumeClaim shared by the pods
of a node: a second replica finds the checkpoint there and downloads nothing), else an emptyDir of
the pod's own. Inside it the checkpoint lives at `sha256-<lineage digest>` (pinned models; the
cache is keyed by digest) or `unpinned` (an emptyDir only: without a digest nothing identifies the
content, so nothing is shared). The engine mounts that one directory at /models, read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kvpilot.operator.builders.security as security
from kvpilot.operator import constants as c
from kvpilot.operator.builders.startup_budget import weights_read_s
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import CapacityPlan
from kvpilot.storage.uri import is_remote

CONTAINER = "storage-init"
VOLUME = "model"
CREDENTIALS_VOLUME = "model-credentials"
CACHE_MOUNT = "/var/lib/kvpilot/models"  # the init container's view of the whole cache
CREDENTIALS_MOUNT = "/var/run/secrets/kvpilot/model"
UNPINNED = "unpinned"


@dataclass(frozen=True)
class Delivery:
    """spec.model's delivery fields, for a URI the storage initializer fetches."""

    uri: str
    sha256: str = ""
    endpoint: str = ""
    secret: str = ""
    cache: Mapping[str, Any] | None = None  # {hostPath: {path}} | {persistentVolumeClaim: {claimName}}

    @classmethod
    def from_spec(cls, spec: ServiceSpec) -> Delivery | None:
        """The track's delivery (spec.model, or a canary's merged model), None for a mounted model."""
        model = spec.model
        if not is_remote(model.uri):
            return None
        return cls(uri=model.uri, sha256=model.sha256, endpoint=model.endpoint, secret=model.credentials_secret,
                   cache=spec.model_dict.get("cache") or None)

    @property
    def cached(self) -> bool:
        """The shared cache is used for pinned checkpoints only (the digest is its key)."""
        return self.cache is not None and bool(self.sha256)

    @property
    def subdir(self) -> str:
        return f"sha256-{self.sha256}" if self.sha256 else UNPINNED


def volumes(d: Delivery) -> list[dict[str, Any]]:
    if d.cached and d.cache is not None and "hostPath" in d.cache:
        source: dict[str, Any] = {"hostPath": {"path": str(d.cache["hostPath"]["path"]), "type": "DirectoryOrCreate"}}
    elif d.cached and d.cache is not None:
        source = {"persistentVolumeClaim": {"claimName": str(d.cache["persistentVolumeClaim"]["claimName"])}}
    else:
        source = {"emptyDir": {}}
    out = [{"name": VOLUME, **source}, *security.writable_volumes(CONTAINER)]
    if d.secret:  # readable by the pod's group only; the values never enter the pod spec
        out.append({"name": CREDENTIALS_VOLUME, "secret": {"secretName": d.secret, "defaultMode": 0o440}})
    return out


def init_container(d: Delivery, image: str) -> dict[str, Any]:
    args = [d.uri, "--dest", f"{CACHE_MOUNT}/{d.subdir}"]
    if d.sha256:
        args += ["--sha256", d.sha256]
    if d.endpoint:
        args += ["--endpoint", d.endpoint]
    mounts = [{"name": VOLUME, "mountPath": CACHE_MOUNT}, *security.writable_mounts(CONTAINER)]
    if d.secret:
        args += ["--credentials", CREDENTIALS_MOUNT]
        mounts.append({"name": CREDENTIALS_VOLUME, "mountPath": CREDENTIALS_MOUNT, "readOnly": True})
    return {
        "name": CONTAINER,
        "image": image,
        "command": ["kvpilot", "storage-init"],
        "args": args,
        "env": [*security.cache_env(CONTAINER), {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": mounts,
        # exit 1's last line (digest mismatch, 403, 404) becomes the pod's status message, read by the operator
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security.container_security_context(),
    }


def engine_mount(d: Delivery) -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": c.MODEL_MOUNT, "subPath": d.subdir, "readOnly": True}


def fetch_seconds(spec: ServiceSpec, plan: CapacityPlan) -> int:
    """What a first fetch adds before the engine's startup probe begins (0 for a mounted model): the
    weights at the read rate the startup budget assumes, so a slow first download is not Degraded."""
    return weights_read_s(plan) if Delivery.from_spec(spec) else 0


# What builders/deployment.py adds to a track's pod (nothing for a pvc://, file:// or path model).
def pod_volumes(spec: ServiceSpec) -> list[dict[str, Any]]:
    d = Delivery.from_spec(spec)
    return volumes(d) if d else []


def init_containers(spec: ServiceSpec) -> dict[str, Any]:
    """`{"initContainers": [...]}` to merge into the pod spec, or {}."""
    d = Delivery.from_spec(spec)
    return {"initContainers": [init_container(d, spec.engine.image)]} if d else {}


def engine_mounts(spec: ServiceSpec) -> list[dict[str, Any]]:
    d = Delivery.from_spec(spec)
    return [engine_mount(d)] if d else []
