"""CUDA graphs for decode-only steps: one captured forward per batch-size bucket, replayed with padding.

A decode step of a small model is hundreds of short kernel launches; replaying a captured graph
issues them as one. At engine start (`EngineConfig.cuda_graphs`, on by default; `enforce_eager` turns it off) the runner captures the model's
forward for each bucket of `graph_batch_sizes` over static input buffers (`StaticInputs`). A
decode-only step of n sequences then copies its inputs into the first n rows, pads rows n..bucket
(slot -1: the store writes nothing; context length 0: the decode kernels attend to nothing and
return zeros) and replays the smallest bucket >= n. The block tables are [max_bs, width] with
width fixed from the longest sequence the pool and model allow, so launch parameters computed on
the host (context splits from batch size and table width) are fixed per bucket.

Replay skips the Python of forward, so a step falls back to eager whenever that Python would do
something a graph cannot repeat (decided by inspection; when in doubt, eager):
- the engine never captures (`runner_fallback_reason`): on CPU, for model families other than
  llama / mistral / qwen2 / deepseek_v2 / deepseek_v3 / minimax (`engine_fallback_reason`), and when
  a memory strategy's `graph_blocker` says so (strategies/*/strategy.py, asked in registry order):
  - eviction: resident views shrink and positions run ahead of context lengths;
  - `kv_cache_dtype` auto switching (kv_quant): a step's layers take per-pool paths chosen on the host;
  - linear: a Performer conversion (exact window + summary, per-sequence exact-path flags); MiniMax's
    lightning decode is one kernel over the state pool at the step's slots, which the static buffers
    hold (`StaticInputs.linear_slots`; padded rows have slot -1, which the kernel skips), so it captures;
  - mla: a latent cache decoded in torch (native MLA with --disable-mla, an MLA conversion without a
    decode kernel: per-step plans). Native DeepSeek MLA with absorbed decode captures
    (`kernel_decoded_latent`): the store_latent and mla_decode kernels, its MoE the fused_moe kernels
    (expert sort on the device, grid sized for the worst routing). An MLA conversion whose decode is a
    kernel captures too (`kernel_decoded_conversion`): partial RoPE through mla_decode, RoPE on every
    dim through the fused mla_conversion kernel (head dims 32/64/128/256); nothing plans on the host;
  - gqa: a GQA conversion's fallback reserve (unmerged K/V blocks, layers/reserve_attention.py).
  Last, any attention layer other than the paged `Attention` or `LatentAttention` keeps it eager.
- a step runs eagerly (`step_fallback_reason`) when it has prefill chunks (prefill or mixed),
  a sequence in the exact pool of a two-pool cache (int8/fp8's 16-bit fallback reserve: the step
  is split by pool on the host), its batch exceeds the largest bucket, its block table is wider
  than the static one, or any module has a forward hook a replay would not call. Two samplers need none:
  runtime validation of an 8-bit cache reads the validated layer's output, which the graphs copy into a
  static buffer (`OutputTap`); gqa_head_utilization reads a layer's first query rows, which the rotary
  kernel writes into a buffer too (`QueryTap`), and its hook is called after the replay. So their steps
  replay (each had been an eager step, ~4x a replayed one at batch 256 on the H200).
int8/fp8 with a fallback reserve capture: the graphs are captured for steps whose sequences are all
in the 8-bit pool (`Context.exact_pool_seqs == 0`, counted on the host from the block tables), the
common case; their 8-bit block ids and slots are rebased by the reserve's size on the device, inside
the graph (layers/pool_split.split_step), so the static buffers hold the engine's own ids. A step with
a sequence moved to the reserve by runtime validation runs eagerly until that sequence finishes.
A kernel-decoded MLA conversion's fallback reserve (unconverted K/V blocks) is graphed the same way.
A capture that fails leaves the engine eager (logged), as a refusal does.
fp8 caches capture too: their per-layer scales are calibrated from a layer's first write, which is
always an eager prefill step (a sequence is prefilled before it decodes), and updated in place, so
a graph captured earlier reads the calibrated scales; static steps never calibrate (`graph_static`).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from kvpilot.engine.context import Context, get_context, reset_context, set_context
from kvpilot.engine.layers.attention import Attention
from kvpilot.engine.layers.latent_attention import LatentAttention
from kvpilot.engine.strategies.contract import RunnerView
from kvpilot.engine.strategies.registry import Strategies

log = logging.getLogger("kvpilot.engine.worker.cuda_graphs")

GRAPH_FAMILIES = ("llama", "mistral", "qwen2", "deepseek_v2", "deepseek_v3", "minimax")
TABLE_WIDTH_MULTIPLE = 16  # as the runner rounds decode block tables (one Triton specialisation)


class ModelRunnerLike(RunnerView, Protocol):
    """What the graphs read of the runner (worker/model_runner.ModelRunner, which builds them)."""

    strategies: Strategies
    block_size: int
    decode_graphs: DecodeGraphs | None


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """Buckets 1, 2, 4, 8, 16, then multiples of 16, up to max_num_seqs (itself the last bucket)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 16))
    return [*sizes, max_num_seqs]


