"""Gateway API Inference Extension CRDs (InferencePool, inference.networking.k8s.io/v1) for the local cluster.

tools/gateway-api-inference-extension/go.mod pins `sigs.k8s.io/gateway-api-inference-extension`;
`fetch()` asks Go where that module is (`go mod download -json`) and copies the v1 InferencePool
CRD from its `config/crd/bases/` into `${KVPILOT_CACHE_DIR:-~/.cache/kvpilot}/gateway-api-inference-extension/<version>/`,
as kvpilot/cluster/gateway_api.py does for the Gateway API. The x-k8s.io alpha CRDs beside it are
left out: kvpilot writes only the v1 InferencePool. Nothing is committed.

    from kvpilot.cluster import inference_pool
    inference_pool.install(cluster.api())     # fetches first if needed; Gateway API CRDs separately
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from kvpilot.cluster import build, crds, gateway_api
from kvpilot.cluster.api import ApiClient

MODULE = "sigs.k8s.io/gateway-api-inference-extension"
TOOLS_SUBDIR = "gateway-api-inference-extension"
CRD_FILES = (Path("config") / "crd" / "bases" / "inference.networking.k8s.io_inferencepools.yaml",)
CRD_NAME = "inferencepools.inference.networking.k8s.io"


def version(tools_dir: Path = build.TOOLS_DIR) -> str:
    return build.module_version((tools_dir / TOOLS_SUBDIR / "go.mod").read_text(), MODULE)


def crd_dir(tools_dir: Path = build.TOOLS_DIR) -> Path:
    return build.cache_dir() / TOOLS_SUBDIR / version(tools_dir)


def module_dir(tools_dir: Path = build.TOOLS_DIR) -> Path:
    """The unpacked module in Go's module cache (downloaded on first use)."""
    return build.go_module_dir(MODULE, TOOLS_SUBDIR, "the Gateway API Inference Extension module", tools_dir)


def fetch(tools_dir: Path = build.TOOLS_DIR) -> list[Path]:
    """The cached v1 InferencePool CRD file(s), copied from the Go module when missing."""
    final = crd_dir(tools_dir)
    if (final / ".complete").exists():
        return sorted(final.glob("*.yaml"))
    source = module_dir(tools_dir)
    staging = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for relative in CRD_FILES:
        if not (source / relative).is_file():
            raise RuntimeError(f"{source / relative} is missing; is {MODULE} {version(tools_dir)} the module expected?")
        shutil.copyfile(source / relative, staging / relative.name)  # the module cache is read-only
    (staging / ".complete").write_text(f"{MODULE} {version(tools_dir)}\n")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return sorted(final.glob("*.yaml"))


def install(api: ApiClient, timeout_s: float = 60.0, tools_dir: Path = build.TOOLS_DIR) -> list[str]:
    """Server-side apply the InferencePool CRD and wait until it serves; returns the CRD names."""
    docs = gateway_api.documents(fetch(tools_dir))
    for doc in docs:
        path = (f"{gateway_api.PATHS[doc['kind']]}/{doc['metadata']['name']}"
                f"?fieldManager={gateway_api.FIELD_MANAGER}&force=true")
        api.request("PATCH", path, doc, content_type="application/apply-patch+yaml")
    names = gateway_api.crd_names(docs)
    deadline = time.monotonic() + timeout_s
    while (pending := [n for n in names if not crds.established(api, n)]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"InferencePool CRD not Established within {timeout_s:.0f} s: {', '.join(pending)}")
        time.sleep(0.2)
    return names
