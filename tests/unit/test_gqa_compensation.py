"""GQA merges with query/value compensation (strategies/gqa/compensate.py): closed-form fits on calibration
activations, folded into q_proj / o_proj, that commute with RoPE and that the exact paths can undo."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from kvpilot.engine.kernels.rotary.reference import rotary_reference
from kvpilot.engine.strategies.gqa.calibrate import group_heads, head_distances, output_grams, query_weights
from kvpilot.engine.strategies.gqa.compensate import (
    checked_kv,
    compensate_layer,
    compensated_distances,
    correct_queries,
    exact_kv,
    merge_keys_rank1,
    merge_values_pca,
    to_pairs,
)

pytestmark = pytest.mark.unit

HIDDEN, HEADS, DIM = 48, 4, 8
INV_FREQ = 1.0 / (10000 ** (torch.arange(0, DIM, 2).double() / DIM))


def make_layer(gen: torch.Generator) -> SimpleNamespace:
    def lin(i: int, o: int, bias: bool = True) -> nn.Linear:
        layer = nn.Linear(i, o, bias=bias).double()
        with torch.no_grad():
            layer.weight.copy_(torch.randn(o, i, generator=gen, dtype=torch.float64) / i**0.5)
            if bias:
                layer.bias.copy_(0.1 * torch.randn(o, generator=gen, dtype=torch.float64))
        return layer

    return SimpleNamespace(q_proj=lin(HIDDEN, HEADS * DIM), k_proj=lin(HIDDEN, HEADS * DIM),
                           v_proj=lin(HIDDEN, HEADS * DIM), o_proj=lin(HEADS * DIM, HIDDEN, False))  # fmt: skip


def attention(layer, x: torch.Tensor, kv: dict[str, torch.Tensor] | None = None,
              output: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Causal RoPE attention through o_proj (`output`: its weight; None: the layer's; empty: none, the
    heads' outputs [T, H*D]); K/V from `kv` (weights by name) or the layer's own."""
    t = x.shape[0]
    kv = kv or {"k_proj.weight": layer.k_proj.weight, "k_proj.bias": layer.k_proj.bias,
                "v_proj.weight": layer.v_proj.weight, "v_proj.bias": layer.v_proj.bias}  # fmt: skip
    kv_heads = kv["k_proj.weight"].shape[0] // DIM
    q = layer.q_proj(x).view(t, HEADS, DIM)
    k = nn.functional.linear(x, kv["k_proj.weight"], kv.get("k_proj.bias")).view(t, kv_heads, DIM)
    v = nn.functional.linear(x, kv["v_proj.weight"], kv.get("v_proj.bias")).view(t, kv_heads, DIM)
    q, k = rotary_reference(torch.arange(t), INV_FREQ, q, k)
    k, v = k.repeat_interleave(HEADS // kv_heads, 1), v.repeat_interleave(HEADS // kv_heads, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / DIM**0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    heads = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(t, HEADS * DIM)
    if output is not None and output.numel() == 0:
        return heads
    return nn.functional.linear(heads, layer.o_proj.weight if output is None else output)


def originals(layer) -> dict[str, torch.Tensor]:
    return {f"{p}.{k}": getattr(getattr(layer, p), k).detach().clone() for p in ("k_proj", "v_proj")
            for k in ("weight", "bias")}  # fmt: skip


def convert(layer, x: torch.Tensor, groups: int, parts: tuple[str, ...]):
    """The layer merged to `groups` KV heads on calibration inputs x: (merged layer, compensation)."""
    merged = copy.deepcopy(layer)
    merged.k_proj, merged.v_proj = nn.Linear(HIDDEN, groups * DIM).double(), nn.Linear(HIDDEN, groups * DIM).double()
    with torch.no_grad():
        q = layer.q_proj(x).view(x.shape[0], HEADS, DIM)
        comp = compensate_layer(merged, originals(layer), x, query_weights(q, HEADS),
                                output_grams(layer.o_proj.weight, HEADS, DIM), groups, parts, keep_output=True)  # fmt: skip
    return merged, comp


def inputs(gen: torch.Generator, n: int) -> torch.Tensor:
    scales = torch.ones(HIDDEN, dtype=torch.float64)
    scales[:5] = 5.0  # a few dominant directions, as trained activations have
    return torch.randn(n, HIDDEN, generator=gen, dtype=torch.float64) * scales


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def relate_heads(layer, gen: torch.Generator, noise: float) -> None:
    """Make heads 1 and 3 head 0's and 2's keys times a complex scalar per RoPE pair and their values an
    invertible linear map of them, plus `noise` (relative) of their own."""
    k = layer.k_proj.weight.view(HEADS, DIM, HIDDEN)
    v = layer.v_proj.weight.view(HEADS, DIM, HIDDEN)
    kb, vb = layer.k_proj.bias.view(HEADS, DIM), layer.v_proj.bias.view(HEADS, DIM)
    for h in (1, 3):
        scale = torch.polar(0.5 + torch.rand(DIM // 2, generator=gen, dtype=torch.float64),
                            6.28 * torch.rand(DIM // 2, generator=gen, dtype=torch.float64))  # fmt: skip
        kc = to_pairs(torch.cat([k[h - 1], kb[h - 1, :, None]], 1)) * scale[:, None]
        kc = torch.cat([kc.real, kc.imag])
        rot = torch.linalg.qr(torch.randn(DIM, DIM, generator=gen, dtype=torch.float64)).Q
        mix = rot @ torch.diag(torch.linspace(1.0, 2.0, DIM, dtype=torch.float64)) @ rot.T
        for w, b, new_w, new_b in ((k, kb, kc[:, :-1], kc[:, -1]), (v, vb, mix @ v[h - 1], mix @ vb[h - 1])):
            own = torch.randn(DIM, HIDDEN, generator=gen, dtype=torch.float64)
            w[h] = new_w + noise * own * new_w.norm() / own.norm()
            b[h] = new_b


@torch.no_grad()
def test_compensation_lowers_the_held_out_attention_error():
    """Heads related as the compensation can express, plus noise it cannot: the query side lowers the
    layer's error on held-out tokens, the output side on top of it lowers it further."""
    gen = torch.Generator().manual_seed(0)
    layer = make_layer(gen)
    relate_heads(layer, gen, noise=0.3)
    layer.q_proj.weight.mul_(3.0)  # peaked attention: the scores, so the keys, matter
    x = inputs(gen, 400)
    calib, held = x[:300], x[300:]
    exact = attention(layer, held)
    error = {parts: relative_error(attention(convert(layer, calib, 2, parts)[0], held), exact)
             for parts in ((), ("keys",), ("values",), ("keys", "values"))}  # fmt: skip
    assert error[("keys",)] < 0.5 * error[()]
    assert error[("keys", "values")] < 0.8 * error[("keys",)]  # values alone help little while scores are off


@torch.no_grad()
def test_heads_related_by_what_the_compensation_can_express_merge_exactly():
    """Head 1's keys are head 0's times one complex scalar per RoPE pair, its values an invertible linear
    map of head 0's: the compensated merge is exact on any input, the plain one is not."""
    gen = torch.Generator().manual_seed(1)
    layer = make_layer(gen)
    relate_heads(layer, gen, noise=0.0)
    x = inputs(gen, 300)
    held = inputs(gen, 60)
    exact = attention(layer, held)
    merged, _ = convert(layer, x, 2, ("keys", "values"))
    assert relative_error(attention(merged, held), exact) < 1e-3  # exact but for the value fit's ridge (1e-4)
    assert relative_error(attention(convert(layer, x, 2, ())[0], held), exact) > 0.05


@torch.no_grad()
def test_identical_heads_give_identity_compensation():
    gen = torch.Generator().manual_seed(2)
    head = torch.randn(DIM, HIDDEN + 1, generator=gen, dtype=torch.float64)
    weight = head.repeat(HEADS, 1)
    x = torch.cat([inputs(gen, 200), torch.ones(200, 1, dtype=torch.float64)], 1)
    energy = torch.rand(HEADS, DIM // 2, generator=gen, dtype=torch.float64).repeat(1, 2)
    merged_k, factors = merge_keys_rank1(weight, x, energy, 2)
    assert torch.allclose(merged_k, head.repeat(2, 1), atol=1e-10)
    assert torch.allclose(factors, torch.ones_like(factors), atol=1e-10)
    grams = torch.stack([m.T @ m for m in torch.randn(HEADS, 2 * DIM, DIM, generator=gen, dtype=torch.float64)])
    merged_v, maps = merge_values_pca(weight, x, grams, head.repeat(2, 1), 2, ridge=0.0)
    assert torch.allclose(merged_v, head.repeat(2, 1), atol=1e-8)
    assert torch.allclose(maps, torch.eye(DIM, dtype=torch.float64).expand(HEADS, DIM, DIM), atol=1e-8)


@torch.no_grad()
def test_query_correction_commutes_with_rope():
    """Scaling a query pair by a complex number before RoPE equals scaling it after, at any position."""
    gen = torch.Generator().manual_seed(3)
    wq = torch.randn(HEADS * DIM, HIDDEN, generator=gen, dtype=torch.float64)
    factors = torch.complex(torch.randn(2, DIM // 2, generator=gen, dtype=torch.float64),
                            torch.randn(2, DIM // 2, generator=gen, dtype=torch.float64))  # fmt: skip
    x = torch.randn(7, HIDDEN, generator=gen, dtype=torch.float64)
    positions = torch.randint(0, 4096, (7,), generator=gen)
    before, _ = rotary_reference(positions, INV_FREQ, (x @ correct_queries(wq, factors).T).view(7, HEADS, DIM),
                                 torch.zeros(7, 1, DIM, dtype=torch.float64))  # fmt: skip
    rotated, _ = rotary_reference(positions, INV_FREQ, (x @ wq.T).view(7, HEADS, DIM),
                                  torch.zeros(7, 1, DIM, dtype=torch.float64))  # fmt: skip
    half = DIM // 2
    after = torch.complex(rotated[..., :half], rotated[..., half:]) * factors.conj().repeat_interleave(2, 0)
    assert torch.allclose(before, torch.cat([after.real, after.imag], -1), atol=1e-9)


@torch.no_grad()
def test_the_exact_paths_through_the_compensated_layer():
    """The fallback reserve attends with the original heads through the compensated q_proj (keys from
    exact_kv) and the original o_proj: the unmerged layer's output. The runtime check's served-basis
    exact side (checked_kv) equals the served heads' output when the merge is exact, and not otherwise."""
    gen = torch.Generator().manual_seed(4)
    layer = make_layer(gen)
    x, held = inputs(gen, 200), inputs(gen, 50)
    merged, comp = convert(layer, x, 1, ("keys", "values"))
    exact = attention(layer, held)
    assert relative_error(attention(merged, held), exact) > 0.05  # four unlike heads in one: lossy
    reserve = attention(merged, held, exact_kv(originals(layer), comp), comp.output_weight)
    assert relative_error(reserve, exact) < 1e-9
    none = torch.empty(0)
    checked = checked_kv(originals(layer), comp, merged.v_proj.weight, merged.v_proj.bias)
    assert relative_error(attention(merged, held, output=none), attention(merged, held, checked, none)) > 0.05

    relate_heads(layer, gen, noise=0.0)
    merged, comp = convert(layer, x, 2, ("keys", "values"))
    checked = checked_kv(originals(layer), comp, merged.v_proj.weight, merged.v_proj.bias)
    served = attention(merged, held, output=none)
    assert relative_error(served, attention(merged, held, checked, none)) < 1e-3  # ridge, as above
    assert relative_error(served, attention(merged, held, exact_kv(originals(layer), comp), none)) > 0.05


@torch.no_grad()
def test_grouping_by_what_the_compensated_merge_leaves():
    """Heads 0 ~ 1 and 2 ~ 3 as the compensation can express (not alike by value): the compensated
    distance of those pairs is ~0 and of every other pair not, which the mean-merge distance misses."""
    gen = torch.Generator().manual_seed(5)
    layer = make_layer(gen)
    relate_heads(layer, gen, noise=0.0)
    x = inputs(gen, 300)
    k, v = layer.k_proj(x).view(300, HEADS, DIM), layer.v_proj(x).view(300, HEADS, DIM)
    q = layer.q_proj(x).view(300, HEADS, DIM)
    weights, grams = query_weights(q, HEADS), output_grams(layer.o_proj.weight, HEADS, DIM)
    dist = compensated_distances(k, v, weights, grams)
    assert float(dist[0, 1]) < 1e-6 and float(dist[2, 3]) < 1e-6
    assert min(float(dist[i, j]) for i, j in ((0, 2), (0, 3), (1, 2), (1, 3))) > 1e-2
    assert group_heads(dist, 2) == [0, 1, 2, 3]
    plain = head_distances(k, v, weights, grams)
    assert float(plain[0, 1]) > 0.5 * float(plain[0, 2])  # by the merge's own cost the twins look unlike
