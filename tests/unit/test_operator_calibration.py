"""Calibrated conversions and partial-RoPE MLA through the InferenceService: spec, preflight, pod, reconcile."""

from __future__ import annotations

import pytest
from operator_fakes import DEEPSEEK_V3, LLAMA3_8B, FakeKube, Run, service

from kvpilot.operator.builders import build_deployment
from kvpilot.operator.builders.calibration import CALIBRATION_DIR
from kvpilot.operator.builders.engine_args import engine_args
from kvpilot.operator.builders.security import container_security_context, pod_security_context
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.reconcile.reconciler import InvalidSpec, RetryLater
from kvpilot.operator.reconcile.tracks import canary_spec
from kvpilot.operator.spec import CalibrationRef, ServiceSpec, track_digest
from kvpilot.operator.status.conditions import get_condition
from kvpilot.planner import PlannerError
from tests.helpers.model_configs import DEEPSEEK_V3_FP8

pytestmark = pytest.mark.unit
CALIBRATED_GQA = {"attention": "gqa", "kvHeadGroups": 4, "maxSeqLen": 8192,
                  "calibration": {"configMap": "chat-calibration", "key": "traffic.txt", "tokens": 1024}}
ROPE_MLA = {"attention": "mla", "latentRank": 512, "mlaRopeDims": 16, "mlaRopePairs": "turn", "maxSeqLen": 8192,
            "calibration": {"configMap": "chat-calibration"}}


def planned(body: dict) -> tuple[ServiceSpec, object]:
    spec = ServiceSpec.from_dict(body["spec"])
    return spec, preflight(spec, body["spec"]["model"]["config"])


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def calibration_configmap(name: str = "chat-calibration", key: str = "traffic.txt", immutable: bool = True,
                          text: str = "def main():\n    return 0\n") -> dict:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"}, "data": {key: text}}
    return {**cm, "immutable": True} if immutable else cm


def test_spec_parses_calibration_and_rope_and_applies_them_only_to_their_attention() -> None:
    spec = ServiceSpec.from_dict(service(strategy=ROPE_MLA)["spec"]).strategy
    assert spec.calibration == CalibrationRef("chat-calibration", "calibration.txt", 2048)
    assert (spec.mla_rope_dims, spec.mla_rope_pairs) == (16, "turn")
    planner = spec.planner_strategy()
    assert planner.calibrated and planner.mla_rope_dims == 16
    # a canary switching to native inherits the stable track's calibration and rope dims, and uses neither
    native = ServiceSpec.from_dict(service(strategy={**ROPE_MLA, "attention": "native"})["spec"]).strategy
    assert native.active_calibration is None and native.active_mla_rope_dims is None
    assert not native.planner_strategy().calibrated and native.planner_strategy().mla_rope_dims is None
    assert ServiceSpec.from_dict(service()["spec"]).strategy.calibration is None


def test_calibrated_gqa_pod_mounts_the_one_key_read_only_and_passes_the_flags() -> None:
    body = service(strategy=CALIBRATED_GQA)
    spec, plan = planned(body)
    pod = build_deployment(body, spec, plan)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "calibration")
    assert volume["configMap"] == {"name": "chat-calibration", "items": [{"key": "traffic.txt", "path": "traffic.txt"}],
                                   "defaultMode": 0o444}
    engine, sidecar = pod["containers"]
    mount = next(m for m in engine["volumeMounts"] if m["name"] == "calibration")
    assert mount == {"name": "calibration", "mountPath": CALIBRATION_DIR, "readOnly": True}
    assert all(m["name"] != "calibration" for m in sidecar["volumeMounts"])
    args = engine["args"]
    assert flag(args, "--conversion-calibration") == f"{CALIBRATION_DIR}/traffic.txt"
    assert flag(args, "--calibration-tokens") == "1024"
    assert "--mla-rope-dims" not in args
    # the restricted Pod Security Standard holds with the extra volume
    assert pod["securityContext"] == pod_security_context()
    assert engine["securityContext"] == container_security_context() == sidecar["securityContext"]
    assert not any("hostPath" in v for v in pod["volumes"])


def test_uncalibrated_pod_has_no_calibration_volume_or_flag() -> None:
    body = service()
    spec, plan = planned(body)
    pod = build_deployment(body, spec, plan)["spec"]["template"]["spec"]
    assert all(v["name"] != "calibration" for v in pod["volumes"])
    assert "--conversion-calibration" not in pod["containers"][0]["args"]


def test_partial_rope_mla_passes_dims_pairs_and_plans_the_wider_row() -> None:
    body = service(strategy=ROPE_MLA)
    spec, plan = planned(body)
    args = engine_args(spec, plan)
    assert flag(args, "--mla-rope-dims") == "16" and flag(args, "--mla-rope-pairs") == "turn"
    assert flag(args, "--latent-rank") == "512"
    assert flag(args, "--conversion-calibration") == f"{CALIBRATION_DIR}/calibration.txt"
    layers, kv_heads = LLAMA3_8B["num_hidden_layers"], LLAMA3_8B["num_key_value_heads"]
    assert plan.bytes_per_token == layers * (512 + kv_heads * 16) * 2  # bf16 row: latent + exact rope keys
    assert plan.strategy == flag(args, "--strategy-name") == "mla512rope16"
    _, exact_rope = planned(service(strategy={k: v for k, v in ROPE_MLA.items() if not k.startswith("mlaRope")}))
    assert exact_rope.bytes_per_token == layers * 512 * 2 and exact_rope.strategy == "mla512"


