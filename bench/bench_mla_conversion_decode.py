"""Decode step time of the MLA conversion (latent_rank r): batched V-absorbed decode, the former
decompress-everything decode and the partial-RoPE absorbed decode, with the unconverted model in the
same run as the baseline.

A random Llama checkpoint (default hidden 512, 4 layers, 8 heads of 64, MHA) is made in a temporary
directory. For each batch x context, `--batch` requests are put straight into the running batch with
their prompts marked computed and the paged cache filled with random values (the prefill is not what
is measured, and on a CPU it would dominate), so every timed step is a pure decode step. Paths:
- `exact`: the checkpoint's own attention over a K/V cache (paged_attention_decode);
- `mla-decompress`: the conversion with `batched_decode = False`, each sequence's whole context
  decompressed to K and V every step (the decode before this script);
- `mla-absorbed`: the exact-RoPE conversion's decode (strategies/mla/decode.py): K decompressed once per
  KV head, V absorbed;
- `mla-rope-absorbed`: `mla_rope_dims=--rope-dims` (strategies/mla/partial.py): both sides absorbed,
  decode reads only the latent and the rope rows (strategies/mla/absorbed.py).
Per step: wall time of LLMEngine.step() and of the model forward inside it (medians of --steps steps
after --warmup), milliseconds.

    PYTHONPATH=. .venv/bin/python bench/bench_mla_conversion_decode.py [--batches 1,16] [--contexts 512,2048] \
        [--rank 128] [--rope-dims 16] [--hidden 512] [--layers 4] [--heads 8] [--kv-heads 8] [--steps 10] \
        [--threads 1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from bench.decode_harness import run_grid
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine

PATHS = ("exact", "mla-decompress", "mla-absorbed", "mla-rope-absorbed")


def build_engine(model_dir: Path, path: str, rank: int, batch: int, total: int, rope_dims: int = 16) -> LLMEngine:
    mla: dict[str, Any] = {} if path == "exact" else {"attention": "mla", "latent_rank": rank}
    if path == "mla-rope-absorbed":
        mla["mla_rope_dims"] = rope_dims
    engine = LLMEngine(EngineConfig(
        model=str(model_dir), device="cpu", block_size=16, num_kv_blocks=batch * -(-total // 16) + 1,
        max_num_seqs=batch, max_num_batched_tokens=max(2048, batch), max_model_len=total + 1,
        enable_prefix_caching=False, validation_sample_rate=0.0, fallback_reserve=0.0, show_progress=False, **mla,
    ))  # fmt: skip
    if path == "mla-decompress":
        for layer in engine.runner.model.model.layers:
            layer.self_attn.batched_decode = False
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--rank", type=int, default=128)
    parser.add_argument("--rope-dims", type=int, default=16, help="mla-rope-absorbed: mla_rope_dims")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = run_grid(args, lambda model_dir, path, batch, total: build_engine(model_dir, path, args.rank, batch, total, args.rope_dims))
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
