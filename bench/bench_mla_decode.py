"""MLA absorbed decode kernel GB/s on DeepSeek-V2-Lite shapes, against the copy bandwidth of the same run.

    PYTHONPATH=. python3 bench/bench_mla_decode.py [--json PATH]

16 heads, kv_lora_rank 512, qk_rope_head_dim 64, bf16 latent cache in blocks of 16, shuffled block
tables, batch 64, context 4096. GB/s counts the latent cache bytes read (each token's 576 values
once per sequence: all heads share them) plus q and the output. The copy roofline is a
device-to-device torch copy of 2 GiB (bytes read + written). A small sweep over the split count and
tile sizes is printed; the default launcher choice is marked.
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from kvpilot.engine.kernels.mla_decode.kernel import mla_decode_triton
from kvpilot.engine.kernels.mla_decode.reference import mla_decode_reference

HEADS, RANK, ROPE, PAGE = 16, 512, 64, 16
BATCH, CTX = 64, 4096


def copy_bandwidth() -> float:
    src = torch.empty(2**30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100)
    return 2 * src.numel() * 2 / ms / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    copy_gbs = copy_bandwidth()
    blocks = BATCH * CTX // PAGE
    cache = torch.randn(blocks, PAGE, RANK + ROPE, device="cuda", dtype=torch.bfloat16)
    tables = torch.randperm(blocks, device="cuda").to(torch.int32).view(BATCH, CTX // PAGE)
    q_lat = (torch.randn(BATCH, HEADS, RANK, device="cuda") * 0.05).to(torch.bfloat16)
    q_pe = torch.randn(BATCH, HEADS, ROPE, device="cuda", dtype=torch.bfloat16)
    ctx = torch.full((BATCH,), CTX, dtype=torch.int32, device="cuda")
    scale = (128 + ROPE) ** -0.5
    sub = slice(0, 2)
    want = mla_decode_reference(q_lat[sub], q_pe[sub], cache, tables[sub], ctx[sub], scale)
    got = mla_decode_triton(q_lat[sub], q_pe[sub], cache, tables[sub], ctx[sub], scale)
    err = float((got.float() - want).norm() / want.norm())
    total = BATCH * CTX * (RANK + ROPE) * 2 + 2 * q_lat.numel() * 2 + q_pe.numel() * 2
    rows = []
    sweep = [(None, None, None, None), (8, 64, 8, None), (8, 64, 4, None), (4, 64, 8, None), (12, 64, 8, None),
             (16, 64, 8, None), (8, 64, 8, 2), (16, 64, 8, 2), (8, 128, 8, 2), (16, 128, 8, 2), (8, 32, 4, None)]
    for splits, block_n, warps, stages in sweep:
        kwargs = {"num_splits": splits, "num_warps": warps, "num_stages": stages}
        if block_n is not None:
            kwargs["block_n"] = block_n
        try:
            ms = do_bench(lambda kw=kwargs: mla_decode_triton(q_lat, q_pe, cache, tables, ctx, scale, **kw),
                          warmup=25, rep=200)
        except Exception as exc:
            print(f"{kwargs} failed: {type(exc).__name__}")
            continue
        rows.append({"num_splits": splits or "default", "block_n": block_n or "default", "warps": warps or "default",
                     "stages": stages or "default", "us": ms * 1e3, "GB/s": total / ms / 1e6,
                     "of_copy": total / ms / 1e6 / copy_gbs})
    print(f"copy bandwidth (read+write): {copy_gbs:.0f} GB/s; kernel rel err vs fp32 reference: {err:.1e}")
    print("| num_splits | block_n | warps | stages | us | GB/s | of copy bandwidth |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['num_splits']} | {r['block_n']} | {r['warps']} | {r['stages']} | {r['us']:.1f} | {r['GB/s']:.0f} "
              f"| {r['of_copy']:.0%} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_GB/s": copy_gbs, "rel_err": err, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
