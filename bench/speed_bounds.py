"""Same-run bounds for the engine-speed figures of a named shape (docs/benchmarks.md, issue 30).

    PYTHONPATH=. python3 bench/speed_bounds.py [--shape llama-3-8b] [--kv-bytes 2]

Measures on this GPU the device-to-device copy bandwidth (read + write bytes per second, best of 20,
4 GiB) and a bf16 GEMM rate (a prefill-sized [8192 x 4096] x [4096 x 14336], best of 20), then gives:
- the bytes bound of a decode step: weights + the K/V it reads, at the copy bandwidth, for batch 1 at
  context 512 and batch 256 at context 700;
- the bound of `kvpilot bench offline`'s workload (256 requests, lengths uniform in [100, 1024], seed 0):
  every request runs at once (max_num_seqs 256), so decode step i reads the weights once and the K/V of
  every request still generating at its context then; prefill is counted at the GEMM rate (2 FLOP per
  weight per prompt token). Last line: JSON.
- a per-kernel roofline of the same workload (`offline_roofline_tok_s`): a decode step's GEMMs take
  max(their weight bytes at the copy bandwidth, their FLOPs at the GEMM rate) (at batch ~190 and
  above the GEMMs of this shape are FLOP-bound, which the bytes bound ignores), its attention the K/V
  bytes at the copy bandwidth, and the embedding table is gathered, not read; prefill adds the causal
  attention FLOPs to the GEMMs'. Kernels are taken to run back to back at their own bound.
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.hf_generate_baseline import hbm_copy_gbps
from kvpilot.bench.shapes import _COMMON, SHAPES
from kvpilot.bench.workload import DEFAULT_LENGTHS, DEFAULT_NUM_REQUESTS, random_requests


def gemm_tflops(m: int = 8192, k: int = 4096, n: int = 14336, reps: int = 20) -> float:
    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
    a @ b
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * m * k * n / best / 1e12


def weight_count(c: dict) -> int:
    h, inter, layers, d = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["head_dim"]
    attn = h * d * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    return layers * (attn + 3 * h * inter + 2 * h) + 2 * c["vocab_size"] * h + h


def roofline_seconds(c: dict, reqs: list, copy: float, flops: float, kv_token: float) -> float:
    """The offline workload at each kernel class's own bound (module docstring); copy in B/s, flops in FLOP/s."""
    gemm_params = weight_count(c) - c["vocab_size"] * c["hidden_size"]  # the embedding is gathered, not multiplied
    attn_flops_per_pair = 4 * c["num_hidden_layers"] * c["num_attention_heads"] * c["head_dim"]  # QK^T and PV
    total = 0.0
    for i in range(max(r.max_tokens for r in reqs)):
        live = [len(r.prompt) + i for r in reqs if r.max_tokens > i]
        total += max(2 * gemm_params / copy, 2 * gemm_params * len(live) / flops) + sum(live) * kv_token / copy
    prompts = [len(r.prompt) for r in reqs]
    return total + 2 * gemm_params * sum(prompts) / flops + sum(attn_flops_per_pair * n * n / 2 for n in prompts) / flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    parser.add_argument("--kv-bytes", type=float, default=2.0, help="bytes per cached K/V element (int8: ~1.03)")
    args = parser.parse_args()
    c = {**_COMMON, **SHAPES[args.shape]}
    copy = hbm_copy_gbps(4.0) * 1e9
    tflops = gemm_tflops()
    weights = weight_count(c) * 2
    kv_token = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * args.kv_bytes

    def step_ms(batch: int, context: int) -> float:
        return (weights + batch * context * kv_token) / copy * 1e3

    reqs = random_requests(DEFAULT_NUM_REQUESTS, DEFAULT_LENGTHS, DEFAULT_LENGTHS, c["vocab_size"], 0)
    prompt_tokens = sum(len(r.prompt) for r in reqs)
    output_tokens = sum(r.max_tokens for r in reqs)
    decode_s = 0.0
    for i in range(max(r.max_tokens for r in reqs)):
        live = [len(r.prompt) + i for r in reqs if r.max_tokens > i]
        decode_s += (weights + sum(live) * kv_token) / copy
    prefill_s = 2 * (weights / 2) * prompt_tokens / (tflops * 1e12)
    roofline_s = roofline_seconds(c, reqs, copy, tflops * 1e12, kv_token)
    record = {"bench": "speed_bounds", "shape": args.shape, "gpu": torch.cuda.get_device_name(),
              "copy_gbps": round(copy / 1e9, 1), "gemm_tflops": round(tflops, 1), "weights_gb": round(weights / 1e9, 2),
              "batch1_ctx512_step_ms": round(step_ms(1, 512), 3), "batch256_ctx700_step_ms": round(step_ms(256, 700), 3),
              "offline_decode_s": round(decode_s, 3), "offline_prefill_s": round(prefill_s, 3),
              "offline_bound_tok_s": round(output_tokens / (decode_s + prefill_s), 1),
              "offline_roofline_s": round(roofline_s, 3),
              "offline_roofline_tok_s": round(output_tokens / roofline_s, 1),
              "offline_output_tokens": output_tokens, "kv_bytes": args.kv_bytes}  # fmt: skip
    print(f"copy {record['copy_gbps']:.0f} GB/s, GEMM {tflops:.0f} TFLOP/s; decode step bounds: batch 1 @ 512 "
          f"{record['batch1_ctx512_step_ms']} ms, batch 256 @ 700 {record['batch256_ctx700_step_ms']} ms; offline "
          f"workload bound {record['offline_bound_tok_s']:.0f} output tok/s (per-kernel roofline "
          f"{record['offline_roofline_tok_s']:.0f})")
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
