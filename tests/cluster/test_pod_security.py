"""The operator's pods pass the `restricted` Pod Security Standard on a real API server, and the
API key reaches the engine as a Secret reference, never as a literal (issue 22).

The namespace carries `pod-security.kubernetes.io/enforce=restricted`, so the API server's
PodSecurity admission refuses any pod that falls short: the stable pods exist only if the
ReplicaSet's pods were admitted. The canary track is built by the same builder (track="canary");
its pod template is created as a Pod directly. A deliberately non-compliant pod is refused, which
proves the label is enforced.
"""

from __future__ import annotations

import json
import secrets

import pytest

from kvpilot.operator.builders import build_deployment
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec
from tests.harness.cluster import wait_for
from tests.harness.operator import manifest, operator_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def env(k8s_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    restricted = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}
    with operator_env(k8s_cluster, tmp_path_factory, "pss", restricted) as env:
        yield env


def _pod_from_template(body: dict, track: str) -> dict:
    spec = ServiceSpec.from_dict(body["spec"])
    dep = build_deployment(body, spec, preflight(spec, body["spec"]["model"]["config"]), track)
    template = dep["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{body['metadata']['name']}-{track}-direct", "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def test_operator_pods_are_admitted_and_the_key_is_only_a_secret_reference(env) -> None:  # type: ignore[no-untyped-def]
    ns, core, apps = env["ns"], env["core"], env["apps"]
    key = secrets.token_hex(24)
    core.create_namespaced_secret(ns, {"metadata": {"name": "chat-key"}, "stringData": {"token": key}})
    body = manifest("chat", ns, engine={"image": "kvpilot:test",
                                        "apiKeySecretRef": {"name": "chat-key", "key": "token"}})
    env["kubectl"].apply(body)

    def pods_running() -> bool:
        found = core.list_namespaced_pod(ns, label_selector="kvpilot.io/service=chat").items
        return len(found) == 2 and all(p.status.phase == "Running" for p in found)

    wait_for(pods_running, "2 admitted, running stable pods in a restricted namespace", 90)
    (dep,) = apps.list_namespaced_deployment(ns, label_selector="kvpilot.io/service=chat").items
    dep_json = json.dumps(apps.api_client.sanitize_for_serialization(dep))
    assert key not in dep_json
    args = dep.spec.template.spec.containers[0].args
    assert "--api-key-file" in args and "--api-key" not in args
    for pod in core.list_namespaced_pod(ns, label_selector="kvpilot.io/service=chat").items:
        assert key not in json.dumps(core.api_client.sanitize_for_serialization(pod))
        (volume,) = [v for v in pod.spec.volumes if v.secret is not None]
        assert volume.secret.secret_name == "chat-key"
        assert [(i.key, i.path) for i in volume.secret.items] == [("token", "api-key")]
    # nothing in the ReplicaSets' events says a pod was forbidden
    events = core.list_namespaced_event(ns).items
    assert not [e.message for e in events if e.reason == "FailedCreate"], "pods were refused"


def test_canary_pod_is_admitted_and_a_noncompliant_pod_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    from kubernetes.client.exceptions import ApiException

    ns, core = env["ns"], env["core"]
    calibrated = {"attention": "gqa", "kvHeadGroups": 4, "kvCacheDtype": "bf16", "maxSeqLen": 8192,
                  "calibration": {"configMap": "chat-calibration"}}  # its read-only ConfigMap volume is admitted too
    body = manifest("canary-probe", ns, engine={"image": "kvpilot:test", "apiKeySecretRef": {"name": "chat-key"}},
                    strategy=calibrated)
    body["metadata"]["uid"] = "uid-canary-probe"
    canary = _pod_from_template(body, "canary")
    assert any(v["name"] == "calibration" for v in canary["spec"]["volumes"])
    for container in canary["spec"]["containers"]:  # KWOK runs it; no scheduling constraints matter here
        container.pop("resources", None)
    canary["spec"].pop("nodeSelector")
    core.create_namespaced_pod(ns, canary)  # raises ApiException 403 if PodSecurity refuses it

    bad = _pod_from_template(body, "stable")
    bad["metadata"]["name"] = "noncompliant"
    bad["spec"].pop("securityContext")
    for container in bad["spec"]["containers"]:
        container["securityContext"] = {"allowPrivilegeEscalation": True}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns, bad)
    assert refused.value.status == 403
    assert "violates PodSecurity" in refused.value.body and "restricted" in refused.value.body
    core.delete_namespaced_pod(canary["metadata"]["name"], ns, grace_period_seconds=0)


def test_probe_gate_reads_the_key_from_the_secret_or_says_why_not(env, k8s_cluster) -> None:  # type: ignore[no-untyped-def]
    from kvpilot.operator.analysis.api_key import ApiKeyError, read_api_key
    from kvpilot.operator.spec import SecretKeyRef
    from tests.harness.gateway import kube_client

    ns, core = env["ns"], env["core"]
    core.create_namespaced_secret(ns, {"metadata": {"name": "probe-key"}, "stringData": {"api-key": " s3cret\n"}})
    kube = kube_client(k8s_cluster)
    try:
        assert read_api_key(kube, ns, SecretKeyRef("probe-key")) == "s3cret"
        with pytest.raises(ApiKeyError, match=f"Secret {ns}/absent .* does not exist"):
            read_api_key(kube, ns, SecretKeyRef("absent"))
        with pytest.raises(ApiKeyError, match=r"has no key 'token' \(it has \['api-key'\]\)"):
            read_api_key(kube, ns, SecretKeyRef("probe-key", "token"))
    finally:
        kube.close()
