"""What makes the operator's pods pass the `restricted` Pod Security Standard, and the API key mount.

Every container runs as a fixed non-root user with a read-only root filesystem, no privilege
escalation, no capabilities and the runtime's default seccomp profile. What the engine must
write (Triton's and torch's compile caches, Hugging Face's cache, Python's temp files) goes to
emptyDirs, and the environment points every cache there.
"""

from __future__ import annotations

from typing import Any

from kvpilot.operator.spec import SecretKeyRef

RUN_AS_USER = 65532  # any non-zero uid works: the image needs no user of its own
CACHE_DIR = "/var/cache/kvpilot"
TMP_DIR = "/tmp"
API_KEY_DIR = "/var/run/secrets/kvpilot"
API_KEY_FILE = f"{API_KEY_DIR}/api-key"


def pod_security_context() -> dict[str, Any]:
    """Pod-wide: non-root, the group that owns mounted volumes, seccomp RuntimeDefault."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def writable_volumes(container: str) -> list[dict[str, Any]]:
    """The emptyDirs one container writes to: its /tmp, and for the engine the compile caches."""
    volumes = [{"name": f"{container}-tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    if container == "engine":
        volumes.append({"name": "engine-cache", "emptyDir": {"sizeLimit": "10Gi"}})
    return volumes


def writable_mounts(container: str) -> list[dict[str, Any]]:
    mounts = [{"name": f"{container}-tmp", "mountPath": TMP_DIR}]
    if container == "engine":
        mounts.append({"name": "engine-cache", "mountPath": CACHE_DIR})
    return mounts


def cache_env(container: str) -> list[dict[str, str]]:
    """HOME, TMPDIR and every cache the engine's libraries write, on the writable volumes."""
    home = CACHE_DIR if container == "engine" else TMP_DIR
    env = [{"name": "HOME", "value": home}, {"name": "TMPDIR", "value": TMP_DIR},
           {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}]
    if container == "engine":
        env += [{"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
                {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_DIR}/triton"},
                {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{CACHE_DIR}/torchinductor"},
                {"name": "TORCH_HOME", "value": f"{CACHE_DIR}/torch"},
                {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"}]
    return env


def api_key_volume(ref: SecretKeyRef) -> dict[str, Any]:
    """The Secret's one key as a file readable by the pod's group only; the key never enters the spec."""
    return {"name": "api-key", "secret": {"secretName": ref.name, "items": [{"key": ref.key, "path": "api-key"}],
                                          "defaultMode": 0o440}}


def api_key_mount() -> dict[str, Any]:
    return {"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True}
