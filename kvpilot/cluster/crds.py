"""Install a CustomResourceDefinition file into the local cluster and wait until it is served."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvpilot.cluster import processes
from kvpilot.cluster.api import ApiClient

CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def established(api: ApiClient, name: str) -> bool:
    conditions = (api.request("GET", f"{CRD_API}/{name}").get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def install_crd(api: ApiClient, path: Path, timeout_s: float = 60.0) -> str:
    """Server-side apply the CRD in `path` (create or update); returns its name once Established."""
    crd = yaml.safe_load(path.read_text())
    name = crd["metadata"]["name"]
    api.request("PATCH", f"{CRD_API}/{name}?fieldManager=kvpilot-cluster&force=true", crd,
                content_type="application/apply-patch+yaml")
    processes.wait_until(lambda: established(api, name), f"CRD {name} established", timeout_s)
    return name
