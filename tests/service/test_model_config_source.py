"""The preflight's config.json read from the source itself (kvpilot/operator/reconcile/model_config.py): versitygw
(s3://, login from the Secret through the API) and a crane registry (oci://), no pasted config."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from kvpilot.operator.kube import KubeError
from kvpilot.operator.reconcile import model_config
from kvpilot.operator.reconcile.model_config import ModelConfigUnavailable, load_model_config
from kvpilot.operator.spec import ModelRef
from tests.harness.registry import CraneRegistry
from tests.harness.s3_server import S3Server
from tests.helpers.model_configs import LLAMA3_8B

pytestmark = pytest.mark.service


class Secrets:
    """The API as the operator sees it for this read: Secrets by path, or a 403 for all of them."""

    def __init__(self, secrets: dict[str, dict[str, str]], forbidden: bool = False) -> None:
        self.objects = {f"/api/v1/namespaces/ns/secrets/{name}": {
            "metadata": {"name": name, "resourceVersion": "7"},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
            for name, data in secrets.items()}
        self.forbidden = forbidden
        self.gets: list[str] = []

    def get(self, path: str) -> dict[str, Any] | None:
        self.gets.append(path)
        if self.forbidden:
            raise KubeError("GET", path, 403, '{"reason": "Forbidden"}')
        return self.objects.get(path)


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    model_config._cache.clear()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    out = tmp_path / "llama"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(LLAMA3_8B))
    (out / "model.safetensors").write_bytes(b"\0" * 4096)
    return out


def test_s3_config_with_the_secrets_login_and_a_pinned_read_kept(checkpoint: Path, tmp_path: Path) -> None:
    s3 = S3Server(tmp_path / "s3")
    with s3:
        uri = s3.put_dir("models", "llama/", checkpoint)
        kube = Secrets({"s3-login": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}})
        ref = ModelRef(uri=uri, sha256="ab" * 32, endpoint=s3.endpoint, credentials_secret="s3-login")
        assert load_model_config(kube, "ns", ref) == LLAMA3_8B
        wrong = Secrets({"s3-login": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": "nope"}})
        with pytest.raises(ModelConfigUnavailable, match=r"HTTP 403.*AWS_SECRET_ACCESS_KEY"):
            load_model_config(wrong, "ns", ModelRef(uri=uri, endpoint=s3.endpoint, credentials_secret="s3-login"))
    # the server is gone: a resync of the same pinned spec and Secret version reads nothing again
    assert load_model_config(kube, "ns", ref) == LLAMA3_8B
    with pytest.raises(ModelConfigUnavailable, match=r"reading config.json from spec.model.uri"):
        load_model_config(kube, "ns", ModelRef(uri=uri, endpoint=s3.endpoint, credentials_secret="s3-login"))


def test_secret_errors_say_what_to_do(checkpoint: Path) -> None:
    ref = ModelRef(uri="s3://models/llama/", endpoint="http://127.0.0.1:9", credentials_secret="s3-login")
    with pytest.raises(ModelConfigUnavailable, match=r"Secret ns/s3-login .* not found"):
        load_model_config(Secrets({}), "ns", ref)
    with pytest.raises(ModelConfigUnavailable, match=r"rbac.readModelSecrets=true, or set spec.model.config"):
        load_model_config(Secrets({}, forbidden=True), "ns", ref)
    pasted = ModelRef(uri="s3://models/llama/", config={"model_type": "llama", "x": 1}, credentials_secret="s3-login")
    assert load_model_config(Secrets({}, forbidden=True), "ns", pasted)["x"] == 1  # the pasted config overrides


def test_oci_config_from_the_artifacts_titled_layer(checkpoint: Path, tmp_path: Path) -> None:
    with CraneRegistry(tmp_path / "registry") as registry:
        uri = registry.push_artifact(checkpoint, "models/llama:8b")
        assert load_model_config(Secrets({}), "ns", ModelRef(uri=uri)) == LLAMA3_8B
        tar_uri = registry.push_tar_image(checkpoint, "models/llama:tar")
        with pytest.raises(ModelConfigUnavailable, match=r"no layer titled config.json.*spec.model.config"):
            load_model_config(Secrets({}), "ns", ModelRef(uri=tar_uri))
