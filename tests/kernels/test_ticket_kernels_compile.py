"""The ticket kernels (kernels/tickets.py) compiled for Hopper (sm_90) on this machine, without a GPU:
Triton's own ptxas builds them, and the PTX must hold the protocol the interpreter cannot show: a CTA
barrier, one predicated acquire-release atomic at GPU scope, and the reduction's loads past L1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.kernels

SCRIPT = r'''
import inspect, json, os
os.environ.pop("TRITON_INTERPRET", None)
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kvpilot.engine.kernels.gemv_norm.kernel import _gemv_norm_kernel
from kvpilot.engine.kernels.paged_decode.kernel import _paged_decode_kernel
from kvpilot.engine.kernels.paged_prefill.kernel import _paged_prefill_kernel

def ptx(jit_fn, types, constexprs):
    names = inspect.signature(jit_fn.fn).parameters
    sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    src = ASTSource(fn=jit_fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3}).asm["ptx"]

ptrs = {n: "*bf16" for n in ("x_ptr", "w_ptr", "res_ptr", "norm_w_ptr", "out_ptr", "sum_ptr", "q_ptr", "k_cache_ptr",
                             "v_cache_ptr", "o_ptr")}
ptrs.update({"partial_ptr": "*fp32", "partial_o_ptr": "*fp32", "partial_lse_ptr": "*fp32", "counter_ptr": "*i32",
             "block_tables_ptr": "*i32", "context_lens_ptr": "*i32", "cu_seqlens_q_ptr": "*i32", "eps": "fp32", "qk_scale_log2": "fp32",
             "block_sq_ptr": "*fp32", "block_counter_ptr": "*i32"})
out = {
    "gemv_norm": ptx(_gemv_norm_kernel, ptrs, {"SILU_INPUT": True, "SPLIT_K": 2, "BLOCK_N": 16, "BLOCK_K": 256,
                                               "BLOCK_ROW": 4096, "SPLIT_EPILOGUE": False, "BLOCK_BLOCKS": 1}),
    "gemv_norm_split": ptx(_gemv_norm_kernel, ptrs, {"SILU_INPUT": False, "SPLIT_K": 2, "BLOCK_N": 16, "BLOCK_K": 512,
                                                     "BLOCK_ROW": 4096, "SPLIT_EPILOGUE": True, "BLOCK_BLOCKS": 256}),
    "paged_decode_fold": ptx(_paged_decode_kernel, ptrs, {"NUM_HEADS": 32, "GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128,
                             "BLOCK_SIZE": 16, "BLOCK_N": 64, "NUM_SPLITS": 8, "DOT_DTYPE": tl.bfloat16,
                             "DOT_PRECISION": "ieee", "FOLD": True}),
    # no ticket: compiled for sm_90 so that the sliding window's runtime loop bounds build outside the interpreter
    "paged_prefill": ptx(_paged_prefill_kernel, ptrs, {"GROUP": 4, "GROUP_PAD": 4, "HEAD_DIM": 128, "BLOCK_SIZE": 16,
                         "BLOCK_Q": 16, "BLOCK_N": 64, "DOT_DTYPE": tl.bfloat16, "DOT_PRECISION": "ieee"}),
}
print(json.dumps(out))
'''


def test_the_ticket_protocol_compiles_for_hopper() -> None:
    import json

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("this triton wheel carries no ptxas: cannot build for sm_90 here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    tickets = {"gemv_norm": 1, "paged_decode_fold": 1, "gemv_norm_split": 2, "paged_prefill": 0}  # the split epilogue: block, then row
    for name, ptx in json.loads(result.stdout.strip().splitlines()[-1]).items():
        lines = [line.strip() for line in ptx.splitlines()]
        atomics = [i for i, line in enumerate(lines) if "atom." in line]
        assert len(atomics) == tickets[name], (name, [lines[i] for i in atomics])
        for at in atomics:
            atom = lines[at]
            assert atom.startswith("@%p") and ".gpu." in atom and ".acq_rel." in atom, (name, atom)  # one thread
            stores = [i for i, line in enumerate(lines[:at]) if "st.global" in line]  # what the ticket publishes
            assert stores and any(line.startswith("bar.sync") for line in lines[stores[-1] : at]), (
                f"{name}: no CTA barrier between the stores and the ticket at PTX line {at}")
            assert any("ld.global.cg" in line for line in lines[at:]), f"{name}: the reduction reads through L1"
