"""Triton twin of align.align_by_expert for a step's few assignments (decode): one launch, not ~25.

Program e counts every expert's assignments (a one-hot sum over chunks of the ids), places its own
after the padded runs of experts 0..e-1 in assignment order (a running cumsum of matches), marks
its pad rows and its blocks; program 0 writes the padded total. Rows and blocks past that total
are left unwritten: the GEMM kernels never read them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvpilot.engine.kernels.interpreter_compat import patch_interpreter

patch_interpreter()  # the block loop's bound is a tensor (NumPy >= 2.4 under the interpreter)


@triton.jit(do_not_specialize=["num_valid"])
def _align_kernel(
    ids_ptr, sorted_ids_ptr, block_experts_ptr, num_padded_ptr, num_valid,
    BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):
    e = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, num_valid, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_valid, other=-1)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start_e = tl.sum(tl.where(experts < e, padded, 0), axis=0)
    count_e = tl.sum(tl.where(experts == e, counts, 0), axis=0)
    padded_e = tl.sum(tl.where(experts == e, padded, 0), axis=0)
    if e == 0:
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    running = tl.zeros([], dtype=tl.int32)
    for start in range(0, num_valid, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_valid, other=-1)
        match = (ids == e).to(tl.int32)
        rank = running + tl.cumsum(match, axis=0) - 1
        tl.store(sorted_ids_ptr + start_e + rank, offs, mask=match > 0)
        running += tl.sum(match, axis=0)
    pad = count_e + tl.arange(0, BLOCK_M)
    tl.store(sorted_ids_ptr + start_e + pad, tl.full([BLOCK_M], 0, tl.int32) + num_valid, mask=pad < padded_e)
    first = start_e // BLOCK_M
    for b in range(0, padded_e // BLOCK_M):
        tl.store(block_experts_ptr + first + b, e)
