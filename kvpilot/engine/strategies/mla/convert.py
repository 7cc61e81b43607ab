"""`convert_to_mla`: every layer of a loaded Llama-style model onto the MLA conversion, in place:
ConvertedMlaAttention (RoPE on every dim, attention.py) or, with `rope_dims`, PartialRopeMlaAttention
(RoPE kept on R dims per KV head, absorbed decode, partial.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpilot.engine.models.llama import LlamaAttention
from kvpilot.engine.strategies.mla.attention import ConvertedMlaAttention
from kvpilot.engine.strategies.mla.decode import DecodePlanner
from kvpilot.engine.strategies.mla.partial import PartialRopeMlaAttention, choose_pairs
from kvpilot.engine.strategies.mla.rope_select import resolve_rule
from kvpilot.engine.strategies.mla.svd import MlaConversion, factorize_kv
from kvpilot.engine.strategies.mla.weighting import key_pair_energy, value_grams

WEIGHTINGS = ("two-sided", "input")  # of the calibrated factorisation: both sides, or the inputs only


@torch.no_grad()
def convert_to_mla(
    model: nn.Module, rank: int, inputs: dict[int, torch.Tensor] | None = None, rope_dims: int | None = None,
    pair_rule: str = "auto", weighting: str = "two-sided", key_balance: float = 1.0,
) -> list[MlaConversion]:
    """Factorise every layer's K/V projections to a rank-`rank` shared latent, in place; one report each.
    `inputs`: each layer's calibration attention inputs (activation-aware factorisation, svd.py), by
    `weighting`: 'two-sided' (also the output side: keys by the queries' per-pair energy, values through
    o_proj, weighting.py; `key_balance`: the keys' share) or 'input' (the input side only). The partial-RoPE
    conversion (`rope_dims`) weights the input side only: its factorised key dims do not rotate, so the
    pair-averaged key weight is not theirs (and measured no better, docs/benchmarks.md).
    `rope_dims`: None keeps RoPE on every dim (this module); R keeps it on R dims per KV head, chosen by
    `pair_rule` (rope_select.py), and serves strategies/mla/partial.py (absorbed decode)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting {weighting!r} is not one of {', '.join(WEIGHTINGS)}")
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
        energy = grams = None
        if x is not None and weighting == "two-sided" and rope_dims is None:  # partial RoPE: input side only
            energy, grams = output_weights(src, x)
        conv = factorize_kv(
            src.k_proj.weight.float(), src.v_proj.weight.float(), src.num_kv_heads, rank, rope_dims or 0,
            inputs=x, pairs=pairs, key_energy=energy, grams=grams, key_balance=key_balance,
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


def output_weights(src: LlamaAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's output-side weights on its calibration inputs x [T, hidden]: the queries' per-pair
    energy [Hkv, D] (from q_proj on x) and the o_proj Grams [Hkv, Dv, Dv] (weighting.py)."""
    weight = src.q_proj.weight
    bias = None if src.q_proj.bias is None else src.q_proj.bias.float()
    q = F.linear(x.to(weight.device).float(), weight.float(), bias).view(x.shape[0], src.num_heads, src.head_dim)
    return key_pair_energy(q, src.num_kv_heads), value_grams(src.o_proj.weight.float(), src.num_kv_heads, src.head_dim)
