"""Capacity preflight: the planner's verdict on a spec, before anything is scheduled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.pod_overrides import conflicts
from kvpilot.operator.spec import ServiceSpec, StrategySpec
from kvpilot.planner import CapacityPlan, ModelShape, PlannerError, gpu_spec, plan_admitting
from kvpilot.strategy_schema import (
    CALIBRATED_ROPE_PAIRS,
    EIGHT_BIT_KV_DTYPES,
    MLA_ROPE_PAIRS,
    configured_window,
    linear_window_stays_resident,
    sliding_window_gap,
)


class StrategyRefused(PlannerError):
    """A strategy the engine would refuse at start: refused here instead, before any pod (as PlannerError)."""


def check_strategy(spec: ServiceSpec) -> None:
    """What the engine checks at start and the CRD cannot (a canary's merged strategy, resources.gpus)."""
    strategy = spec.strategy
    if strategy.mla_rope_pairs not in MLA_ROPE_PAIRS:
        raise StrategyRefused(f"strategy.mlaRopePairs {strategy.mla_rope_pairs!r} is not a rule; choose one of "
                              f"{', '.join(MLA_ROPE_PAIRS)}")
    rope_needs_text = strategy.mla_rope_pairs in CALIBRATED_ROPE_PAIRS
    if strategy.active_mla_rope_dims is not None and rope_needs_text and strategy.active_calibration is None:
        raise StrategyRefused(
            f"strategy.mlaRopePairs {strategy.mla_rope_pairs} scores RoPE pairs on calibration text: set "
            "strategy.calibration (a ConfigMap with the text), or use mlaRopePairs high or auto"
        )
    probe_set = str((spec.canary.analysis if spec.canary else {}).get("probeSet") or "")
    if strategy.active_calibration is not None and strategy.active_calibration.config_map == probe_set:
        raise StrategyRefused(
            f"strategy.calibration.configMap {probe_set} is the canary's probe set (canary.analysis.probeSet): "
            "calibrating on the prompts the accuracy gate scores leaks them into the model, and the gate would "
            "pass conversions that lose accuracy on real traffic; calibrate on a ConfigMap of other traffic"
        )
    if strategy.attention == "linear":
        _check_linear(strategy)
    if strategy.attention == "gqa" and strategy.active_calibration is not None and spec.gpus > 1:
        raise StrategyRefused(
            f"strategy.calibration with attention gqa regroups the KV heads on one GPU; it is not available with "
            f"resources.gpus={spec.gpus}: drop strategy.calibration (index grouping works on several GPUs) or use "
            "resources.gpus 1"
        )


def _check_linear(strategy: StrategySpec) -> None:
    """The Performer conversion's rules (engine/config/strategy.check_linear_strategy)."""
    switching = strategy.kv_cache_dtype == "auto" and strategy.kv_quant_auto_threshold is not None
    if strategy.kv_cache_dtype in EIGHT_BIT_KV_DTYPES or switching:
        chosen = "auto with kvQuantAutoThreshold" if switching else strategy.kv_cache_dtype
        raise StrategyRefused(
            f"attention linear reads its exact window from a 16-bit KV cache, not kvCacheDtype {chosen}; choose "
            "kvCacheDtype bf16, fp16 or auto (without kvQuantAutoThreshold)"
        )
    if not linear_window_stays_resident(strategy.eviction, strategy.eviction_sinks, strategy.eviction_window,
                                        strategy.block_size, strategy.linear_window):
        raise StrategyRefused(
            f"attention linear reads its exact window by position, so eviction may only drop the oldest blocks: "
            f"eviction sinks with evictionSinks 0 and evictionWindow >= linearWindow - 1 "
            f"({strategy.linear_window - 1}); got eviction {strategy.eviction}, evictionSinks "
            f"{strategy.eviction_sinks}, evictionWindow {strategy.eviction_window} (or use eviction none)"
        )


def _check_sliding_window(strategy: StrategySpec, disabled: tuple[str, ...], model_config: Mapping[str, Any]) -> None:
    """A maxSeqLen past the model's sliding window where the engine cannot apply it (it would refuse to
    start); `disabled`: spec.engine.disable, the switches served as the checkpoint's own (kv-quant, gqa, ...)."""
    window = configured_window(model_config)
    if window is None or strategy.max_seq_len <= window:
        return
    switching = strategy.kv_cache_dtype == "auto" and strategy.kv_quant_auto_threshold is not None
    eight_bit = (switching or strategy.kv_cache_dtype in EIGHT_BIT_KV_DTYPES) and "kv-quant" not in disabled
    attention = "native" if strategy.attention in disabled else strategy.attention
    gap = sliding_window_gap(str(model_config.get("model_type")), window, attention,
                             "auto-switching" if switching else strategy.kv_cache_dtype, not eight_bit,
                             strategy.eviction, strategy.eviction_sinks, strategy.eviction_window, strategy.block_size)
    if gap:
        raise StrategyRefused(
            f"strategy.maxSeqLen {strategy.max_seq_len} is past the model's sliding window ({window} tokens), and "
            f"{gap}; the engine applies the window with attention native, kvCacheDtype bf16, fp16 or auto (without "
            f"kvQuantAutoThreshold) and eviction none or sinks with evictionSinks 0 and evictionWindow >= "
            f"{window - 1}, on Llama/Mistral checkpoints: use those, or maxSeqLen <= {window}"
        )


def preflight(spec: ServiceSpec, model_config: Mapping[str, Any]) -> CapacityPlan:
    """The plan for one replica (spec.resources.gpus GPUs of spec.resources.gpuProduct).

    Raises PlannerError when the spec cannot be planned at all (unknown GPU, groups that do
    not divide the KV heads, mlaRopeDims above the model's head_dim, norm RoPE pairs without
    calibration, ...); returns an infeasible plan when it merely does not fit.
    """
    check_strategy(spec)
    quant = model_config.get("quantization_config")
    if quant:  # the engine refuses it at start (engine/config/model.py): refused here, before a crash-looping pod
        method = quant.get("quant_method") if isinstance(quant, Mapping) else quant
        raise StrategyRefused(
            f"the model's config.json has quantization_config (quant_method {method!r}): the engine loads "
            "unquantised weights only (float32/float16/bfloat16); point spec.model at the unquantised checkpoint "
            "(strategy.kvCacheDtype int8 or fp8 quantises the KV cache instead)"
        )
    _check_sliding_window(spec.strategy, spec.engine.disable, model_config)
    problems = conflicts(spec.pod)  # spec.pod against the operator's own labels, volumes and mounts
    if problems:
        raise StrategyRefused("; ".join(problems))
    return plan_admitting(  # the engine's --max-num-seqs is the plan's concurrency: its logits are counted
        ModelShape.from_hf_config(model_config),
        spec.strategy.planner_strategy(),
        gpu_spec(spec.gpu_product),
        max_seq_len=spec.strategy.max_seq_len,
        gpus=spec.gpus,
        max_num_batched_tokens=spec.strategy.max_num_batched_tokens,
    )
