"""cuBLAS against the Triton GEMM (bench/triton_gemm.py) at a model's decode GEMM shapes, M = decode batch.

    PYTHONPATH=. python3 bench/gemm_sweep.py [--shape llama-3-8b] [--m 1,16,...,256] [--json PATH]

Each (weight shape, M) is timed as the engine runs it: inside a CUDA graph (no launch overhead), the
weight rotated over enough copies that L2 (~60 MB) holds none of them from one call to the next, as
between a model's layers. Per point: cuBLAS (F.linear), cuBLASLt (preferred_blas_library), and every
Triton config of the grid below; the best Triton config, its time against cuBLAS's, and the bound
max(bytes / copy bandwidth, FLOPs / GEMM peak) with both measured in the same run. The cuBLAS kernel
names (their tile sizes) are printed once per point. The last line is the JSON record.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.triton_gemm import GemmConfig, gemv_triton, linear_triton

L2_FLUSH_BYTES = 256 << 20
GRID = [  # (block_n, block_k, num_stages, num_warps)
    (128, 64, 4, 4), (128, 128, 3, 8), (64, 128, 4, 4), (256, 64, 3, 8), (64, 64, 5, 4), (128, 64, 5, 8),
]


def shapes_of(name: str) -> dict[str, tuple[int, int]]:
    from kvpilot.bench.shapes import SHAPES

    c = SHAPES[name]
    hidden, inter, heads, kv, vocab = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                                       c["num_key_value_heads"], c["vocab_size"])  # fmt: skip
    dim = c.get("head_dim", hidden // heads)
    return {"qkv": ((heads + 2 * kv) * dim, hidden), "o": (hidden, heads * dim), "gate_up": (2 * inter, hidden),
            "down": (hidden, inter), "lm_head": (vocab, hidden)}  # fmt: skip


def graph_replay_us(call, calls: int, reps: int = 3) -> float:
    """Median µs per call of call(0), ..., call(calls - 1) captured in one CUDA graph (after one eager pass)."""
    for i in range(calls):
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def graph_time_us(fn, weights: list[torch.Tensor], x: torch.Tensor, reps: int = 3) -> float:
    """Median per-call µs of fn(x, w) over the copies, captured in one CUDA graph."""
    return graph_replay_us(lambda i: fn(x, weights[i % len(weights)]), max(len(weights), 8), reps)


def cublas_kernels(x: torch.Tensor, w: torch.Tensor) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        F.linear(x, w)
        torch.cuda.synchronize()
    return sorted({e.name[:90] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def peaks() -> tuple[float, float]:
    """(copy bytes/s read + write, bf16 GEMM FLOP/s), best of a few, as bench/speed_bounds.py measures."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    a = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(4096, 14336, dtype=torch.bfloat16, device="cuda")
    best_copy = best_mm = 0.0
    for _ in range(10):
        for kind in ("copy", "mm"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src) if kind == "copy" else a @ b
            end.record()
            end.synchronize()
            s = start.elapsed_time(end) / 1e3
            if kind == "copy":
                best_copy = max(best_copy, 2 * src.numel() / s)
            else:
                best_mm = max(best_mm, 2 * 8192 * 4096 * 14336 / s)
    del src, dst, a, b
    return best_copy, best_mm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="llama-3-8b")
    parser.add_argument("--m", default="1,16,32,64,96,128,160,192,224,256")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    copy_bw, gemm_peak = peaks()
    print(f"copy {copy_bw / 1e9:.0f} GB/s, bf16 GEMM {gemm_peak / 1e12:.0f} TFLOP/s", flush=True)
    ms = [int(v) for v in args.m.split(",")]
    points = []
    for name, (n, k) in shapes_of(args.shape).items():
        bytes_w = n * k * 2
        copies = max(1, -(-L2_FLUSH_BYTES // bytes_w))
        weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for _ in range(copies)]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            bound_us = max((bytes_w + 2 * m * (k + n)) / copy_bw, 2 * m * n * k / gemm_peak) * 1e6
            ref = F.linear(x, weights[0]).float()
            row = {"shape": name, "n": n, "k": k, "m": m, "bound_us": round(bound_us, 2)}
            row["cublas_us"] = round(graph_time_us(F.linear, weights, x), 2)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            row["cublaslt_us"] = round(graph_time_us(F.linear, weights, x), 2)
            torch.backends.cuda.preferred_blas_library("cublas")
            row["cublas_kernels"] = cublas_kernels(x, weights[0])
            best = None
            for block_m, (block_n, block_k, stages, warps), split in itertools.product(
                    sorted({max(16, min(64, 1 << (m - 1).bit_length())), 64, 128}), GRID, (1, 2, 4)):  # fmt: skip
                if m < 16 or (block_m > 64 and m <= 64) or (split > 1 and k < 8192 and n > 8192):
                    continue
                config = GemmConfig(block_m, block_n, block_k, 8, split, warps, stages)
                try:
                    err = (linear_triton(x, weights[0], config).float() - ref).abs().max().item()
                    us = graph_time_us(lambda a, w, c=config: linear_triton(a, w, c), weights, x)
                except Exception as exc:  # out of shared memory / registers for this tile: skip it
                    print(f"  {name} m={m} {config.label()}: {type(exc).__name__} {str(exc)[:80]}")
                    continue
                if err > 0.05 * ref.abs().max().item() + 1e-2:
                    print(f"  {name} m={m} {config.label()}: WRONG (max err {err:.3g})")
                    continue
                if best is None or us < best[0]:
                    best = (us, config)
            if m == 1:  # one row: the GEMV kernel instead of tiles (tl.dot needs 16 rows)
                for block_n, block_k, warps in itertools.product((8, 16, 32), (256, 512, 1024), (4, 8)):
                    label = f"gemv n{block_n}k{block_k}w{warps}"
                    fn = lambda a, w, c=(block_n, block_k, warps): gemv_triton(a, w, *c, 3)  # noqa: E731
                    err = (fn(x, weights[0]).float() - ref).abs().max().item()
                    if err > 0.05 * ref.abs().max().item() + 1e-2:
                        print(f"  {name} m=1 {label}: WRONG (max err {err:.3g})")
                        continue
                    us = graph_time_us(fn, weights, x)
                    if best is None or us < best[0]:
                        best = (us, label)
            if best is not None:
                row["triton_us"] = round(best[0], 2)
                row["triton_config"] = best[1] if isinstance(best[1], str) else best[1].label()
            points.append(row)
            t = row.get("triton_us", float("nan"))
            print(f"{name:8s} N={n:6d} K={k:5d} M={m:4d}: bound {bound_us:7.1f} us, cuBLAS {row['cublas_us']:7.1f} "
                  f"(Lt {row['cublaslt_us']:7.1f}), Triton {t:7.1f} {row.get('triton_config', '')} "
                  f"[{row['cublas_us'] / t:.2f}x]  {' | '.join(row['cublas_kernels'])[:150]}", flush=True)
        del weights
        torch.cuda.empty_cache()
    record = {"bench": "gemm_sweep", "shape": args.shape, "copy_gbps": round(copy_bw / 1e9), "gemm_tflops":
              round(gemm_peak / 1e12), "points": points}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
