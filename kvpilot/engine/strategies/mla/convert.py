"""`convert_to_mla`: every layer of a loaded Llama-style model onto the MLA conversion, in place:
ConvertedMlaAttention (RoPE on every dim, attention.py) or, with `rope_dims`, PartialRopeMlaAttention
(RoPE kept on R dims per KV head, absorbed decode, partial.py)."""

from __future__ import annotations

import torch
from torch import nn

from kvpilot.engine.models.llama import LlamaAttention
from kvpilot.engine.strategies.mla.attention import ConvertedMlaAttention
from kvpilot.engine.strategies.mla.decode import DecodePlanner
from kvpilot.engine.strategies.mla.partial import PartialRopeMlaAttention, choose_pairs
from kvpilot.engine.strategies.mla.rope_select import resolve_rule
from kvpilot.engine.strategies.mla.svd import MlaConversion, factorize_kv


@torch.no_grad()
def convert_to_mla(
    model: nn.Module, rank: int, inputs: dict[int, torch.Tensor] | None = None, rope_dims: int | None = None,
    pair_rule: str = "auto",
) -> list[MlaConversion]:
    """Factorise every layer's K/V projections to a rank-`rank` shared latent, in place; one report each.
    `inputs`: each layer's calibration attention inputs (activation-aware factorisation, svd.py).
    `rope_dims`: None keeps RoPE on every dim (this module); R keeps it on R dims per KV head, chosen by
    `pair_rule` (rope_select.py), and serves strategies/mla/partial.py (absorbed decode)."""
    layers = model.model.layers
    if not all(isinstance(layer.self_attn, LlamaAttention) for layer in layers):
        raise ValueError("MLA conversion needs a Llama-style model (q/k/v/o projections); this one has none")
    rule = resolve_rule(pair_rule, inputs is not None) if rope_dims is not None else None
    conversions: list[MlaConversion] = []
    planners: list[DecodePlanner] = []
    for index, layer in enumerate(layers):
        src = layer.self_attn
        x = None if inputs is None else inputs[index]
        pairs = None
        if rope_dims is not None and rule is not None:
            pairs = choose_pairs(src, x, rope_dims, rule, model.config.max_position_embeddings)
        conv = factorize_kv(
            src.k_proj.weight.float(), src.v_proj.weight.float(), src.num_kv_heads, rank, rope_dims or 0,
            inputs=x, pairs=pairs,
        )  # fmt: skip
        inv_freq = src.rotary_emb.inv_freq
        planner = next((p for p in planners if torch.equal(p.inv_freq, inv_freq)), None)
        if planner is None:  # one per distinct RoPE (all layers of these families share one)
            planner = DecodePlanner(inv_freq)
            planners.append(planner)
        cls = ConvertedMlaAttention if rope_dims is None else PartialRopeMlaAttention
        layer.self_attn = cls(src, conv, planner)
        conversions.append(conv)
    model.latent_cache_width = layers[0].self_attn.attn.width
    return conversions
