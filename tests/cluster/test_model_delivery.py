"""Model delivery on a real API server: the CRD's rules for remote sources, and the operator reading
config.json from the source itself (a local Hub endpoint, with the token from a Secret) and writing
the Deployment with the storage initializer, its volumes and the engine's mount."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.harness.cluster import wait_for
from tests.harness.hub import LocalHub
from tests.harness.operator import manifest, operator_env
from tests.helpers.model_configs import LLAMA3_8B

pytestmark = pytest.mark.cluster
SHA = "cd" * 32


@pytest.fixture(scope="module")
def env(k8s_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    with operator_env(k8s_cluster, tmp_path_factory, "delivery") as env:
        yield env


def remote(name: str, ns: str, **model: object) -> dict:
    body = manifest(name, ns)
    body["spec"]["model"] = {"uri": "s3://models/llama-3-8b/", "sha256": SHA, **model}
    return body


@pytest.mark.parametrize(("model", "field", "words"), [
    ({"uri": "gs://bucket/llama"}, "spec.model.uri", "spec.model.uri must be pvc://<claim>/<dir>"),
    ({"uri": "oci://registry-only"}, "spec.model.uri", "oci://<registry>/<repository>"),
    ({"uri": "oci://r.io/m:v1", "endpoint": "http://x:9000"}, "spec.model.endpoint", "or a Hub mirror (hf://)"),
    ({"uri": "s3://b/m/", "endpoint": "minio:9000"}, "spec.model.endpoint", "must be an http(s):// URL"),
    ({"uri": "pvc://models/m", "credentialsSecretRef": {"name": "x"}}, "spec.model.credentialsSecretRef", "login"),
    ({"uri": "hf://org/m", "sha256": None, "cache": {"hostPath": {"path": "/var/cache/m"}}}, "spec.model.cache",
     "set spec.model.sha256"),
    ({"uri": "hf://org/m", "cache": {}}, "spec.model.cache", "exactly one of hostPath or persistentVolumeClaim"),
    ({"uri": "pvc://models/m"}, "spec.model", "needs config"),
])
def test_the_crd_refuses_bad_delivery_fields_naming_them(env, model: dict, field: str, words: str) -> None:  # type: ignore[no-untyped-def]
    body = remote("bad", env["ns"], **model)
    body["spec"]["model"] = {k: v for k, v in body["spec"]["model"].items() if v is not None}
    result = env["kubectl"].apply(body, check=False)
    assert result.returncode != 0, f"accepted: {model}"
    assert field in result.stderr and words in result.stderr, result.stderr


def test_the_crd_admits_every_source_without_a_pasted_config(env) -> None:  # type: ignore[no-untyped-def]
    for uri in ("oci://127.0.0.1:5000/models/llama:8b", "oci://ghcr.io/org/m@sha256:" + "a" * 64,
                "s3://models/llama-3-8b/", "hf://meta-llama/Llama-3.1-8B@main"):
        result = env["kubectl"]("apply", "--dry-run=server", "-f", "-",
                                stdin=json.dumps(remote("ok", env["ns"], uri=uri)), check=False)
        assert result.returncode == 0, f"{uri}: {result.stderr}"


def test_the_operator_reads_config_from_the_hub_and_writes_the_storage_initializer(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "llama-3-8b"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(LLAMA3_8B))
    (repo / "model.safetensors").write_bytes(b"\0" * 1024)
    ns = env["ns"]
    with LocalHub({"meta-llama/Llama-3-8B": repo}, token="hf_cluster_token") as hub:
        env["core"].create_namespaced_secret(ns, {"metadata": {"name": "hf-login"}, "data": {
            "HF_TOKEN": base64.b64encode(b"hf_cluster_token").decode()}})
        body = remote("hub", ns, uri="hf://meta-llama/Llama-3-8B@main", endpoint=hub.url,
                      credentialsSecretRef={"name": "hf-login"}, cache={"hostPath": {"path": "/var/cache/kvpilot/models"}})
        env["kubectl"].apply(body)
        wait_for(lambda: _deployment(env, "hub-stable") is not None, "hub-stable Deployment", 90)
        assert any("config.json" in r for r in hub.requests), hub.requests  # the preflight asked the source
    pod = _deployment(env, "hub-stable")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["name"] == "storage-init" and init["command"] == ["kvpilot", "storage-init"]
    assert init["args"][:2] == ["hf://meta-llama/Llama-3-8B@main", "--dest"] and SHA in init["args"]
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"]["hostPath"]["path"] == "/var/cache/kvpilot/models"
    assert volumes["model-credentials"]["secret"]["secretName"] == "hf-login"
    engine = next(c for c in pod["containers"] if c["name"] == "engine")
    mount = next(m for m in engine["volumeMounts"] if m["name"] == "model")
    assert mount["mountPath"] == "/models" and mount["subPath"] == f"sha256-{SHA}" and mount["readOnly"]
    status = env["custom"].get_namespaced_custom_object("kvpilot.io", "v1alpha1", ns, "inferenceservices", "hub")["status"]
    assert status["capacity"]["feasible"] and status["capacity"]["bytesPerToken"] > 0  # planned from the Hub's config


def test_a_source_the_operator_cannot_read_leaves_the_service_pending_with_the_reason(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "m"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(LLAMA3_8B))
    with LocalHub({"org/m": repo}, token="hf_right") as hub:
        env["kubectl"].apply(remote("locked", env["ns"], uri="hf://org/m", endpoint=hub.url))  # no token given
        wait_for(lambda: _condition(env, "locked").get("reason") == "ModelConfigUnavailable", "locked pending", 60)
    message = _condition(env, "locked")["message"]
    assert "hf://org/m@main" in message and "401" in message and "HF_TOKEN" in message
    assert _deployment(env, "locked-stable") is None


def _deployment(env, name: str) -> dict | None:  # type: ignore[no-untyped-def]
    result = env["kubectl"]("get", "deployment", name, "-n", env["ns"], "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _condition(env, name: str) -> dict:  # type: ignore[no-untyped-def]
    obj = env["custom"].get_namespaced_custom_object("kvpilot.io", "v1alpha1", env["ns"], "inferenceservices", name)
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "CapacityPlanned"), {})


def _template_pod(body: dict, name: str) -> dict:
    from kvpilot.operator.builders import build_deployment
    from kvpilot.operator.reconcile.preflight import preflight
    from kvpilot.operator.spec import ServiceSpec

    body["spec"]["model"]["config"] = LLAMA3_8B  # the builder's input; the preflight's read is tested above
    spec = ServiceSpec.from_dict(body["spec"], body["metadata"]["namespace"])
    template = build_deployment(body | {"metadata": {**body["metadata"], "uid": "u"}}, spec,
                                preflight(spec, LLAMA3_8B))["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def test_the_storage_initializer_passes_restricted_pod_security_and_a_hostpath_cache_does_not(k8s_cluster) -> None:  # type: ignore[no-untyped-def]
    """What docs/operator.md says of the cache: emptyDir and PVC pods are admitted under `restricted`, a hostPath
    cache is refused there (it needs a namespace that allows hostPath)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from tests.harness.cluster import k8s_api_client, unique_namespace

    core = client.CoreV1Api(k8s_api_client(k8s_cluster))
    ns = unique_namespace(core, "delivery-pss")
    try:
        core.patch_namespace(ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                                          "pod-security.kubernetes.io/enforce-version": "latest"}}})
        login = {"credentialsSecretRef": {"name": "s3-login"}, "endpoint": "http://minio.storage:9000"}
        core.create_namespaced_pod(ns, _template_pod(remote("plain", ns, **login), "plain"))
        pvc = remote("pvc", ns, cache={"persistentVolumeClaim": {"claimName": "model-cache"}}, **login)
        core.create_namespaced_pod(ns, _template_pod(pvc, "pvc"))
        host = remote("host", ns, cache={"hostPath": {"path": "/var/cache/kvpilot/models"}})
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(ns, _template_pod(host, "host"))
        assert refused.value.status == 403 and "hostPath" in refused.value.body
    finally:
        core.delete_namespace(ns)
