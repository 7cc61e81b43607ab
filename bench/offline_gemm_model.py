"""What the offline workload's decode would cost with the GEMMs as a sweep measured them (no GPU needed).

    PYTHONPATH=. python3 bench/offline_gemm_model.py gemm_sweep.json [--attention-efficiency 0.87] [--copy-gbps 4160]

Reads bench/gemm_sweep.py's JSON (cuBLAS and bound µs per GEMM shape and M), replays the batch sizes and
contexts of `kvpilot bench offline --shape llama-3-8b`'s requests (256, lengths uniform in [100, 1024], seed 0)
step by step, and sums per step the layer GEMMs (x32) and the LM head at the step's batch padded as the CUDA
graphs pad it (to 16), interpolated between measured M, and the K/V bytes attention reads (128 KiB a token)
at copy speed and at the given efficiency. Prints the sums in seconds: the floor the GEMMs leave.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from kvpilot.bench.workload import random_requests

LAYERS, KV_BYTES_PER_TOKEN = 32, 131072


def interpolate(table: dict[int, float], m: int) -> float:
    ms = sorted(table)
    m = min(max(m, ms[0]), ms[-1])
    for lo, hi in itertools.pairwise(ms):
        if lo <= m <= hi:
            return table[lo] + (table[hi] - table[lo]) * (m - lo) / (hi - lo)
    return table[ms[-1]]


def step_gemm_ms(tables: dict[str, dict[int, float]], batch: int) -> float:
    m = -(-batch // 16) * 16 if batch > 8 else batch
    layer = sum(interpolate(tables[s], m) for s in ("qkv", "o", "gate_up", "down"))
    return (layer * LAYERS + interpolate(tables["lm_head"], m)) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_json")
    parser.add_argument("--attention-efficiency", type=float, default=0.87)
    parser.add_argument("--copy-gbps", type=float, default=None, help="default: the sweep's own copy figure")
    args = parser.parse_args()
    record = json.loads(Path(args.sweep_json).read_text())
    copy = (args.copy_gbps or record["copy_gbps"]) * 1e9
    cublas: dict[str, dict[int, float]] = {}
    bound: dict[str, dict[int, float]] = {}
    for p in record["points"]:
        cublas.setdefault(p["shape"], {})[p["m"]] = p["cublas_us"]
        bound.setdefault(p["shape"], {})[p["m"]] = p["bound_us"]
    requests = random_requests(256, (100, 1024), (100, 1024), 128256, seed=0)
    sums = dict.fromkeys(("gemm_cublas_s", "gemm_bound_s", "attention_copy_s", "attention_kernel_s"), 0.0)
    steps = 0
    for t in range(1, 1 + max(r.max_tokens for r in requests)):
        contexts = [len(r.prompt) + t for r in requests if r.max_tokens > t]
        if not contexts:
            break
        steps += 1
        sums["gemm_cublas_s"] += step_gemm_ms(cublas, len(contexts)) / 1e3
        sums["gemm_bound_s"] += step_gemm_ms(bound, len(contexts)) / 1e3
        seconds = sum(contexts) * KV_BYTES_PER_TOKEN / copy
        sums["attention_copy_s"] += seconds
        sums["attention_kernel_s"] += seconds / args.attention_efficiency
    print(json.dumps({"bench": "offline_gemm_model", "decode_steps": steps, **{k: round(v, 2) for k, v in sums.items()}}))


if __name__ == "__main__":
    main()
