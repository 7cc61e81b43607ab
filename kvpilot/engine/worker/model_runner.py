"""The only owner of the device: model weights, the paged KV cache, forward passes and sampling."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.batch import fill_batch_defaults
from kvpilot.engine.config.strategy import check_model_strategy, served_model_config
from kvpilot.engine.context import Context, dense_context, reset_context, set_context
from kvpilot.engine.core.cache_spec import KVCacheSpec, block_bytes
from kvpilot.engine.core.scheduler import SchedulerOutput
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.models import build_model
from kvpilot.engine.parallel.driver import TPDriver
from kvpilot.engine.parallel.shard import head_shard
from kvpilot.engine.parallel.state import all_reduce_min, barrier, tp_rank, tp_world
from kvpilot.engine.strategies.registry import Strategies
from kvpilot.engine.worker.cuda_graphs import build_decode_graphs
from kvpilot.engine.worker.inputs import BlockTableRows, InputStager
from kvpilot.engine.worker.kv_cache import KVCache, allocate_kv_cache, kv_layout_for, layer_specs
from kvpilot.engine.worker.loader import init_dummy_weights, load_weights
from kvpilot.engine.worker.logits_processors import apply_logits_processors
from kvpilot.engine.worker.memory import (
    cuda_kv_blocks,
    device_memory_bytes,
    estimate_activation_bytes,
    pick_device,
    pick_dtype,
    torch_memory,
)
from kvpilot.engine.worker.pending import PLACEHOLDER, HostReadback, PendingStep
from kvpilot.engine.worker.sampler import TopLogprobs, sample, token_logprobs
from kvpilot.engine.worker.state_cache import build_linear_state


class ModelRunner:
    """Loads the model, sizes and owns the KV pool, and turns scheduled chunks into sampled tokens."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, tp_driver: TPDriver | None = None) -> None:
        """`tp_driver`: rank 0 of a tensor-parallel engine (worker/tp_launch.py); the other ranks build
        their runner with none and follow rank 0's calls (worker/tp_worker.py)."""
        check_model_strategy(config, model_config)  # refused combinations, before any weight loads
        self.config = config
        self.strategies = Strategies(config, model_config)  # THE registry: every strategy hook loops over it
        self.model_config = model_config = served_model_config(config, model_config)  # GQA conversion
        self.world = tp_world()  # tensor-parallel ranks; 1: every branch below is the single-device path
        self.device = pick_device(config.device)
        if self.world > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", tp_rank())
            torch.cuda.set_device(self.device)
        # the KV heads this rank caches, and those the engine caches over all ranks (copies counted)
        self.rank_kv_config = self.kv_model_config = model_config
        if self.world > 1:
            heads = head_shard(model_config.num_attention_heads, model_config.num_key_value_heads, tp_rank(), self.world)
            self.rank_kv_config = replace(
                model_config, num_attention_heads=heads.num_heads, num_key_value_heads=heads.num_kv_heads
            )
            self.kv_model_config = replace(model_config, num_key_value_heads=heads.num_kv_heads * self.world)
        fill_batch_defaults(config, self.device.type, device_memory_bytes(self.device))  # config/batch.py
        self.dtype = pick_dtype(config.dtype, model_config.torch_dtype, self.device)
        self.kv_layout = kv_layout_for(config, self.dtype)  # 16-bit, int8, fp8, auto (worker/kv_cache.py)
        self.kv_dtype = self.kv_layout.dtype
        self.block_size = config.block_size
        with torch.device("meta"):  # no memory until the target device, already in the target dtype
            model = build_model(model_config).to(self.dtype)
        self.model = model.to_empty(device=self.device)
        self.model.tie_weights()
        if hasattr(self.model, "merge_projections"):  # the Llama family: merged QKV and gate/up GEMMs
            self.model.merge_projections()
            if self.is_cuda:
                torch.cuda.empty_cache()  # the separate tensors' memory back to the driver (the KV pool sizes from it)
        self._restore_buffers()
        if config.load_format == "dummy":
            init_dummy_weights(self.model)
        else:
            transform = self.strategies.weight_transform(model_config)  # GQA merges KV heads as they load
            load_weights(self.model, config.model, config.weight_sha256, config.show_progress, transform)
        self.model.eval()
        self.strategies.load(self, self.world)  # GQA regrouping, MLA (native or converted), Performer
        if config.fused_gemv_rows and self.world == 1 and hasattr(self.model, "fuse_gemv"):
            # kernels/gemv_norm (the Triton backend; else the same ops)
            self.model.fuse_gemv(config.fused_gemv_rows, frozenset(config.fused_gemv_projections.split(",")))
        self.mla = self.strategies.mla.state
        self.gqa_orders = self.strategies.gqa.orders  # per layer, when GQA heads were grouped on calibration text
        self.linear_state = build_linear_state(self.model, config, self.device)  # None: no recurrent state
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.generators: dict[str, torch.Generator] = {}
        self.last_sample_rows: list[tuple[int, int]] = []
        self.last_logprobs: dict[int, tuple[float, TopLogprobs]] = {}  # scheduled index -> (log p, top)
        self.eos_token_ids: tuple[int, ...] = tuple(model_config.eos_token_ids)  # min_tokens masks them
        self.structured: Any = None  # engine/structured/matchers.StructuredOutput, set by LLMEngine
        self.block_rows = BlockTableRows(rows=config.max_num_seqs)  # host mirror of the block tables
        self.stager = InputStager(self.device)  # the step's inputs to the device, one copy per dtype
        self.readback = HostReadback(self.device)  # sampled tokens to the host without blocking (launch)
        self._sample_index: torch.Tensor | None = None
        self._estimated = (0, 0)  # (tokens, logit rows) of the largest CPU activation estimate so far
        self.activation_peak_bytes = 0
        self._baseline_allocated = torch.cuda.memory_allocated(self.device) if self.is_cuda else 0
        if self.world > 1:
            barrier()  # every rank has its weights: collectives (the CUDA profile pass) may start
        num_blocks = self._size_kv_pool()
        if self.world > 1:  # block ids are shared: every rank holds the smallest rank's count
            num_blocks = all_reduce_min(num_blocks)
        self.cache: KVCache = allocate_kv_cache(
            self.kv_layout, self.model, self.rank_kv_config, self.layer_specs(self.rank_kv_config), num_blocks,
            self.block_size, self.device, self.strategies.conversion_reserve(self),
        )  # fmt: skip
        self.kv_cache = self.cache.kv_cache
        self.num_kv_blocks = self.cache.num_blocks
        self.kv_pool_sizes = self.cache.pool_sizes  # (16-bit, int8) under auto switching
        # the approximate pool's first block id: a two-pool cache's exact pool (a fallback reserve, auto
        # switching's 16-bit pool) holds the ids below it; 0 with one pool
        self.first_approx_block = self.kv_pool_sizes[0] if len(self.kv_pool_sizes) == 2 else 0
        capture = config.cuda_graphs and not config.enforce_eager and self.world == 1  # TP: eager (the doc says why)
        self.decode_graphs = build_decode_graphs(self) if capture else None  # worker/cuda_graphs.py
        self.model.tp_driver = tp_driver  # from here on rank 0's model calls are sent to the other ranks

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def _restore_buffers(self) -> None:
        from kvpilot.engine.models.layers import RotaryEmbedding, rope_inv_freq

        mc = self.model_config
        for module in self.model.modules():
            if isinstance(module, RotaryEmbedding):
                module.inv_freq = rope_inv_freq(mc.head_dim, mc.rope_theta, mc.rope_scaling).to(self.device)
        if hasattr(self.model, "restore_buffers"):  # models with their own rotary (DeepSeek)
            self.model.restore_buffers(self.device)

    # -- KV pool -------------------------------------------------------------------------
    def layer_specs(self, mc: ModelConfig) -> list[KVCacheSpec]:
        """Each paged layer's cache spec for `mc`'s KV heads, with every strategy applied (worker/kv_cache.py)."""
        return layer_specs(self.kv_layout, mc, self.strategies, self)

    @property
    def bytes_per_block(self) -> int:
        """One block over all layers and (under TP) all ranks: the figure the feed and the planner use."""
        return block_bytes(self.layer_specs(self.kv_model_config), self.block_size)

    @property
    def rank_bytes_per_block(self) -> int:
        """One block on this rank (its share of the KV heads): what sizes this rank's memory."""
        return block_bytes(self.layer_specs(self.rank_kv_config), self.block_size)

    def _size_kv_pool(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if not self.is_cuda:
            state = self.linear_state.bytes_total if self.linear_state is not None else 0
            return max(1, (self.config.cpu_kv_cache_bytes - state) // self.rank_bytes_per_block)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        self._profile_run()
        self.activation_peak_bytes = torch.cuda.max_memory_allocated(self.device) - before
        return cuda_kv_blocks(
            self.device, self.config.gpu_memory_utilization, self.activation_peak_bytes, self.rank_bytes_per_block
        )

    @torch.inference_mode()
    def _profile_run(self) -> None:
        n = min(self.config.max_num_batched_tokens, self.model_config.max_position_embeddings)
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        with dense_context():
            hidden = self.model(ids, torch.arange(n, device=self.device))
            self.model.compute_logits(hidden[-min(n, self.config.max_num_seqs) :]).float()
        torch.cuda.synchronize(self.device)

    # -- one step ------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, out: SchedulerOutput) -> list[int | None]:
        """Run the scheduled chunks; return a sampled token for each chunk that ends its sequence."""
        sample_rows, picked, logits, seqs = self._execute(out, None)
        sampled: list[int | None] = [None] * len(out.scheduled)
        self.last_logprobs = {}
        if picked is not None:
            self.last_logprobs = self._logprobs(logits, picked, seqs, sample_rows)
            for (i, _), token in zip(sample_rows, picked.tolist(), strict=True):
                sampled[i] = int(token)
        return sampled

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, prev: PendingStep | None) -> PendingStep:
        """Queue the step on the device and return without waiting for its tokens (async scheduling).

        Chunks whose last token is `prev`'s sampled token, not yet read back (PLACEHOLDER on the host),
        take it from `prev.sampled` on the device. No log-probabilities: the engine runs steps that ask
        for them through run().
        """
        sample_rows, picked, _, _ = self._execute(out, prev)
        self.last_logprobs = {}
        pending = PendingStep(out, sample_rows, picked)
        if picked is not None:
            pending.host, pending.copied = self.readback.start(picked)
            pending.row_of = {out.scheduled[i].seq.request_id: k for k, (i, _) in enumerate(sample_rows)}
        return pending

    def _execute(
        self, out: SchedulerOutput, prev: PendingStep | None
    ) -> tuple[list[tuple[int, int]], torch.Tensor | None, torch.Tensor | None, list[Sequence]]:
        """Forward and sampling of one step: (sample rows, picked tokens on the device, logits, their seqs)."""
        ctx, input_ids, positions, sample_rows = self._prepare(out, prev)
        self.last_sample_rows = sample_rows  # (scheduled index, packed row): read by validation/runner.py
        if self.linear_state is not None:
            self.linear_state.attach(ctx, out)
        set_context(ctx)
        try:
            hidden = self._forward(ctx, input_ids, positions)
        finally:
            reset_context()
        picked = logits = None
        seqs: list[Sequence] = []
        if sample_rows:
            last = hidden if self._sample_index is None else hidden[self._sample_index]
            logits = self.model.compute_logits(last).float()
            seqs = [out.scheduled[i].seq for i, _ in sample_rows]
            picked = self._sample(logits, seqs)
        self._track_activation(input_ids.numel(), len(sample_rows))
        return sample_rows, picked, logits, seqs

    def _forward(self, ctx: Context, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        graphs = self.decode_graphs
        if graphs is not None and graphs.fallback_reason(ctx, input_ids.shape[0]) is None:
            return graphs.run(ctx, input_ids, positions)
        return self.model(input_ids, positions)

    def _prepare(
        self, out: SchedulerOutput, prev: PendingStep | None = None
    ) -> tuple[Context, torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
        """Pack prefill chunks first, then single-token decodes; return (context, ids, positions,
        [(scheduled index, packed row of its last token) for chunks that sample]).

        Host work is O(tokens + sequences), not O(blocks): block tables come from the incremental
        mirror in `self.block_rows`, slots and lengths are computed with numpy, and the step's
        int32 metadata and int64 ids / positions reach the device in one copy each.
        """
        bs, items = self.block_size, out.scheduled
        order = [i for i, s in enumerate(items) if s.num_new_tokens > 1]
        num_prefill = len(order)
        order += [i for i, s in enumerate(items) if s.num_new_tokens == 1]
        seqs = [items[i].seq for i in order]
        rows = np.array([self.block_rows.row(s.request_id, s.block_table) for s in seqs], dtype=np.int64)
        table = self.block_rows.table  # after every row(): a row may have grown the table
        starts = np.array([s.num_computed_tokens for s in seqs], dtype=np.int64)
        resident = starts - np.array([s.num_evicted_tokens for s in seqs], dtype=np.int64)  # strategies/eviction/policy.py
        counts = np.array([items[i].num_new_tokens for i in order], dtype=np.int64)
        input_ids: list[int] = []
        for seq, start, n in zip(seqs, starts.tolist(), counts.tolist(), strict=True):
            input_ids += seq.token_ids[start : start + n]
        ends = np.cumsum(counts)
        sample_rows = [(i, int(end) - 1) for i, end in zip(order, ends.tolist(), strict=True) if items[i].samples]
        num_tokens = int(ends[-1])
        if num_prefill:  # chunk tokens: per token, with numpy (decodes below are one token each)
            offset = np.arange(int(ends[num_prefill - 1])) - np.repeat(ends[:num_prefill] - counts[:num_prefill],
                                                                      counts[:num_prefill])
            tok_seq = np.repeat(np.arange(num_prefill), counts[:num_prefill])
            positions = np.concatenate([starts[tok_seq] + offset, starts[num_prefill:]])
            token_rows = np.concatenate([rows[tok_seq], rows[num_prefill:]])
            rel = np.concatenate([resident[tok_seq] + offset, resident[num_prefill:]])
        else:
            positions, token_rows, rel = starts, rows, resident
        slots = table[token_rows, rel // bs] * bs + rel % bs
        if slots.min() < 0:
            raise RuntimeError(f"a scheduled token has no KV block (block tables {[s.block_table for s in seqs]})")
        lens = resident + counts  # resident context after this step, per sequence
        int32_parts: list[np.ndarray] = [slots]
        shapes: list[tuple[int, ...]] = [(num_tokens,)]
        for group, is_prefill in ((slice(0, num_prefill), True), (slice(num_prefill, len(order)), False)):
            if group.start == group.stop:
                continue
            width = max(len(s.block_table) for s in seqs[group])
            width = -(-width // 16) * 16  # a width divisible by 16: one Triton specialisation of the row stride
            parts = [lens[group], table[rows[group], :width].ravel()]
            part_shapes = [(group.stop - group.start,), (group.stop - group.start, width)]
            if is_prefill:  # prefill chunks also need their query offsets
                parts.append(np.concatenate([[0], ends[:num_prefill]]))
                part_shapes.append((num_prefill + 1,))
            int32_parts += parts
            shapes += part_shapes
        int64_parts = [np.array(input_ids, dtype=np.int64), positions]
        self._sample_index = None  # decode-only steps sample every row in order: no gather needed
        num_sample_index = 0
        if sample_rows and len(sample_rows) < num_tokens:
            int64_parts.append(np.array([r for _, r in sample_rows], dtype=np.int64))
            num_sample_index = len(sample_rows)
        feed = self._feed_rows(items, sample_rows, prev)  # (packed row, prev's sampled row) of unread tokens
        if feed:
            int64_parts.append(np.array(feed, dtype=np.int64).T.ravel())
        with self.stager:
            meta = InputStager.split(self.stager.pack(int32_parts, np.int32), shapes)
            packed64 = self.stager.pack(int64_parts, np.int64)
        ids, pos = packed64[:num_tokens], packed64[num_tokens : 2 * num_tokens]
        at = 2 * num_tokens
        if num_sample_index:
            self._sample_index = packed64[at : at + num_sample_index]
            at += num_sample_index
        if feed:  # the previous step's tokens into this step's ids, on the device: no host sync
            assert prev is not None and prev.sampled is not None
            dst, src = packed64[at : at + len(feed)], packed64[at + len(feed) : at + 2 * len(feed)]
            ids[dst] = prev.sampled[src]
        ctx = Context(slot_mapping=meta.pop(0), num_prefill_tokens=int(ends[num_prefill - 1]) if num_prefill else 0)
        # a sequence's blocks all lie in its pool: its first block tells which (core/pools.py)
        ctx.exact_pool_seqs = int(np.count_nonzero(table[rows, 0] < self.first_approx_block))
        if num_prefill:
            ctx.context_lens, ctx.block_tables, ctx.cu_seqlens_q = meta[:3]
            ctx.max_seqlen_q = int(counts[:num_prefill].max())
            meta = meta[3:]
        if num_prefill < len(order):
            ctx.decode_context_lens, ctx.decode_block_tables = meta
        return ctx, ids, pos, sample_rows

    @staticmethod
    def _feed_rows(
        items: list[Any], sample_rows: list[tuple[int, int]], prev: PendingStep | None
    ) -> list[tuple[int, int]]:
        """(packed row, row of prev.sampled) for chunks ending in a token still on the device. Such a token is
        a sequence's last (PLACEHOLDER on the host), so only a sampling chunk reaches it, at its sample row."""
        if prev is None or not prev.row_of:
            return []
        feed = []
        for index, row in sample_rows:
            seq = items[index].seq
            k = prev.row_of.get(seq.request_id)
            if k is not None and seq.token_ids[-1] == PLACEHOLDER:
                feed.append((row, k))
        return feed

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, picked: torch.Tensor, seqs: list[Sequence], sample_rows: list[tuple[int, int]]
    ) -> dict[int, tuple[float, TopLogprobs]]:
        """Scheduled index -> (log p of the sampled token, top alternatives) for requests that asked."""
        wanted = [k for k, s in enumerate(seqs) if s.params.logprobs is not None]
        if not wanted:
            return {}
        top = max(seqs[k].params.logprobs or 0 for k in wanted)
        rows = torch.tensor(wanted, device=logits.device)
        chosen, tops = token_logprobs(logits[rows], picked[rows], top)
        return {
            sample_rows[k][0]: (lp, alts[: seqs[k].params.logprobs or 0])
            for k, lp, alts in zip(wanted, chosen, tops, strict=True)
        }

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [s.params for s in seqs]
        logits = apply_logits_processors(logits, seqs, self.eos_token_ids)  # penalties, logit_bias, min_tokens
        if self.structured is not None:
            logits = self.structured.apply(logits, seqs)  # grammar token masks (structured output)
        if all(p.greedy for p in params):
            return logits.argmax(dim=-1)
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=self.device)
        top_ks = torch.tensor([p.top_k for p in params], dtype=torch.long, device=self.device)
        top_ps = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=self.device)
        vocab = logits.shape[-1]
        filters = (any(0 < p.top_k < vocab for p in params), any(p.top_p < 1.0 for p in params))
        generators = [self._generator(s) for s in seqs]
        return sample(logits, temps, top_ks, top_ps, generators, all_greedy=False, filters=filters)

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.params.seed is None or seq.params.greedy:
            return None
        gen = self.generators.get(seq.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seq.params.seed)
            self.generators[seq.request_id] = gen
        return gen

    def release(self, request_id: str) -> None:
        """Forget per-request device state (its seeded generator, its recurrent-state slot)."""
        self.generators.pop(request_id, None)
        self.block_rows.release(request_id)
        self.release_state(request_id)

    def release_state(self, request_id: str) -> None:
        """Free the request's recurrent-state slot (preemption: it is rebuilt from token 0 later)."""
        if self.linear_state is not None:
            self.linear_state.free(request_id)

    def _track_activation(self, num_tokens: int, num_logit_rows: int) -> None:
        if self.is_cuda:
            base = self._baseline_allocated + self.kv_cache.numel() * self.kv_cache.element_size()
            base += self.cache.quant_bytes
            peak = torch.cuda.max_memory_allocated(self.device) - base
        elif num_tokens > self._estimated[0] or num_logit_rows > self._estimated[1]:  # the estimate only grows
            self._estimated = (max(num_tokens, self._estimated[0]), max(num_logit_rows, self._estimated[1]))
            peak = estimate_activation_bytes(self.model_config, self.dtype, *self._estimated)
        else:
            return
        self.activation_peak_bytes = max(self.activation_peak_bytes, peak)

    # -- scoring -------------------------------------------------------------------------
    def score(self, prompt_token_ids: list[int], continuation_token_ids: list[int]) -> list[float]:
        """log p(continuation[i] | prompt + continuation[:i]) for each continuation token."""
        return self.score_tokens(prompt_token_ids, continuation_token_ids)[0]

    @torch.inference_mode()
    def score_tokens(
        self, prompt_token_ids: list[int], continuation_token_ids: list[int], top: int = 0
    ) -> tuple[list[float], list[TopLogprobs]]:
        """score(), densely (no cache), plus each position's `top` most likely tokens."""
        tokens = list(prompt_token_ids) + list(continuation_token_ids)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        with dense_context():
            hidden = self.model(ids, torch.arange(len(tokens), device=self.device))
        start = len(prompt_token_ids) - 1
        logits = self.model.compute_logits(hidden[start : len(tokens) - 1]).float()
        target = torch.tensor(continuation_token_ids, dtype=torch.long, device=self.device)
        return token_logprobs(logits, target, top)

    def memory_stats(self) -> dict[str, int]:
        return torch_memory(self.device)
