"""Cost of sampling gqa_head_utilization, as a share of decode time.

    python bench/bench_head_utilization.py [--every 16 --period 64 --batch 8 --prompt 512 --steps 96]
    python bench/bench_head_utilization.py --device cuda --batch 64 --prompt 4096   # on the device

Greedy decode on a make-model "small" llama (4 layers, 8 query / 2 KV heads, fp32) with
head_utilization_every=EVERY (16: enough samples to time in a short run). The sampler times its
own hooks (`seconds_total`), so the cost is measured inside the same run as the decode it is
compared with: per-sample cost / median decode step = samples' cost in steps, and that divided by
PERIOD (64, the serving default) is the overhead. On a loaded shared machine this is far more
stable than the difference of two runs' totals (also printed with --compare-off).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams


def decode_run(model: str, every: int, args: argparse.Namespace) -> tuple[float, list[float], LLMEngine]:
    eng = LLMEngine(
        EngineConfig(model=model, device=args.device, dtype="float32", show_progress=False,
                     head_utilization_every=every, max_num_batched_tokens=args.batch * args.prompt,
                     cpu_kv_cache_bytes=512 * 2**20)
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 1, ignore_eos=True)
    for b in range(args.batch):
        eng.add_request(f"r{b}", [(b * 7 + i) % 1000 + 3 for i in range(args.prompt)], params)
    eng.step()  # prefill
    steps = []
    start = time.perf_counter()
    for _ in range(args.steps):
        t = time.perf_counter()
        eng.step()
        steps.append(time.perf_counter() - t)
    return time.perf_counter() - start, steps, eng


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=16, help="period of this run (more samples to time)")
    parser.add_argument("--period", type=int, default=64, help="the serving period the overhead is quoted at")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--compare-off", action="store_true", help="also time a run without sampling")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(tmp, "llama", "small"))
        total, steps, eng = decode_run(model, args.every, args)
        off_total = decode_run(model, 0, args)[0] if args.compare_off else None
    sampler = eng.checks.head_utilization
    per_sample = sampler.seconds_total / max(1, sampler.samples_total)
    step = statistics.median(steps)
    print(f"{args.device}, torch threads {torch.get_num_threads()}, batch {args.batch}, context {args.prompt}+, "
          f"{args.steps} decode steps, every {args.every}: {sampler.samples_total} samples")  # fmt: skip
    print(f"decode total {total:.2f} s, median step {step * 1e3:.2f} ms; sampling hooks {sampler.seconds_total:.3f} s "
          f"= {100 * sampler.seconds_total / total:.3f}% of this run")  # fmt: skip
    print(f"one sample {per_sample * 1e3:.2f} ms = {per_sample / step:.4f} steps; overhead at every {args.period}: "
          f"{100 * per_sample / (step * args.period):.3f}% of decode time")  # fmt: skip
    if off_total is not None:
        print(f"run without sampling: {off_total:.2f} s ({100 * (total / off_total - 1):+.2f}% with; noisy)")


if __name__ == "__main__":
    main()
