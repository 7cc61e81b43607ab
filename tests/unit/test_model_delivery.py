"""Model delivery in the operator: the init container, volumes and mounts a remote model.uri gets; the
CRD's uri rule against the storage initializer's parser; how a failed fetch reaches the status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from operator_fakes import SHA, service

from kvpilot.operator.builders import build_deployment
from kvpilot.operator.builders.model_init import CACHE_MOUNT, CREDENTIALS_MOUNT
from kvpilot.operator.builders.security import container_security_context
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.reconcile.tracks import canary_spec
from kvpilot.operator.spec import ServiceSpec
from kvpilot.operator.status.pod_blockers import find_blockers
from kvpilot.storage.uri import CRD_URI_PATTERN, BadModelUri, parse

pytestmark = pytest.mark.unit
CRD = Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml"


def _pod(body: dict) -> dict:
    spec = ServiceSpec.from_dict(body["spec"], "ns")
    return build_deployment(body, spec, preflight(spec, body["spec"]["model"]["config"]))["spec"]["template"]["spec"]


def _remote(uri: str = "s3://models/llama/8b/", **extra: object) -> dict:
    body = service()
    body["spec"]["model"] = {**body["spec"]["model"], "uri": uri, **extra}
    return body


def test_a_remote_model_gets_the_init_container_its_volume_and_a_read_only_mount() -> None:
    pod = _pod(_remote(endpoint="http://minio.storage:9000", credentialsSecretRef={"name": "s3-login"},
                       cache={"hostPath": {"path": "/var/cache/kvpilot/models"}}))
    (init,) = pod["initContainers"]
    assert init["command"] == ["kvpilot", "storage-init"]
    assert init["args"] == ["s3://models/llama/8b/", "--dest", f"{CACHE_MOUNT}/sha256-{SHA}", "--sha256", SHA,
                            "--endpoint", "http://minio.storage:9000", "--credentials", CREDENTIALS_MOUNT]
    assert init["image"] == "kvpilot:test" and init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert init["securityContext"] == container_security_context()
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"]["hostPath"] == {"path": "/var/cache/kvpilot/models", "type": "DirectoryOrCreate"}
    assert volumes["model-credentials"]["secret"] == {"secretName": "s3-login", "defaultMode": 0o440}
    mounts = {m["name"]: m for m in init["volumeMounts"]}
    assert mounts["model"]["mountPath"] == CACHE_MOUNT and mounts["model-credentials"]["readOnly"]
    assert all(m["name"] in volumes for m in init["volumeMounts"])
    engine = next(c for c in pod["containers"] if c["name"] == "engine")
    model_mount = next(m for m in engine["volumeMounts"] if m["name"] == "model")
    assert model_mount == {"name": "model", "mountPath": "/models", "subPath": f"sha256-{SHA}", "readOnly": True}
    args = engine["args"]
    assert args[args.index("--model") + 1] == "/models" and args[args.index("--model-sha256") + 1] == SHA
    assert not any("s3-login" in str(c.get("env")) for c in pod["containers"])  # the login stays in the init container


def test_a_pvc_cache_and_the_default_emptydir() -> None:
    pvc = _pod(_remote("hf://Qwen/Qwen2-7B@main", cache={"persistentVolumeClaim": {"claimName": "model-cache"}}))
    assert {v["name"]: v for v in pvc["volumes"]}["model"]["persistentVolumeClaim"] == {"claimName": "model-cache"}
    plain = _pod(_remote("oci://registry.example/models/llama:8b"))
    assert {v["name"]: v for v in plain["volumes"]}["model"] == {"name": "model", "emptyDir": {}}
    assert "model-credentials" not in {v["name"] for v in plain["volumes"]}
    unpinned = _remote("oci://registry.example/models/llama:8b", cache={"hostPath": {"path": "/var/cache/m"}})
    del unpinned["spec"]["model"]["sha256"]
    pod = _pod(unpinned)  # nothing identifies unpinned content: no shared cache, the pod's own emptyDir
    assert {v["name"]: v for v in pod["volumes"]}["model"] == {"name": "model", "emptyDir": {}}
    assert pod["initContainers"][0]["args"][:3] == ["oci://registry.example/models/llama:8b", "--dest",
                                                    f"{CACHE_MOUNT}/unpinned"]


def test_a_mounted_model_has_no_init_container() -> None:
    pod = _pod(service())
    assert "initContainers" not in pod
    assert {v["name"]: v for v in pod["volumes"]}["model"]["persistentVolumeClaim"]["claimName"] == "models"


def test_a_canary_with_a_new_source_fetches_its_own_checkpoint() -> None:
    body = _remote(cache={"hostPath": {"path": "/var/cache/kvpilot/models"}})
    body["spec"]["canary"] = {"model": {"uri": "hf://org/llama-8b-int8@v2", "sha256": "cd" * 32}}
    canary = canary_spec(body["spec"], None, "ns")
    plan = preflight(canary, body["spec"]["model"]["config"])
    pod = build_deployment(body, canary, plan, track="canary")["spec"]["template"]["spec"]
    args = pod["initContainers"][0]["args"]
    assert args[0] == "hf://org/llama-8b-int8@v2" and args[args.index("--sha256") + 1] == "cd" * 32
    assert {v["name"]: v for v in pod["volumes"]}["model"]["hostPath"]["path"] == "/var/cache/kvpilot/models"


def _crd_model() -> dict:
    doc = yaml.safe_load(CRD.read_text())
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["model"]


GOOD = ["pvc://models/llama", "file:///data/m", "/data/m", "oci://127.0.0.1:5000/models/tiny:v1",
        "oci://ghcr.io/org/sub/model@sha256:" + "a" * 64, "oci://r.io/a__b/c-d", "s3://bucket/models/llama/",
        "s3://bucket", "hf://Qwen/Qwen2-7B", "hf://meta-llama/Llama-3.1-8B@refs/pr/1"]
BAD = ["gs://bucket/m", "oci://registry-only", "oci://r.io/UPPER:v1", "s3://B", "hf://no-owner", "http://x/y",
       "oci://r.io/m:", "s3://b/m?x=1"]


def test_the_crd_uri_rule_is_the_storage_initializers_grammar() -> None:
    (rule,) = _crd_model()["properties"]["uri"]["x-kubernetes-validations"]
    assert rule["rule"] == f"self.matches('{CRD_URI_PATTERN}')"
    assert "spec.model.uri must be" in rule["message"] and "oci://<registry>" in rule["message"]
    regex = re.compile(CRD_URI_PATTERN)  # RE2 and Python agree on this subset (no backslashes, no lookarounds)
    for uri in GOOD:
        assert regex.match(uri), uri
        if "://" in uri and not uri.startswith(("pvc", "file")):
            parse(uri)
    for uri in BAD:
        assert not regex.match(uri), uri
        with pytest.raises(BadModelUri):
            parse(uri)


def test_a_failed_fetch_reaches_the_status_in_the_initializers_words() -> None:
    """The kubelet puts the init container's last line (FallbackToLogsOnError) in lastState; PodsBlocked quotes it."""
    message = ("kvpilot storage-init: s3://models/llama/8b/ does not match spec.model.sha256: expected " + SHA +
               ", the fetched files (weights, config, tokenizer, chat template) digest to " + "cd" * 32)
    pod = {"metadata": {"name": "chat-stable-x", "uid": "u1", "labels": {"kvpilot.io/track": "stable"}},
           "status": {"phase": "Pending", "initContainerStatuses": [{
               "name": "storage-init", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
               "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": message}}}]}}
    (blocker,) = find_blockers([pod])
    assert blocker.container == "storage-init" and blocker.reason == "CrashLoopBackOff"
    assert SHA in blocker.message and "does not match spec.model.sha256" in blocker.message


