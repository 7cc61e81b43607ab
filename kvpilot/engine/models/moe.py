"""Mixture-of-experts MLPs: DeepSeek-V2/V3's router (grouped top-k, V3's sigmoid + correction bias),
stacked routed experts run by kernels/fused_moe, shared experts.

Routed experts live in two stacked tensors per layer, `experts.w13` [E, 2I, H] (gate rows, then up
rows) and `experts.w2` [E, H, I], so one grouped GEMM runs them all. Checkpoints keep their
per-expert names: `StackedExperts.piece` tells the loader where `experts.{e}.gate_proj.weight`
(DeepSeek) or `experts.{e}.w1.weight` (MiniMax) goes. Other DeepSeek names are the checkpoint's:
`mlp.gate.weight` (+ `mlp.gate.e_score_correction_bias` for V3), `mlp.shared_experts.*`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.config.deepseek import DeepseekFields
from kvpilot.engine.kernels.fused_moe import fused_moe
from kvpilot.engine.models.layers import SiluAndMulMLP

# per-expert checkpoint names -> (stacked tensor, half of w13: 0 gate, 1 up, None the whole w2 row)
DEEPSEEK_EXPERT_NAMES = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", None)}
MINIMAX_EXPERT_NAMES = {"w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", None)}
_EXPERT_TENSOR = re.compile(r"(.*\.experts)\.(\d+)\.(\w+)\.weight")


@dataclass(frozen=True)
class StackedPiece:
    """Where one per-expert checkpoint tensor lands: `param[index]` (a view of a stacked parameter)."""

    param: str
    index: tuple[int, slice]


class StackedExperts(nn.Module):
    """E SwiGLU experts as w13 [E, 2I, H] and w2 [E, H, I], run by kernels/fused_moe."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, names: dict) -> None:
        super().__init__()
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.names = names  # checkpoint sub-module name -> (stacked tensor, gate/up half)
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """sum_k weights[t, k] * expert_{index[t, k]}(x[t])."""
        return fused_moe(x, self.w13, self.w2, weights, index)

    def piece(self, prefix: str, expert: int, name: str) -> StackedPiece | None:
        """The slice of w13 / w2 that checkpoint tensor `{prefix}.{expert}.{name}.weight` fills."""
        if name not in self.names or not 0 <= expert < self.num_experts:
            return None
        param, half = self.names[name]
        inter = self.intermediate_size
        rows = slice(None) if half is None else slice(half * inter, (half + 1) * inter)
        return StackedPiece(f"{prefix}.{param}", (expert, rows))


def stacked_piece(model: nn.Module, name: str) -> StackedPiece | None:
    """The stacked-expert slice a per-expert checkpoint tensor fills in `model`, or None (not an expert)."""
    match = _EXPERT_TENSOR.fullmatch(name)
    if match is None:
        return None
    prefix, expert, sub = match.groups()
    try:
        module = model.get_submodule(prefix)
    except AttributeError:
        return None
    return module.piece(prefix, int(expert), sub) if isinstance(module, StackedExperts) else None


class TopkRouter(nn.Module):
    """Expert choice per token: (weights [T, k] fp32, expert ids [T, k])."""

    def __init__(self, hidden_size: int, f: DeepseekFields) -> None:
        super().__init__()
        self.f = f
        self.weight = nn.Parameter(torch.empty(f.n_routed_experts, hidden_size))
        if f.scoring_func == "sigmoid":  # a checkpoint tensor, so a (frozen) parameter the loader fills
            self.e_score_correction_bias = nn.Parameter(torch.zeros(f.n_routed_experts), requires_grad=False)

    def _apply(self, fn, recurse: bool = True):
        """Keep e_score_correction_bias in fp32 under .to(dtype), as HF does (_keep_in_fp32_modules):
        rounded to bf16 it flips expert choices between near-equal scores."""
        super()._apply(fn, recurse)
        bias = getattr(self, "e_score_correction_bias", None)
        if bias is not None and bias.dtype != torch.float32:
            self.e_score_correction_bias = nn.Parameter(bias.float(), requires_grad=False)
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.f
        logits = F.linear(x.float(), self.weight.float())
        if f.scoring_func == "sigmoid":
            scores = logits.sigmoid()
            choice = scores + self.e_score_correction_bias.float()
            group_scores = self._grouped(choice).topk(2, dim=-1)[0].sum(dim=-1)
            choice = choice.masked_fill(~self._group_mask(group_scores), float("-inf"))
            index = choice.topk(f.num_experts_per_tok, dim=-1, sorted=False)[1]
            weights = scores.gather(1, index)
            if f.norm_topk_prob:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            scores = logits.softmax(dim=-1)
            if f.topk_method == "group_limited_greedy":
                group_scores = self._grouped(scores).max(dim=-1).values
                scores = scores.masked_fill(~self._group_mask(group_scores), 0.0)
            weights, index = scores.topk(f.num_experts_per_tok, dim=-1, sorted=False)
        return weights * f.routed_scaling_factor, index

    def _grouped(self, scores: torch.Tensor) -> torch.Tensor:
        n_group = self.f.n_group or 1
        return scores.view(scores.shape[0], n_group, -1)

    def _group_mask(self, group_scores: torch.Tensor) -> torch.Tensor:
        """[T, n_experts] True for experts in the topk_group best groups."""
        top = group_scores.topk(self.f.topk_group or 1, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top, True)
        per_group = self.f.n_routed_experts // group_scores.shape[1]
        return mask.repeat_interleave(per_group, dim=1)


class DeepseekMoE(nn.Module):
    """sum_k w_k expert_k(x) over the routed experts, plus the shared experts on every token."""

    def __init__(self, hidden_size: int, f: DeepseekFields) -> None:
        super().__init__()
        self.gate = TopkRouter(hidden_size, f)
        self.experts = StackedExperts(
            f.n_routed_experts, hidden_size, f.moe_intermediate_size, DEEPSEEK_EXPERT_NAMES
        )
        self.shared_experts = (
            SiluAndMulMLP(hidden_size, f.moe_intermediate_size * f.n_shared_experts)
            if f.n_shared_experts
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, index = self.gate(x)
        out = self.experts(x, weights, index)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
