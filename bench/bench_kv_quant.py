"""Paged GQA decode attention over bf16 vs int8 vs fp8 KV caches (Llama-3-8B attention shapes).

    PYTHONPATH=. python3 bench/bench_kv_quant.py [--shapes 64x1024,64x8192] [--json PATH]
        [--sweep [--sweep-set paged|splits] [--sweep-shapes 64x8192,...]]

32 query / 8 KV heads, head dim 128, block size 16, shuffled block tables, random data. The same
kernel (kv_quant.decode) runs all three caches (16-bit: no scales), so only the cache format
differs; the kernels engineer's bf16 paged_decode runs beside it when importable. GB/s counts the
bytes the kernel must read: K/V (+ int8 scales) of every context token, plus q and the output.
Each case is first checked against the fp32 reference on the same quantised cache. The HBM roofline
of the same run: a 1 GiB device-to-device copy (read + write bytes over its time).
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from triton.testing import do_bench

from kvpilot.engine.kernels.kv_quant import reference as ref
from kvpilot.engine.kernels.kv_quant.decode import paged_attention_decode_quant_triton
from kvpilot.engine.kernels.kv_quant.layout import zeros_dim_major, zeros_token_contiguous

HQ, HKV, D, PAGE, LAYERS = 32, 8, 128, 16, 32
SHAPES = [(64, 1024), (64, 8192)]


def make_cache(batch: int, ctx: int, mode: str, gen: torch.Generator, layout: str = "engine"):
    """Random caches; 8-bit ones in the engine's layout (V dim-major, int8 scales token-contiguous,
    kv_quant/layout.py), with layout="contiguous" all token-major as before session 3, with
    layout="token-v" V token-major and the scales token-contiguous."""
    k, v, ks, vs, tables = _make_contiguous(batch, ctx, mode, gen)
    if mode == "bf16" or layout == "contiguous":
        return k, v, ks, vs, tables
    num_blocks = k.shape[0]
    v_dm = v if layout == "token-v" else zeros_dim_major((), num_blocks, PAGE, HKV, D, v.dtype, "cuda")
    v_dm.copy_(v)
    if mode == "int8":
        ks_t, vs_t = (zeros_token_contiguous((), num_blocks, PAGE, HKV, torch.float32, "cuda") for _ in range(2))
        ks_t.copy_(ks)
        vs_t.copy_(vs)
        ks, vs = ks_t, vs_t
    return k, v_dm, ks, vs, tables


def _make_contiguous(batch: int, ctx: int, mode: str, gen: torch.Generator):
    blocks_per_seq = ctx // PAGE
    num_blocks = batch * blocks_per_seq
    tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(batch, blocks_per_seq).cuda()
    shape = (num_blocks, PAGE, HKV, D)
    k16 = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v16 = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if mode == "bf16":
        return k16, v16, None, None, tables
    if mode == "int8":
        kq, ks = ref.quantize_int8(k16.view(-1, HKV, D))
        vq, vs = ref.quantize_int8(v16.view(-1, HKV, D))
        return kq.view(shape), vq.view(shape), ks.view(shape[:3]), vs.view(shape[:3]), tables
    ks = ref.calibrate_fp8_scale(k16.view(-1, HKV, D)[:4096])
    vs = ref.calibrate_fp8_scale(v16.view(-1, HKV, D)[:4096])
    kq = ref.quantize_fp8(k16.view(-1, HKV, D), ks).view(shape)
    vq = ref.quantize_fp8(v16.view(-1, HKV, D), vs).view(shape)
    return kq, vq, ks, vs, tables


def check(q, k, v, ks, vs, tables, ctx_lens) -> float:
    """Relative error of the kernel against the fp32 reference on the same cache (first 2 sequences)."""
    sub = slice(0, 2)
    got = paged_attention_decode_quant_triton(q[sub], k, v, ks, vs, tables[sub], ctx_lens[sub], D**-0.5)
    want = reference(q[sub], k, v, ks, vs, tables[sub], ctx_lens[sub])
    return float((got.float() - want).norm() / want.norm())


def reference(q, k, v, ks, vs, tables, ctx_lens):
    """fp32 attention of q over the paged cache as stored: dense for a 16-bit cache (scales None), the
    8-bit reference (exact query) otherwise."""
    if ks is not None:
        return ref.paged_attention_decode_quant_reference(q.float(), k, v, ks, vs, tables, ctx_lens, D**-0.5)
    out = []
    for b, n in enumerate(ctx_lens.tolist()):
        ids = tables[b, : -(-n // PAGE)].long()
        out.append(ref.attend_fp32(q[b].float(), k[ids].reshape(-1, HKV, D)[:n], v[ids].reshape(-1, HKV, D)[:n], D**-0.5))
    return torch.stack(out)


def bench_case(batch: int, ctx: int, mode: str, gen: torch.Generator, base_decode) -> list[dict]:
    """Time one cache format (and the base bf16 kernel beside the bf16 case); returns table rows."""
    k, v, ks, vs, tables = make_cache(batch, ctx, mode, gen)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    ctx_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    err = check(q, k, v, ks, vs, tables, ctx_lens)
    kv_bytes = 2 * batch * ctx * HKV * D * k.element_size()
    scale_bytes = 2 * batch * ctx * HKV * ks.element_size() if mode == "int8" else 0
    total = kv_bytes + scale_bytes + 2 * q.numel() * q.element_size()
    kernels = [(f"kv_quant.decode[{mode}]", lambda: paged_attention_decode_quant_triton(
        q, k, v, ks, vs, tables, ctx_lens, D**-0.5), err)]
    if mode == "bf16" and base_decode is not None:
        kernels.append(("paged_decode (base kernel, bf16)", lambda: base_decode(q, k, v, tables, ctx_lens, D**-0.5),
                        float("nan")))
    rows = []
    for name, fn, rel in kernels:
        try:
            ms = do_bench(fn, warmup=25, rep=200)
        except Exception as exc:
            print(f"{name} failed: {exc!r}")
            continue
        rows.append({"kernel": name, "mode": mode, "batch": batch, "ctx": ctx, "us": ms * 1e3,
                     "GB/s": total / ms / 1e6, "rel_err_vs_ref": rel,
                     "attn_tok_s_32_layers": batch / (LAYERS * ms * 1e-3)})
    return rows


# Launch keyword arguments of paged_attention_decode_quant_triton per cache format (absent = the kernel's
# default; maxnreg 0 = no register cap); "layout": "contiguous" = token-major 8-bit V and scales (before
# session 3) instead of the engine's layout.
def _grid(**axes) -> list[dict]:
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]


_PAGED = _grid(v_paged_load=[True], block_n=[128, 256], num_warps=[1, 2], num_splits=[1, 2], num_stages=[2, 3],
               maxnreg=[0])
_SPLITS = _grid(num_splits=[1, 2, 4, 8, 16, 32, 64])
SWEEPS = {
    "paged": {"bf16": [{}], "int8": [{}, *_PAGED], "fp8": [{}, *_PAGED]},
    "splits": {"bf16": [{}, *_SPLITS], "int8": [{}, *_SPLITS], "fp8": [{}, *_SPLITS]},
}
SWEEP = SWEEPS["paged"]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'64x1024,64x8192' -> [(64, 1024), (64, 8192)] (batch x context)."""
    try:
        return [(int(b), int(c)) for b, c in (part.lower().split("x") for part in text.split(",") if part)]
    except ValueError as exc:
        raise SystemExit(f"shapes must look like 64x8192,1x32768 (batch x context), got {text!r}") from exc


