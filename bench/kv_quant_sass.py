"""Compile the 8-bit decode kernel for sm_90 on a machine without a GPU and count its SASS.

    python3 bench/kv_quant_sass.py --mode int8 [--block-n 128] [--warps 4] [--maxnreg 128] [--stages 3]
        [--splits 2] [--no-fp16-dots] [--no-int8-qk] [--top 20] [--keep DIR]

Triton ships ptxas, nvdisasm and cuobjdump, so a kernel can be compiled ahead of time for Hopper
here and read: registers, stack (spills), and the instructions of the main loop per (token, KV head)
per warp, by opcode. Device time is scarce (30 minutes a session); use this to choose which variants
are worth timing. Pointer arguments and the strides Triton would specialise are marked divisible by
16, as the launcher does at run time, or the loads come out unvectorised.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
from pathlib import Path

ARGS = ["q_ptr", "k_cache_ptr", "v_cache_ptr", "k_scale_ptr", "v_scale_ptr", "block_tables_ptr", "context_lens_ptr",
        "out_ptr", "part_o_ptr", "part_lse_ptr", "stride_qb", "stride_qh", "stride_bt", "stride_ob", "stride_oh",
        "stride_pb", "stride_ph", "stride_ps", "stride_lb", "stride_lh",
        "stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt", "stride_vh", "stride_vd",
        "stride_sb", "stride_st", "stride_sh", "qk_scale_log2"]
DIVISIBLE = ("stride_bt", "stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_pb", "stride_ph", "stride_ps",
             "stride_lb", "stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt", "stride_vh", "stride_vd",
             "stride_sb", "stride_st", "stride_sh")
HKV, D, PAGE = 8, 128, 16
CACHE_TYPE = {"int8": "*i8", "fp8": "*fp8e4nv", "bf16": "*bf16"}
QUANT = {"bf16": 0, "int8": 1, "fp8": 2}


def compile_decode(args: argparse.Namespace):
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kvpilot.engine.kernels.kv_quant.decode import _paged_decode_quant_kernel

    cache = CACHE_TYPE[args.mode]
    types = ["*bf16", cache, cache, "*fp32", "*fp32", "*i32", "*i32", "*bf16", "*fp32", "*fp32"] + ["i32"] * 20 + ["fp32"]
    signature = dict(zip(ARGS, types, strict=True))
    dim_major = args.v_layout == "dim" and args.mode != "bf16"
    # the launcher specialises integer arguments equal to 1 as constants: the contiguous stride of each layout
    ones = {"stride_vt": 1} if dim_major else {"stride_vd": 1}
    if args.mode == "int8":
        ones["stride_st" if args.scale_layout == "token" else "stride_sh"] = 1
    constexprs = {"GROUP": 4, "BLOCK_G": 16, "HEAD_DIM": D, "BLOCK_D": D, "PAGE": PAGE,
                  "BLOCK_N": args.block_n, "NUM_SPLITS": args.splits, "QUANT": QUANT[args.mode],
                  "FP16_DOT": args.fp16_dots and args.mode != "bf16", "INT8_QK": args.int8_qk and args.mode == "int8",
                  "V_DIM_MAJOR": dim_major, "SCALE_TOKEN_CONTIG": args.mode == "int8" and args.scale_layout == "token",
                  "RUN": min(PAGE, args.block_n), "PTX": not args.no_ptx,
                  "TABLE_AHEAD": args.table_ahead,
                  "HEADS_FASTEST": False, "V_PAGED_LOAD": args.v_paged_load, **ones}
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(ARGS.index(n),): [["tt.divisibility", 16]] for n in ARGS
             if (n.endswith("_ptr") or n in DIVISIBLE) and n not in ones}
    options = {"num_warps": args.warps, "num_stages": args.stages}
    if args.maxnreg:
        options["maxnreg"] = args.maxnreg
    src = ASTSource(fn=_paged_decode_quant_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def loop_bodies(sass: str) -> list[list[str]]:
    """Instructions between each backward branch and its target label (the kernel's loops)."""
    instrs, labels, pending = [], {}, None
    for line in sass.splitlines():
        text = line.strip()
        if m := re.match(r"^\.(L_x_\d+):", text):
            pending = m.group(1)
        elif m := re.match(r"/\*([0-9a-f]+)\*/\s+(.*?);", text):
            addr = int(m.group(1), 16)
            if pending:
                labels[pending], pending = addr, None
            instrs.append((addr, m.group(2)))
    loops = []
    for addr, text in instrs:
        m = re.search(r"BRA.*?\.(L_x_\d+)", text)
        if m and labels.get(m.group(1), addr + 1) < addr:
            loops.append([t for a, t in instrs if labels[m.group(1)] <= a <= addr])
    return loops


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(QUANT), default="int8")
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--maxnreg", type=int, default=128, help="0: no cap")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--splits", type=int, default=2)
    parser.add_argument("--no-fp16-dots", dest="fp16_dots", action="store_false")
    parser.add_argument("--no-int8-qk", dest="int8_qk", action="store_false")
    parser.add_argument("--v-layout", choices=["dim", "token"], default="dim", help="8-bit V layout (layout.py)")
    parser.add_argument("--scale-layout", choices=["token", "head"], default="token", help="int8 scale layout")
    parser.add_argument("--no-ptx", action="store_true", help="the generic int8->fp16 widening, not inline PTX")
    parser.add_argument("--table-ahead", action="store_true", help="load block ids a tile ahead")
    parser.add_argument("--v-paged-load", action="store_true", help="dim-major V loaded page by page [pages, D, PAGE]")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--keep", type=Path, help="write the cubin and SASS here")
    args = parser.parse_args()
    compiled = compile_decode(args)
    out = args.keep or Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    cubin = out / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    (out / "kernel.sass").write_text(sass)
    usage = subprocess.run([tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", usage)
    regs, stack = (m.group(1), m.group(2)) if m else ("?", "?")
    print(f"{args.mode} V {args.v_layout}-major block_n {args.block_n} warps {args.warps} maxnreg "
          f"{args.maxnreg or 'none'} stages {args.stages}: {regs} registers, {stack} B stack (spills), shared {compiled.metadata.shared} B")
    for body in loop_bodies(sass):
        per_token = len(body) * args.warps / args.block_n
        print(f"loop: {len(body)} instructions per warp per tile = {per_token:.1f} warp-instructions per "
              f"(token, KV head)")
        print("  " + ", ".join(f"{op} {n}" for op, n in collections.Counter(map(opcode, body)).most_common(args.top)))


if __name__ == "__main__":
    main()