def test_a_canary_on_another_kind_of_source_does_not_inherit_the_stable_login() -> None:
    body = _remote(endpoint="http://minio.storage:9000", credentialsSecretRef={"name": "s3-login"})
    body["spec"]["canary"] = {"model": {"uri": "hf://org/llama-8b@v2"}}
    args = build_deployment(body, (c := canary_spec(body["spec"], None, "ns")), preflight(c, body["spec"]["model"]["config"]),
                            track="canary")["spec"]["template"]["spec"]["initContainers"][0]["args"]
    assert "--endpoint" not in args and "--credentials" not in args
    body["spec"]["canary"] = {"model": {"uri": "s3://models/llama/8b-v2/"}}  # same kind: same server and login
    args = build_deployment(body, (c := canary_spec(body["spec"], None, "ns")), preflight(c, body["spec"]["model"]["config"]),
                            track="canary")["spec"]["template"]["spec"]["initContainers"][0]["args"]
    assert args[args.index("--endpoint") + 1] == "http://minio.storage:9000" and "--credentials" in args


def test_a_fetched_model_extends_the_progress_deadline_by_its_download() -> None:
    from kvpilot.operator.builders.startup_budget import weights_read_s

    mounted, fetched = service(), _remote()
    deadline = {}
    for name, body in (("mounted", mounted), ("fetched", fetched)):
        spec = ServiceSpec.from_dict(body["spec"], "ns")
        plan = preflight(spec, body["spec"]["model"]["config"])
        deadline[name] = build_deployment(body, spec, plan)["spec"]["progressDeadlineSeconds"]
    assert deadline["fetched"] - deadline["mounted"] >= weights_read_s(plan) - 60  # rounded to a minute
