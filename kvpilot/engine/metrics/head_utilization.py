"""Sampled `gqa_head_utilization` (../shared/DESIGN.md): how widely each KV head's queries attend.

On one decode step in every `head_utilization_every`, a forward hook on ONE paged attention layer
(round robin, so each layer is refreshed every `every x num_layers` decode steps) recomputes the
first MAX_SAMPLED_SEQS decode queries' attention probabilities over the cached keys (in fp32,
beside the kernel, which never materialises them) and records, per KV head of that layer,

    mean over decode sequences and over the query heads of the group of exp(H(p)) / context_len

where H is the entropy of the softmax over the sequence's resident context. 1 means uniform
attention over every position; 1/context_len means all weight on one position. The feed holds
the latest sample of each layer. Sampling one layer and a few sequences keeps the cost at a
fraction of one decode step per sample (docs/benchmarks.md, "gqa_head_utilization sampling cost").
Layers whose cache is not a float [blocks, block_size, Hkv, D] tensor (8-bit
or latent caches) are skipped: their keys are not directly readable here.
"""

from __future__ import annotations

import time

import torch

from kvpilot.engine.context import get_context
from kvpilot.engine.core.scheduler import SchedulerOutput
from kvpilot.engine.metrics.stats_contract import HeadUtilization

MAX_SAMPLED_SEQS = 4  # decode sequences per sampled step (bounds the cost at large batches)


def head_utilization(
    q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """[Hkv] mean over sequences and grouped query heads of exp(entropy) / context_len.

    q [B, Hq, D] (one decode query per sequence), k_cache [N, block_size, Hkv, D],
    block_tables int32 [B, max_blocks] (-1 padded), context_lens int32 [B].
    """
    batch, num_heads, dim = q.shape
    block_size, num_kv = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv
    lens = context_lens.long()
    width = int(-(-int(lens.max()) // block_size))
    tables = block_tables[:, :width].long().clamp_min(0)
    keys = k_cache[tables].reshape(batch, width * block_size, num_kv, dim).float()  # [B, L, Hkv, D]
    qg = q.float().view(batch, num_kv, group, dim)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, keys) * scale
    valid = torch.arange(width * block_size, device=q.device)[None, :] < lens[:, None]  # [B, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    logp = torch.log_softmax(scores, dim=-1)
    entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)  # [B, Hkv, G]
    effective = entropy.exp() / lens[:, None, None].float()
    return effective.mean(dim=(0, 2))


class HeadUtilizationSampler:
    """Hooks the attention layers on every `every`-th decode step and keeps the latest values."""

    def __init__(self, layers: list[torch.nn.Module], every: int) -> None:
        self.every = every
        self.layers = [(i, m) for i, m in enumerate(layers) if self._readable(m)]
        self.values: dict[int, list[float]] = {}
        self.samples_total = 0
        self.seconds_total = 0.0  # wall time inside the sampling hooks (the metric's own cost)
        self._decode_steps = 0
        self._handles: list = []

    @staticmethod
    def _readable(module: torch.nn.Module) -> bool:
        cache = getattr(module, "k_cache", None)
        return (
            isinstance(cache, torch.Tensor)
            and hasattr(module, "num_kv_heads")
            and hasattr(module, "scale")
            and getattr(module, "kv_quant", None) is None  # 8-bit / switched pools: ids beyond k_cache
            and (cache.dim() != 4 or cache.dtype.is_floating_point)
        )

    def before_run(self, out: SchedulerOutput) -> None:
        if self.every <= 0 or not self.layers or not any(s.num_new_tokens == 1 for s in out.scheduled):
            return
        self._decode_steps += 1
        if self._decode_steps % self.every:
            return
        layer, module = self.layers[self.samples_total % len(self.layers)]
        self._handles = [module.register_forward_hook(self._hook(layer))]
        self.samples_total += 1

    def after_step(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, layer: int):
        def hook(module, args, _output):
            ctx = get_context()
            cache = module.k_cache
            if (
                ctx.dense
                or ctx.graph_static  # a CUDA graph's forward: worker/cuda_graphs.QueryTap calls this after it
                or ctx.decode_context_lens is None
                or cache.dim() != 4
                or not cache.dtype.is_floating_point
                or cache.numel() == 0  # strategies that keep their cache elsewhere (8-bit, latent)
                or getattr(module, "kv_quant", None) is not None
            ):
                return
            start = time.perf_counter()
            q = args[0][ctx.num_prefill_tokens :][:MAX_SAMPLED_SEQS]
            n = q.shape[0]
            values = head_utilization(
                q, cache, ctx.decode_block_tables[:n], ctx.decode_context_lens[:n], module.scale
            )
            self.values[layer] = values.tolist()  # synchronises a CUDA device: the time below is real
            self.seconds_total += time.perf_counter() - start

        hook.query_rows = MAX_SAMPLED_SEQS  # type: ignore[attr-defined]  # only these q rows: replays keep it (cuda_graphs.QueryTap)
        return hook

    def feed(self) -> list[HeadUtilization]:
        return [
            {"layer": layer, "kv_head": h, "value": v}
            for layer in sorted(self.values)
            for h, v in enumerate(self.values[layer])
        ]
