"""Gateway API CRDs (standard channel) for the local control plane, from the Go module's own files.

tools/gateway-api/go.mod pins `sigs.k8s.io/gateway-api`; `fetch()` asks Go where that module is
(`go mod download -json`, which downloads it into Go's module cache the first time) and copies
its `config/crd/standard/*.yaml` into `${KVPILOT_CACHE_DIR:-~/.cache/kvpilot}/gateway-api/<version>/`.
Nothing is committed. `install(api)` server-side applies every object in those files (the CRDs and
the upstream ValidatingAdmissionPolicy that guards them) and waits until each CRD is Established.

    from kvpilot.cluster import gateway_api
    gateway_api.install(cluster.api())        # fetches first if needed
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from kvpilot.cluster import build, crds
from kvpilot.cluster.api import ApiClient

MODULE = "sigs.k8s.io/gateway-api"
GROUP = "gateway.networking.k8s.io"
TOOLS_SUBDIR = "gateway-api"
CRD_SUBDIR = Path("config") / "crd" / "standard"
FIELD_MANAGER = "kvpilot-cluster"
# Cluster-scoped kinds the standard channel ships, and where each lives in the API.
PATHS = {
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
}


def version(tools_dir: Path = build.TOOLS_DIR) -> str:
    return build.module_version((tools_dir / TOOLS_SUBDIR / "go.mod").read_text(), MODULE)


def crd_dir(tools_dir: Path = build.TOOLS_DIR) -> Path:
    return build.cache_dir() / "gateway-api" / version(tools_dir)


def _cached_files(where: Path) -> list[Path]:
    return sorted(where.glob("*.yaml")) if (where / ".complete").exists() else []


def module_dir(tools_dir: Path = build.TOOLS_DIR) -> Path:
    """The unpacked module in Go's module cache (downloaded on first use)."""
    return build.go_module_dir(MODULE, TOOLS_SUBDIR, "the Gateway API module", tools_dir)


def fetch(tools_dir: Path = build.TOOLS_DIR) -> list[Path]:
    """The cached standard-channel YAML files, copying them from the Go module when missing."""
    final = crd_dir(tools_dir)
    files = _cached_files(final)
    if files:
        return files
    source = module_dir(tools_dir) / CRD_SUBDIR
    yamls = sorted(source.glob("*.yaml"))
    if not yamls:
        raise RuntimeError(f"{source} holds no *.yaml; is {MODULE} {version(tools_dir)} the module expected?")
    staging = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in yamls:
        shutil.copyfile(path, staging / path.name)  # the module cache is read-only; copies are not
    (staging / ".complete").write_text(f"{MODULE} {version(tools_dir)}\n")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return _cached_files(final)


def documents(files: list[Path]) -> list[dict[str, Any]]:
    """Every object in the files, checked to be a kind `install` knows how to apply."""
    docs: list[dict[str, Any]] = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc.get("kind") not in PATHS:
                raise RuntimeError(f"{path.name}: unexpected kind {doc.get('kind')!r}; expected one of {sorted(PATHS)}")
            docs.append(doc)
    return docs


def crd_names(docs: list[dict[str, Any]]) -> list[str]:
    return [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]


def install(api: ApiClient, timeout_s: float = 60.0, tools_dir: Path = build.TOOLS_DIR) -> list[str]:
    """Server-side apply the standard channel and wait until its CRDs serve; returns the CRD names."""
    docs = documents(fetch(tools_dir))
    for doc in docs:
        path = f"{PATHS[doc['kind']]}/{doc['metadata']['name']}?fieldManager={FIELD_MANAGER}&force=true"
        api.request("PATCH", path, doc, content_type="application/apply-patch+yaml")
    names = crd_names(docs)
    deadline = time.monotonic() + timeout_s
    pending = list(names)
    while pending:
        pending = [n for n in pending if not crds.established(api, n)]
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"Gateway API CRDs not Established within {timeout_s:.0f} s: {', '.join(pending)}")
        if pending:
            time.sleep(0.2)
    return names


def installed(api: ApiClient, tools_dir: Path = build.TOOLS_DIR) -> bool:
    """Whether every standard-channel CRD of the pinned version is Established."""
    return all(crds.established(api, n) for n in crd_names(documents(fetch(tools_dir))))
