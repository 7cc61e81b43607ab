"""One default launch of the 8-bit decode kernel per cache format, for Nsight Compute (device only):

    ncu --clock-control none -k regex:_paged_decode_quant_kernel --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        python3 bench/ncu_kv_quant.py [--heads-fastest] [--modes=int8,fp8] [--layouts=engine,contiguous]

Batch 64, context 8192, Llama-3-8B attention shapes, caches in the engine's layout (bench_kv_quant).
Each format launches twice: the first compiles (ncu profiles both; read the second).
"""

from __future__ import annotations

import sys

import torch

from bench.bench_kv_quant import D, make_cache
from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton as decode

gen = torch.Generator().manual_seed(0)
extra = {"heads_fastest": True} if "--heads-fastest" in sys.argv else {}
modes = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--modes=")), ["bf16", "int8", "fp8"])
layouts = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--layouts=")), ["engine"])
for mode, layout in ((m, lay) for m in modes for lay in layouts):  # layouts: bench_kv_quant.make_cache
    k, v, ks, vs, tables = make_cache(64, 8192, mode, gen, layout)
    q = torch.randn(64, 32, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((64,), 8192, dtype=torch.int32, device="cuda")
    for _ in range(2):
        decode(q, k, v, ks, vs, tables, lens, D**-0.5, **extra)
    torch.cuda.synchronize()
    del k, v, ks, vs
    torch.cuda.empty_cache()
