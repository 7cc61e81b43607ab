"""Where a decode step of a named shape spends GPU time, by kernel (torch profiler), and its step time.

    PYTHONPATH=. python3 bench/profile_decode_kernels.py [--shape llama-3-8b] [--batch 1] [--context 512] \
        [--steps 20] [--top 18] [EngineConfig knobs, e.g. --enforce-eager]

Random weights of the shape (load_format=dummy). `--batch` requests with `--context` prompt tokens
already computed (bench/decode_harness.admit_computed: blocks allocated, K/V random) decode for
`--steps` timed steps after 5 warm-up steps: the median wall time of LLMEngine.step() with a synchronize
around each, and the mean of `--steps` steps run back to back (what async scheduling overlaps) are printed,
then, over `--steps` more steps under the profiler, the GPU kernels by total time per step
(graph replays included where CUPTI reports them; run with --enforce-eager to see every kernel).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench.decode_harness import admit_computed, kernel_table, shape_engine
from kvpilot.bench.shapes import SHAPES
from kvpilot.engine.config.arguments import add_config_arguments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--fold-reduce", action="store_true",
                        help="paged decode folds its split reduction into the split kernel (heuristics.FOLD_REDUCE)")
    parser.add_argument("--gemv-split-epilogue", action="store_true",
                        help="the fused GEMV's two-level epilogue (kernels/gemv_norm/launcher.SPLIT_EPILOGUE)")
    add_config_arguments(parser.add_argument_group("engine"))
    args = parser.parse_args()
    if args.fold_reduce:
        from kvpilot.engine.kernels.paged_decode import heuristics

        heuristics.FOLD_REDUCE = True
    if args.gemv_split_epilogue:
        from kvpilot.engine.kernels.gemv_norm import launcher

        launcher.SPLIT_EPILOGUE = True
    engine = shape_engine(args.shape, args)
    admit_computed(engine, args.batch, args.context, max_tokens=3 * args.steps + 10)
    for _ in range(5):
        engine.step()
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    synced_ms = statistics.median(times)
    # back to back, as serving runs them: under async scheduling the host prepares step N+1 while the
    # GPU runs step N, which a synchronize around each step would undo
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - start) * 1e3 / args.steps
    print(f"{args.shape} batch {args.batch} context {args.context} graphs {engine.runner.decode_graphs is not None} "
          f"async {engine.async_scheduling}: step {step_ms:.2f} ms back to back ({args.batch / step_ms * 1e3:.0f} "
          f"tok/s), {synced_ms:.2f} ms median with a synchronize around each", flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    total, rows = kernel_table(prof, args.steps, args.top)
    print(f"GPU kernel time {total:.2f} ms/step; top kernels (ms/step, calls/step):")
    for ms, calls, name in rows:
        print(f"  {ms:7.3f}  {calls:6.1f}  {name}")
    print(json.dumps({"bench": "decode_profile", "shape": args.shape, "batch": args.batch, "context": args.context,
                      "step_ms": round(step_ms, 3), "synced_step_ms": round(synced_ms, 3),
                      "async_scheduling": engine.async_scheduling, "gpu_kernel_ms": round(total, 3),
                      "graphs": engine.runner.decode_graphs is not None}))


if __name__ == "__main__":
    main()
