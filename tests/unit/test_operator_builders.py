"""Pure builders: what each child of an InferenceService looks like."""

from __future__ import annotations

import json

import pytest
from operator_fakes import SHA, service

from kvpilot.operator import constants as c
from kvpilot.operator.builders import (
    build_api_service,
    build_deployment,
    build_lineage_configmap,
    build_metrics_service,
    build_podmonitor,
    read_lineage,
)
from kvpilot.operator.builders.engine_args import UnsupportedModelUri, engine_args, model_path
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec

pytestmark = pytest.mark.unit


def planned(body: dict):  # type: ignore[no-untyped-def]
    spec = ServiceSpec.from_dict(body["spec"])
    return spec, preflight(spec, body["spec"]["model"]["config"])


def test_children_are_owned_by_the_service_and_labelled() -> None:
    body = service()
    spec, plan = planned(body)
    children = [build_deployment(body, spec, plan), build_api_service(body), build_metrics_service(body),
                build_lineage_configmap(body, spec, plan, None), build_podmonitor(body)]
    for child in children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService", "name": "chat",
                       "uid": "uid-chat", "controller": True, "blockOwnerDeletion": True}
        assert child["metadata"]["namespace"] == "ns"
        assert child["metadata"]["labels"][c.LABEL_MANAGED_BY] == "kvpilot"
    assert [ch["metadata"]["name"] for ch in children] == [
        "chat-stable", "chat", "chat-metrics", "chat-lineage", "chat"]


