"""Runtime validation of the GQA conversion (attention="gqa", kv_head_groups N).

Exact side: the validated layer's attention with the checkpoint's own K/V projections, read from
the checkpoint at start for that one layer only (kept for this purpose; the capacity planner counts
their bytes, kvpilot/planner/memory.py), on the same input as the served layer (a dense recompute
up to that layer, whose earlier layers are the served, merged ones). Served side: the layer's
output over the merged KV heads. So the check measures what merging did to this layer. A calibrated
conversion compensates in q_proj / o_proj (compensate.py): the exact side then uses the original
scores through the compensated queries and values in the served basis (compensate.checked_kv).

Fallback: with `fallback_reserve > 0` every layer keeps its original K/V projections and the pool a
reserve of full-head K/V blocks (strategies/gqa/reserve.py); a failing sequence is recomputed there,
unmerged. Without a reserve a failing check is counted under `validation.unrecovered_total{gqa}` and
logged (the remedy is more kv_head_groups or --disable-gqa).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open

from kvpilot.engine.config.strategy import gqa_groups
from kvpilot.engine.context import dense_context
from kvpilot.engine.core.pools import BlockManagerLike, PooledBlockManager
from kvpilot.engine.core.reserve import ReserveFallback
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.strategies.contract import RunnerView
from kvpilot.engine.strategies.gqa.compensate import checked_kv
from kvpilot.engine.validation.runner import DenseRecompute, token_ids_on

_PROJ = ("k_proj", "v_proj")


class _Captured(Exception):
    """Stops the dense recompute at the validated layer's input."""


def read_original_kv(model_dir: str | Path, layer: int) -> dict[str, torch.Tensor]:
    """The checkpoint's k_proj / v_proj weight (and bias) of one layer, by short name ('k_proj.weight')."""
    prefix = f"model.layers.{layer}.self_attn."
    wanted = {f"{prefix}{p}.{kind}" for p in _PROJ for kind in ("weight", "bias")}
    found: dict[str, torch.Tensor] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in wanted & set(f.keys()):
                found[name.removeprefix(prefix)] = f.get_tensor(name)
    if "k_proj.weight" not in found or "v_proj.weight" not in found:
        raise ValueError(
            f"GQA runtime validation reads layer {layer}'s original k_proj/v_proj from {model_dir}, but the "
            "checkpoint has no such tensors (HF Llama/Qwen2 names expected)"
        )
    return found


class GqaCheck(DenseRecompute, ReserveFallback):
    """The GQA conversion's ApproximationCheck (validation/runner.py), for one validated layer."""

    name = "gqa"

    def __init__(self, runner: RunnerView, layer: int, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None]) -> None:
        DenseRecompute.__init__(self, runner)
        ReserveFallback.__init__(self, block_manager, requeue, runner.model_config.max_position_embeddings)
        self.pooled = isinstance(block_manager, PooledBlockManager)
        self.layer = layer
        original = read_original_kv(runner.config.model, layer)
        attn = runner.model.model.layers[layer].self_attn
        head_dim = attn.head_dim
        self.num_kv_heads = original["k_proj.weight"].shape[0] // head_dim
        order = getattr(attn, "kv_head_order", None)  # calibrated grouping permuted the layer's heads
        if order is not None:
            rows = torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in order])
            original = {k: t[rows] for k, t in original.items()}
        # compensation (calibrated): the original scores through the compensated q_proj, values in the served basis
        original = checked_kv(original, getattr(attn, "gqa_compensation", None), attn.v_proj.weight, attn.v_proj.bias)
        self.weights = {k: t.to(runner.device, runner.dtype) for k, t in original.items()}

    @property
    def extra_bytes(self) -> int:
        """Device bytes of the kept original projections."""
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def applies(self, seq: Sequence) -> bool:
        return not seq.exact_path

    @torch.inference_mode()
    def exact_attention(self, seq: Sequence, layer: int, num_tokens: int) -> torch.Tensor:
        if layer != self.layer:
            raise ValueError(f"the GQA check holds layer {self.layer}'s original K/V, not layer {layer}'s")
        runner = self.runner
        module = runner.model.model.layers[layer].self_attn
        store: dict[str, torch.Tensor] = {}

        def stop(_module, args):
            store["positions"], store["x"] = args[0], args[1]
            raise _Captured

        handle = module.register_forward_pre_hook(stop)
        ids = token_ids_on(runner.device, seq.token_ids[:num_tokens])  # no host/device sync
        try:
            with dense_context():
                runner.model(ids, torch.arange(num_tokens, device=runner.device))
        except _Captured:
            pass
        finally:
            handle.remove()
        return self._original_attention(module, store["positions"], store["x"])[-1]

    def _original_attention(self, module: Any, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        t, w = x.shape[0], self.weights
        heads, dim = module.num_heads, module.head_dim
        q = module.q_proj(x).view(t, heads, dim)
        k = F.linear(x, w["k_proj.weight"], w.get("k_proj.bias")).view(t, self.num_kv_heads, dim)
        v = F.linear(x, w["v_proj.weight"], w.get("v_proj.bias")).view(t, self.num_kv_heads, dim)
        q, k = module.rotary_emb(positions, q, k)
        group = heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], is_causal=True,
            scale=module.attn.scale,
        )
        return out[0].transpose(0, 1)

    def can_fall_back(self, seq: Sequence) -> bool:
        return self.pooled and ReserveFallback.can_fall_back(self, seq)


def gqa_checks(runner: RunnerView, config: Any, block_manager: BlockManagerLike, requeue: Callable[[Sequence], None]) -> list[GqaCheck]:
    """The GQA check when the runner serves a checkpoint with merged KV heads, else none."""
    if gqa_groups(config) is None or runner.model_config.family not in ("llama", "mistral", "qwen2"):
        return []
    if getattr(runner, "world", 1) > 1:  # tensor parallel: each rank holds a slice of the heads
        return []
    layers = len(runner.model.model.layers)
    check = GqaCheck(runner, config.validation_layer % layers, block_manager, requeue)
    merged = runner.model.model.layers[check.layer].self_attn.num_kv_heads
    return [check] if check.num_kv_heads != merged else []  # kv_head_groups = the checkpoint's: nothing merged
