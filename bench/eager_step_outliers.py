"""Which eager decode steps are slow, and whether a compiler ran in them (the 'exact eager' rows of
bench_mla_engine and int8's mean step read one step of seconds, session 8/9).

    TRITON_CACHE_DIR=/tmp/tc python bench/eager_step_outliers.py [--batch 64 --prompt 2048 --rounds 3]

Llama-3-8B attention shapes (bench_mla_engine's checkpoint), enforce_eager; per round of --new decode
steps after the prefill: the steps over 3x the median (index, ms), the Triton kernels compiled in the
round (new entries of TRITON_CACHE_DIR) and torch.compile's frame count.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_mla_engine import build, decode_only

from kvpilot.engine.llm import LLM


def cache_entries() -> int:
    root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    return sum(1 for _ in root.iterdir()) if root.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", default="{}", help="extra engine arguments as Python literal dict")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = build("llama", Path(tmp) / "llama", 4, tiny=False)
        llm = LLM(str(path), device="cuda", dtype="bfloat16", show_progress=False, max_num_seqs=args.batch,
                  max_num_batched_tokens=max(4096, args.prompt), enforce_eager=True, fallback_reserve=0.0,
                  num_kv_blocks=args.batch * ((args.prompt + args.new) * args.rounds // 16 + 4),
                  validation_sample_rate=0.0, enable_prefix_caching=False, **eval(args.engine))  # fmt: skip
        prompts = [[3 + (i * 7 + j) % 300 for j in range(args.prompt)] for i in range(args.batch)]
        from torch._dynamo.utils import counters

        for r in range(args.rounds):
            before, frames = cache_entries(), sum(counters["frames"].values())
            seconds, tokens, steps = decode_only(llm, prompts, "cuda", args.new, r)
            median = sorted(steps)[len(steps) // 2]
            slow = [(i, round(1e3 * t, 1)) for i, t in enumerate(steps) if t > 3 * median]
            print(f"round {r}: {tokens / seconds:9.1f} tok/s, median {1e3 * median:.2f} ms, slow steps {slow}, "
                  f"triton compiles {cache_entries() - before}, dynamo frames {sum(counters['frames'].values()) - frames}")  # fmt: skip
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
