"""GQA merges with query/value compensation: closed-form, fitted on calibration activations, folded into weights.

A merge keeps one K/V head per group; what each original head loses is given back on the query and
output side, which stay per query head:

- Keys. Per RoPE pair p (dims i, i + D/2 in the rotate-half layout, the complex k_p = k_i + i k_{i+D/2})
  the score is sum_p Re(q_p conj(k_p) e^{i theta_p (t - s)}). The merged key k_m and a complex factor
  d_h per original head and pair minimise sum_h w_h,p sum_s |k_h,p - d_h,p k_m,p|^2 (w: the queries'
  energy on that pair): a rank-1 complex approximation, the top eigenvector of the group's weighted
  pair Gram. Query heads reading h then use conj(d_h,p) q_p, so Re(q' conj(k_m)) ~ Re(q conj(k_h)).
  A complex scalar per pair is a scaled 2x2 rotation [[a, b], [-b, a]]: it commutes with RoPE.
- Values. The merged values V_m span the top-D principal subspace of the group's values seen through
  o_proj (V_h L_h, L_h L_h^T = O_h^T O_h); each head gets N_h (ridge least squares V_h ~ V_m N_h)
  folded into its query heads' o_proj columns, O_j <- O_j N_h^T. N_h is often far from invertible (a
  head's values need only part of the merged subspace), so the exact paths do not invert it: the
  fallback reserve keeps the original o_proj for its rows (exact_kv, Compensation.output_weight) and
  the runtime check compares in the served basis (checked_kv).

Weights are [rows, hidden + 1] here: the projection with its bias as the last column (x gets a 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpilot.engine.strategies.gqa.merge import merge_keys, merge_values

MIN_FACTOR = 1e-3  # |d| floor relative to its head's mean: keys divided by d stay finite on the exact paths


@dataclass(frozen=True)
class Compensation:
    """Per original KV head (in the layer's head order): key factors d [H, D/2] complex, value maps N
    [H, D, D]; `output_weight`: the layer's o_proj before compensation (host), kept for the reserve."""

    key_factors: torch.Tensor | None
    value_maps: torch.Tensor | None
    output_weight: torch.Tensor | None = None


def to_pairs(t: torch.Tensor) -> torch.Tensor:
    """[..., D, n] real rows (rotate-half layout) -> [..., D/2, n] complex: row i + i * row (i + D/2)."""
    half = t.shape[-2] // 2
    return torch.complex(t[..., :half, :], t[..., half:, :])


def from_pairs(c: torch.Tensor) -> torch.Tensor:
    """Inverse of to_pairs."""
    return torch.cat([c.real, c.imag], dim=-2)


def key_factors(keys: torch.Tensor, merged: torch.Tensor) -> torch.Tensor:
    """keys [T, m, P] (a group's heads), merged [T, P] complex -> d [m, P]: least squares k_h ~ d_h k_m per pair."""
    num = torch.einsum("tp,tmp->mp", merged.conj(), keys)
    den = merged.abs().pow(2).sum(0)
    d = num / den.clamp_min(1e-30 * den.max().clamp_min(1e-300))
    floor = MIN_FACTOR * d.abs().mean(-1, keepdim=True).clamp_min(1e-30)
    return torch.where(d.abs() < floor, torch.polar(floor.expand_as(d.real), d.angle()), d)


def merge_keys_rank1(weight: torch.Tensor, x: torch.Tensor, energy: torch.Tensor, groups: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """K weight [H*D, n] (heads in group order), inputs x [T, n], query energy [H, D] -> merged weight
    [groups*D, n] and key factors d [H, D/2]: per group and RoPE pair the rank-1 complex fit above.
    Heads that agree give their energy-weighted mean and d = 1."""
    heads, d = energy.shape
    size = heads // groups
    wc = to_pairs(weight.double().reshape(heads, d, -1))  # [H, P, n]
    keys = torch.einsum("tn,hpn->thp", x.double().to(wc.dtype), wc)  # [T, H, P]
    w = energy.double()[:, : d // 2].clamp_min(1e-12)  # pair-averaged already: both halves alike
    merged_rows, factors = [], []
    for g in range(groups):
        hs = slice(g * size, (g + 1) * size)
        scaled = keys[:, hs] * w[hs].sqrt()
        gram = torch.einsum("tmp,tnp->pmn", scaled.conj(), scaled)  # [P, m, m] Hermitian
        top = torch.linalg.eigh(gram).eigenvectors[..., -1]  # [P, m]
        coef = top * w[hs].T.sqrt()  # k_m = sum_h coef_h k_h
        total = coef.sum(-1, keepdim=True)
        norm = coef.abs().sum(-1, keepdim=True)
        # scale so that coefficients sum to 1 (agreeing heads: their weighted mean); else unit l1 norm
        coef = coef / torch.where(total.abs() > 1e-3 * norm, total, norm)
        merged_c = torch.einsum("pm,mpn->pn", coef, wc[hs])  # [P, n]
        merged_rows.append(from_pairs(merged_c))
        factors.append(key_factors(keys[:, hs], x.double().to(wc.dtype) @ merged_c.T))
    return torch.cat(merged_rows).to(weight.dtype), torch.cat(factors)


def correct_queries(q_weight: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """q weight [Hq*D, n] -> each query head's pairs times conj(d) of the KV head it reads (head j reads j // (Hq/H))."""
    heads = factors.shape[0]
    d = factors.shape[1] * 2
    qc = to_pairs(q_weight.double().reshape(heads, -1, d, q_weight.shape[-1]))  # [H, s, P, n]
    qc = qc * factors.conj()[:, None, :, None]
    return from_pairs(qc).reshape(q_weight.shape).to(q_weight.dtype)


def merge_values_pca(weight: torch.Tensor, x: torch.Tensor, grams: torch.Tensor, reference: torch.Tensor,
                     groups: int, ridge: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """V weight [H*D, n] (group order), inputs x [T, n], o_proj grams [H, D, D], the plain merge `reference`
    [groups*D, n] -> merged weight [groups*D, n] and value maps N [H, D, D]. The merged basis within the
    principal subspace is the one closest to `reference` (agreeing heads: reference itself and N = I)."""
    heads, d, _ = grams.shape
    size = heads // groups
    xd = x.double()
    w = weight.double().reshape(heads, d, -1)
    values = torch.einsum("tn,hdn->thd", xd, w)
    g = grams.double()
    eye = torch.eye(d, dtype=torch.float64, device=g.device)
    chol = torch.linalg.cholesky(g + 1e-6 * g.diagonal(dim1=1, dim2=2).mean(-1)[:, None, None] * eye)
    merged_rows, maps = [], []
    for grp in range(groups):
        hs = range(grp * size, (grp + 1) * size)
        z = torch.cat([values[:, h] @ chol[h] for h in hs], dim=1)  # [T, m*D]
        basis = torch.linalg.eigh(z.T @ z).eigenvectors[:, -d:]  # [m*D, D]
        merged = sum(basis[i * d : (i + 1) * d].T @ chol[h].T @ w[h] for i, h in enumerate(hs))  # [D, n]
        ref = reference.double()[grp * d : (grp + 1) * d]
        vm, vref = xd @ merged.T, xd @ ref.T
        align = torch.linalg.lstsq(vm, vref).solution  # [D, D]: vm @ align ~ vref
        if torch.linalg.cond(align) < 1e6:
            merged = align.T @ merged
            vm = xd @ merged.T
        cov = vm.T @ vm
        cov = cov + ridge * cov.diagonal().mean() * eye
        for h in hs:
            maps.append(torch.linalg.solve(cov, vm.T @ values[:, h]))
        merged_rows.append(merged)
    return torch.cat(merged_rows).to(weight.dtype), torch.stack(maps)


def map_outputs(o_weight: torch.Tensor, maps: torch.Tensor) -> torch.Tensor:
    """o_proj weight [hidden, Hq*D] -> each query head's block O_j times N_h^T of the KV head it reads."""
    heads, d, _ = maps.shape
    blocks = o_weight.double().reshape(o_weight.shape[0], heads, -1, d)  # [hidden, H, s, D]
    out = torch.einsum("nhsd,hed->nhse", blocks, maps.double())
    return out.reshape(o_weight.shape).to(o_weight.dtype)


def exact_kv(original: dict[str, torch.Tensor], comp: Compensation | None) -> dict[str, torch.Tensor]:
    """The original K/V projections ('k_proj.weight', ... in the layer's head order) for the unmerged
    path through the compensated q_proj: keys divided by d per pair (exact: a complex scalar per pair,
    no mixing). Values stay the original ones; with value maps they need the original o_proj
    (Compensation.output_weight), which the fallback reserve keeps."""
    out = dict(original)
    if comp is None or comp.key_factors is None:
        return out
    rows = _with_bias(original, "k_proj")
    heads, pairs = comp.key_factors.shape
    kc = to_pairs(rows.reshape(heads, 2 * pairs, -1)) / comp.key_factors.to(rows.device)[..., None]
    _put(out, "k_proj", from_pairs(kc).reshape(rows.shape), original)
    return out


def checked_kv(original: dict[str, torch.Tensor], comp: Compensation | None, merged_v: torch.Tensor,
               merged_v_bias: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """The runtime check's exact side in the served basis: exact_kv's keys (the original scores) and, with
    value maps, per head the merged value plus what its fit misses, v_m + (v_h - N_h^T v_m) (merged_v:
    the served v_proj weight [groups*D, hidden]). The served output equals it when scores and the value
    fit are exact on the checked tokens; its cosine falls as either is off."""
    out = exact_kv(original, comp)
    if comp is None or comp.value_maps is None:
        return out
    rows = _with_bias(original, "v_proj")
    maps = comp.value_maps.double().to(rows.device)
    heads, d, _ = maps.shape
    merged = {"m.weight": merged_v.detach().to(rows.device)}
    if merged_v_bias is not None:
        merged["m.bias"] = merged_v_bias.detach().to(rows.device)
    vm = _with_bias(merged, "m").reshape(-1, d, rows.shape[1])  # [groups, D, n]
    vm = vm.repeat_interleave(heads // vm.shape[0], dim=0)  # each original head's group
    fitted = torch.einsum("hde,hdn->hen", maps, vm)  # N_h^T v_m
    _put(out, "v_proj", (vm + rows.reshape(heads, d, -1) - fitted).reshape(rows.shape), original)
    return out


def _put(out: dict[str, torch.Tensor], proj: str, rows: torch.Tensor, original: dict[str, torch.Tensor]) -> None:
    weight = original[f"{proj}.weight"]
    out[f"{proj}.weight"] = rows[:, : weight.shape[1]].to(weight)
    if f"{proj}.bias" in original:
        out[f"{proj}.bias"] = rows[:, -1].to(original[f"{proj}.bias"])


def _with_bias(original: dict[str, torch.Tensor], proj: str) -> torch.Tensor:
    weight = original[f"{proj}.weight"].double()
    bias = original.get(f"{proj}.bias")
    return weight if bias is None else torch.cat([weight, bias.double().to(weight.device)[:, None]], dim=1)


@torch.no_grad()
def compensate_layer(attn: torch.nn.Module, original: dict[str, torch.Tensor], x: torch.Tensor,
                     key_weights: torch.Tensor, value_grams: torch.Tensor, groups: int,
                     parts: tuple[str, ...] = ("keys", "values"), keep_output: bool = False
                     ) -> Compensation:  # fmt: skip
    """Merge one layer's K/V (`original`: its projections, heads already in group order; `key_weights`,
    `value_grams` in that order too) into `groups` heads on inputs x [T, hidden], compensating `parts`
    in q_proj / o_proj; the layer's weights are set and the compensation is returned (and kept on the
    layer as `gqa_compensation` for the exact paths). `keep_output`: keep the original o_proj (host) for
    the fallback reserve."""

    xb = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64, device=x.device)], dim=1)
    k_rows, v_rows = _with_bias(original, "k_proj"), _with_bias(original, "v_proj")
    xk = xb if k_rows.shape[1] == xb.shape[1] else xb[:, :-1]
    xv = xb if v_rows.shape[1] == xb.shape[1] else xb[:, :-1]
    factors = maps = None
    if "keys" in parts:
        k_merged, factors = merge_keys_rank1(k_rows, xk, key_weights, groups)
        _set(attn.q_proj, correct_queries(_with_bias_of(attn.q_proj), factors))
    else:
        k_merged = merge_keys(k_rows, key_weights, groups)
    v_plain = merge_values(v_rows, value_grams, groups)
    output = None
    if "values" in parts:
        v_merged, maps = merge_values_pca(v_rows, xv, value_grams, v_plain, groups)
        output = attn.o_proj.weight.detach().to("cpu", copy=True) if keep_output else None
        attn.o_proj.weight.copy_(map_outputs(attn.o_proj.weight, maps).to(attn.o_proj.weight))
    else:
        v_merged = v_plain
    _set(attn.k_proj, k_merged)
    _set(attn.v_proj, v_merged)
    comp = Compensation(factors, maps, output)
    attn.gqa_compensation = comp
    return comp


def _with_bias_of(linear: torch.nn.Module) -> torch.Tensor:
    return _with_bias({"p.weight": linear.weight, **({"p.bias": linear.bias} if linear.bias is not None else {})}, "p")


def _set(linear: torch.nn.Module, rows: torch.Tensor) -> None:
    """Copy [out, in (+1 with the bias)] rows into a Linear's weight (and bias)."""
    width = linear.weight.shape[1]
    linear.weight.copy_(rows[:, :width].to(linear.weight))
    if linear.bias is not None:
        linear.bias.copy_(rows[:, width].to(linear.bias))


def compensated_distances(k: torch.Tensor, v: torch.Tensor, key_weights: torch.Tensor, value_grams: torch.Tensor
                          ) -> torch.Tensor:  # fmt: skip
    """k, v [T, H, D] -> [H, H]: what merging two heads with compensation leaves, keys (the weighted
    rank-1 residual per RoPE pair) plus values (the principal subspace's residual through o_proj), each
    relative to its mean energy as calibrate.head_distances does; for groups of two the exact cost."""
    heads, d = k.shape[1], k.shape[2]
    w = key_weights.double().cpu()[:, : d // 2]
    kc = torch.complex(k.double().cpu()[..., : d // 2], k.double().cpu()[..., d // 2 :]) * w.sqrt()  # [T, H, P]
    energy = kc.abs().pow(2).mean(0)  # [H, P]
    cross = torch.einsum("tip,tjp->ijp", kc.conj(), kc).abs() / kc.shape[0]  # [H, H, P]
    half = (energy[:, None] + energy[None]) / 2
    gap = (energy[:, None] - energy[None]) / 2
    dist_k = (half - (gap.pow(2) + cross.pow(2)).sqrt()).clamp_min(0).sum(-1)
    g = value_grams.double().cpu()
    eye = torch.eye(d, dtype=torch.float64)
    chol = torch.linalg.cholesky(g + 1e-6 * g.diagonal(dim1=1, dim2=2).mean(-1)[:, None, None] * eye)
    z = torch.einsum("thd,hde->the", v.double().cpu(), chol)  # [T, H, D]
    dist_v = torch.zeros(heads, heads, dtype=torch.float64)
    for i in range(heads):
        for j in range(i + 1, heads):
            pair = torch.cat([z[:, i], z[:, j]], dim=1)
            dist_v[i, j] = dist_v[j, i] = torch.linalg.eigvalsh(pair.T @ pair)[:d].clamp_min(0).sum() / z.shape[0]
    dist_k.fill_diagonal_(0)
    scale_k = energy.sum(-1).mean().clamp_min(1e-30)
    scale_v = z.pow(2).sum(-1).mean().clamp_min(1e-30)
    return dist_k / scale_k + dist_v / scale_v
