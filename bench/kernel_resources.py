"""Registers, spills and time per call of the latent decode kernels, alone, at the engine bench's shapes.

    python bench/kernel_resources.py [--batch 64 --context 2048 --rank 256]

Llama-3-8B attention shapes (32 query heads, 8 KV heads of 128) converted at latent rank r:
- `mla_conversion` (RoPE on every dim: keys decompressed and rotated in the program, values absorbed);
- `mla_decode` with a 16-dim RoPE part per KV head (the absorbed partial-RoPE conversion: rows of r + Hkv x 16).
Prints each compiled variant's registers per thread and spilled bytes (Triton's CompiledKernel), the
median time per call (CUDA events, 50 calls after 3 warm-ups) and the bytes the call must read at least
(the latent cache), as a fraction of the H200's 4.8 TB/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from kvpilot.engine.kernels.mla_conversion.kernel import (
    _mla_conversion_decode_kernel,
    mla_conversion_decode_triton,
)
from kvpilot.engine.kernels.mla_decode.kernel import _mla_decode_kernel, mla_decode_triton

sys.path.insert(0, str(Path(__file__).parent))
from sweep_latent_decode import median_us

HBM_BYTES_PER_S = 4.8e12


def median_ms(fn) -> float:
    return median_us(fn, calls=50) / 1e3


def compiled_variants(kernel) -> list[tuple[str, int, int]]:
    """(name, registers, spills) of every variant the JIT function compiled so far."""
    rows = []
    for caches in kernel.device_caches.values():
        for cache in caches:
            if not isinstance(cache, dict):
                continue
            for compiled in cache.values():
                if hasattr(compiled, "_init_handles"):
                    compiled._init_handles()
                if hasattr(compiled, "n_regs"):
                    rows.append((compiled.name, compiled.n_regs, compiled.n_spills))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--rank", type=int, default=256)
    parser.add_argument("--rope-dims", type=int, default=16)
    parser.add_argument("--page", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    batch, ctx, rank, heads, kv_heads, head_dim = args.batch, args.context, args.rank, 32, 8, 128
    blocks_per_seq = -(-ctx // args.page)
    tables = torch.arange(batch * blocks_per_seq, device=dev, dtype=torch.int32).view(batch, blocks_per_seq)
    lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
    scale = head_dim**-0.5

    # RoPE on every dim: one latent of width r per token per KV head ([blocks, page, Hkv*r] as the engine
    # lays it out per head: the kernel reads [blocks, page, r] per KV head; here one head's worth x Hkv).
    cache = torch.randn(batch * blocks_per_seq, args.page, rank, device=dev, dtype=dt) * 0.3
    q = torch.randn(batch, heads, head_dim, device=dev, dtype=dt)
    up_k = torch.randn(kv_heads * head_dim, rank, device=dev, dtype=dt) * rank**-0.5
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=dev, dtype=torch.float32) / head_dim))
    ms = median_ms(
        lambda: mla_conversion_decode_triton(q, cache, up_k, None, inv_freq, tables, lens, scale, kv_heads)
    )
    read = cache.element_size() * batch * ctx * rank
    print(
        f"mla_conversion  B={batch} ctx={ctx} r={rank}: {ms * 1e3:8.1f} us/call, reads >= {read / 1e6:.1f} MB "
        f"({read / (ms * 1e-3) / HBM_BYTES_PER_S:.1%} of HBM)"
    )
    for name, regs, spills in compiled_variants(_mla_conversion_decode_kernel):
        print(f"  {name}: {regs} registers/thread, {spills} B spilled")

    # Partial RoPE, absorbed: row [c (r) ; k_rope of every KV head (Hkv x R)], one per token.
    width = rank + kv_heads * args.rope_dims
    cache_p = torch.randn(batch * blocks_per_seq, args.page, width, device=dev, dtype=dt) * 0.3
    q_lat = torch.randn(batch, heads, rank, device=dev, dtype=dt)
    q_pe = torch.randn(batch, heads, args.rope_dims, device=dev, dtype=dt)
    ms = median_ms(
        lambda: mla_decode_triton(q_lat, q_pe, cache_p, tables, lens, scale, pe_group=args.rope_dims)
    )
    read = cache_p.element_size() * batch * ctx * width
    print(
        f"mla_decode      B={batch} ctx={ctx} r={rank}+{kv_heads}x{args.rope_dims}: {ms * 1e3:8.1f} us/call, "
        f"reads >= {read / 1e6:.1f} MB ({read / (ms * 1e-3) / HBM_BYTES_PER_S:.1%} of HBM)"
    )
    # Exact attention's paged decode reads 2 x Hkv x D per token: its floor at the same shapes.
    exact = 2 * kv_heads * head_dim * 2 * batch * ctx
    print(
        f"exact attention would read {exact / 1e6:.1f} MB: {exact / HBM_BYTES_PER_S * 1e6:.1f} us at 4.8 TB/s"
    )
    for name, regs, spills in compiled_variants(_mla_decode_kernel):
        print(f"  {name}: {regs} registers/thread, {spills} B spilled")


if __name__ == "__main__":
    main()