@pytest.mark.parametrize("strategy, config, words", [
    ({**ROPE_MLA, "mlaRopeDims": 160}, LLAMA3_8B, ["mlaRopeDims", "head_dim 128", "2..128"]),
    ({"attention": "mla", "mlaRopeDims": 16}, DEEPSEEK_V3, ["mlaRopeDims", "own RoPE split", "unset"]),
    ({**ROPE_MLA, "calibration": None}, LLAMA3_8B, ["mlaRopePairs turn", "strategy.calibration", "high or auto"]),
    ({**ROPE_MLA, "mlaRopePairs": "norm", "calibration": None}, LLAMA3_8B, ["mlaRopePairs norm"]),
    ({"attention": "native"}, DEEPSEEK_V3_FP8, ["quantization_config", "'fp8'", "unquantised checkpoint"]),
    ({"attention": "linear", "kvCacheDtype": "int8"}, LLAMA3_8B, ["16-bit KV cache", "kvCacheDtype int8", "bf16"]),
    ({"attention": "linear", "kvCacheDtype": "auto", "kvQuantAutoThreshold": 8}, LLAMA3_8B, ["kvQuantAutoThreshold"]),
    ({"attention": "linear", "eviction": "sinks"}, LLAMA3_8B, ["evictionSinks 0", "evictionWindow >= linearWindow - 1",
                                                               "got eviction sinks, evictionSinks 4", "eviction none"]),
])
def test_preflight_refuses_what_the_engine_would_refuse(strategy: dict, config: dict, words: list[str]) -> None:
    spec = ServiceSpec.from_dict(service(config=config, strategy=strategy)["spec"])
    with pytest.raises(PlannerError) as exc:
        preflight(spec, config)
    for word in words:
        assert word in str(exc.value)


def test_preflight_refuses_calibrated_gqa_on_several_gpus() -> None:
    body = service(strategy=CALIBRATED_GQA, resources={"gpus": 2, "gpuProduct": "NVIDIA-H200"})
    with pytest.raises(PlannerError, match=r"resources.gpus=2.*drop strategy.calibration"):
        planned(body)
    _, plan = planned(service(strategy={**CALIBRATED_GQA, "calibration": None},
                              resources={"gpus": 2, "gpuProduct": "NVIDIA-H200"}))
    assert plan.feasible  # index grouping works on several GPUs


def test_high_pairs_need_no_calibration() -> None:
    _, plan = planned(service(strategy={**ROPE_MLA, "mlaRopePairs": "high", "calibration": None}))
    assert plan.feasible and plan.strategy == "mla512rope16"


def test_calibration_is_part_of_the_strategy_digest_and_the_engine_args() -> None:
    body = service(strategy=CALIBRATED_GQA)
    other = service(strategy={**CALIBRATED_GQA, "calibration": {**CALIBRATED_GQA["calibration"],
                                                                 "configMap": "chat-calibration-v2"}})
    assert track_digest(body["spec"]["model"], body["spec"]["strategy"]) != track_digest(
        other["spec"]["model"], other["spec"]["strategy"])
    (spec_a, plan_a), (spec_b, plan_b) = planned(body), planned(other)
    dep_a, dep_b = build_deployment(body, spec_a, plan_a), build_deployment(other, spec_b, plan_b)
    assert dep_a["spec"]["template"] != dep_b["spec"]["template"]  # a new reference rolls the pods


def test_a_canary_replaces_the_calibration_as_a_whole() -> None:
    body = service(strategy=CALIBRATED_GQA, canary={"strategy": {"calibration": {"configMap": "new-text"}}})
    canary = canary_spec(body["spec"], None, "ns")
    assert canary is not None and canary.strategy.calibration == CalibrationRef("new-text")


def capacity_condition(run: Run) -> dict:
    """The service's phase and its CapacityPlanned condition."""
    status = run.status()
    return {"phase": status["phase"], **get_condition(status["conditions"], "CapacityPlanned")}


