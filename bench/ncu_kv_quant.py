"""One launch of each 8-bit decode variant for Nsight Compute (device only):

    ncu --clock-control none -k regex:kernel --section SpeedOfLight --section WarpStateStats \
        python3 bench/ncu_kv_quant.py
"""

from __future__ import annotations

import torch

from bench.kv_quant_variants import D, decode_native, make
from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton as lib

gen = torch.Generator().manual_seed(0)
for mode in ("bf16", "int8"):
    k, v, ks, vs, tables = make(64, 8192, mode, gen)
    q = torch.randn(64, 32, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((64,), 8192, dtype=torch.int32, device="cuda")
    lib(q, k, v, ks, vs, tables, lens, D**-0.5, num_splits=1)
    if mode == "int8":
        lib(q, k, v, ks, vs, tables, lens, D**-0.5, fp16_dots=True, num_splits=1)
        decode_native(q, k, v, ks, vs, tables, lens, block_n=128, splits=1, warps=4, stages=None, kt=False, pv_t=False,
                      pv8=False)
    torch.cuda.synchronize()
