"""Where one decode step of LLMEngine.step() spends its time: the model forward vs the host work around it.

    PYTHONPATH=. python3 bench/profile_engine_step.py [--batch 64] [--context 4096] [--block-size 16] \
        [--steps 30] [--warmup 5] [--device cpu|cuda] [--size tiny] [--kv-cache-dtype auto] [--auto-threshold N] \
        [--no-prefix-caching] [--stub-model] [--cprofile-steps 10] [--top 25] [--json PATH]

A tiny random Llama checkpoint is made in a temporary directory. `--batch` requests of `--context`
random prompt tokens are put straight into the running batch with their prompts marked computed
(blocks allocated and committed, the K/V left zero: the prefill is not what is profiled, and on a
CPU it would take minutes), so every measured step is a pure decode step whose block tables are
batch x context/block_size wide. After `--warmup` steps (JIT compiles, caches), `--steps` steps are
timed: per step the wall time of step(), the time inside the model (forward and compute_logits,
with a device synchronise around them on CUDA, so there it is their launches plus GPU time), the time in sampling
(same), and host = step - model - sampling: scheduler, block manager, building the step's tensors,
postprocess, stats, runtime-check hooks. Median and mean are printed, then a cProfile of
`--cprofile-steps` more steps (cProfile inflates Python-heavy code; read it for where, not how much).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.decode_harness import admit_computed
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model

# pstats restriction: kvpilot's engine files except the model, its attention layers and kernels
HOST_CODE = r"kvpilot/engine/(?!kernels/|models/|layers/|strategies/kv_quant/layer\.py)"


class StepTimer:
    """Accumulates wall time spent inside wrapped callables (synchronising a CUDA device around them)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.seconds = 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def wrap(self, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.seconds += time.perf_counter() - start

        return timed


def build_engine(args: argparse.Namespace, model_dir: Path) -> LLMEngine:
    total = args.context + args.warmup + args.steps + args.cprofile_steps + 2
    blocks_per_seq = -(-total // args.block_size)
    extra: dict[str, Any] = {"kv_cache_dtype": args.kv_cache_dtype}
    kv_blocks = args.batch * blocks_per_seq + 1
    if args.kv_cache_dtype in ("int8", "fp8"):  # the 16-bit fallback reserve takes its share of the pool
        kv_blocks = -(-kv_blocks * 5 // 4)
    if args.auto_threshold is not None:  # kv_cache_dtype auto switching 16-bit / int8 blocks by batch size
        extra["kv_quant_auto_threshold"] = args.auto_threshold
    if args.stub_model:  # no attention layer runs, so no served output to validate
        extra["validation_sample_rate"] = 0.0
    return LLMEngine(EngineConfig(
        model=str(model_dir), device=args.device, block_size=args.block_size,
        num_kv_blocks=kv_blocks, max_num_seqs=args.batch,
        max_num_batched_tokens=max(2048, args.batch), max_model_len=total + 1,
        enable_prefix_caching=not args.no_prefix_caching, show_progress=False, **extra,
    ))


def time_steps(engine: LLMEngine, n: int, model: StepTimer, sampling: StepTimer) -> list[dict[str, float]]:
    rows = []
    for _ in range(n):
        if model.cuda:
            torch.cuda.synchronize()
        model.seconds = sampling.seconds = 0.0
        start = time.perf_counter()
        outs = engine.step()
        if model.cuda:
            torch.cuda.synchronize()
        total = time.perf_counter() - start
        if len(outs) != engine.config.max_num_seqs:
            raise RuntimeError(f"a step produced {len(outs)} outputs, expected one per sequence (was it a decode?)")
        rows.append({
            "step_ms": total * 1e3, "model_ms": model.seconds * 1e3, "sample_ms": sampling.seconds * 1e3,
            "host_ms": (total - model.seconds - sampling.seconds) * 1e3,
        })
    return rows


def summarise(rows: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        out[f"median_{key}"] = statistics.median(values)
        out[f"mean_{key}"] = statistics.fmean(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's 16-bit dtype), int8, fp8")
    parser.add_argument("--auto-threshold", type=int, help="kv_cache_dtype auto: switch to int8 blocks at this batch")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--cprofile-steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--stub-model", action="store_true",
                        help="replace the model forward by a zeros tensor (host work only, quick and less noisy)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        total = args.context + args.warmup + args.steps + args.cprofile_steps + 2
        model_dir = make_model(Path(tmp) / "tiny", "llama", args.size, max_position_embeddings=max(2048, total + 16))
        engine = build_engine(args, model_dir)
    runner = engine.runner
    model_timer, sample_timer = StepTimer(runner.device), StepTimer(runner.device)
    forward = runner.model.forward
    if args.stub_model:  # host work only: the forward returns zeros (the attention layers never run)
        hidden = engine.model_config.hidden_size

        def forward(ids: torch.Tensor, _positions: torch.Tensor) -> torch.Tensor:
            return torch.zeros(ids.shape[0], hidden, dtype=runner.dtype, device=runner.device)

    runner.model.forward = model_timer.wrap(forward)
    runner.model.compute_logits = model_timer.wrap(runner.model.compute_logits)
    runner._sample = sample_timer.wrap(runner._sample)
    start = time.perf_counter()
    admit_computed(engine, args.batch, args.context, total, fill_cache=False)
    admit_s = time.perf_counter() - start
    time_steps(engine, args.warmup, model_timer, sample_timer)
    rows = time_steps(engine, args.steps, model_timer, sample_timer)
    result: dict[str, Any] = {
        "device": runner.device.type, "batch": args.batch, "context": args.context, "block_size": args.block_size,
        "block_table_width": max(len(s.block_table) for s in engine.scheduler.running),
        "kv_cache_dtype": str(runner.kv_dtype).removeprefix("torch."), "steps": args.steps,
        "stub_model": args.stub_model,
        "admit_seconds": admit_s, **summarise(rows),
    }
    print(json.dumps(result))
    print(f"decode step at batch {args.batch} x context {args.context} ({runner.device.type}): "
          f"median {result['median_step_ms']:.2f} ms = model {result['median_model_ms']:.2f} + "
          f"sampling {result['median_sample_ms']:.2f} + host {result['median_host_ms']:.2f} ms "
          f"(means {result['mean_step_ms']:.2f} / {result['mean_model_ms']:.2f} / {result['mean_sample_ms']:.2f} / "
          f"{result['mean_host_ms']:.2f})")
    if args.cprofile_steps:
        profiler = cProfile.Profile()
        profiler.enable()
        time_steps(engine, args.cprofile_steps, model_timer, sample_timer)
        profiler.disable()
        for order, where, label in (
            ("cumulative", HOST_CODE, "engine code outside the model"),
            ("tottime", HOST_CODE, "engine code outside the model"),
            ("tottime", "", "everything"),
        ):
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text).sort_stats(order)
            stats.print_stats(where, args.top) if where else stats.print_stats(args.top)
            print(f"--- cProfile of {args.cprofile_steps} steps, {label}, by {order} ---")
            print(text.getvalue().split("\n\n", 2)[-1].strip())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
