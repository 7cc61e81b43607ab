"""The capacity plan (seed 002, section 5): free memory over the per-request peak, at a watermark."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvpilot.planner.errors import PlannerError
from kvpilot.planner.gpus import GpuSpec
from kvpilot.planner.memory import activation_peak_bytes, weights_bytes
from kvpilot.planner.model_shape import ModelShape
from kvpilot.planner.pools import exact_sequence_bytes, extra_weight_bytes, split_pool
from kvpilot.planner.strategy import KVFootprint, KVStrategy, kv_footprint
from kvpilot.planner.units import human_bytes as hb
from kvpilot.strategy_schema import default

DEFAULT_WATERMARK = 0.8
DEFAULT_MAX_NUM_BATCHED_TOKENS = default("max_num_batched_tokens")  # spec.strategy.maxNumBatchedTokens
DEFAULT_MAX_NUM_SEQS = 256


class InfeasiblePlanError(PlannerError):
    """The plan does not fit; `plan` holds the numbers."""

    def __init__(self, plan: CapacityPlan) -> None:
        super().__init__(plan.reason)
        self.plan = plan


@dataclass(frozen=True)
class CapacityPlan:
    """Memory account and limits for one engine (all GPUs of one replica together)."""

    strategy: str
    gpu_product: str
    gpus: int
    total_memory_bytes: int
    weights_bytes: int
    cuda_context_bytes: int
    activation_peak_bytes: int
    free_bytes: int  # total - weights - CUDA context - activation peak (may be negative)
    watermark: float
    kv_pool_bytes: int  # watermark x free, 0 when nothing is free
    bytes_per_token: int  # growing KV per token, all layers and GPUs (scales included)
    fixed_bytes_per_sequence: int  # recurrent state of linear layers
    block_size: int
    block_bytes: int  # bytes of one paged block (0 when nothing grows per token)
    num_blocks: int
    max_seq_len: int
    blocks_per_request: int
    per_request_peak_bytes: int  # one request at max_seq_len, blocks rounded up
    max_concurrency: int  # requests at max_seq_len the pool holds at once (beside the reserve)
    feasible: bool
    reason: str  # why not feasible (with the numbers), or a one-line summary when it is
    reserve_bytes: int = 0  # runtime validation's exact-path fallback reserve, part of kv_pool_bytes
    reserve_sequences: int = 0  # max_seq_len sequences the reserve holds at once
    pool16_sequences: int = 0  # kv_cache_dtype auto switching: sequences the 16-bit pool holds
    pool8_sequences: int = 0  # ... and the int8 pool
    # blocks of block_bytes in the whole pool, the reserve included, beside the fixed state of max_num_seqs
    # sequences: the engine's num_kv_blocks (it carves the reserve out of them and allocates a state slot per
    # sequence it may run), which `kvpilot serve` sets from the plan
    engine_blocks: int = 0
    max_num_seqs: int = 0  # the sequences whose logits and recurrent state the plan counts

    def require(self) -> CapacityPlan:
        """This plan, or InfeasiblePlanError when it does not fit."""
        if not self.feasible:
            raise InfeasiblePlanError(self)
        return self

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def plan_capacity(
    model: ModelShape,
    strategy: KVStrategy,
    gpu: GpuSpec,
    *,
    max_seq_len: int,
    gpus: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    watermark: float = DEFAULT_WATERMARK,
    weights_bytes_override: int | None = None,
    activation_peak_bytes_override: int | None = None,
) -> CapacityPlan:
    """Plan the KV pool and concurrency limit; never raises for a plan that merely does not fit."""
    _check(max_seq_len=max_seq_len, gpus=gpus, max_num_batched_tokens=max_num_batched_tokens,
           max_num_seqs=max_num_seqs)
    if not 0 < watermark <= 1:
        raise PlannerError(f"watermark must be in (0, 1], got {watermark}")
    footprint = _shard(kv_footprint(model, strategy), model, strategy, gpus)
    total = gpus * gpu.memory_bytes
    checkpoint = weights_bytes(model) if weights_bytes_override is None else weights_bytes_override
    weights = checkpoint + extra_weight_bytes(model, strategy)  # a conversion's factors and kept originals
    activation = gpus * (
        activation_peak_bytes(model, max_num_batched_tokens, max_num_seqs)
        if activation_peak_bytes_override is None else activation_peak_bytes_override
    )
    context = gpus * gpu.cuda_context_bytes
    free = total - weights - context - activation
    pool = max(0, int(free * watermark))
    bs = strategy.block_size
    per_request = _request_bytes(footprint, strategy, max_seq_len)  # under eviction: its resident blocks
    split = split_pool(model, strategy, pool, max_seq_len)  # sequences counted unsharded: conservative
    serving = pool - split.reserve_bytes  # the approximate pool beside the fallback reserve
    room = serving
    if strategy.eviction != "none" and footprint.bytes_per_token:
        # a prompt's chunk lands before its eviction runs: room for one step's prefill budget beside the residents
        room -= -(-max_num_batched_tokens // bs) * bs * footprint.bytes_per_token
    concurrency = max(0, room) // per_request if per_request else 0
    if split.pool16_sequences or split.pool8_sequences:  # auto switching: both pools, if the switch happens
        switches = (strategy.kv_quant_auto_threshold or 0) <= split.pool16_sequences
        concurrency = split.pool16_sequences + (split.pool8_sequences if switches else 0)
        per_request = exact_sequence_bytes(model, strategy, max_seq_len)
    block_bytes = bs * footprint.bytes_per_token
    blocks_per_request = strategy.resident_blocks(max_seq_len) if footprint.bytes_per_token else 0
    paged_pool = serving - concurrency * footprint.fixed_bytes_per_sequence
    num_blocks = paged_pool // block_bytes if block_bytes else 0
    state = max_num_seqs * footprint.fixed_bytes_per_sequence
    engine_blocks = max(0, pool - state) // block_bytes if block_bytes else 0
    plan = CapacityPlan(
        strategy=strategy.label, gpu_product=gpu.product, gpus=gpus, total_memory_bytes=total,
        weights_bytes=weights, cuda_context_bytes=context, activation_peak_bytes=activation,
        free_bytes=free, watermark=watermark, kv_pool_bytes=pool,
        bytes_per_token=footprint.bytes_per_token,
        fixed_bytes_per_sequence=footprint.fixed_bytes_per_sequence, block_size=bs,
        block_bytes=block_bytes, num_blocks=num_blocks, max_seq_len=max_seq_len,
        blocks_per_request=blocks_per_request, per_request_peak_bytes=per_request,
        max_concurrency=concurrency, feasible=concurrency >= 1, reason="",
        reserve_bytes=split.reserve_bytes, reserve_sequences=split.reserve_sequences,
        pool16_sequences=split.pool16_sequences, pool8_sequences=split.pool8_sequences,
        engine_blocks=engine_blocks, max_num_seqs=max_num_seqs,
    )
    return _with_reason(plan, footprint, strategy)


def plan_admitting(model: ModelShape, strategy: KVStrategy, gpu: GpuSpec, **kwargs) -> CapacityPlan:
    """The plan for an engine whose max_num_seqs is the concurrency the plan admits (the operator's
    `--max-num-seqs`): planned with max_num_seqs sequences' logits and state, then, when it admits more, again
    with that many. One re-plan suffices: more sequences only add activation and state, so the second plan
    admits no more than the sequences it counted (max_concurrency <= max_num_seqs)."""
    plan = plan_capacity(model, strategy, gpu, **kwargs)
    if plan.max_concurrency <= plan.max_num_seqs:
        return plan
    return plan_capacity(model, strategy, gpu, **{**kwargs, "max_num_seqs": plan.max_concurrency})


def max_seq_len_from_p95(p95_request_tokens: int, headroom: float = 0.2, block_size: int = 16) -> int:
    """Seed 002's first step: the P95 request length plus 20 % headroom, rounded up to a block."""
    if p95_request_tokens < 1 or headroom < 0:
        raise PlannerError("p95_request_tokens must be >= 1 and headroom >= 0")
    tokens = math.ceil(p95_request_tokens * (1 + headroom))
    return -(-tokens // block_size) * block_size


def _check(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise PlannerError(f"{name} must be >= 1, got {value}")


def _shard(fp: KVFootprint, model: ModelShape, strategy: KVStrategy, gpus: int) -> KVFootprint:
    """Tensor parallel splits K/V heads over GPUs; a head (or the MLA latent) that cannot split is copied."""
    if gpus == 1:
        return fp
    if strategy.attention == "mla" or (strategy.attention == "native" and model.mla):
        copies_num, copies_den = gpus, 1
    else:
        heads = strategy.kv_head_groups if strategy.attention == "gqa" else model.num_kv_heads
        if model.num_attention_heads % gpus or (heads % gpus and gpus % heads):
            raise PlannerError(
                f"{gpus} GPUs (tensor parallel) must divide num_attention_heads={model.num_attention_heads}, and "
                f"they and the {heads} KV heads must divide one another (KV heads are split over GPUs, or copied "
                "when fewer); choose another GPU count (resources.gpus, kvpilot plan --gpus)"
            )
        copies_num, copies_den = gpus * -(-heads // gpus), heads  # fewer heads than GPUs: one copy per GPU
    return KVFootprint(
        bytes_per_token=fp.bytes_per_token * copies_num // copies_den,
        fixed_bytes_per_sequence=fp.fixed_bytes_per_sequence,
    )


def _request_bytes(fp: KVFootprint, strategy: KVStrategy, tokens: int) -> int:
    """Peak KV bytes of one request of up to `tokens` tokens: the blocks it keeps resident, and its fixed state."""
    return strategy.resident_blocks(tokens) * strategy.block_size * fp.bytes_per_token + fp.fixed_bytes_per_sequence


def _longest_fitting(fp: KVFootprint, strategy: KVStrategy, pool: int) -> int:
    if _request_bytes(fp, strategy, 1) > pool:
        return 0
    lo, hi = 1, 1 << 40
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _request_bytes(fp, strategy, mid) <= pool else (lo, mid - 1)
    return lo


def _with_reason(plan: CapacityPlan, fp: KVFootprint, strategy: KVStrategy) -> CapacityPlan:
    if plan.free_bytes <= 0:
        reason = (
            f"weights {hb(plan.weights_bytes)} + CUDA context {hb(plan.cuda_context_bytes)} + activation peak "
            f"{hb(plan.activation_peak_bytes)} = {hb(plan.total_memory_bytes - plan.free_bytes)} exceed "
            f"{plan.gpus} x {plan.gpu_product} = {hb(plan.total_memory_bytes)}; use more or larger GPUs "
            "or a smaller prefill token budget"
        )
    elif plan.max_concurrency < 1:
        longest = _longest_fitting(fp, strategy, plan.kv_pool_bytes)
        reason = (
            f"one request at max_seq_len {plan.max_seq_len} needs {hb(plan.per_request_peak_bytes)} of KV "
            f"({hb(plan.bytes_per_token)}/token) but the KV pool is {hb(plan.kv_pool_bytes)} "
            f"({plan.watermark:.0%} of {hb(plan.free_bytes)} free); the longest max_seq_len that fits is "
            f"{longest}; lower max_seq_len, quantise the KV cache (int8/fp8) or add GPUs"
        )
    else:
        reason = (
            f"{plan.max_concurrency} concurrent requests of {plan.max_seq_len} tokens in a "
            f"{hb(plan.kv_pool_bytes)} KV pool ({hb(plan.bytes_per_token)}/token)"
        )
        if strategy.eviction != "none":
            reason += (
                f", each keeping {plan.blocks_per_request} blocks resident under {strategy.eviction} eviction "
                "(room for one step's prefill chunk beside them)"
            )
    if plan.reserve_bytes:
        reason += (
            f"; {hb(plan.reserve_bytes)} of it is the fallback reserve, {plan.reserve_sequences} exact-path "
            "sequences for runtime validation's fallbacks"
        )
        if plan.reserve_sequences < 1:
            reason += " (none fits: no sequence can fall back; raise fallback_reserve or lower max_seq_len)"
    if plan.pool16_sequences or plan.pool8_sequences:
        reason += f"; auto switching: {plan.pool16_sequences} in the 16-bit pool, {plan.pool8_sequences} in int8"
        if plan.max_concurrency == plan.pool16_sequences:
            reason += (
                " never used: the 16-bit pool fills before the switch threshold is reached; lower "
                "kvQuantAutoThreshold or raise the 16-bit share"
            )
    return CapacityPlan(**{**plan.to_dict(), "reason": reason})
