"""Gateway API CRD files: the version comes from tools/gateway-api/go.mod, the files from the Go module."""

from __future__ import annotations

import shutil

import pytest

from kvpilot.cluster import build
from kvpilot.cluster import gateway_api as gw

pytestmark = pytest.mark.unit


def test_version_is_the_one_pinned_in_go_mod() -> None:
    assert gw.version() == "v1.6.3"


def test_fetch_copies_the_standard_channel_into_the_cache(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    if shutil.which("go", path=build.go_env()["PATH"]) is None:
        pytest.skip("go not installed")
    monkeypatch.setenv("KVPILOT_CACHE_DIR", str(tmp_path))
    files = gw.fetch()
    assert files[0].parent == tmp_path / "gateway-api" / "v1.6.3"
    docs = gw.documents(files)
    assert "httproutes.gateway.networking.k8s.io" in gw.crd_names(docs)
    assert "gateways.gateway.networking.k8s.io" in gw.crd_names(docs)
    for doc in docs:  # the standard channel of exactly the pinned release
        annotations = doc["metadata"].get("annotations", {})
        if doc["kind"] == "CustomResourceDefinition":
            assert annotations["gateway.networking.k8s.io/bundle-version"] == "v1.6.3"
            assert annotations["gateway.networking.k8s.io/channel"] == "standard"
    httproute = next(d for d in docs if d["metadata"]["name"] == "httproutes.gateway.networking.k8s.io")
    assert any(v["name"] == "v1" and v["served"] for v in httproute["spec"]["versions"])
    assert gw.fetch() == files  # second call: from the cache


def test_unknown_kind_in_a_crd_file_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "x.yaml"
    path.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    with pytest.raises(RuntimeError, match=r"x\.yaml: unexpected kind 'Namespace'; expected one of"):
        gw.documents([path])
