"""GQA conversion by key similarity: which KV heads to merge, chosen on calibration text.

Mean-pooling merges consecutive heads by index. Here, per layer, the heads whose keys and values
are closest on the calibration tokens are merged instead: the cost of merging a group by its mean
is sum_{h in G} ||K_h - mean_G K||^2 = (1/2m) sum_{i,j in G} ||K_i - K_j||^2 (the same for V), so a
greedy grouping of nearest heads refined by pairwise swaps minimises it. The chosen grouping is
applied by permuting the layer's heads (query blocks, o_proj columns, K/V heads: an exact
relabelling) so that each group's heads are consecutive, then merged with weights from the same
tokens (merge_keys: by the queries' energy per key dim; merge_values: through o_proj), the grouping
cost measured with those weights too. By default the merge is compensate.py's instead (query/value
compensation folded into q_proj / o_proj) and the grouping cost is what that merge leaves. Layers are
calibrated in order, each on the inputs its already-converted predecessors produce.
"""

from __future__ import annotations

import logging
from itertools import combinations

import torch

from kvpilot.engine.strategies.calibration.capture import attention_inputs
from kvpilot.engine.strategies.gqa.compensate import compensate_layer, compensated_distances
from kvpilot.engine.strategies.gqa.convert import mean_pool_heads
from kvpilot.engine.strategies.gqa.merge import merge_keys, merge_values

log = logging.getLogger("kvpilot.engine.gqa")


def head_distances(k: torch.Tensor, v: torch.Tensor, key_weights: torch.Tensor | None = None,
                   value_grams: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """k, v [T, H, D] -> [H, H]: mean squared distance between heads' keys plus that of their values,
    each relative to its mean squared norm (so K and V weigh alike). With `key_weights` [H, D] and
    `value_grams` [H, D, D] (query_weights, output_grams) the distances are measured as the merge
    weighs them: key dims by the queries' energy, values through o_proj (each pair's mean weight)."""
    kd, vd = k.double(), v.double()
    heads, d = k.shape[1], k.shape[2]
    wk = torch.ones(heads, d, dtype=torch.float64) if key_weights is None else key_weights.double().cpu()
    g = torch.eye(d, dtype=torch.float64).expand(heads, d, d) if value_grams is None else value_grams.double().cpu()
    kd, vd = kd.cpu(), vd.cpu()
    dist_k = torch.zeros(heads, heads, dtype=torch.float64)
    dist_v = torch.zeros(heads, heads, dtype=torch.float64)
    for i in range(heads):
        for j in range(i + 1, heads):
            diff_k = kd[:, i] - kd[:, j]
            dist_k[i, j] = dist_k[j, i] = (diff_k.pow(2) * (wk[i] + wk[j]) / 2).sum(-1).mean()
            diff_v = vd[:, i] - vd[:, j]
            dist_v[i, j] = dist_v[j, i] = torch.einsum("td,de,te->t", diff_v, (g[i] + g[j]) / 2, diff_v).mean()
    scale_k = (kd.pow(2) * wk[None]).sum(-1).mean().clamp_min(1e-30)
    scale_v = torch.einsum("thd,hde,the->th", vd, g, vd).mean().clamp_min(1e-30)
    return dist_k / scale_k + dist_v / scale_v


def group_cost(dist: torch.Tensor, group: list[int]) -> float:
    return float(sum(dist[i, j] for i, j in combinations(group, 2)))


def group_heads(dist: torch.Tensor, groups: int, passes: int = 20) -> list[int]:
    """A permutation of the H heads in which each run of H / groups consecutive heads is one group."""
    heads = dist.shape[0]
    size = heads // groups
    free = list(range(heads))
    parts: list[list[int]] = []
    while free:
        group = [free.pop(0)]
        while len(group) < size:
            best = min(free, key=lambda j: sum(float(dist[j, g]) for g in group))
            free.remove(best)
            group.append(best)
        parts.append(group)
    for _ in range(passes):  # swap two heads of different groups while it lowers the total cost
        improved = False
        for a, b in combinations(range(len(parts)), 2):
            for i in range(size):
                for j in range(size):
                    ga, gb = parts[a], parts[b]
                    before = group_cost(dist, ga) + group_cost(dist, gb)
                    na, nb = ga.copy(), gb.copy()
                    na[i], nb[j] = gb[j], ga[i]
                    if group_cost(dist, na) + group_cost(dist, nb) < before - 1e-12:
                        parts[a], parts[b], improved = na, nb, True
        if not improved:
            break
    return [h for group in sorted(parts) for h in sorted(group)]


def _rows(order: list[int], width: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * width, (h + 1) * width) for h in order])


