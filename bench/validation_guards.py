"""How runtime validation behaves on a trained checkpoint: checks, fallbacks and cosines per strategy.

    python bench/validation_guards.py /tmp/tiny-trained [--prompts 4 --tokens 64 --every 16]

Greedy generation from held-out prompts (bench/perplexity.py's windows) with every sequence validated
every `--every` decode tokens at the default threshold 0.92 and the default 10% fallback reserve
(`--reserve`); prints, per strategy, the checks run, the fallbacks (moved to the exact path), the
failures with no exact path (unrecovered) and the lowest cosine seen.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from perplexity import heldout_windows, strategies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=192)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--every", type=int, default=16)
    parser.add_argument("--reserve", type=float, default=0.1)
    parser.add_argument("--only", help="comma-separated label prefixes (default: all)")
    parser.add_argument("--calibration", help="a text file (not held out): adds the calibrated GQA/MLA conversions")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = parser.parse_args()
    raw = json.loads((args.model / "config.json").read_text())
    heads_kv = int(raw.get("num_key_value_heads") or raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"])
    print("| strategy | checks | fallbacks | unrecovered | lowest cosine (last of each step) | reserve blocks |\n|---|---|---|---|---|---|")
    for label, overrides in strategies(heads_kv, head_dim, 4 * args.prompt_length, args.calibration):
        if label == "native" or (args.only and not any(label.startswith(p) for p in args.only.split(","))):
            continue
        engine = LLMEngine(EngineConfig(
            model=str(args.model), device=args.device, show_progress=False, cpu_kv_cache_bytes=256 * 2**20,
            gpu_memory_utilization=args.gpu_memory_utilization,
            validate_every=args.every, validation_sample_rate=1.0, fallback_reserve=args.reserve, **overrides,
        ))  # fmt: skip
        prompts = heldout_windows(args.model, engine.tokenizer, args.prompt_length, args.prompts)
        lowest = 1.0
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
        for i, prompt in enumerate(prompts):
            engine.add_request(f"p{i}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
            cosine = engine.stats()["validation"]["last_cosine"]
            lowest = min(lowest, cosine) if cosine is not None else lowest
        v = engine.stats()["validation"]
        fallbacks = sum(n for reasons in v["fallbacks_total"].values() for n in reasons.values())
        print(f"| {label} | {v['checks_total']} | {fallbacks} | {sum(v['unrecovered_total'].values())} | "
              f"{lowest:.4f} | {v['reserve']['blocks_total']} |", flush=True)  # fmt: skip
        del engine
        gc.collect()


if __name__ == "__main__":
    main()
