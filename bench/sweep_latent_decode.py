"""Launch-parameter sweep of the latent decode kernels beside exact paged attention, alone, on the GPU.

    python bench/sweep_latent_decode.py --shapes 64x2048,32x8192 [--rank 256 --rope-dims 16]

Llama-3-8B attention shapes (32 query heads, 8 KV heads of 128), bf16, pages of 16 tokens. For each shape
(batch x context) it times (median of 30 CUDA-event timed calls after 3 warm-ups):
- exact paged decode (kernels/paged_decode with its default launch), the speed to match;
- `mla_decode` for the absorbed partial-RoPE conversion (rows r + Hkv x R) over block_h, block_n, warps,
  stages and split counts;
- `mla_conversion` (RoPE on every dim) over block_n, warps, stages and split counts;
and prints the defaults' time and the five fastest launches of each.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from kvpilot.engine.kernels.mla_conversion.kernel import mla_conversion_decode_triton
from kvpilot.engine.kernels.mla_decode.kernel import mla_decode_triton
from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton


def median_us(fn, calls: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def sweep(name: str, default, grid: dict[str, list], defaults_only: bool) -> None:
    base = median_us(default)
    if defaults_only:
        print(f"{name}: default {base:.1f} us")
        return
    results = []
    for values in itertools.product(*grid.values()):
        launch = dict(zip(grid, values, strict=True))
        try:
            results.append((median_us(lambda launch=launch: default(**launch)), launch))
        except Exception as exc:
            print(f"  {name} {launch}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    results.sort(key=lambda r: r[0])
    print(f"{name}: default {base:.1f} us; fastest:")
    for us, launch in results[:5]:
        print(f"    {us:8.1f} us  {launch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x2048,32x8192")
    parser.add_argument("--rank", type=int, default=256)
    parser.add_argument("--rope-dims", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a smaller grid")
    parser.add_argument("--defaults", action="store_true", help="only exact decode and the default launches")
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        batch, ctx = (int(x) for x in shape.split("x"))
        sweep_shape(batch, ctx, args)


def sweep_shape(batch: int, ctx: int, args: argparse.Namespace) -> None:
    dev, dt, page = torch.device("cuda"), torch.bfloat16, 16
    heads, kv_heads, head_dim, rank, rope = 32, 8, 128, args.rank, args.rope_dims
    scale = head_dim**-0.5
    torch.manual_seed(0)
    per_seq = -(-ctx // page)
    tables = torch.arange(batch * per_seq, device=dev, dtype=torch.int32).view(batch, per_seq)
    lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
    print(f"=== batch {batch}, context {ctx}")

    k = torch.randn(batch * per_seq, page, kv_heads, head_dim, device=dev, dtype=dt)
    v = torch.randn_like(k)
    q = torch.randn(batch, heads, head_dim, device=dev, dtype=dt)
    us = median_us(lambda: paged_attention_decode_triton(q, k, v, tables, lens, scale))
    print(f"exact paged decode: {us:.1f} us ({k.numel() * 4 / (us * 1e-6) / 1e12:.2f} TB/s)")

    rows = torch.randn(batch * per_seq, page, rank + kv_heads * rope, device=dev, dtype=dt) * 0.3
    q_lat = torch.randn(batch, heads, rank, device=dev, dtype=dt)
    q_pe = torch.randn(batch, heads, rope, device=dev, dtype=dt)

    def absorbed(**launch):
        return mla_decode_triton(q_lat, q_pe, rows, tables, lens, scale, pe_group=rope, **launch)

    sweep("mla_decode (partial RoPE, absorbed)", absorbed, {
        "block_h": [16, 32], "block_n": [32, 64] if args.quick else [16, 32, 64, 128],
        "num_warps": [4, 8], "num_stages": [2, 3] if args.quick else [1, 2, 3, 4],
        "num_splits": [1, 2, 4, 8, 16],
    }, args.defaults)  # fmt: skip

    cache = torch.randn(batch * per_seq, page, rank, device=dev, dtype=dt) * 0.3
    up_k = torch.randn(kv_heads * head_dim, rank, device=dev, dtype=dt) * rank**-0.5
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=dev, dtype=torch.float32) / head_dim))

    def converted(**launch):
        return mla_conversion_decode_triton(
            q, cache, up_k, None, inv_freq, tables, lens, scale, kv_heads, **launch
        )

    sweep("mla_conversion (RoPE on every dim)", converted, {
        "block_n": [32, 64] if args.quick else [16, 32, 64], "num_warps": [4, 8], "num_stages": [1, 2, 3],
        "num_splits": [1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16],
    }, args.defaults)  # fmt: skip


if __name__ == "__main__":
    main()
