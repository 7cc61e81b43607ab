"""Helpers for the Helm chart tests: render with the helm built under tools/, parse the documents,
and a kubeconfig for a ServiceAccount token from the TokenRequest API."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kvpilot"


def helm_binary() -> Path:
    from kvpilot.cluster.build import binary_path

    return binary_path("helm")


def helm(*args: str, home: Path, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed (exit {result.returncode}):\n{result.stderr}")
    return result


def set_args(values: dict[str, Any]) -> list[str]:
    """`--set-json key=value` for each top-level value (exact JSON, no --set string parsing)."""
    import json

    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def documents(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
            and (namespace is None or d["metadata"].get("namespace") == namespace)]


def token_kubeconfig(admin_kubeconfig: Path, server: str, namespace: str, service_account: str, out: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount with a bound token (TokenRequest API)."""
    token = subprocess.run(["kubectl", f"--kubeconfig={admin_kubeconfig}", "create", "token", service_account,
                            "-n", namespace, "--duration=2h"], capture_output=True, text=True, check=True,
                           timeout=60).stdout.strip()
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data") or base64.b64encode(
        Path(cluster["certificate-authority"]).read_bytes()).decode()
    out.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": service_account,
                                                 "namespace": namespace}}],
    }))
    return out