def query_weights(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q [T, Hq, D] (pre-RoPE) -> [Hkv, D]: how much each key dim of each KV head counts in q.k, the mean
    squared query over its query heads, averaged over each RoPE pair (i, i + D/2): RoPE rotates each
    pair by a position-dependent angle, and a weight that survives every angle is the same on both."""
    t, heads, d = q.shape
    w = q.double().pow(2).view(t, kv_heads, heads // kv_heads, d).mean(dim=(0, 2))
    half = d // 2
    pair = (w[:, :half] + w[:, half:]) / 2
    return torch.cat([pair, pair], dim=1)


def output_grams(o_weight: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """o_proj weight [hidden, Hq*D] -> [Hkv, D, D]: sum over a KV head's query heads of O_j^T O_j, how
    an error in that head's values reaches the layer's output."""
    hidden = o_weight.shape[0]
    blocks = o_weight.double().view(hidden, kv_heads, -1, head_dim)  # [hidden, Hkv, s, D]
    return torch.einsum("nhsd,nhse->hde", blocks, blocks)


@torch.no_grad()
def regroup_layer(attn: torch.nn.Module, original: dict[str, torch.Tensor], order: list[int], groups: int,
                  key_weights: torch.Tensor | None = None, value_grams: torch.Tensor | None = None,
                  inputs: torch.Tensor | None = None, compensate: tuple[str, ...] = (),
                  keep_output: bool = False) -> None:  # fmt: skip
    """Permute one converted layer's heads to `order` (original KV head indices) and re-merge its K/V
    from the original projections: consecutive runs of the new order become the groups. With
    `key_weights` [H, D] / `value_grams` [H, D, D] (original head order) the merge is weighted by what
    the queries and o_proj make of each head (merge_keys, merge_values); else it is the plain mean.
    With `inputs` [T, hidden] and `compensate` ('keys', 'values'), the merge is compensate.py's
    (`keep_output`: the original o_proj kept for the fallback reserve)."""
    d = attn.head_dim
    kv_heads = len(order)
    per_kv = attn.num_heads // kv_heads  # query heads per original KV head
    q_rows = _rows(order, per_kv * d).to(attn.q_proj.weight.device)
    attn.q_proj.weight.copy_(attn.q_proj.weight[q_rows])
    if attn.q_proj.bias is not None:
        attn.q_proj.bias.copy_(attn.q_proj.bias[q_rows])
    attn.o_proj.weight.copy_(attn.o_proj.weight[:, q_rows])
    kv_rows = _rows(order, d)
    attn.kv_head_order = list(order)  # the GQA runtime check reorders the original K/V the same way
    if inputs is not None and compensate and key_weights is not None and value_grams is not None:
        rows = {name: t[kv_rows.to(t.device)] for name, t in original.items()}
        compensate_layer(attn, rows, inputs, key_weights[order], value_grams[order], groups, compensate, keep_output)
        return
    for proj in ("k_proj", "v_proj"):
        module = getattr(attn, proj)
        for kind in ("weight", "bias"):
            source = original.get(f"{proj}.{kind}")
            if source is None:
                continue
            rows = source[kv_rows].float()
            if proj == "k_proj" and key_weights is not None:
                merged = merge_keys(rows, key_weights[order], groups)
            elif proj == "v_proj" and value_grams is not None:
                merged = merge_values(rows, value_grams[order], groups)
            else:
                merged = mean_pool_heads(rows, kv_heads, groups)
            getattr(module, kind).copy_(merged.to(getattr(module, kind)))


@torch.no_grad()
def calibrate_gqa(model: torch.nn.Module, originals: dict[str, torch.Tensor], groups: int, ids: list[int],
                  device: torch.device, compensate: tuple[str, ...] = ("keys", "values"),
                  grouping: str = "compensated", keep_output: bool = False) -> list[list[int]]:  # fmt: skip
    """Regroup every layer of a mean-pooled GQA model by similarity on `ids` and re-merge it with
    query/value compensation (compensate.py; `compensate=()`: the weighted merges alone); the orders,
    per layer. `grouping`: 'compensated' (what a compensated merge leaves, compensated_distances) or
    'merge' (what the weighted merges leave, head_distances); `keep_output`: each layer's original o_proj
    kept (host) for the fallback reserve. `originals`: the checkpoint's k_proj / v_proj tensors by full
    name (kept by the load transform)."""
    if grouping not in ("compensated", "merge") or not set(compensate) <= {"keys", "values"}:
        raise ValueError(f"grouping {grouping!r} / compensate {compensate!r}: expected 'compensated' or 'merge' / "
                         "a subset of ('keys', 'values')")  # fmt: skip
    orders: list[list[int]] = []
    for index, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        prefix = f"model.layers.{index}.self_attn."
        original = {k.removeprefix(prefix): t.to(device) for k, t in originals.items() if k.startswith(prefix)}
        x = attention_inputs(model, ids, [index], device)[index]
        d = attn.head_dim
        k = torch.nn.functional.linear(x, original["k_proj.weight"].float(), _bias(original, "k_proj"))
        v = torch.nn.functional.linear(x, original["v_proj.weight"].float(), _bias(original, "v_proj"))
        heads = k.shape[1] // d
        k, v = k.view(-1, heads, d), v.view(-1, heads, d)
        q = torch.nn.functional.linear(x, attn.q_proj.weight.float(), _bias_of(attn.q_proj)).view(k.shape[0], -1, d)
        key_weights, grams = query_weights(q, heads), output_grams(attn.o_proj.weight.float(), heads, d)
        if grouping == "compensated":
            dist = compensated_distances(k, v, key_weights, grams)
        else:
            dist = head_distances(k, v, key_weights, grams)
        order = group_heads(dist, groups)
        size = heads // groups
        by_index = sum(group_cost(dist, list(range(g * size, (g + 1) * size))) for g in range(groups))
        chosen = sum(group_cost(dist, order[g * size : (g + 1) * size]) for g in range(groups))
        log.info("gqa layer %d: %s merge cost %.4f by similarity vs %.4f by index (groups %s)", index, grouping,
                 chosen, by_index,
                 [order[g * size : (g + 1) * size] for g in range(groups)])  # fmt: skip
        regroup_layer(attn, original, order, groups, key_weights, grams, x, compensate, keep_output)
        orders.append(order)
    return orders


def _bias_of(linear: torch.nn.Module) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.float()


def _bias(original: dict[str, torch.Tensor], proj: str) -> torch.Tensor | None:
    bias = original.get(f"{proj}.bias")
    return None if bias is None else bias.float()
