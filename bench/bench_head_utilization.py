"""Cost of sampling gqa_head_utilization: decode time with and without it, on CPU.

    python bench/bench_head_utilization.py [--every 16 --period 64] [--batch 8] [--prompt 512] [--steps 192]

Runs the same greedy decode twice on a make-model "small" llama (4 layers, 8 query / 2 KV heads,
fp32): head_utilization_every=0 (off) and =EVERY (16, for enough samples to time). Reports total decode time of each run, and,
from the sampled run itself, the median time of sampled vs unsampled decode steps: the extra cost
of one sample divided by PERIOD steps (64, the serving default) is the amortised overhead (robust to run-to-run noise on a
shared machine, unlike the difference of two totals).
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


def decode_run(
    model: str, every: int, batch: int, prompt: int, steps: int, device: str = "cpu"
) -> tuple[float, list[float], list[float]]:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    eng = LLMEngine(
        EngineConfig(model=model, device=device, dtype="float32", show_progress=False, head_utilization_every=every,
                     max_num_batched_tokens=batch * prompt, cpu_kv_cache_bytes=512 * 2**20)
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for b in range(batch):
        eng.add_request(f"r{b}", [(b * 7 + i) % 1000 + 3 for i in range(prompt)], params)
    eng.step()  # prefill
    sampler = eng.checks.head_utilization
    sampled, plain = [], []
    start = time.perf_counter()
    for _ in range(steps):
        before = sampler.samples_total
        t = time.perf_counter()
        eng.step()
        sync()
        (sampled if sampler.samples_total > before else plain).append(time.perf_counter() - t)
    return time.perf_counter() - start, sampled, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=16, help="period of this run (more samples to time)")
    parser.add_argument("--period", type=int, default=64, help="the serving period the overhead is quoted at")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=192)
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_model(tmp, "llama", "small"))
        off_total, _, off_steps = decode_run(model, 0, args.batch, args.prompt, args.steps, args.device)
        on_total, sampled, plain = decode_run(model, args.every, args.batch, args.prompt, args.steps, args.device)
    step = statistics.median(plain)
    extra = statistics.median(sampled) - step
    print(f"torch threads {torch.get_num_threads()}, batch {args.batch}, context {args.prompt}+, every {args.every}")
    print(f"decode total: off {off_total:.2f} s, on {on_total:.2f} s ({100 * (on_total / off_total - 1):+.2f}%)")
    print(f"median step: off {statistics.median(off_steps) * 1e3:.2f} ms, unsampled {step * 1e3:.2f} ms, "
          f"sampled {statistics.median(sampled) * 1e3:.2f} ms ({len(sampled)} samples)")  # fmt: skip
    print(f"one sample costs {extra * 1e3:.2f} ms = {extra / step:.3f} steps; amortised: "
          f"{100 * extra / (step * args.every):.3f}% at every {args.every}, "
          f"{100 * extra / (step * args.period):.3f}% at every {args.period}")  # fmt: skip


if __name__ == "__main__":
    main()
