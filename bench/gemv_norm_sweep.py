"""The fused small-batch GEMV + add + RMSNorm (kernels/gemv_norm) against what it replaces, at a
model's o_proj and down_proj shapes and M = 1, 2, 4 decode rows.

    PYTHONPATH=. python3 bench/gemv_norm_sweep.py [--shape llama-3-8b] [--m 1,2,4] [--json PATH]

Each point also times the two-level epilogue (GemvConfig.split_epilogue) at the default and the best config.
Per point, timed inside a CUDA graph with the weight rotated over copies (bench/gemm_sweep.graph_time_us,
so L2 holds none of it): `separate` = cuBLAS F.linear + the fused add-RMSNorm kernel (+ the SiLU-and-mul
kernel before down_proj), the engine's path with fused_gemv_rows 0; `fused` = the best launch config of
the grid below; the bound = weight bytes / copy bandwidth measured in the same run. The last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.gemm_sweep import L2_FLUSH_BYTES, graph_time_us, peaks, shapes_of
from kvpilot.engine.kernels import rmsnorm, silu_mul
from kvpilot.engine.kernels.gemv_norm.launcher import GemvConfig, gemv_config, linear_add_rmsnorm_triton

# block_n, block_k, split_k, warps: 30 launches (each a compile per shape: ~60 compiles in all)
GRID = [*itertools.product((8, 16, 32), (128, 256, 512), (1, 2, 4), (4,)), *((16, 512, s, 8) for s in (1, 2, 4))]


def separate(x: torch.Tensor, w: torch.Tensor, res: torch.Tensor, norm_w: torch.Tensor, silu: bool):
    """The engine's ops with fused_gemv_rows 0."""
    if silu:
        gate, up = x.chunk(2, dim=-1)
        x = silu_mul(gate, up)
    return rmsnorm(F.linear(x, w), norm_w, 1e-5, res)


def fused(cfg: GemvConfig, x: torch.Tensor, w: torch.Tensor, res: torch.Tensor, norm_w: torch.Tensor, silu: bool):
    return linear_add_rmsnorm_triton(x, w, res, norm_w, 1e-5, silu, cfg)


def fixed(op, res: torch.Tensor, norm_w: torch.Tensor, silu: bool, x: torch.Tensor, w: torch.Tensor):
    """op(x, w, res, norm_w, silu) as graph_time_us calls it: fn(x, w)."""
    return op(x, w, res, norm_w, silu)


def time_fused(cfg: GemvConfig, *, x: torch.Tensor, weights: list[torch.Tensor], res: torch.Tensor,
               norm_w: torch.Tensor, silu: bool, want: list[torch.Tensor], label: str) -> float | None:
    """Graph time of the fused kernel at cfg (us); None, printed, when it fails or is wrong."""
    fn = functools.partial(fixed, functools.partial(fused, cfg), res, norm_w, silu)
    try:
        got = fn(x, weights[0])
        err = max(((g.float() - w).norm() / w.norm()).item() for g, w in zip(got, want, strict=True))
        us = graph_time_us(fn, weights, x)
    except Exception as exc:  # out of registers / shared memory for this tile
        print(f"  {label} {cfg}: {type(exc).__name__} {str(exc)[:80]}")
        return None
    if err > 2e-2:
        print(f"  {label} {cfg}: WRONG (relative error {err:.3g})")
        return None
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="llama-3-8b")
    parser.add_argument("--m", default="1,2,4")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw, _ = peaks()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    shapes = shapes_of(args.shape)
    points = []
    for name, silu in (("o", False), ("down", True)):
        n, k = shapes[name]
        bytes_w = n * k * 2
        copies = max(1, -(-L2_FLUSH_BYTES // bytes_w))
        weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for _ in range(copies)]
        norm_w = torch.ones(n, dtype=torch.bfloat16, device="cuda")
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, 2 * k if silu else k, dtype=torch.bfloat16, device="cuda")
            res = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
            want = [t.float() for t in separate(x, weights[0], res, norm_w, silu)]  # (normed, sum)
            timed = functools.partial(time_fused, x=x, weights=weights, res=res, norm_w=norm_w, silu=silu,
                                      want=want, label=f"{name} m={m}")  # fmt: skip
            row = {"shape": name, "n": n, "k": k, "m": m, "bound_us": round(bytes_w / copy_bw * 1e6, 2),
                   "separate_us": round(graph_time_us(functools.partial(fixed, separate, res, norm_w, silu), weights, x), 2)}
            default = dataclasses.replace(gemv_config(n, k, x.device), split_epilogue=False)
            results = {}
            for block_n, block_k, split, warps in GRID:
                us = timed(GemvConfig(block_n=block_n, block_k=block_k, split_k=split, num_warps=warps))
                if us is not None:
                    results[(block_n, block_k, split, warps)] = us
            best = min(results, key=results.get)
            key = (default.block_n, default.block_k, default.split_k, default.num_warps)
            best_cfg = GemvConfig(block_n=best[0], block_k=best[1], split_k=best[2], num_warps=best[3])
            # the two-level epilogue (kernel.py SPLIT_EPILOGUE) at the default and at the grid's best
            split_default = timed(dataclasses.replace(default, split_epilogue=True))
            split_best = timed(dataclasses.replace(best_cfg, split_epilogue=True))
            row.update({"fused_us": round(results[best], 2), "fused_config": "n{}k{}s{}w{}".format(*best),
                        "default_config_us": round(results.get(key, float("nan")), 2),
                        "split_epilogue_default_us": split_default and round(split_default, 2),
                        "split_epilogue_best_us": split_best and round(split_best, 2)})
            print(f"{name} [{n} x {k}] m={m}: bound {row['bound_us']} us, separate {row['separate_us']}, fused best "
                  f"{row['fused_us']} ({row['fused_config']}), fused default {row['default_config_us']}; split "
                  f"epilogue: default {row['split_epilogue_default_us']}, best {row['split_epilogue_best_us']}",
                  flush=True)  # fmt: skip
            points.append(row)
    record = {"bench": "gemv_norm_sweep", "shape": args.shape, "copy_gbps": round(copy_bw / 1e9), "points": points}
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
