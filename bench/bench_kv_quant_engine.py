"""The engine's decode throughput and KV capacity with a bf16 vs int8 vs fp8 vs auto-switched KV cache.

    PYTHONPATH=. python3 bench/bench_kv_quant_engine.py [--layers 4] [--batch 64] [--context 4096] \
        [--caches bf16,int8,fp8,int8-no-reserve,fp8-no-reserve,auto] [--gqa-groups 0] [--warmup-tokens 4] [--skip-steps 2] [--cuda-graphs] \
        [--json PATH]

Llama-3-8B shapes (hidden 4096, 32 query / 8 KV heads of 128, intermediate 14336, vocab 128256),
random bf16 weights, `--layers` of the 32 layers (the KV read per layer is what changes; fewer layers
keep the checkpoint small). Per cache: KV blocks in the pool at gpu_memory_utilization 0.9, bytes per
block, the 8k-token requests that fit, then `--batch` requests of `--context` random prompt tokens
decoding `--new-tokens` tokens each; decode tokens/s counts only steps with no prefill in them.

Each engine first serves an unmeasured batch of the same shape (`--warmup-tokens` tokens each), so
Triton compiles and lazy CUDA module loads fall outside the measurement. Measured are the decode
steps with all `--batch` requests running (chunked prefill admits them over many steps and the
first admitted finish first, so only about `--new-tokens` - batch x context / 8192 steps qualify;
raise `--new-tokens` for more), less the first `--skip-steps`. `decode_tokens_per_s` is the batch
over the MEDIAN such step (`decode_tokens_per_s_mean` over their mean;
`decode_tokens_per_s_all_decode_steps` is every prefill-free step, shrinking batches included, the
old definition without compiles); per step, the GPU span of the model forward (CUDA events) and
host = step - that span are reported as medians.
`int8` / `fp8` keep the default 16-bit fallback reserve (`fallback_reserve` 0.1 of the KV memory),
`int8-no-reserve` / `fp8-no-reserve` have none (the whole pool 8-bit).
`--cuda-graphs` sets EngineConfig.cuda_graphs: decode-only steps replay captured graphs where the
cache allows (kvpilot/engine/worker/cuda_graphs.py: bf16, int8 and fp8 with or without the reserve here;
auto stays eager), and the GPU span of a replayed step covers the static-input copies and the replay.
CUDA only (the device machine).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import model_config, write_generation_config, write_tokenizer
from kvpilot.engine.sampling_params import SamplingParams

LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "vocab_size": 128256, "rope_theta": 500000.0, "max_position_embeddings": 16384}
CACHES = {"bf16": {}, "int8": {"kv_cache_dtype": "int8"}, "fp8": {"kv_cache_dtype": "fp8"},
          "int8-no-reserve": {"kv_cache_dtype": "int8", "fallback_reserve": 0.0},
          "fp8-no-reserve": {"kv_cache_dtype": "fp8", "fallback_reserve": 0.0},
          "auto": {"kv_quant_auto_threshold": 32}}


def build_checkpoint(out: Path, layers: int, max_len: int = 0) -> Path:
    """Random bf16 Llama-3-8B-shaped checkpoint; max_position_embeddings grows to fit max_len tokens."""
    import transformers

    shapes = {**LLAMA3_8B, "max_position_embeddings": max(LLAMA3_8B["max_position_embeddings"], max_len)}
    raw = model_config("llama", "tiny", num_hidden_layers=layers, torch_dtype="bfloat16", **shapes)
    raw.pop("architectures")
    raw.pop("model_type")
    config = transformers.AutoConfig.for_model("llama", **raw)
    config.architectures = ["LlamaForCausalLM"]
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    write_tokenizer(out, 512)  # prompts are random ids; the tokenizer only has to load
    write_generation_config(out)
    del model
    torch.cuda.empty_cache()
    return out


def add_batch(engine: LLMEngine, args: argparse.Namespace, rng: random.Random, tag: str, new_tokens: int) -> None:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i in range(args.batch):
        prompt = [rng.randrange(3, engine.model_config.vocab_size) for _ in range(args.context)]
        engine.add_request(f"{tag}{i}", prompt, params)


class ForwardSpan:
    """CUDA events around each model forward: the GPU time from its first kernel to its last (no sync)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        forward = engine.runner.model.forward

        def timed(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                return forward(*args, **kwargs)
            finally:
                end.record()
                self.events.append((start, end))

        engine.runner.model.forward = timed
        graphs = engine.runner.decode_graphs  # replays never call model.forward: time them the same way
        if graphs is not None:
            run = graphs.run

            def timed_replay(*args, **kwargs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                try:
                    return run(*args, **kwargs)
                finally:
                    end.record()
                    self.events.append((start, end))

            graphs.run = timed_replay

    def take_ms(self) -> float:
        """Milliseconds of the forwards since the last call (call after a synchronise)."""
        ms = sum(start.elapsed_time(end) for start, end in self.events)
        self.events = []
        return ms


def run_batch(engine: LLMEngine, span: ForwardSpan) -> list[dict]:
    """Step until every request is done; one record per decode step (steps with no prefill in them)."""
    steps = []
    while engine.has_unfinished_requests():
        prefilling = any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or bool(
            engine.scheduler.waiting)
        torch.cuda.synchronize()
        span.take_ms()
        start = time.perf_counter()
        outs = engine.step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        forward_ms = span.take_ms()
        if not prefilling:
            steps.append({"ms": ms, "forward_ms": forward_ms, "tokens": sum(len(o.new_token_ids) for o in outs)})
    return steps


def run_cache(path: Path, name: str, args: argparse.Namespace) -> dict:
    extra = dict(CACHES[name])
    if args.gqa_groups:
        extra.update(attention="gqa", kv_head_groups=args.gqa_groups)
    engine = LLMEngine(EngineConfig(
        model=str(path), dtype="bfloat16", show_progress=False, max_num_seqs=args.batch,
        max_num_batched_tokens=8192, enable_prefix_caching=False, cuda_graphs=args.cuda_graphs, **extra,
    ))
    kv = engine.stats()["kv"]
    span = ForwardSpan(engine)
    rng = random.Random(0)
    warmup_steps: list[dict] = []
    if args.warmup_tokens:  # same batch and context: compiles every kernel variant the measured run uses
        add_batch(engine, args, rng, "warmup-", args.warmup_tokens)
        warmup_steps = run_batch(engine, span)
        engine.reset_stats()
    add_batch(engine, args, rng, "", args.new_tokens)
    steps = run_batch(engine, span)
    stats = engine.stats()
    # Chunked prefill admits the batch over many steps and the early requests finish first, so only the
    # decode steps where every request is still running measure decode at `--batch`.
    full = [s for s in steps if s["tokens"] == args.batch]
    measured = full[args.skip_steps :] or full or steps
    step_ms = [s["ms"] for s in measured]
    host_ms = [s["ms"] - s["forward_ms"] for s in measured]
    rates = [s["tokens"] / (s["ms"] / 1e3) for s in measured]
    decode_tokens, decode_s = sum(s["tokens"] for s in measured), sum(step_ms) / 1e3
    result = {
        "cache": name, "gqa_groups": args.gqa_groups or None, "layers": args.layers,
        "kv_blocks": kv["blocks_total"], "bytes_per_block": kv["bytes_per_block"],
        "kv_pool_bytes": stats["memory_bytes"]["kv_pool"],
        "max_8k_requests": kv["blocks_total"] * kv["block_size"] // 8192,
        "batch": args.batch, "context": args.context,
        "decode_tokens_per_s": statistics.median(rates),  # from the median step (was the mean over all steps)
        "decode_tokens_per_s_mean": decode_tokens / max(decode_s, 1e-9),
        "decode_step_ms_median": statistics.median(step_ms), "decode_step_ms_mean": statistics.fmean(step_ms),
        "decode_forward_gpu_ms_median": statistics.median(s["forward_ms"] for s in measured),
        "decode_host_ms_median": statistics.median(host_ms),
        "decode_steps_measured": len(measured), "decode_steps_skipped": len(steps) - len(measured),
        "decode_tokens_per_s_all_decode_steps": sum(s["tokens"] for s in steps) / max(sum(s["ms"] for s in steps) / 1e3,
                                                                                      1e-9),
        "first_decode_step_ms": steps[0]["ms"] if steps else None,
        "warmup_first_decode_step_ms": warmup_steps[0]["ms"] if warmup_steps else None,
        "preemptions": stats["requests"]["preemptions_total"], "strategy_dtype": stats["engine"]["kv_cache_dtype"],
        "cuda_graphs": engine.runner.decode_graphs is not None,
        "graph_replays": engine.runner.decode_graphs.replays_total if engine.runner.decode_graphs else 0,
    }
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--caches", default="bf16,int8,fp8,auto")
    parser.add_argument("--gqa-groups", type=int, default=0)
    parser.add_argument("--warmup-tokens", type=int, default=4,
                        help="tokens per request of an unmeasured batch of the same shape first (0: none)")
    parser.add_argument("--skip-steps", type=int, default=2, help="first decode steps of the measured batch left out")
    parser.add_argument("--cuda-graphs", action="store_true", help="EngineConfig.cuda_graphs: replay decode steps")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kv_quant_engine needs CUDA (run it on the device machine)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "llama3-8b-shapes", args.layers,
                                args.context + max(args.new_tokens, args.warmup_tokens) + 16)
        for name in args.caches.split(","):
            results.append(run_cache(path, name, args))
            print(json.dumps(results[-1]), flush=True)
    base = results[0]["decode_tokens_per_s"]
    print("| cache | bytes/block | KV blocks | 8k requests | decode tok/s (median step) | vs first | "
          "step ms median / mean | GPU forward ms | host ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['cache']} | {r['bytes_per_block']} | {r['kv_blocks']} | {r['max_8k_requests']} | "
              f"{r['decode_tokens_per_s']:.0f} | {r['decode_tokens_per_s'] / base:.2f}x | "
              f"{r['decode_step_ms_median']:.2f} / {r['decode_step_ms_mean']:.2f} | "
              f"{r['decode_forward_gpu_ms_median']:.2f} | {r['decode_host_ms_median']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
