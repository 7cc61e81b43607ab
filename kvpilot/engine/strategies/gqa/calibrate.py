"""GQA conversion by key similarity: which KV heads to merge, chosen on calibration text.

Mean-pooling merges consecutive heads by index. Here, per layer, the heads whose keys and values
are closest on the calibration tokens are merged instead: the cost of merging a group by its mean
is sum_{h in G} ||K_h - mean_G K||^2 = (1/2m) sum_{i,j in G} ||K_i - K_j||^2 (the same for V), so a
greedy grouping of nearest heads refined by pairwise swaps minimises it. The chosen grouping is
applied by permuting the layer's heads (query blocks, o_proj columns, K/V heads: an exact
relabelling) so that each group's heads are consecutive, then mean-pooling as before. Layers are
calibrated in order, each on the inputs its already-converted predecessors produce.
"""

from __future__ import annotations

import logging
from itertools import combinations

import torch

from kvpilot.engine.strategies.calibration.capture import attention_inputs
from kvpilot.engine.strategies.gqa.convert import mean_pool_heads

log = logging.getLogger("kvpilot.engine.gqa")


def head_distances(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """k, v [T, H, D] -> [H, H]: mean squared distance between heads' keys plus that of their values,
    each relative to its mean squared norm (so K and V weigh alike)."""

    def part(x: torch.Tensor) -> torch.Tensor:
        x = x.double().transpose(0, 1).reshape(x.shape[1], -1)  # [H, T*D]
        d = torch.cdist(x, x).pow(2) / x.shape[1]
        return d / x.pow(2).mean().clamp_min(1e-30)

    return part(k) + part(v)


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


@torch.no_grad()
def regroup_layer(attn: torch.nn.Module, original: dict[str, torch.Tensor], order: list[int], groups: int) -> None:
    """Permute one converted layer's heads to `order` (original KV head indices) and re-merge its K/V
    from the original projections: consecutive runs of the new order become the groups."""
    d = attn.head_dim
    kv_heads = len(order)
    per_kv = attn.num_heads // kv_heads  # query heads per original KV head
    q_rows = _rows(order, per_kv * d).to(attn.q_proj.weight.device)
    attn.q_proj.weight.copy_(attn.q_proj.weight[q_rows])
    if attn.q_proj.bias is not None:
        attn.q_proj.bias.copy_(attn.q_proj.bias[q_rows])
    attn.o_proj.weight.copy_(attn.o_proj.weight[:, q_rows])
    kv_rows = _rows(order, d)
    for proj in ("k_proj", "v_proj"):
        module = getattr(attn, proj)
        for kind in ("weight", "bias"):
            source = original.get(f"{proj}.{kind}")
            if source is None:
                continue
            merged = mean_pool_heads(source[kv_rows].float(), kv_heads, groups)
            getattr(module, kind).copy_(merged.to(getattr(module, kind)))
    attn.kv_head_order = list(order)  # the GQA runtime check reorders the original K/V the same way


@torch.no_grad()
def calibrate_gqa(model: torch.nn.Module, originals: dict[str, torch.Tensor], groups: int, ids: list[int],
                  device: torch.device) -> list[list[int]]:  # fmt: skip
    """Regroup every layer of a mean-pooled GQA model by key similarity on `ids`; the orders, per layer.
    `originals`: the checkpoint's k_proj / v_proj tensors by full name (kept by the load transform)."""
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
        dist = head_distances(k, v)
        order = group_heads(dist, groups)
        size = heads // groups
        by_index = sum(group_cost(dist, list(range(g * size, (g + 1) * size))) for g in range(groups))
        chosen = sum(group_cost(dist, order[g * size : (g + 1) * size]) for g in range(groups))
        log.info("gqa layer %d: merge cost %.4f by similarity vs %.4f by index (groups %s)", index, chosen, by_index,
                 [order[g * size : (g + 1) * size] for g in range(groups)])  # fmt: skip
        regroup_layer(attn, original, order, groups)
        orders.append(order)
    return orders


def _bias(original: dict[str, torch.Tensor], proj: str) -> torch.Tensor | None:
    bias = original.get(f"{proj}.bias")
    return None if bias is None else bias.float()
