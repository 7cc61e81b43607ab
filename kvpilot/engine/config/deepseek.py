"""DeepSeek-V2/V3 architecture fields (MLA attention, YaRN RoPE, MoE routing) read from config.json.

Torch-free: kvpilot/engine/config.py imports it. Field names and defaults follow HF transformers'
`DeepseekV2Config` / `DeepseekV3Config` (5.x): V2 routes by softmax with greedy or
group-limited-greedy top-k and never renormalises; V3 routes by sigmoid plus
`e_score_correction_bias` with group-limited top-k (noaux_tc), renormalises when `norm_topk_prob`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEEPSEEK_FAMILIES = ("deepseek_v2", "deepseek_v3")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


@dataclass(frozen=True)
class DeepseekFields:
    """What a DeepSeek model needs beyond the Llama fields of ModelConfig."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # pairs (2i, 2i+1) rotated together (V2 always; V3 by default)
    rope_yarn: dict[str, Any] | None  # the yarn rope parameters, or None for plain RoPE
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    topk_method: str
    scoring_func: str  # "softmax" (V2) or "sigmoid" (V3)
    n_group: int | None
    topk_group: int | None
    norm_topk_prob: bool
    # DeepSeek-V3's multi-token-prediction modules, stored as layers num_hidden_layers.. in the
    # checkpoint; kvpilot decodes one token a step and does not load them (loader skips them).
    num_nextn_predict_layers: int = 0

    @property
    def latent_width(self) -> int:
        """Cached elements per token and layer: the latent c_kv plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def deepseek_fields(family: str, raw: dict[str, Any], source: str = "config") -> DeepseekFields:
    """Parse the MLA / MoE fields of a DeepSeek config.json; errors name the field and what is allowed."""
    v3 = family == "deepseek_v3"
    method = "noaux_tc" if v3 else str(raw.get("topk_method") or "greedy")
    if method not in TOPK_METHODS[:2] and not v3:
        raise ValueError(
            f"{source}: topk_method {method!r} is not supported for DeepSeek-V2; use {TOPK_METHODS[:2]}"
        )
    fields = DeepseekFields(
        kv_lora_rank=int(raw.get("kv_lora_rank", 512)),
        q_lora_rank=None if raw.get("q_lora_rank") is None else int(raw["q_lora_rank"]),
        qk_nope_head_dim=int(raw.get("qk_nope_head_dim", 128)),
        qk_rope_head_dim=int(raw.get("qk_rope_head_dim", 64)),
        v_head_dim=int(raw.get("v_head_dim") or 128),
        rope_interleave=bool(raw.get("rope_interleave", True)) if v3 else True,
        rope_yarn=_yarn(raw, source),
        n_routed_experts=int(raw.get("n_routed_experts") or raw.get("num_local_experts") or 0),
        num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0),
        n_shared_experts=int(raw.get("n_shared_experts") or 0),
        moe_intermediate_size=int(raw.get("moe_intermediate_size", 0)),
        first_k_dense_replace=int(raw.get("first_k_dense_replace", 0)),
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 2.5 if v3 else 1.0)),
        topk_method=method,
        scoring_func="sigmoid" if v3 else "softmax",
        n_group=None if raw.get("n_group") is None else int(raw["n_group"]),
        topk_group=None if raw.get("topk_group") is None else int(raw["topk_group"]),
        norm_topk_prob=bool(raw.get("norm_topk_prob", v3)) if v3 else False,
        num_nextn_predict_layers=int(raw.get("num_nextn_predict_layers") or raw.get("num_mtp_layers") or 0),
    )
    has_moe = fields.first_k_dense_replace < int(raw.get("num_hidden_layers", 0))
    if has_moe and (
        fields.n_routed_experts < 1 or not 1 <= fields.num_experts_per_tok <= fields.n_routed_experts
    ):
        raise ValueError(
            f"{source}: MoE layers need n_routed_experts >= 1 and 1 <= num_experts_per_tok <= n_routed_experts, "
            f"got {fields.n_routed_experts} and {fields.num_experts_per_tok}"
        )
    groups_ok = fields.n_group and fields.topk_group and not fields.n_routed_experts % fields.n_group
    if has_moe and method != "greedy" and not groups_ok:
        raise ValueError(
            f"{source}: topk_method {method!r} needs n_group dividing n_routed_experts and topk_group >= 1, "
            f"got n_group={fields.n_group} topk_group={fields.topk_group}"
        )
    if fields.qk_rope_head_dim % 2:
        raise ValueError(f"{source}: qk_rope_head_dim must be even, got {fields.qk_rope_head_dim}")
    return fields


def _yarn(raw: dict[str, Any], source: str) -> dict[str, Any] | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind != "yarn":
        raise ValueError(
            f"{source}: DeepSeek rope type {kind!r} is not supported; kvpilot supports 'yarn' or none"
        )
    yarn = dict(scaling)
    if yarn.get("factor") is None:  # HF: the ratio of the context lengths
        yarn["factor"] = int(raw.get("max_position_embeddings", 4096)) / int(
            yarn["original_max_position_embeddings"]
        )
    return yarn
