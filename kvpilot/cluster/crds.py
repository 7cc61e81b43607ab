"""Install a CustomResourceDefinition file into the local cluster and wait until it is served."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvpilot.cluster import processes
from kvpilot.cluster.api import ApiClient, ApiError

CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def established(api: ApiClient, name: str) -> bool:
    """True once the CRD's Established condition is True; False while it is absent, not yet reported, or the
    API server answers 5xx (a wait retries); other errors (403: no permission) are raised, they will not pass.

    A CRD just applied may read back with `status.conditions: null`, so every level may be null."""
    try:
        crd = api.request("GET", f"{CRD_API}/{name}")
    except ApiError as exc:
        if exc.status == 404 or exc.status >= 500:  # not created yet, or the API server busy serving the new CRD
            return False
        raise
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def install_crd(api: ApiClient, path: Path, timeout_s: float = 60.0) -> str:
    """Server-side apply the CRD in `path` (create or update); returns its name once Established."""
    crd = yaml.safe_load(path.read_text())
    name = crd["metadata"]["name"]
    api.request("PATCH", f"{CRD_API}/{name}?fieldManager=kvpilot-cluster&force=true", crd,
                content_type="application/apply-patch+yaml")
    processes.wait_until(lambda: established(api, name), f"CRD {name} established", timeout_s)
    return name
