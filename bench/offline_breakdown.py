"""`kvpilot bench offline`'s workload with each engine step timed and classified: where a cache's time goes.

    PYTHONPATH=. python3 bench/offline_breakdown.py [--shape llama-3-8b] [--num-requests 256] \
        [--input-len 100:1024] [--output-len 100:1024] [--seed 0] [EngineConfig knobs, e.g. --kv-cache-dtype int8]

The same engine, warm-up and requests as `kvpilot bench offline --shape ...` (random weights). Every
step's wall time (perf_counter from one step() return to the next; under async scheduling a step
returns once its successor is queued, so the wall time follows the device) is put in one class:
`prefill` (the step has prefill chunks), `validation` (a runtime-validation check ran after it),
`eager decode` (decode-only, not replayed from a CUDA graph) or `graph decode`. Per class: steps, total
and median ms, and the seconds spent inside the runtime-validation hook (its dense recompute and
cosine, which read the device). Triton compiles during the timed run are counted from new files in the
Triton cache (`TRITON_CACHE_DIR`, a fresh directory unless set): a compile mid-run is a stall no kernel
profile shows. The last line is the JSON record (`bench: offline_breakdown`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))


def cache_files(root: str) -> int:
    """Compiled-kernel metadata files under a Triton cache directory (one per compiled variant)."""
    return sum(name.endswith(".json") and not name.startswith("__grp__")
               for _, _, files in os.walk(root) for name in files)  # fmt: skip


class StepClock:
    """Times LLMEngine.step() calls and classifies each by what the engine did in it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.rows: list[tuple[str, float]] = []
        self.validation_s = 0.0
        self._step_validation = 0.0
        hooks = engine.checks
        after = hooks.validation.after_step

        def timed_after() -> None:
            start = time.perf_counter()
            try:
                after()
            finally:
                self._step_validation += time.perf_counter() - start

        hooks.validation.after_step = timed_after

    def run(self, requests: list[Any], temperature: float, tag: str) -> dict:
        from kvpilot.engine.sampling_params import SamplingParams

        engine = self.engine
        for i, req in enumerate(requests):
            params = SamplingParams(max_tokens=req.max_tokens, temperature=temperature, ignore_eos=True)
            engine.add_request(f"{tag}-{i}", req.prompt, params)
        graphs = engine.runner.decode_graphs
        validation = engine.checks.validation
        output_tokens = 0
        self.rows, self.validation_s = [], 0.0
        start = last = time.perf_counter()
        while engine.has_unfinished_requests():
            replays = graphs.replays_total if graphs is not None else 0
            checks = validation.checks_total + validation.checks_skipped_total
            prefill = [0]
            schedule = engine.scheduler.schedule

            def spy(schedule=schedule, prefill=prefill):
                out = schedule()
                prefill[0] = sum(s.num_new_tokens for s in out.scheduled if s.num_new_tokens > 1)
                return out

            engine.scheduler.schedule = spy
            self._step_validation = 0.0
            try:
                outs = engine.step()
            finally:
                del engine.scheduler.schedule
            now = time.perf_counter()
            replayed = graphs is not None and graphs.replays_total > replays
            checked = validation.checks_total + validation.checks_skipped_total > checks
            kind = ("prefill" if prefill[0] else "validation" if checked
                    else "graph decode" if replayed else "eager decode")  # fmt: skip
            self.rows.append((kind, (now - last) * 1e3))
            self.validation_s += self._step_validation
            last = now
            output_tokens += sum(len(o.new_token_ids) for o in outs)
            if len(self.rows) % 250 == 0:  # a run cut short by a time limit still says where it went
                print(f"  {tag} after {len(self.rows)} steps, {now - start:.2f} s: {self.classes()}", flush=True)
        if engine.runner.is_cuda:
            import torch

            torch.cuda.synchronize()
        return {"seconds": time.perf_counter() - start, "output_tokens": output_tokens}

    def classes(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind in ("prefill", "validation", "eager decode", "graph decode"):
            ms = [t for k, t in self.rows if k == kind]
            if ms:
                out[kind] = {"steps": len(ms), "total_s": round(sum(ms) / 1e3, 3), "median_ms": round(statistics.median(ms), 2),
                             "max_ms": round(max(ms), 1)}  # fmt: skip
        return out


def main() -> None:
    from kvpilot.bench.shapes import SHAPES
    from kvpilot.engine.config.arguments import add_config_arguments, config_kwargs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    parser.add_argument("--model", help="a checkpoint directory instead of --shape's random weights")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--input-len", default="100:1024")
    parser.add_argument("--output-len", default="100:1024")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0)
    add_config_arguments(parser.add_argument_group("engine"))
    args = parser.parse_args()
    triton_cache = os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-breakdown-"))

    from kvpilot.bench.offline import warmup_requests
    from kvpilot.bench.shapes import write_shape
    from kvpilot.bench.workload import parse_range, random_requests
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    knobs = config_kwargs(args)
    knobs["show_progress"] = False
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model = args.model
        else:
            model, knobs["load_format"] = str(write_shape(args.shape, tmp)), "dummy"
        engine = LLMEngine(EngineConfig(model=model, **knobs))
    requests = random_requests(args.num_requests, parse_range(args.input_len), parse_range(args.output_len),
                               engine.model_config.vocab_size, args.seed)  # fmt: skip
    print(f"engine ready: {engine.runner.num_kv_blocks} KV blocks, graphs {engine.runner.decode_graphs is not None}, "
          f"async {engine.async_scheduling}", flush=True)  # fmt: skip
    clock = StepClock(engine)
    clock.run(warmup_requests(requests), args.temperature, "warmup")
    compiled_before = cache_files(triton_cache)
    run = clock.run(requests, args.temperature, "offline")
    compiled = cache_files(triton_cache) - compiled_before
    expected = sum(r.max_tokens for r in requests)
    if run["output_tokens"] != expected:
        raise RuntimeError(f"the engine generated {run['output_tokens']} tokens, the workload asks {expected}")
    classes = clock.classes()
    name = args.model or args.shape
    print(f"{name} kv {engine.config.kv_cache_dtype}: {run['output_tokens']} tokens in {run['seconds']:.2f} s = "
          f"{run['output_tokens'] / run['seconds']:.0f} output tok/s; Triton compiles during the run: {compiled}; "
          f"inside runtime validation: {clock.validation_s:.3f} s")  # fmt: skip
    for kind, row in classes.items():
        print(f"  {kind:>13}: {row['steps']:5d} steps, {row['total_s']:7.3f} s, median {row['median_ms']:6.2f} ms, "
              f"max {row['max_ms']:7.1f} ms")  # fmt: skip
    feed = engine.checks.feed_sections()["validation"]
    print(json.dumps({
        "bench": "offline_breakdown", "model": name, "kv_cache_dtype": engine.config.kv_cache_dtype,
        "seconds": round(run["seconds"], 3), "output_tok_s": round(run["output_tokens"] / run["seconds"], 1),
        "kv_blocks": engine.runner.num_kv_blocks, "async_scheduling": engine.async_scheduling,
        "triton_compiles_in_run": compiled, "validation_hook_s": round(clock.validation_s, 3),
        "validation": {k: feed[k] for k in ("checks_total", "fallbacks_total", "checks_skipped_total")},
        "classes": classes,
    }))  # fmt: skip
    engine.shutdown()


if __name__ == "__main__":
    main()
