"""spec.pod, spec.resources.requests/limits and spec.disruptionBudget as typed values (no defaults guessed).

The fields keep the Kubernetes shapes the user wrote (tolerations, affinity, volumes, ... are
core/v1 objects): the operator copies them into both tracks' pod templates and lets the API
server validate them, except where they would collide with what the operator itself sets
(`conflicts`), which the preflight refuses by field name before anything is applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Prefixes of label keys the operator's selectors and queries rely on (the CRD refuses them too).
RESERVED_LABEL_PREFIXES = ("kvpilot.io/", "app.kubernetes.io/")
# Volumes and mount paths of the operator's own (builders/deployment.py, builders/security.py, ...).
RESERVED_VOLUMES = ("dshm", "model", "engine-tmp", "sidecar-tmp", "engine-cache", "api-key", "calibration",
                    "model-credentials", "storage-init-tmp")
RESERVED_MOUNT_PATHS = ("/dev/shm", "/models", "/tmp", "/var/cache/kvpilot", "/var/run/secrets/kvpilot",
                        "/etc/kvpilot")


@dataclass(frozen=True)
class PodOverrides:
    """spec.pod: what a platform adds to both tracks' pods (scheduling, identity, extra env/volumes)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: Mapping[str, Any] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    topology_spread_constraints: tuple[Mapping[str, Any], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    runtime_class_name: str = ""
    priority_class_name: str = ""
    service_account_name: str = ""
    env: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> PodOverrides:
        raw = raw or {}
        return cls(
            labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
            annotations={str(k): str(v) for k, v in (raw.get("annotations") or {}).items()},
            node_selector={str(k): str(v) for k, v in (raw.get("nodeSelector") or {}).items()},
            affinity=dict(raw.get("affinity") or {}),
            tolerations=_dicts(raw.get("tolerations")),
            topology_spread_constraints=_dicts(raw.get("topologySpreadConstraints")),
            image_pull_secrets=tuple(str(s.get("name", "")) if isinstance(s, Mapping) else str(s)
                                     for s in raw.get("imagePullSecrets") or ()),
            runtime_class_name=str(raw.get("runtimeClassName") or ""),
            priority_class_name=str(raw.get("priorityClassName") or ""),
            service_account_name=str(raw.get("serviceAccountName") or ""),
            env=_dicts(raw.get("env")),
            volumes=_dicts(raw.get("volumes")),
            volume_mounts=_dicts(raw.get("volumeMounts")),
        )


@dataclass(frozen=True)
class ContainerResources:
    """spec.resources.requests / .limits for the engine container (cpu, memory, ephemeral-storage)."""

    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, resources: Mapping[str, Any]) -> ContainerResources:
        return cls(requests={str(k): str(v) for k, v in (resources.get("requests") or {}).items()},
                   limits={str(k): str(v) for k, v in (resources.get("limits") or {}).items()})


@dataclass(frozen=True)
class DisruptionBudget:
    """spec.disruptionBudget: one PodDisruptionBudget per track (maxUnavailable 1 unless told)."""

    enabled: bool = True
    max_unavailable: int | str | None = 1
    min_available: int | str | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> DisruptionBudget:
        raw = raw or {}
        enabled = bool(raw.get("enabled", True))
        if raw.get("minAvailable") is not None:
            return cls(enabled=enabled, max_unavailable=None, min_available=raw["minAvailable"])
        return cls(enabled=enabled, max_unavailable=raw.get("maxUnavailable", 1))


def conflicts(pod: PodOverrides, own_volumes: Sequence[str] = RESERVED_VOLUMES,
              own_mount_paths: Sequence[str] = RESERVED_MOUNT_PATHS) -> list[str]:
    """What in spec.pod collides with the operator's own pod fields, each naming the field (empty: none)."""
    problems = [f"spec.pod.labels[{key!r}]: keys under {', '.join(RESERVED_LABEL_PREFIXES)} are the operator's "
                "(its selectors and metric labels); use another prefix"
                for key in pod.labels if key.startswith(RESERVED_LABEL_PREFIXES)]
    for i, volume in enumerate(pod.volumes):
        if volume.get("name") in own_volumes:
            problems.append(f"spec.pod.volumes[{i}].name {volume.get('name')!r} is one of the operator's volumes "
                            f"({', '.join(own_volumes)}); choose another name")
    declared = {v.get("name") for v in pod.volumes}
    for i, mount in enumerate(pod.volume_mounts):
        path = str(mount.get("mountPath", "")).rstrip("/") or "/"
        if mount.get("name") not in declared:
            problems.append(f"spec.pod.volumeMounts[{i}] mounts {mount.get('name')!r}, which spec.pod.volumes does "
                            "not declare; add the volume there")
        if any(path == own or path.startswith(own + "/") or own.startswith(path + "/") or path == "/"
               for own in own_mount_paths):
            problems.append(f"spec.pod.volumeMounts[{i}].mountPath {path!r} overlaps the operator's mounts "
                            f"({', '.join(own_mount_paths)}); mount elsewhere, e.g. /mnt/<name>")
    return problems


def _dicts(items: Any) -> tuple[Mapping[str, Any], ...]:
    return tuple(dict(item) for item in items or () if isinstance(item, Mapping))
