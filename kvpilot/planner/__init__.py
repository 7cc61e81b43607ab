"""Capacity planner (seed 002, section 5): pure Python, no torch, shared by the engine and the operator.

Procedure: max_seq_len = P95 request length + 20 % (`max_seq_len_from_p95`); per-request KV
peak at max_seq_len from the strategy's bytes per token; free = GPU memory - weights - CUDA
context - activation peak of one prefill step; KV pool = watermark (0.8) x free; concurrency
limit = pool // per-request peak.

API::

    from kvpilot.planner import KVStrategy, ModelShape, gpu_spec, plan_capacity, format_plan

    model = ModelShape.from_hf_config(json.load(open("config.json")))   # Llama/Qwen2/Mistral,
                                                   # DeepSeek-V2/V3 (MLA, MoE), MiniMax (hybrid linear)
    strategy = KVStrategy(attention="gqa", kv_head_groups=4, kv_cache_dtype="int8", block_size=16)
    plan = plan_capacity(model, strategy, gpu_spec("NVIDIA-H200"), max_seq_len=4096,
                         gpus=1,                          # tensor parallel degree of one replica
                         max_num_batched_tokens=8192,     # prefill token budget -> activation peak
                         max_num_seqs=256, watermark=0.8,
                         weights_bytes_override=None,     # measured bytes, if known (engine)
                         activation_peak_bytes_override=None)   # per GPU, if measured
    plan.feasible, plan.reason          # reason carries the numbers when infeasible
    plan.bytes_per_token                # KV bytes per token, all layers (+ int8/fp8 scales)
    plan.kv_pool_bytes, plan.num_blocks, plan.block_bytes, plan.blocks_per_request
    plan.per_request_peak_bytes, plan.max_concurrency
    plan.require()                      # raises InfeasiblePlanError(plan) when it does not fit
    print(format_plan(plan))            # the table `kvpilot plan` / `kvpilot serve` print

Strategies (`KVStrategy.attention`): `native` (the model's own: MHA/GQA K/V heads, the DeepSeek
latent kv_lora_rank + qk_rope_head_dim, MiniMax's linear layers as fixed state); `gqa` with
`kv_head_groups` = KV heads after merging; `mla` with `latent_rank` = width of the one cached
latent per token and layer; `linear` (the Performer conversion) = every token's K/V as
`native` + a fixed fp32 summary per layer (the window changes compute, not memory). `eviction`
sinks | ladder (with `eviction_sinks`, `eviction_window`, `eviction_ladder_span` tokens): a request costs
the blocks it keeps resident (planner/eviction.py). `kv_cache_dtype`: auto (the model's dtype) | bf16 | fp16 | int8 | fp8
(kvpilot/strategy_schema.py holds the names, bytes and defaults the engine and operator share);
int8 adds one `scale_bytes` (fp32) scale per token, layer and cached K or V head vector (fp8's scales are per
layer and head: no bytes per token).
Wrong inputs raise `PlannerError` (a ValueError) whose message names the field and the allowed
values; a plan that merely does not fit is returned with `feasible=False`.
"""

from kvpilot.planner.capacity import (
    DEFAULT_WATERMARK,
    CapacityPlan,
    InfeasiblePlanError,
    max_seq_len_from_p95,
    plan_admitting,
    plan_capacity,
)
from kvpilot.planner.errors import PlannerError
from kvpilot.planner.gpus import GPU_PRODUCTS, GpuSpec, gpu_spec
from kvpilot.planner.memory import activation_peak_bytes, parameter_count, weights_bytes
from kvpilot.planner.model_shape import ModelShape
from kvpilot.planner.strategy import KVFootprint, KVStrategy, kv_footprint
from kvpilot.planner.table import format_plan
from kvpilot.planner.units import human_bytes

__all__ = [
    "DEFAULT_WATERMARK",
    "GPU_PRODUCTS",
    "CapacityPlan",
    "GpuSpec",
    "InfeasiblePlanError",
    "KVFootprint",
    "KVStrategy",
    "ModelShape",
    "PlannerError",
    "activation_peak_bytes",
    "format_plan",
    "gpu_spec",
    "human_bytes",
    "kv_footprint",
    "max_seq_len_from_p95",
    "parameter_count",
    "plan_admitting",
    "plan_capacity",
    "weights_bytes",
]
