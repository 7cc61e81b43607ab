"""MiniMax-style hybrid architecture fields of an HF config.json (torch-free).

Which layers are lightning (linear) attention and which are softmax: `layer_types`
("linear_attention" | "full_attention", HF's MiniMaxConfig), or the original MiniMax checkpoints'
`attn_type_list` (0 = lightning, 1 = softmax); without either, HF's default alternation (even
layers softmax, odd layers lightning). Plus the sparse MoE MLP and the residual scaling factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class HybridFields:
    """Per-layer attention kinds, MoE routing and the alpha/beta residual factors of MiniMax."""

    layer_types: tuple[str, ...]
    num_local_experts: int
    num_experts_per_tok: int
    linear_attn_alpha_factor: float = 1.0
    linear_attn_beta_factor: float = 1.0
    full_attn_alpha_factor: float = 1.0
    full_attn_beta_factor: float = 1.0
    mlp_alpha_factor: float = 1.0
    mlp_beta_factor: float = 1.0

    @property
    def num_linear_layers(self) -> int:
        return self.layer_types.count(LINEAR)

    @property
    def num_full_layers(self) -> int:
        return self.layer_types.count(FULL)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> HybridFields:
        layers = int(raw["num_hidden_layers"])
        types = raw.get("layer_types")
        if types is None and raw.get("attn_type_list") is not None:
            types = [FULL if int(t) == 1 else LINEAR for t in raw["attn_type_list"]]
        if types is None:
            types = [FULL if (i + 1) % 2 else LINEAR for i in range(layers)]
        types = tuple(str(t) for t in types)
        bad = sorted({t for t in types if t not in (LINEAR, FULL)})
        if bad or len(types) != layers:
            raise ValueError(
                f"{source}: layer_types must list {layers} entries of {LINEAR!r} or {FULL!r}, "
                f"got {len(types)} entries{f' with {bad}' if bad else ''}"
            )
        experts = int(raw.get("num_local_experts") or raw.get("num_experts") or 0)
        top_k = int(raw.get("num_experts_per_tok") or 0)
        if experts < 1 or not 1 <= top_k <= experts:
            raise ValueError(
                f"{source}: MiniMax's sparse MLP needs num_local_experts >= 1 and "
                f"1 <= num_experts_per_tok <= num_local_experts, got {experts} and {top_k}"
            )
        factors = {
            name: float(raw.get(name, 1.0))
            for name in (
                "linear_attn_alpha_factor", "linear_attn_beta_factor", "full_attn_alpha_factor",
                "full_attn_beta_factor", "mlp_alpha_factor", "mlp_beta_factor",
            )
        }  # fmt: skip
        return cls(layer_types=types, num_local_experts=experts, num_experts_per_tok=top_k, **factors)