def test_deployment_runs_engine_and_sidecar_on_the_right_gpus() -> None:
    body = service(resources={"gpus": 2, "gpuProduct": "NVIDIA-H100-80GB-HBM3"})
    spec, plan = planned(body)
    dep = build_deployment(body, spec, plan)
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    engine, sidecar = pod["containers"]
    assert engine["resources"]["limits"] == {"nvidia.com/gpu": "2"} == engine["resources"]["requests"]
    assert engine["args"][engine["args"].index("--tensor-parallel-size") + 1] == "2"  # the engine uses both GPUs
    assert "nvidia.com/gpu" not in sidecar["resources"]["limits"]
    assert engine["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 8000}
    assert engine["livenessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert engine["startupProbe"]["httpGet"]["path"] == "/health"
    assert sidecar["command"] == ["kvpilot", "sidecar"]
    host = sidecar["args"][sidecar["args"].index("--host") + 1]
    assert host == "$(POD_IP)" and {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in sidecar["env"]
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    assert pod["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    assert pod["terminationGracePeriodSeconds"] == 300
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9400", "prometheus.io/path": "/metrics"}
    assert dep["spec"]["selector"]["matchLabels"] == {"kvpilot.io/service": "chat", "kvpilot.io/track": "stable"}
    assert dep["spec"]["template"]["metadata"]["labels"]["kvpilot.io/strategy"] == "gqa4-int8"


def test_engine_args_carry_the_strategy_and_the_planned_concurrency() -> None:
    body = service()
    spec, plan = planned(body)
    args = engine_args(spec, plan)
    assert plan.feasible and plan.max_concurrency > 1
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert args[:2] == ["--model", "/models/llama-3-8b"]
    assert pairs["--attention"] == "gqa" and pairs["--kv-head-groups"] == "4"
    assert pairs["--kv-cache-dtype"] == "int8" and pairs["--max-model-len"] == "8192"
    assert args[args.index("--max-num-seqs") + 1] == str(plan.max_concurrency)
    assert args[args.index("--strategy-name") + 1] == "gqa4-int8"
    assert args[args.index("--shutdown-grace") + 1] == "285"  # 300 s grace minus a margin
    assert "--eviction" not in args and "--latent-rank" not in args
    assert "--disable-kv-quant" in args
    assert spec.gpus == 1 and "--tensor-parallel-size" not in args  # one GPU: no tensor parallelism
    assert args[-2:] == ["--log-level", "INFO"]
    served = ["--served-model-name", body["metadata"]["name"]]  # the model name clients send, on both tracks
    assert build_deployment(body, spec, plan)["spec"]["template"]["spec"]["containers"][0]["args"] == \
        [*args[:6], *served, *args[6:]]


def test_changing_only_the_strategy_changes_only_the_engine_args_and_strategy_label() -> None:
    body = service()
    spec, plan = planned(body)
    other = service(strategy={"attention": "native", "kvCacheDtype": "bf16", "maxSeqLen": 8192})
    spec2, plan2 = planned(other)
    a, b = build_deployment(body, spec, plan), build_deployment(other, spec2, plan2)
    a_pod, b_pod = a["spec"]["template"], b["spec"]["template"]
    assert a_pod["spec"]["containers"][0]["args"] != b_pod["spec"]["containers"][0]["args"]
    a_pod["spec"]["containers"][0].pop("args"), b_pod["spec"]["containers"][0].pop("args")
    a_pod["metadata"]["labels"].pop("kvpilot.io/strategy"), b_pod["metadata"]["labels"].pop("kvpilot.io/strategy")
    assert a == b


def test_model_uris() -> None:
    assert model_path("pvc://models/llama/8b") == "/models/llama/8b"
    assert model_path("file:///data/m") == "/data/m"
    assert model_path("/data/m") == "/data/m"
    assert model_path("s3://bucket/m") == "/models"  # fetched by the storage initializer (model_init.py)
    for bad in ("gs://bucket/m", "oci://no-repository"):
        with pytest.raises(UnsupportedModelUri, match=r"pvc://<claim>/<dir>|oci://<registry>"):
            model_path(bad)


def test_services_select_stable_api_and_every_tracks_metrics() -> None:
    body = service()
    api, metrics = build_api_service(body), build_metrics_service(body)
    assert api["spec"]["selector"] == {"kvpilot.io/service": "chat", "kvpilot.io/track": "stable"}
    assert api["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert metrics["spec"]["selector"] == {"kvpilot.io/service": "chat"}
    assert metrics["spec"]["ports"][0]["port"] == 9400
    assert metrics["spec"]["clusterIP"] == "None" and "clusterIP" not in api["spec"]


def test_podmonitor_scrapes_the_sidecar_port() -> None:
    pm = build_podmonitor(service())
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["kind"] == "PodMonitor"
    [endpoint] = pm["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "15s")


def test_podmonitor_relabels_namespace_service_and_track_for_the_rollout_queries() -> None:
    [endpoint] = build_podmonitor(service())["spec"]["podMetricsEndpoints"]
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["service"] == ["__meta_kubernetes_pod_label_kvpilot_io_service"]
    assert targets["track"] == ["__meta_kubernetes_pod_label_kvpilot_io_track"]


def test_lineage_keeps_previous_only_when_the_track_changed() -> None:
    body = service()
    spec, plan = planned(body)
    first = build_lineage_configmap(body, spec, plan, None)
    lineage = read_lineage(first)
    assert lineage["stable"]["previous"] is None and lineage["canary"] is None
    current = lineage["stable"]["current"]
    assert current["uri"] == "pvc://models/llama-3-8b" and current["sha256"] == SHA
    assert current["path"] == "/models/llama-3-8b" and current["strategy"] == "gqa4-int8"
    assert "--kv-head-groups" in current["engineArgs"]
    # a resync builds the identical object (so the apply is a no-op)
    assert build_lineage_configmap(body, spec, plan, first) == first
    # a new checkpoint: the old one becomes previous
    new_sha = "cd" * 32
    body2 = service(model={"uri": "pvc://models/llama-3-8b-v2", "sha256": new_sha,
                           "config": body["spec"]["model"]["config"]})
    spec2, plan2 = planned(body2)
    second = read_lineage(build_lineage_configmap(body2, spec2, plan2, first))
    assert second["stable"]["current"]["sha256"] == new_sha
    assert second["stable"]["previous"] == current
    # the data is deterministic JSON
    assert json.loads(first["data"]["stable"]) == lineage["stable"]
