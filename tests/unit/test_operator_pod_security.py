"""The operator's pods meet the `restricted` Pod Security Standard, and the API key is a Secret reference."""

from __future__ import annotations

import json

import pytest
from operator_fakes import service

from kvpilot.operator.builders import build_deployment
from kvpilot.operator.builders.security import API_KEY_FILE, CACHE_DIR
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import SecretKeyRef, ServiceSpec

pytestmark = pytest.mark.unit


def pod_of(body: dict, track: str = "stable") -> dict:
    spec = ServiceSpec.from_dict(body["spec"])
    return build_deployment(body, spec, preflight(spec, body["spec"]["model"]["config"]), track)["spec"]["template"]["spec"]


@pytest.mark.parametrize("track", ["stable", "canary"])
def test_every_container_is_restricted(track: str) -> None:
    pod = pod_of(service(), track)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert [c["name"] for c in pod["containers"]] == ["engine", "sidecar"]
    for container in pod["containers"]:
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["capabilities"] == {"drop": ["ALL"]}
        assert ctx["runAsNonRoot"] is True
        assert "privileged" not in ctx and "add" not in ctx["capabilities"]
    assert not any("hostPath" in v for v in pod["volumes"])
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


def test_writable_paths_are_emptydirs_and_caches_point_there() -> None:
    pod = pod_of(service())
    volumes = {v["name"]: v for v in pod["volumes"]}
    engine, sidecar = pod["containers"]
    for container in (engine, sidecar):
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TMPDIR"] == "/tmp"
    engine_mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    assert "emptyDir" in volumes[engine_mounts[CACHE_DIR]]
    assert engine_mounts["/dev/shm"] == "dshm"
    env = {e["name"]: e["value"] for e in engine["env"]}
    for name in ("HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME", "HF_HOME"):
        assert env[name].startswith(CACHE_DIR), name
    # the two containers do not share a /tmp
    assert engine_mounts["/tmp"] != {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}["/tmp"]


def test_api_key_is_a_mounted_secret_file_never_a_literal() -> None:
    body = service(engine={"image": "kvpilot:test", "apiKeySecretRef": {"name": "chat-key", "key": "token"}})
    spec = ServiceSpec.from_dict(body["spec"])
    assert spec.engine.api_key_secret == SecretKeyRef("chat-key", "token")
    pod = pod_of(body)
    engine = pod["containers"][0]
    args = engine["args"]
    assert args[args.index("--api-key-file") + 1] == API_KEY_FILE
    assert "--api-key" not in args
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-key"]
    assert volume["secret"] == {"secretName": "chat-key", "items": [{"key": "token", "path": "api-key"}],
                                "defaultMode": 0o440}
    (mount,) = [m for m in engine["volumeMounts"] if m["name"] == "api-key"]
    assert mount["readOnly"] is True and API_KEY_FILE.startswith(mount["mountPath"] + "/")
    assert not any(m["name"] == "api-key" for m in pod["containers"][1]["volumeMounts"])  # the sidecar never sees it


def test_secret_key_defaults_to_api_key_and_no_ref_means_no_flag() -> None:
    body = service(engine={"apiKeySecretRef": {"name": "k"}})
    assert ServiceSpec.from_dict(body["spec"]).engine.api_key_secret == SecretKeyRef("k", "api-key")
    pod = pod_of(service())
    assert "--api-key-file" not in pod["containers"][0]["args"]
    assert "api-key" not in json.dumps(pod["volumes"])


def test_the_local_pod_runner_plans_the_restricted_pod() -> None:
    """The pod runner (local fleet) ignores security contexts but must accept the env and the mounts
    (emptyDirs stay host paths; the model's PVC is what it cannot provide: a file:// model here)."""
    from kvpilot.cluster.podrunner.containers import plan_pod

    body = service()
    body["spec"]["model"]["uri"] = "file:///models/llama"
    template = pod_of(body)
    plans = plan_pod({"metadata": {"name": "p"}, "status": {"podIP": "10.0.0.7"}, "spec": template}, python="py")
    engine, sidecar = plans
    assert engine.argv[:4] == ("py", "-m", "kvpilot.cli", "serve")
    assert dict(engine.env)["TRITON_CACHE_DIR"] == f"{CACHE_DIR}/triton"
    assert "10.0.0.7" in sidecar.argv and dict(sidecar.env)["TMPDIR"] == "/tmp"
