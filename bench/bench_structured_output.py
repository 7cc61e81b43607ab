"""Structured output's cost per decode step on CPU: the same batch decoded plain and under a JSON
schema (the matcher fill + bitmask apply every step), and the time inside StructuredOutput.apply.

    python bench/bench_structured_output.py [--batch 16] [--tokens 64] [--size small]

Prints one JSON line; docs/benchmarks.md records a run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.structured.spec import StructuredSpec

# stays inside one string for as long as max_tokens lets it: every step is a masked JSON step
SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 4000}}, "required": ["text"]}


def run(engine: LLMEngine, batch: int, tokens: int, structured: bool) -> tuple[float, int]:
    """(seconds of engine.step() after the first step, decode steps timed)."""
    spec = StructuredSpec("json_schema", SCHEMA) if structured else None
    ids = engine.tokenizer.encode("Write JSON: ")
    for i in range(batch):
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=tokens, ignore_eos=not structured,
                                structured=spec)  # fmt: skip
        engine.add_request(f"{structured}-{i}", ids, params)
    engine.step()  # the prefill
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return time.perf_counter() - start, steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "m", "llama", args.size)
        engine = LLMEngine(EngineConfig(model=str(model), device="cpu", show_progress=False, num_kv_blocks=1024))
        engine.structured.compiler.compile(StructuredSpec("json_schema", SCHEMA))  # load xgrammar, compile once
        structured = engine.structured
        inner = structured.apply
        spent = [0.0]

        def timed(logits, seqs):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return inner(logits, seqs)
            finally:
                spent[0] += time.perf_counter() - t

        structured.apply = timed  # type: ignore[method-assign]
        run(engine, args.batch, 4, False)  # warm-up
        plain, plain_steps = run(engine, args.batch, args.tokens, False)
        spent[0] = 0.0
        masked, masked_steps = run(engine, args.batch, args.tokens, True)
    print(json.dumps({
        "batch": args.batch, "size": args.size, "decode_steps": [plain_steps, masked_steps],
        "plain_ms_per_step": round(1000 * plain / plain_steps, 3),
        "structured_ms_per_step": round(1000 * masked / masked_steps, 3),
        "apply_ms_per_step": round(1000 * spent[0] / masked_steps, 3),
        "apply_us_per_row": round(1e6 * spent[0] / masked_steps / args.batch, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
