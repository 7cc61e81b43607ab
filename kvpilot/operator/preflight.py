"""Capacity preflight: the planner's verdict on a spec, before anything is scheduled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.conditions import CAPACITY_PLANNED, Condition
from kvpilot.operator.spec import ServiceSpec
from kvpilot.planner import CapacityPlan, ModelShape, gpu_spec, plan_capacity


def preflight(spec: ServiceSpec, model_config: Mapping[str, Any]) -> CapacityPlan:
    """The plan for one replica (spec.resources.gpus GPUs of spec.resources.gpuProduct).

    Raises PlannerError when the spec cannot be planned at all (unknown GPU, groups that do
    not divide the KV heads, ...); returns an infeasible plan when it merely does not fit.
    """
    return plan_capacity(
        ModelShape.from_hf_config(model_config),
        spec.strategy.planner_strategy(),
        gpu_spec(spec.gpu_product),
        max_seq_len=spec.strategy.max_seq_len,
        gpus=spec.gpus,
        max_num_batched_tokens=spec.strategy.max_num_batched_tokens,
    )


def capacity_status(plan: CapacityPlan) -> dict[str, Any]:
    """status.capacity: the figures a user checks before and after a strategy change."""
    return {
        "strategy": plan.strategy,
        "gpuProduct": plan.gpu_product,
        "gpus": plan.gpus,
        "feasible": plan.feasible,
        "bytesPerToken": plan.bytes_per_token,
        "kvPoolBytes": plan.kv_pool_bytes,
        "numBlocks": plan.num_blocks,
        "perRequestPeakBytes": plan.per_request_peak_bytes,
        "maxSeqLen": plan.max_seq_len,
        "maxConcurrency": plan.max_concurrency,
        "weightsBytes": plan.weights_bytes,
        "freeBytes": plan.free_bytes,
    }


def capacity_condition(plan: CapacityPlan) -> Condition:
    if plan.feasible:
        return Condition(CAPACITY_PLANNED, "True", "Planned", plan.reason)
    return Condition(CAPACITY_PLANNED, "False", "Infeasible", plan.reason)
