"""The engine's decode throughput and KV capacity with a bf16 vs int8 vs fp8 vs auto-switched KV cache.

    PYTHONPATH=. python3 bench/bench_kv_quant_engine.py [--layers 4] [--batch 64] [--context 4096] \
        [--caches bf16,int8,fp8,auto] [--gqa-groups 0] [--json PATH]

Llama-3-8B shapes (hidden 4096, 32 query / 8 KV heads of 128, intermediate 14336, vocab 128256),
random bf16 weights, `--layers` of the 32 layers (the KV read per layer is what changes; fewer layers
keep the checkpoint small). Per cache: KV blocks in the pool at gpu_memory_utilization 0.9, bytes per
block, the 8k-token requests that fit, then `--batch` requests of `--context` random prompt tokens
decoding `--new-tokens` tokens each; decode tokens/s counts only steps with no prefill in them.
CUDA only (the device machine).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
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
          "auto": {"kv_quant_auto_threshold": 32}}


def build_checkpoint(out: Path, layers: int) -> Path:
    import transformers

    raw = model_config("llama", "tiny", num_hidden_layers=layers, torch_dtype="bfloat16", **LLAMA3_8B)
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


def run_cache(path: Path, name: str, args: argparse.Namespace) -> dict:
    extra = dict(CACHES[name])
    if args.gqa_groups:
        extra.update(attention="gqa", kv_head_groups=args.gqa_groups)
    engine = LLMEngine(EngineConfig(
        model=str(path), dtype="bfloat16", show_progress=False, max_num_seqs=args.batch,
        max_num_batched_tokens=8192, enable_prefix_caching=False, **extra,
    ))
    kv = engine.stats()["kv"]
    rng = random.Random(0)
    for i in range(args.batch):
        prompt = [rng.randrange(3, engine.model_config.vocab_size) for _ in range(args.context)]
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True))
    decode_tokens, decode_time, preempted = 0, 0.0, 0
    while engine.has_unfinished_requests():
        prefilling = any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or bool(
            engine.scheduler.waiting)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = engine.step()
        torch.cuda.synchronize()
        if not prefilling:
            decode_time += time.perf_counter() - start
            decode_tokens += sum(len(o.new_token_ids) for o in outs)
    stats = engine.stats()
    preempted = stats["requests"]["preemptions_total"]
    result = {
        "cache": name, "gqa_groups": args.gqa_groups or None, "layers": args.layers,
        "kv_blocks": kv["blocks_total"], "bytes_per_block": kv["bytes_per_block"],
        "kv_pool_bytes": stats["memory_bytes"]["kv_pool"],
        "max_8k_requests": kv["blocks_total"] * kv["block_size"] // 8192,
        "batch": args.batch, "context": args.context, "decode_tokens_per_s": decode_tokens / max(decode_time, 1e-9),
        "preemptions": preempted, "strategy_dtype": stats["engine"]["kv_cache_dtype"],
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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_kv_quant_engine needs CUDA (run it on the device machine)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "llama3-8b-shapes", args.layers)
        for name in args.caches.split(","):
            results.append(run_cache(path, name, args))
            print(json.dumps(results[-1]), flush=True)
    base = results[0]["decode_tokens_per_s"]
    print("| cache | bytes/block | KV blocks | 8k requests | decode tok/s | vs first |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['cache']} | {r['bytes_per_block']} | {r['kv_blocks']} | {r['max_8k_requests']} | "
              f"{r['decode_tokens_per_s']:.0f} | {r['decode_tokens_per_s'] / base:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
