"""Decode step of a MoE shape (DeepSeek MLA or MiniMax hybrid) against its bytes bound, measured in one run.

    PYTHONPATH=. python3 bench/bench_moe_decode.py --shape deepseek-v2-lite [--batches 64,1] [--context 1024] \
        [--steps 20] [--json out.json] [EngineConfig knobs, e.g. --enforce-eager]

Random weights of the shape (load_format=dummy), one engine. For each batch, `batch` requests with
`--context` prompt tokens already computed (bench/decode_harness.admit_computed) decode: the median
wall time of LLMEngine.step() over `--steps` steps after 5 warm-up steps, then the GPU kernel time
per step (torch profiler). The bytes bound of that step, at the device-to-device copy bandwidth
measured first in the same process (read + written bytes / s):
- weights touched: every parameter outside the routed experts (the embedding: the batch's rows), plus
  per MoE layer the experts this batch routes to (counted in one hooked step: `experts_touched`);
- cache: DeepSeek's latent rows (every layer, batch x context x latent width), MiniMax's softmax
  layers' K/V rows and its lightning layers' fp32 state (read and written).
`--model DIR` runs a checkpoint instead of a shape (CPU smoke runs: `--device cpu`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import torch

from bench.decode_harness import admit_computed
from kvpilot.bench.shapes import SHAPES, write_shape
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.config.arguments import add_config_arguments, config_kwargs
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.models.moe import StackedExperts


def copy_gbps(device: torch.device, gib: float = 4.0, reps: int = 20) -> float:
    """Device-to-device copy: bytes read + written per second (GB/s), best of `reps`."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    del src, dst
    return 2 * n * 2 / best / 1e9


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def experts_touched(engine: LLMEngine) -> list[int]:
    """Distinct experts each MoE layer runs in the next step (a hooked step: it runs eagerly)."""
    counts: list[int] = []
    hooks = [m.register_forward_hook(lambda _m, args, _out: counts.append(int(args[2].unique().numel())))
             for m in engine.runner.model.modules() if isinstance(m, StackedExperts)]  # fmt: skip
    try:
        engine.step()
    finally:
        for h in hooks:
            h.remove()
    return counts


def step_bytes(engine: LLMEngine, batch: int, context: int, touched: list[int]) -> dict[str, int]:
    """Bytes one decode step must read (and write, for recurrent state): weights touched + cache."""
    model, mc = engine.runner.model, engine.runner.model_config
    experts = [m for m in model.modules() if isinstance(m, StackedExperts)]
    expert_params = {id(p) for m in experts for p in m.parameters()}
    dense = 0
    for name, p in model.named_parameters():
        if id(p) in expert_params:
            continue
        nbytes = p.numel() * p.element_size()
        dense += batch * p.shape[1] * p.element_size() if name.endswith("embed_tokens.weight") else nbytes
    per_expert = [(m.w13[0].numel() + m.w2[0].numel()) * m.w13.element_size() for m in experts]
    routed = sum(n * b for n, b in zip(touched, per_expert, strict=True))
    elem = engine.runner.kv_cache.element_size()
    if mc.deepseek is not None:
        cache = mc.num_hidden_layers * batch * context * mc.deepseek.latent_width * elem
    else:
        full = mc.hybrid.num_full_layers if mc.hybrid is not None else mc.num_hidden_layers
        cache = full * batch * context * 2 * mc.num_key_value_heads * mc.head_dim * elem
    state = 0
    if engine.runner.linear_state is not None:
        per_seq = sum(layer.state_pool[0].numel() * 4 for layer in engine.runner.linear_state.layers)
        state = 2 * batch * per_seq  # read and written back
    return {"dense_weights": dense, "routed_experts": routed, "cache": cache, "state": state,
            "total": dense + routed + cache + state}  # fmt: skip


def time_decode(engine: LLMEngine, batch: int, context: int, steps: int) -> dict[str, Any]:
    device = engine.runner.device
    admit_computed(engine, batch, context, max_tokens=2 * steps + 20)
    for _ in range(5):
        engine.step()
    touched = experts_touched(engine)
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        engine.step()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    gpu_ms = None
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                engine.step()
            sync(device)
        kernel_us = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        gpu_ms = kernel_us / 5 / 1e3
    for i in range(batch):
        engine.abort_request(str(i))
    step_ms = statistics.median(times)
    return {"batch": batch, "context": context, "step_ms": round(step_ms, 3), "tok_s": round(batch / step_ms * 1e3, 1),
            "gpu_kernel_ms": None if gpu_ms is None else round(gpu_ms, 3), "max_step_ms": round(max(times), 3),
            "experts_touched_mean": round(sum(touched) / max(len(touched), 1), 2),
            "bytes": step_bytes(engine, batch, context, touched)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--shape", choices=sorted(SHAPES))
    source.add_argument("--model", help="a checkpoint directory instead of a named shape")
    parser.add_argument("--batches", default="64,1")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="write the rows here too")
    add_config_arguments(parser.add_argument_group("engine"))
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    knobs = config_kwargs(args)
    if knobs.get("max_num_seqs") is None:
        knobs["max_num_seqs"] = max(batches)
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape:
            knobs["load_format"] = "dummy"
        model = str(write_shape(args.shape, tmp)) if args.shape else args.model
        start = time.perf_counter()
        engine = LLMEngine(EngineConfig(model=model, show_progress=False, **knobs))
        start_s = time.perf_counter() - start
    device = engine.runner.device
    gbps = copy_gbps(device, 4.0 if device.type == "cuda" else 0.25)
    graphs = engine.runner.decode_graphs is not None
    print(f"{args.shape or args.model}: engine start {start_s:.1f} s, graphs {graphs}, copy {gbps:.0f} GB/s", flush=True)
    rows = []
    for batch in batches:
        row = time_decode(engine, batch, args.context, args.steps)
        bound_ms = row["bytes"]["total"] / (gbps * 1e9) * 1e3
        row.update({"bench": "moe_decode", "shape": args.shape or args.model, "graphs": graphs,
                    "copy_gbps": round(gbps, 1), "bound_ms": round(bound_ms, 3),
                    "x_bound": round(row["step_ms"] / bound_ms, 2)})  # fmt: skip
        rows.append(row)
        print(f"batch {batch} context {args.context}: step {row['step_ms']:.2f} ms ({row['tok_s']:.0f} tok/s), "
              f"GPU kernels {row['gpu_kernel_ms']} ms, bound {bound_ms:.2f} ms "
              f"({row['bytes']['total'] / 1e9:.2f} GB), {row['x_bound']}x the bound", flush=True)  # fmt: skip
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