def pick_bucket(batch: int, buckets: list[int]) -> int | None:
    """The smallest bucket >= batch (buckets ascending), or None when the batch exceeds them all."""
    if batch < 1:
        return None
    i = bisect.bisect_left(buckets, batch)
    return buckets[i] if i < len(buckets) else None


def table_width(max_len: int, block_size: int) -> int:
    """Block table columns for sequences up to max_len tokens, rounded up as the runner rounds."""
    blocks = -(-max_len // block_size)
    return -(-blocks // TABLE_WIDTH_MULTIPLE) * TABLE_WIDTH_MULTIPLE


def engine_fallback_reason(*, device_type: str, family: str) -> str | None:
    """Why this device or model family never replays graphs (None: the strategies decide, below)."""
    if device_type != "cuda":
        return f"device {device_type}: CUDA graphs need a CUDA device"
    if family not in GRAPH_FAMILIES:
        return f"model family {family!r}: graphs are captured for {', '.join(GRAPH_FAMILIES)} only"
    return None


def step_fallback_reason(
    *, num_prefill_tokens: int, batch: int, bucket: int | None, width: int, static_width: int, hooked: bool,
    exact_pool_seqs: int | None,
) -> str | None:
    """Why this step runs eagerly (None: replay the bucket's graph). `exact_pool_seqs`: the step's
    sequences in a two-pool cache's exact pool (Context.exact_pool_seqs; None: not counted)."""
    if num_prefill_tokens:
        return "prefill or mixed step"
    if exact_pool_seqs is None:
        return "the step's sequences per KV pool were not counted"
    if exact_pool_seqs:
        return f"{exact_pool_seqs} sequence(s) on the fallback reserve pool: the step is split by pool on the host"
    if bucket is None:
        return f"batch {batch} exceeds the largest graph bucket"
    if width > static_width:
        return f"block table width {width} exceeds the captured {static_width}"
    if hooked:
        return "a forward hook is armed (validation or head-utilization sampling)"
    return None


def has_forward_hooks(modules: list[nn.Module], query_tapped: frozenset[int] = frozenset()) -> bool:
    """Any forward (pre-)hook on these modules or registered globally: a replay would skip it. An
    `OutputTap`'s hook does not count (its copy is part of the captured graphs), nor a hook that reads only
    the first query rows (`query_rows`) of a layer in `query_tapped` (ids): `QueryTap` calls it after a replay."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True

    def replayable(m: nn.Module, hook: Any) -> bool:
        return getattr(hook, "captured_in_graphs", False) or (
            getattr(hook, "query_rows", 0) > 0 and id(m) in query_tapped
        )

    return any(m._forward_pre_hooks or any(not replayable(m, h) for h in m._forward_hooks.values()) for m in modules)


class QueryTap:
    """The first `rows` rotated query rows of every tapped layer, written by the rotary kernel itself (no extra
    launch, graph replays included), so a hook that reads only them (gqa_head_utilization's sampler, marked
    `query_rows`) runs after a replay instead of making its step eager. Such a hook had cost a sampled step
    ~4x a replayed one at batch 256 on the H200 (docs/benchmarks.md, issue 30)."""

    def __init__(self, layers: list[tuple[nn.Module, nn.Module]], rows: int, heads: int, dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        self.rows = rows
        self.buffer = torch.zeros(len(layers), rows, heads, dim, dtype=dtype, device=device)
        self.modules = [attn for attn, _ in layers]
        self.ids = frozenset(id(m) for m in self.modules)
        for i, (_, rotary) in enumerate(layers):
            rotary.query_tap = self.buffer[i]
        self._rotaries = [rotary for _, rotary in layers]

    def run_hooks(self, ctx: Context, num_tokens: int) -> None:
        """Call the tapped layers' `query_rows` hooks as the replayed forward would have, under the step's context."""
        for i, module in enumerate(self.modules):
            hooks = [h for h in module._forward_hooks.values() if getattr(h, "query_rows", 0) > 0]
            if not hooks:
                continue
            set_context(ctx)
            try:
                for hook in hooks:
                    hook(module, (self.buffer[i][: min(num_tokens, self.rows, hook.query_rows)],), None)
            finally:
                reset_context()

    def close(self) -> None:
        for rotary in self._rotaries:
            rotary.query_tap = None


def query_tap(runner: ModelRunnerLike) -> QueryTap | None:
    """A tap on every layer gqa_head_utilization samples (`head_utilization_every` > 0, a 16-bit cache, a rotary
    of models/layers.RotaryEmbedding before a plain `Attention`); None elsewhere."""
    from kvpilot.engine.metrics.head_utilization import MAX_SAMPLED_SEQS, HeadUtilizationSampler
    from kvpilot.engine.models.layers import RotaryEmbedding

    if runner.config.head_utilization_every <= 0 or runner.kv_layout.is_quantised:
        return None
    attention = runner.model.attention_layers()
    blocks = getattr(getattr(runner.model, "model", None), "layers", None)
    if blocks is None or len(blocks) != len(attention):
        return None
    layers = []
    for block, attn in zip(blocks, attention, strict=True):
        rotary = getattr(getattr(block, "self_attn", None), "rotary_emb", None)
        if type(attn) is not Attention or type(rotary) is not RotaryEmbedding or block.self_attn.attn is not attn:
            return None
        if HeadUtilizationSampler._readable(attn):
            layers.append((attn, rotary))
    if not layers:
        return None
    first = layers[0][0]
    return QueryTap(layers, MAX_SAMPLED_SEQS, first.num_heads, first.head_dim, runner.dtype, runner.device)


class OutputTap:
    """One attention layer's output of every step, graph replays included, for runtime validation.

    A permanent forward hook on the layer: in a graph's forward (capture, or its uncaptured padded twin)
    it copies the output into the static `buffer`, so the copy is captured and every replay repeats it;
    in other (eager) steps it keeps the output while `armed`. `DecodeGraphs.run` adds the replayed rows.
    """

    def __init__(self, module: nn.Module, layer: int, rows: int, heads: int, dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        self.module = module
        self.layer = layer
        self.buffer = torch.zeros(rows, heads, dim, dtype=dtype, device=device)
        self.armed = False
        self.outputs: list[torch.Tensor] = []  # this step's outputs while armed

        def hook(_module: nn.Module, _args: Any, output: torch.Tensor) -> None:
            ctx = get_context()
            if ctx.dense:
                return
            if ctx.graph_static:
                self.buffer[: output.shape[0]].copy_(output)
            elif self.armed:
                self.outputs.append(output.detach())

        hook.captured_in_graphs = True  # type: ignore[attr-defined]
        self._handle = module.register_forward_hook(hook)

    def replayed(self, rows: int) -> None:
        """A graph step ran: its first `rows` rows are this step's output."""
        if self.armed:
            self.outputs.append(self.buffer[:rows])

    def close(self) -> None:
        self._handle.remove()


def output_tap(runner: ModelRunnerLike, rows: int) -> OutputTap | None:
    """The tap on the runtime-validated layer where its steps would otherwise run eagerly: an 8-bit cache
    (the check every such engine has), at a plain paged `Attention` layer; None elsewhere (no cost)."""
    layers = runner.model.attention_layers()
    layer = runner.config.validation_layer % len(layers)
    module = layers[layer]
    if not runner.kv_layout.is_quantised or type(module) is not Attention:
        return None
    return OutputTap(module, layer, rows, module.num_heads, module.head_dim, runner.dtype, runner.device)


@dataclass
class StaticInputs:
    """The graphs' inputs: ids, positions, slots, context lengths, block tables and recurrent-state slots
    of max_bs rows."""

    input_ids: torch.Tensor  # int64 [max_bs]
    positions: torch.Tensor  # int64 [max_bs]
    slot_mapping: torch.Tensor  # int32 [max_bs]
    context_lens: torch.Tensor  # int32 [max_bs]
    block_tables: torch.Tensor  # int32 [max_bs, width]
    linear_slots: torch.Tensor  # int32 [max_bs]: state-pool slot per decode (-1: none)

    @classmethod
    def allocate(cls, max_bs: int, width: int, device: torch.device) -> StaticInputs:
        def ints(*shape: int, dtype: torch.dtype = torch.int32, fill: int = 0) -> torch.Tensor:
            return torch.full(shape, fill, dtype=dtype, device=device)

        return cls(
            ints(max_bs, dtype=torch.int64), ints(max_bs, dtype=torch.int64), ints(max_bs, fill=-1),
            ints(max_bs), ints(max_bs, width, fill=-1), ints(max_bs, fill=-1),
        )

    @property
    def width(self) -> int:
        return self.block_tables.shape[1]

    def fill(self, ids: torch.Tensor, positions: torch.Tensor, ctx: Context, bucket: int) -> None:
        """Copy a decode step's n rows in; rows n..bucket write nothing and attend to nothing."""
        n, width = ids.shape[0], ctx.decode_block_tables.shape[1]
        self.input_ids[:n].copy_(ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(ctx.slot_mapping)
        self.context_lens[:n].copy_(ctx.decode_context_lens)
        self.block_tables[:n, :width].copy_(ctx.decode_block_tables)
        if ctx.decode_linear_slots is not None:
            self.linear_slots[:n].copy_(ctx.decode_linear_slots)
        if n < bucket:
            self.slot_mapping[n:bucket].fill_(-1)
            self.context_lens[n:bucket].zero_()
            self.linear_slots[n:bucket].fill_(-1)

    def context(self, bucket: int) -> Context:
        """The decode-only context of the first `bucket` rows (what the graph was captured with)."""
        return Context(
            slot_mapping=self.slot_mapping[:bucket],
            decode_context_lens=self.context_lens[:bucket],
            decode_block_tables=self.block_tables[:bucket],
            decode_linear_slots=self.linear_slots[:bucket],
            exact_pool_seqs=0,  # every sequence in the approximate pool: fallback_reason keeps other steps eager
            graph_static=True,
        )


class DecodeGraphs:
    """Decode forwards over `StaticInputs`, captured per bucket on CUDA, or run eagerly padded."""

    def __init__(self, model: nn.Module, static: StaticInputs, buckets: list[int], hidden_size: int,
                 dtype: torch.dtype, tap: OutputTap | None = None) -> None:
        self.model = model
        self.tap = tap  # the runtime-validated layer's output, copied by every replay
        self.query_tap: QueryTap | None = None  # the first query rows of each sampled layer (gqa_head_utilization)
        self.static = static
        self.buckets = buckets
        self.modules = list(model.modules())
        self.outputs = torch.zeros(buckets[-1], hidden_size, dtype=dtype, device=static.input_ids.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.steps_total = 0  # decode steps run through the static buffers
        self.replays_total = 0  # of which replayed from a captured graph

    def _forward(self, bucket: int) -> None:
        set_context(self.static.context(bucket))
        try:
            s = self.static
            self.outputs[:bucket] = self.model(s.input_ids[:bucket], s.positions[:bucket])
        finally:
            reset_context()

    def capture(self) -> None:
        """Warm up (compiles the kernels) and capture every bucket, largest first (one memory pool)."""
        pool = None
        for bucket in reversed(self.buckets):
            self._forward(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self._forward(bucket)
            pool = graph.pool() if pool is None else pool
            self.graphs[bucket] = graph
        torch.cuda.synchronize()

    def close_taps(self) -> None:
        """Detach the taps from the model (these graphs are given up)."""
        if self.tap is not None:
            self.tap.close()
        if self.query_tap is not None:
            self.query_tap.close()

    def fallback_reason(self, ctx: Context, num_tokens: int) -> str | None:
        width = ctx.decode_block_tables.shape[1] if ctx.decode_block_tables is not None else 0
        return step_fallback_reason(
            num_prefill_tokens=ctx.num_prefill_tokens, batch=num_tokens, bucket=pick_bucket(num_tokens, self.buckets),
            width=width, static_width=self.static.width,
            hooked=has_forward_hooks(self.modules, self.query_tap.ids if self.query_tap is not None else frozenset()),
            exact_pool_seqs=ctx.exact_pool_seqs,
        )

    def run(self, ctx: Context, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [n, hidden] of a decode-only step through its bucket: replayed if captured."""
        n = ids.shape[0]
        bucket = pick_bucket(n, self.buckets)
        assert bucket is not None and ctx.num_prefill_tokens == 0, f"batch {n} / prefill: not a graph step"
        self.static.fill(ids, positions, ctx, bucket)
        self.steps_total += 1
        graph = self.graphs.get(bucket)
        if graph is None:  # not captured (CPU tests): the same padded forward, eagerly
            self._forward(bucket)
        else:
            graph.replay()
            self.replays_total += 1
        if self.tap is not None:
            self.tap.replayed(n)
        if self.query_tap is not None:
            self.query_tap.run_hooks(ctx, n)
        return self.outputs[:n]


def graph_attention(runner: ModelRunnerLike) -> bool:
    """Every attention layer is one a graph can replay: the plain paged `Attention`, or latent attention
    (whose strategy, MLA, refuses graphs itself unless a kernel decodes it)."""
    return all(type(m) in (Attention, LatentAttention) for m in runner.model.attention_layers())


def runner_fallback_reason(runner: ModelRunnerLike, device_type: str | None = None) -> str | None:
    """Why this runner never replays graphs (None: it captures them; `device_type`: as a runner on that
    device would see it): the device and model family, then each strategy's `graph_blocker` in registry
    order (strategies/registry.py), then any attention layer a graph cannot replay."""
    reason = engine_fallback_reason(device_type=device_type or runner.device.type, family=runner.model_config.family)
    if reason is None:
        reason = runner.strategies.graph_blocker(runner)
    if reason is None and not graph_attention(runner):
        reason = "converted attention layers: data-dependent forward"
    return reason


@torch.inference_mode()
def build_decode_graphs(runner: ModelRunnerLike) -> DecodeGraphs | None:
    """Capture the decode graphs for this runner, or log why it stays eager and return None. A capture
    that fails (an operation a graph cannot hold, e.g. a host sync) leaves the engine eager, with the
    error in the log, rather than failing its start."""
    reason = runner_fallback_reason(runner)
    if reason is not None:  # on by default: a CPU engine is not worth a warning, an uncapturable GPU one is
        (log.info if runner.device.type != "cuda" else log.warning)("cuda_graphs: decode steps stay eager (%s)", reason)
        return None
    graphs = uncaptured_decode_graphs(runner)
    try:
        graphs.capture()
    except RuntimeError as exc:
        log.warning("cuda_graphs: capture failed, decode steps stay eager: %s", str(exc).splitlines()[0][:300])
        graphs.graphs.clear()
        graphs.close_taps()
        torch.cuda.synchronize()
        return None
    log.info("cuda_graphs: captured decode buckets %s (block table width %d)", graphs.buckets, graphs.static.width)
    return graphs


def uncaptured_decode_graphs(runner: ModelRunnerLike) -> DecodeGraphs:
    """The runner's buckets and static buffers, nothing captured yet (CPU tests run them eagerly padded)."""
    config, mc = runner.config, runner.model_config
    # graphed steps run over the approximate pool only (the last pool; the only one without a reserve)
    max_len = min(mc.max_position_embeddings, runner.kv_pool_sizes[-1] * runner.block_size)
    if config.max_model_len is not None:
        max_len = min(max_len, config.max_model_len)
    buckets = graph_batch_sizes(config.max_num_seqs)
    static = StaticInputs.allocate(buckets[-1], table_width(max_len, runner.block_size), runner.device)
    old = getattr(runner, "decode_graphs", None)
    if old is not None:  # built again (tests): one tap hook on the layer
        old.close_taps()
    graphs = DecodeGraphs(runner.model, static, buckets, mc.hidden_size, runner.dtype, output_tap(runner, buckets[-1]))
    graphs.query_tap = query_tap(runner)
    return graphs
