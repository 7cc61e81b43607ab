"""Paged GQA decode attention on the GPU: GB/s of K/V read, against dense SDPA and a copy roofline.

    PYTHONPATH=. python3 bench/bench_decode_attention.py [--sweep] [--fold] [--json PATH]

bf16, 32 query / 8 KV heads, head dim 128, block size 16, block tables shuffled at random.
Each shape is checked against the fp32 reference and dense SDPA before it is timed. `--fold` also
times the split reduction in its own launch against folded into the split kernel (DecodeConfig.fold_reduce)
as the engine runs decode: 32 calls (one per layer) in one CUDA graph, at batch 1 and 4 with a block table
as wide as max_model_len 8192 (the graph's static table: the split count the engine picks) and at batch 256.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from kvpilot.engine.kernels.paged_decode.heuristics import DecodeConfig, decode_config
from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton
from kvpilot.engine.kernels.paged_decode.reference import paged_attention_decode_reference

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
SHAPES = [(32, 4096), (64, 8192)]
DTYPE = torch.bfloat16
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def time_ms(fn) -> float:  # type: ignore[no-untyped-def]
    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def copy_roofline_gbps(num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy: bytes read + bytes written per second."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * num_bytes / ms / 1e6


def make_inputs(batch: int, context: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    blocks_per_seq = context // BLOCK_SIZE
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    block_tables = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, blocks_per_seq)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables, "context_lens": context_lens}


def dense_from_paged(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """The same K (or V) as a contiguous [B, Hkv, S, D] tensor, for SDPA."""
    batch, blocks_per_seq = block_tables.shape
    gathered = cache[block_tables.long()].view(batch, blocks_per_seq * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    return gathered.transpose(1, 2).contiguous()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def sweep_configs(default: DecodeConfig) -> list[DecodeConfig]:
    grid = [DecodeConfig(k, n, 4, s) for k in (1, 2, 3, 4) for n in (64, 128) for s in (2, 3, 4)]
    return [default, *grid, replace(default, num_warps=8), replace(default, block_n=32)]


def bench_shape(batch: int, context: int, sweep: bool) -> dict:
    x = make_inputs(batch, context)
    scale = HEAD_DIM**-0.5
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * x["k_cache"].element_size()
    gbps = lambda ms: kv_bytes / ms / 1e6  # noqa: E731
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], scale)

    default = decode_config(batch, NUM_KV_HEADS, HEAD_DIM, x["block_tables"].shape[1] * BLOCK_SIZE, x["q"].device)
    out = paged_attention_decode_triton(*args)
    n_ref = 4
    ref = paged_attention_decode_reference(
        x["q"][:n_ref], x["k_cache"], x["v_cache"], x["block_tables"][:n_ref], x["context_lens"][:n_ref], scale
    )
    k_dense = dense_from_paged(x["k_cache"], x["block_tables"])
    v_dense = dense_from_paged(x["v_cache"], x["block_tables"])
    q_dense = x["q"][:, :, None, :]
    sdpa = lambda: F.scaled_dot_product_attention(q_dense, k_dense, v_dense, scale=scale, enable_gqa=True)  # noqa: E731
    sdpa_out = sdpa()[:, :, 0, :]
    result: dict = {
        "batch": batch,
        "context": context,
        "kv_bytes": kv_bytes,
        "rel_err_vs_fp32_reference": rel_err(out[:n_ref], ref),
        "rel_err_vs_sdpa": rel_err(out, sdpa_out),
        "default_config": asdict(default),
    }
    assert result["rel_err_vs_fp32_reference"] < 1.2e-2, result
    assert result["rel_err_vs_sdpa"] < 1.2e-2, result

    sdpa_ms = time_ms(sdpa)
    result["sdpa_default"] = {"ms": sdpa_ms, "gbps": gbps(sdpa_ms)}
    for name, backend in SDPA_BACKENDS.items():
        try:
            with sdpa_kernel([backend]):
                ms = time_ms(sdpa)
            result[f"sdpa_{name}"] = {"ms": ms, "gbps": gbps(ms)}
        except RuntimeError as exc:
            result[f"sdpa_{name}"] = {"error": str(exc).splitlines()[0][:160]}

    kernel_ms = time_ms(lambda: paged_attention_decode_triton(*args))
    result["paged_triton"] = {"ms": kernel_ms, "gbps": gbps(kernel_ms), "config": asdict(default)}
    if sweep:
        rows = []
        for config in sweep_configs(default):
            try:
                got = paged_attention_decode_triton(*args, config)
                err = rel_err(got, out)
                ms = time_ms(lambda config=config: paged_attention_decode_triton(*args, config))
                rows.append({**asdict(config), "ms": ms, "gbps": gbps(ms), "rel_err_vs_default": err})
            except Exception as exc:  # out of shared memory etc.: record and go on
                rows.append({**asdict(config), "error": str(exc).splitlines()[0][:160]})
            print("  sweep", rows[-1], flush=True)
        result["sweep"] = rows
    return result


def graph_us(fn, calls: int = 32) -> float:
    """Median µs per call of `calls` back-to-back fn() (one per layer) in one CUDA graph."""
    from bench.gemm_sweep import graph_replay_us

    return graph_replay_us(lambda _: fn(), calls, reps=5)


def bench_fold(batch: int, context: int, width_tokens: int) -> dict:
    x = make_inputs(batch, max(context, width_tokens))
    x["context_lens"].fill_(context)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_tables"], x["context_lens"], HEAD_DIM**-0.5)
    default = decode_config(batch, NUM_KV_HEADS, HEAD_DIM, x["block_tables"].shape[1] * BLOCK_SIZE, x["q"].device)
    separate, folded = replace(default, fold_reduce=False), replace(default, fold_reduce=True)
    want = paged_attention_decode_triton(*args, separate)
    for _ in range(200):  # the ticket protocol on the device: every folded launch equals the reduce launch
        got = paged_attention_decode_triton(*args, folded)
        assert rel_err(got, want) < 1e-3, rel_err(got, want)
    row = {"batch": batch, "context": context, "splits": default.num_splits,
           "separate_us": graph_us(lambda: paged_attention_decode_triton(*args, separate)),
           "folded_us": graph_us(lambda: paged_attention_decode_triton(*args, folded))}
    print(f"fold: batch {batch} context {context} splits {default.num_splits}: reduce launch "
          f"{row['separate_us']:.2f} us, folded {row['folded_us']:.2f} us a layer", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time a grid of tile/warp/stage/split configs")
    parser.add_argument("--fold", action="store_true", help="only time the folded split reduction (see above)")
    parser.add_argument("--json", help="write all results to this JSON file")
    opts = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    report: dict = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "copy_roofline_gbps": copy_roofline_gbps(),
        "shapes": [],
    }
    print(f"{report['device']} ({report['sms']} SMs), torch {report['torch']}, triton {report['triton']}")
    print(f"device-to-device copy (read + write): {report['copy_roofline_gbps']:.0f} GB/s")
    if opts.fold:
        report["fold"] = [bench_fold(b, c, w) for b, c, w in ((1, 512, 8192), (4, 512, 8192), (256, 700, 1024))]
    for batch, context in [] if opts.fold else SHAPES:
        r = bench_shape(batch, context, opts.sweep)
        report["shapes"].append(r)
        torch.cuda.empty_cache()
        ours, dense = r["paged_triton"]["gbps"], r["sdpa_default"]["gbps"]
        print(
            f"batch {batch:3d} context {context:5d}: paged triton {ours:7.0f} GB/s ({r['paged_triton']['ms'] * 1e3:.1f} us, "
            f"{r['default_config']}) | dense SDPA {dense:7.0f} GB/s ({r['sdpa_default']['ms'] * 1e3:.1f} us) | "
            f"ratio {ours / dense:.3f} | rel err vs fp32 ref {r['rel_err_vs_fp32_reference']:.2e}, vs SDPA {r['rel_err_vs_sdpa']:.2e}"
        )
        for name in SDPA_BACKENDS:
            print(f"    sdpa[{name}]: {r[f'sdpa_{name}']}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