@pytest.mark.parametrize("configmap, words", [
    (None, ["ConfigMap ns/chat-calibration", "not found", "immutable: true"]),
    (calibration_configmap(key="other.txt"), ["no key 'traffic.txt'", "other.txt"]),
    (calibration_configmap(immutable=False), ["must set immutable: true", "new ConfigMap"]),
    (calibration_configmap(text="  \n"), ["is empty"]),
])
def test_reconcile_waits_for_a_usable_calibration_configmap_before_any_pod(configmap: dict | None,
                                                                           words: list[str]) -> None:
    run = Run(FakeKube())
    if configmap:
        run.kube.add(configmap)
    with pytest.raises(RetryLater) as exc:
        run.reconcile(service(strategy=CALIBRATED_GQA))
    for word in words:
        assert word in str(exc.value)
    assert run.kube.find("Deployment", "chat-stable", "apps/v1") is None
    condition = capacity_condition(run)
    assert (condition["phase"], condition["status"], condition["reason"]) == ("Pending", "False",
                                                                             "CalibrationUnavailable")
    assert run.events == [("Warning", "CalibrationUnavailable", str(exc.value))]


def test_reconcile_with_an_immutable_calibration_configmap_schedules_the_pod() -> None:
    run = Run(FakeKube())
    run.kube.add(calibration_configmap())
    assert run.reconcile(service(strategy=CALIBRATED_GQA)).feasible
    dep = run.kube.find("Deployment", "chat-stable", "apps/v1")
    assert any(v["name"] == "calibration" for v in dep["spec"]["template"]["spec"]["volumes"])
    assert capacity_condition(run)["status"] == "True"


def test_reconcile_refuses_rope_dims_beyond_head_dim_as_an_invalid_spec() -> None:
    run = Run(FakeKube())
    with pytest.raises(InvalidSpec, match="mlaRopeDims"):
        run.reconcile(service(strategy={**ROPE_MLA, "mlaRopeDims": 130}))
    condition = capacity_condition(run)
    assert (condition["phase"], condition["reason"]) == ("Failed", "InvalidSpec")
    assert run.kube.find("Deployment", "chat-stable", "apps/v1") is None
    assert [e[:2] for e in run.events] == [("Warning", "InvalidSpec")]


@pytest.mark.parametrize("where", ["stable", "canary"])
def test_the_probe_set_is_refused_as_calibration_text(where: str) -> None:
    analysis = {"probeSet": "kvpilot-probes"}
    if where == "stable":
        body = service(strategy={**CALIBRATED_GQA, "calibration": {"configMap": "kvpilot-probes"}},
                       canary={"strategy": {"kvCacheDtype": "int8"}, "analysis": analysis})
        spec = ServiceSpec.from_dict(body["spec"])
    else:
        body = service(canary={"strategy": {"calibration": {"configMap": "kvpilot-probes"}}, "analysis": analysis})
        spec = canary_spec(body["spec"], None, "ns")
    with pytest.raises(PlannerError, match=r"kvpilot-probes is the canary's probe set.*leaks them"):
        preflight(spec, LLAMA3_8B)
    body["spec"]["canary"]["analysis"] = {"probeSet": "other-probes"}  # a disjoint probe set is fine
    spec = ServiceSpec.from_dict(body["spec"]) if where == "stable" else canary_spec(body["spec"], None, "ns")
    assert preflight(spec, LLAMA3_8B).feasible


@pytest.mark.parametrize("strategy", [
    {"attention": "linear"}, {"attention": "linear", "kvCacheDtype": "bf16"}, {"attention": "linear", "kvCacheDtype": "int8"},
    {"attention": "linear", "kvCacheDtype": "fp8"}, {"attention": "linear", "kvCacheDtype": "auto", "kvQuantAutoThreshold": 8},
    {"attention": "linear", "eviction": "sinks"}, {"attention": "linear", "eviction": "ladder"},
    {"attention": "linear", "eviction": "sinks", "evictionSinks": 0, "evictionWindow": 64},
    {"attention": "linear", "eviction": "sinks", "evictionSinks": 0, "evictionWindow": 48},
    {"attention": "linear", "eviction": "sinks", "evictionSinks": 0, "evictionWindow": 62, "blockSize": 8},
    {"attention": "native", "eviction": "ladder", "evictionSinks": 0, "evictionWindow": 256, "evictionLadderSpan": 128},
    {"attention": "native", "eviction": "sinks", "kvCacheDtype": "int8"}, {"attention": "mla", "latentRank": 512, "kvCacheDtype": "fp8"},
])  # fmt: skip
def test_preflight_refuses_exactly_what_the_engine_refuses_at_start(strategy: dict, tmp_path) -> None:
    """The engine's flags as the operator writes them, parsed by `kvpilot serve`'s own parser: a spec the preflight
    passes must start, and one the engine refuses must not get a (crash-looping) pod."""
    import argparse
    import json

    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.config.arguments import add_config_arguments, config_kwargs
    from kvpilot.operator.builders.engine_args import strategy_flags

    spec = ServiceSpec.from_dict(service(config=LLAMA3_8B, strategy=strategy)["spec"])
    try:
        preflight(spec, LLAMA3_8B)
        refused = None
    except PlannerError as exc:
        refused = exc
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args, _ = parser.parse_known_args(strategy_flags(spec.strategy))
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    try:
        EngineConfig(model=str(tmp_path), **config_kwargs(args))
        engine_refusal = None
    except ValueError as exc:
        engine_refusal = exc
    assert (refused is None) == (engine_refusal is None), (refused, engine_refusal)
