"""Shared by the CPU decode benches: requests admitted with their prompts already computed, timed steps.

Every timed step is then a pure decode step over a full batch, without paying for the prefill.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvpilot.engine.core.sequence import SequenceStatus
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams


def shape_engine(shape: str, args: Any) -> LLMEngine:
    """An engine of a named shape (kvpilot.bench.shapes) with random weights and the parsed EngineConfig knobs
    (kvpilot.engine.config.arguments.add_config_arguments)."""
    from kvpilot.bench.shapes import write_shape
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.config.arguments import config_kwargs

    knobs = config_kwargs(args)
    knobs["load_format"] = "dummy"
    with tempfile.TemporaryDirectory() as tmp:
        return LLMEngine(EngineConfig(model=str(write_shape(shape, tmp)), show_progress=False, **knobs))


def kernel_table(prof: Any, per: int, top: int) -> tuple[float, list[tuple[float, float, str]]]:
    """(GPU kernel ms per `per`, the `top` kernels as (ms per `per`, calls per `per`, name)) of a torch profile."""
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time)
    total = sum(sum(v) for v in kernels.values()) / per / 1e3
    rows = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]
    return total, [(sum(us) / per / 1e3, len(us) / per, name[:110]) for name, us in rows]


def admit_computed(engine: LLMEngine, batch: int, context: int, max_tokens: int, fill_cache: bool = True) -> None:
    """`batch` running requests of `context` random prompt tokens with all but the last computed.

    fill_cache: the KV cache gets random rows (the computed tokens were never written) and, for a
    linear-attention engine, each summary is resident (a hit at the first decode step) with random
    positive values.
    """
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    scheduler, bm = engine.scheduler, engine.block_manager
    linear = engine.runner.linear_state if fill_cache else None
    for i in range(batch):
        prompt = [rng.randrange(3, vocab) for _ in range(context)]
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    while scheduler.waiting:
        seq = scheduler.waiting.popleft()
        bm.allocate(seq, len(seq), [])
        seq.num_computed_tokens = len(seq) - 1  # the first step computes the last prompt token and samples
        bm.commit(seq)
        seq.status = SequenceStatus.RUNNING
        scheduler.running.append(seq)
        if linear is not None:
            linear.pool.resolve(seq.request_id, 0)
            linear.pool.advance(seq.request_id, seq.num_computed_tokens)
    if fill_cache:
        torch.manual_seed(0)
        engine.runner.kv_cache.normal_()
        if linear is not None:
            for layer in linear.layers:
                layer.state_pool.uniform_(0.0, 1.0)


def time_steps(engine: LLMEngine, warmup: int, steps: int) -> dict[str, float]:
    """Median wall time of `steps` engine steps after `warmup`, and of the model forward inside them."""
    model = engine.runner.model
    forward, spent = model.forward, [0.0]

    def timed_forward(*args: Any) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return forward(*args)
        finally:
            spent[0] += time.perf_counter() - start

    model.forward = timed_forward
    rows = []
    batch = engine.config.max_num_seqs
    try:
        for i in range(warmup + steps):
            spent[0] = 0.0
            start = time.perf_counter()
            outs = engine.step()
            total = time.perf_counter() - start
            if len(outs) != batch:
                raise RuntimeError(f"a step produced {len(outs)} outputs, expected one per sequence")
            if i >= warmup:
                rows.append((total * 1e3, spent[0] * 1e3))
    finally:
        model.forward = forward
    step_ms = statistics.median(r[0] for r in rows)
    return {"step_ms": step_ms, "forward_ms": statistics.median(r[1] for r in rows), "tok_s": batch / step_ms * 1e3}


def run_grid(args: Any, build_engine: Callable[[Path, str, int, int], LLMEngine]) -> list[dict[str, Any]]:
    """Time decode steps for every batch x context x path of `args` on one random Llama checkpoint.

    args: batches, contexts (comma-separated), paths (comma-separated), hidden, layers, heads, kv_heads,
    warmup, steps. build_engine(model_dir, path, batch, total_tokens) makes one engine per cell.
    """
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        longest = max(contexts) + args.warmup + args.steps + 2
        model_dir = make_model(
            Path(tmp) / "llama", "llama", "tiny", hidden_size=args.hidden, intermediate_size=2 * args.hidden,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
            head_dim=args.hidden // args.heads, max_position_embeddings=max(2048, longest + 16),
        )  # fmt: skip
        for batch in batches:
            for context in contexts:
                total = context + args.warmup + args.steps + 2
                for path in args.paths.split(","):
                    engine = build_engine(model_dir, path, batch, total)
                    admit_computed(engine, batch, context, total)
                    result = time_steps(engine, args.warmup, args.steps)
                    rows.append({"batch": batch, "context": context, "path": path, **result})
                    print(f"batch {batch:>3} context {context:>5} {path:18} step {result['step_ms']:9.2f} ms "
                          f"(forward {result['forward_ms']:9.2f} ms) {result['tok_s']:9.1f} tok/s",
                          flush=True)  # fmt: skip
                    del engine
    return rows
