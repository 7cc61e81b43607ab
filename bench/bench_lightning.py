"""Lightning attention kernels on MiniMax-Text-01 shapes (64 heads, head dim 128), beside fla-core.

    PYTHONPATH=. python3 bench/bench_lightning.py [--json PATH]

Prefill: bf16 q/k/v, fp32 state out; tokens/s = tokens / time. Decode: one token per sequence,
fp32 state pool [B, 64, 128, 128] (64 KiB per head), state GB/s = state bytes read + written / time.
fla-core (flash-linear-attention) runs the same shapes when it imports: `chunk_lightning_attn`
(prefill) and `fused_recurrent_lightning_attn` (decode, T=1 with initial and final state). fla
derives its own per-head decay from layer_idx (not HF's slopes), which does not change the work
done, so only timings are compared; our outputs are checked against the fp32 recurrence.
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from kvpilot.engine.kernels.lightning_attn.decode import lightning_decode_triton
from kvpilot.engine.kernels.lightning_attn.prefill import lightning_prefill_triton
from kvpilot.engine.kernels.lightning_attn.reference import lightning_recurrent_reference, minimax_slopes

H, D, LAYER, LAYERS = 64, 128, 10, 80
PREFILL = [(1, 32768), (8, 4096), (32, 1024)]
DECODE_BATCH = [1, 64, 256]


def load_fla():
    try:
        from fla.ops.lightning_attn import chunk_lightning_attn, fused_recurrent_lightning_attn
    except Exception as exc:
        print(f"fla-core not importable: {exc!r}")
        return None, None
    return chunk_lightning_attn, fused_recurrent_lightning_attn


def prefill_case(batch: int, seqlen: int, slopes, fla_chunk, configs) -> list[dict]:
    tokens = batch * seqlen
    q, k, v = ((torch.randn(tokens, H, D, device="cuda") * 0.1).to(torch.bfloat16) for _ in range(3))
    cu = (torch.arange(batch + 1, device="cuda") * seqlen).to(torch.int32)
    pool = torch.zeros(batch, H, D, D, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    # correctness: the first 200 tokens of one sequence, all heads, against the fp32 recurrence
    n = min(200, seqlen)
    got = lightning_prefill_triton(q[:n], k[:n], v[:n], torch.tensor([0, n], dtype=torch.int32, device="cuda"),
                                   slopes, torch.zeros(1, H, D, D, device="cuda"), slots[:1])
    want, _ = lightning_recurrent_reference(q[:n], k[:n], v[:n], slopes, torch.zeros(H, D, D, device="cuda"))
    err = float((got.float() - want).norm() / want.norm())
    rows = []
    for chunk, block_v, warps in configs:
        try:
            ms = do_bench(lambda c=chunk, b=block_v, w=warps: lightning_prefill_triton(
                q, k, v, cu, slopes, pool, slots, chunk=c, block_v=b, num_warps=w), warmup=5, rep=50)
        except Exception as exc:
            print(f"prefill chunk={chunk} block_v={block_v} warps={warps} failed: {exc!r}")
            continue
        rows.append({"impl": f"kvpilot (chunk={chunk}, block_v={block_v}, warps={warps})", "batch": batch,
                     "seqlen": seqlen, "ms": ms, "Mtok/s": tokens / ms / 1e3, "rel_err": err})
    if fla_chunk is not None:
        qf, kf, vf = (t.view(batch, seqlen, H, D) for t in (q, k, v))
        try:
            ms = do_bench(lambda: fla_chunk(qf, kf, vf, LAYER, LAYERS, scale=1.0, output_final_state=True),
                          warmup=5, rep=50)
            rows.append({"impl": "fla chunk_lightning_attn", "batch": batch, "seqlen": seqlen, "ms": ms,
                         "Mtok/s": tokens / ms / 1e3, "rel_err": float("nan")})
        except Exception as exc:
            print(f"fla prefill failed: {exc!r}")
    return rows


def decode_case(batch: int, slopes, fla_recurrent) -> list[dict]:
    q, k, v = ((torch.randn(batch, H, D, device="cuda") * 0.1).to(torch.bfloat16) for _ in range(3))
    pool = torch.randn(batch, H, D, D, device="cuda") * 0.01
    slots = torch.randperm(batch, device="cuda").to(torch.int32)
    state_bytes = 2 * batch * H * D * D * 4
    got = lightning_decode_triton(q, k, v, slopes, pool.clone(), slots)
    want, _ = lightning_recurrent_reference(q[:1], k[:1], v[:1], slopes, pool[int(slots[0])])
    err = float((got[0].float() - want[0]).norm() / want.norm())
    rows = []
    for block_v in (32, 64):
        ms = do_bench(lambda b=block_v: lightning_decode_triton(q, k, v, slopes, pool, slots, block_v=b),
                      warmup=25, rep=200)
        rows.append({"impl": f"kvpilot (block_v={block_v})", "batch": batch, "us": ms * 1e3,
                     "state GB/s": state_bytes / ms / 1e6, "rel_err": err})
    if fla_recurrent is not None:
        qf, kf, vf = (t.view(batch, 1, H, D) for t in (q, k, v))
        try:
            ms = do_bench(lambda: fla_recurrent(qf, kf, vf, LAYER, LAYERS, scale=1.0, initial_state=pool,
                                                output_final_state=True), warmup=25, rep=200)
            rows.append({"impl": "fla fused_recurrent_lightning_attn", "batch": batch, "us": ms * 1e3,
                         "state GB/s": state_bytes / ms / 1e6, "rel_err": float("nan")})
        except Exception as exc:
            print(f"fla decode failed: {exc!r}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}")
    fla_chunk, fla_recurrent = load_fla()
    slopes = minimax_slopes(H, LAYER, LAYERS).cuda()
    configs = [(64, 64, 4), (64, 32, 4), (128, 64, 8)]
    prefill = []
    for batch, seqlen in PREFILL:
        prefill += prefill_case(batch, seqlen, slopes, fla_chunk, configs)
        torch.cuda.empty_cache()
    decode = []
    for batch in DECODE_BATCH:
        decode += decode_case(batch, slopes, fla_recurrent)
    print("| prefill impl | batch x seqlen | ms | M tok/s | rel err vs fp32 recurrence |")
    print("|---|---|---|---|---|")
    for r in prefill:
        print(f"| {r['impl']} | {r['batch']} x {r['seqlen']} | {r['ms']:.2f} | {r['Mtok/s']:.2f} | {r['rel_err']:.1e} |")
    print("| decode impl | batch | us | state GB/s | rel err vs fp32 recurrence |")
    print("|---|---|---|---|---|")
    for r in decode:
        print(f"| {r['impl']} | {r['batch']} | {r['us']:.1f} | {r['state GB/s']:.0f} | {r['rel_err']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prefill": prefill, "decode": decode}, f, indent=1)


if __name__ == "__main__":
    main()