def copy_roofline(gib: float = 1.0) -> dict:
    """A device-to-device copy of `gib` GiB: the HBM bandwidth this run can reach (read + write bytes)."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # also the run's warm-up: half a second of copies first (the first case measured after a cold start read
    # 2x slow on the H200: int8 at 64 x 1024 took 107-115 us first in the process, 55.6 us after another case)
    do_bench(lambda: dst.copy_(src), warmup=10, rep=500)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=100)
    return {"bytes": 2 * n, "us": ms * 1e3, "GB/s": 2 * n / ms / 1e6}


def sweep_mode(batch: int, ctx: int, mode: str, gen: torch.Generator, entries: list[dict]) -> list[dict]:
    caches = {name: make_cache(batch, ctx, mode, gen, name) for name in ("engine", "contiguous", "token-v")}
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    ctx_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    total = 2 * batch * ctx * HKV * D * (1 if mode != "bf16" else 2) + (2 * batch * ctx * HKV * 4 if mode == "int8" else 0)
    rows = []
    for entry in entries:
        kw = dict(entry)
        layout = kw.pop("layout", "engine")
        k, v, ks, vs, tables = caches[layout]
        want = reference(q[:2], k, v, ks, vs, tables[:2], ctx_lens[:2])
        try:
            got = paged_attention_decode_quant_triton(q[:2], k, v, ks, vs, tables[:2], ctx_lens[:2], D**-0.5, **kw)
            err = float((got.float() - want).norm() / want.norm())
            ms = do_bench(lambda kw=kw, c=caches[layout]: paged_attention_decode_quant_triton(
                q, *c, ctx_lens, D**-0.5, **kw), warmup=10, rep=100)
        except Exception as exc:
            print(f"sweep {mode} {kw} failed: {type(exc).__name__}: {exc}"[:300])
            continue
        rows.append({"mode": mode, "layout": layout, **kw, "us": ms * 1e3, "GB/s": total / ms / 1e6, "rel_err": err})
    del caches
    return rows


def sweep(batch: int, ctx: int, gen: torch.Generator, sweep_set: dict = SWEEP) -> list[dict]:
    """Launch parameters of the same kernel per cache format, to pick the defaults from measurements."""
    rows = []
    for mode in ("bf16", "int8", "fp8"):
        rows += [{"batch": batch, "ctx": ctx, **r} for r in sweep_mode(batch, ctx, mode, gen, sweep_set[mode])]
        torch.cuda.empty_cache()
    print(f"sweep at batch {batch}, ctx {ctx}:")
    cols = ("layout", "block_n", "num_splits", "num_warps", "num_stages", "maxnreg", "table_ahead", "v_paged_load",
            "int8_qk")
    print("| cache | " + " | ".join(cols) + " | us | GB/s | rel err |")
    print("|---" * (len(cols) + 4) + "|")
    for r in rows:
        print(f"| {r['mode']} | " + " | ".join(str(r.get(c, "default")) for c in cols)
              + f" | {r['us']:.1f} | {r['GB/s']:.0f} | {r['rel_err']:.1e} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--shapes", default=",".join(f"{b}x{c}" for b, c in SHAPES),
                        help="comma-separated batch x context cases of the table")
    parser.add_argument("--sweep", action="store_true", help="also sweep launch parameters")
    parser.add_argument("--sweep-ctx", default="8192", help="comma-separated contexts for --sweep, at batch 64")
    parser.add_argument("--sweep-shapes", help="batch x context cases for --sweep (instead of --sweep-ctx)")
    parser.add_argument("--sweep-set", choices=sorted(SWEEPS), default="paged",
                        help="paged: tile/warps/stages/splits around the paged-V load; splits: context splits only")
    args = parser.parse_args()
    shapes = parse_shapes(args.shapes)
    sweep_shapes = parse_shapes(args.sweep_shapes or ",".join(f"64x{c}" for c in args.sweep_ctx.split(",")))
    gen = torch.Generator().manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    roofline = copy_roofline()
    print(f"HBM roofline, 1 GiB device copy: {roofline['us']:.1f} us, {roofline['GB/s']:.0f} GB/s (read + write)")
    try:
        from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton as base_decode
    except Exception as exc:  # the base kernel is another engineer's work in progress
        base_decode = None
        print(f"base paged_decode not importable: {exc!r}")
    rows = []
    for batch, ctx in shapes:
        for mode in ("bf16", "int8", "fp8"):
            rows += bench_case(batch, ctx, mode, gen, base_decode)
            torch.cuda.empty_cache()
    print("| kernel | batch | ctx | us | GB/s | of roofline | speedup vs bf16 (same kernel) | attn tok/s (32 layers) "
          "| rel err vs ref |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bf16 = next((x["us"] for x in rows if x["kernel"] == "kv_quant.decode[bf16]"
                     and (x["batch"], x["ctx"]) == (r["batch"], r["ctx"])), float("nan"))
        print(f"| {r['kernel']} | {r['batch']} | {r['ctx']} | {r['us']:.1f} | {r['GB/s']:.0f} | "
              f"{r['GB/s'] / roofline['GB/s']:.0%} | {bf16 / r['us']:.2f}x | {r['attn_tok_s_32_layers']:.0f} | "
              f"{r['rel_err_vs_ref']:.1e} |")
    bytes_per_token = {"bf16": 2 * LAYERS * HKV * D * 2, "int8": 2 * LAYERS * HKV * (D + 4), "fp8": 2 * LAYERS * HKV * D}
    print(f"KV bytes per token (Llama-3-8B, 32 layers): {bytes_per_token}")
    swept = [r for b, c in sweep_shapes for r in sweep(b, c, gen, SWEEPS[args.sweep_set])] if args.sweep else []
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "bytes_per_token": bytes_per_token, "sweep": swept, "roofline": roofline}, f,
                      indent=1)


if __name__ == "__main__":
    main()
