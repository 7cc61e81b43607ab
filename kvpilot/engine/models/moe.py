"""DeepSeek-V2/V3 mixture-of-experts MLP in plain torch (matches HF, not fast): router, experts, shared.

Parameter names are the checkpoint's: `mlp.gate.weight` (+ `mlp.gate.e_score_correction_bias` for
V3), `mlp.experts.{e}.{gate,up,down}_proj.weight`, `mlp.shared_experts.{gate,up,down}_proj.weight`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.config.deepseek import DeepseekFields
from kvpilot.engine.models.layers import SiluAndMulMLP


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
        self.experts = nn.ModuleList(
            SiluAndMulMLP(hidden_size, f.moe_intermediate_size) for _ in range(f.n_routed_experts)
        )
        self.shared_experts = (
            SiluAndMulMLP(hidden_size, f.moe_intermediate_size * f.n_shared_experts)
            if f.n_shared_experts
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, index = self.gate(x)
        out = torch.zeros_like(x)
        for expert in index.unique().tolist():  # ascending, as HF accumulates
            token, slot = torch.where(index == expert)
            y = self.experts[expert](x[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
