"""Decode step time of the Performer conversion (attention="linear"): batched decode vs the former
per-sequence loop, with the unconverted model (softmax attention) in the same run as the baseline.

A random Llama checkpoint (default hidden 256, 4 layers, 4 heads of 64, MHA) is made in a temporary
directory. For each batch x context, `--batch` requests are put straight into the running batch with
their prompts marked computed, the paged cache filled with random values and, for the conversion,
each sequence's summary marked resident (a random positive state: the prefill that would build it is
not what is measured, and on a CPU it would dominate), so every timed step is a pure decode step.
Paths:
- `softmax`: the checkpoint's own attention over the whole K/V cache (paged_attention_decode);
- `performer-loop`: the conversion with `batched_decode = False`, one sequence at a time with host
  syncs (the decode before this script);
- `performer-batched`: the conversion's batched decode (strategies/linear/attention._decode_batched).
Per step: wall time of LLMEngine.step() and of the model forward inside it (medians of --steps steps
after --warmup), milliseconds, and decode tokens/s (batch / step time).
`--layer-only`: one PerformerAttention layer's decode forward alone (same shapes, random paged cache
and summaries), loop and batched interleaved, medians of 15 rounds: less noisy at batch 1, where the
rest of the step dominates.

    PYTHONPATH=. .venv/bin/python bench/bench_performer_decode.py [--batches 1,16,64] [--contexts 512,2048] \
        [--window 64] [--hidden 256] [--layers 4] [--heads 4] [--steps 10] [--threads 1] [--layer-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.decode_harness import run_grid
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.context import Context, reset_context, set_context
from kvpilot.engine.layers.attention import Attention
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.strategies.linear.attention import PerformerAttention
from kvpilot.engine.strategies.linear.features import draw_features

PATHS = ("softmax", "performer-loop", "performer-batched")


def build_engine(model_dir: Path, path: str, window: int, batch: int, total: int) -> LLMEngine:
    linear: dict[str, Any] = {} if path == "softmax" else {"attention": "linear", "linear_window": window}
    engine = LLMEngine(EngineConfig(
        model=str(model_dir), device="cpu", block_size=16, num_kv_blocks=batch * -(-total // 16) + 1,
        max_num_seqs=batch, max_num_batched_tokens=max(2048, batch), max_model_len=total + 1,
        enable_prefix_caching=False, validation_sample_rate=0.0, head_utilization_every=0,
        show_progress=False, **linear,
    ))  # fmt: skip
    layers = [m for m in engine.runner.model.modules() if isinstance(m, PerformerAttention)]
    if path != "softmax" and not layers:
        raise RuntimeError("attention='linear' converted no layer")
    for layer in layers:
        layer.batched_decode = path == "performer-batched"
    return engine


def time_layer(batch: int, context: int, window: int, heads: int, head_dim: int) -> dict[str, float]:
    """Median ms of one layer's decode forward, per-sequence loop vs batched (interleaved rounds)."""
    gen = torch.Generator().manual_seed(0)
    bs, blocks = 16, -(-context // 16)
    w = torch.stack([draw_features(head_dim, head_dim, gen) for _ in range(heads)])
    layer = PerformerAttention(Attention(heads, heads, head_dim, head_dim**-0.5), window, w)
    layer.k_cache = 0.3 * torch.randn(batch * blocks + 1, bs, heads, head_dim, generator=gen)
    layer.v_cache = torch.randn(batch * blocks + 1, bs, heads, head_dim, generator=gen)
    layer.state_pool = torch.rand(batch, *layer.state_shape, generator=gen)
    tables = torch.randperm(batch * blocks, generator=gen).view(batch, blocks).int()
    lens = torch.full((batch,), context, dtype=torch.int32)
    last = lens.long() - 1
    set_context(Context(
        slot_mapping=tables.long().gather(1, (last // bs)[:, None])[:, 0] * bs + last % bs,
        decode_block_tables=tables, decode_context_lens=lens,
        decode_linear_slots=torch.arange(batch, dtype=torch.int32), linear_exact=[False] * batch,
    ))  # fmt: skip
    q, k, v = (torch.randn(batch, heads, head_dim, generator=gen) for _ in range(3))
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(15):
            for batched in (False, True):
                layer.batched_decode = batched
                start = time.perf_counter()
                for _ in range(5):
                    layer(q, k, v)
                times[batched].append((time.perf_counter() - start) / 5 * 1e3)
    finally:
        reset_context()
    return {"loop_ms": statistics.median(times[False]), "batched_ms": statistics.median(times[True])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--layer-only", action="store_true", help="time one attention layer, loop vs batched")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    if args.layer_only:
        rows = []
        for batch in batches:
            for context in contexts:
                r = time_layer(batch, context, args.window, args.heads, args.hidden // args.heads)
                rows.append({"batch": batch, "context": context, **r})
                print(f"layer batch {batch:>3} context {context:>5} loop {r['loop_ms']:8.3f} ms batched "
                      f"{r['batched_ms']:8.3f} ms ({r['loop_ms'] / r['batched_ms']:.1f}x)", flush=True)  # fmt: skip
        print(json.dumps({"args": vars(args), "rows": rows}))
        return
    rows = run_grid(args, lambda model_dir, path, batch, total: build_engine(model_dir, path, args.window, batch, total))
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
