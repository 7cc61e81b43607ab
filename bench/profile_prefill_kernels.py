"""Where one full prefill step of a named shape spends GPU time, by kernel (torch profiler).

    PYTHONPATH=. python3 bench/profile_prefill_kernels.py [--shape llama-3-8b] [--prompt 1024] [--top 16] \
        [EngineConfig knobs, e.g. --kv-cache-dtype int8]

Random weights (load_format=dummy). max_num_batched_tokens / --prompt requests of --prompt random tokens
fill one prefill step; a warm-up step of the same shape first (compiles), then the measured step: its
wall time with a synchronize around it and its kernels by total time. Run once per KV dtype to compare.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from bench.decode_harness import kernel_table, shape_engine
from kvpilot.bench.shapes import SHAPES
from kvpilot.engine.config.arguments import add_config_arguments
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams


def add_batch(engine: LLMEngine, tag: str, count: int, prompt: int, rng: random.Random) -> None:
    vocab = engine.model_config.vocab_size
    for i in range(count):
        ids = [rng.randrange(3, vocab) for _ in range(prompt)]
        engine.add_request(f"{tag}{i}", ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--top", type=int, default=16)
    add_config_arguments(parser.add_argument_group("engine"))
    args = parser.parse_args()
    engine = shape_engine(args.shape, args)
    count = max(1, engine.config.max_num_batched_tokens // args.prompt)
    rng = random.Random(0)
    from torch.profiler import ProfilerActivity, profile

    for label in ("warm-up", "measured"):
        add_batch(engine, label, count, args.prompt, rng)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
        while engine.has_unfinished_requests():
            engine.step()
    total, rows = kernel_table(prof, 1, args.top)
    print(f"{args.shape} kv {engine.config.kv_cache_dtype} prefill step of {count} x {args.prompt} tokens: "
          f"{wall:.1f} ms wall (profiled), GPU kernels {total:.1f} ms; top kernels (ms, calls):", flush=True)
    for ms, calls, name in rows:
        print(f"  {ms:8.3f}  {calls:5.0f}  {name}")


if __name__ == "__main__":
    main()
