"""`kvpilot bench offline` (engine throughput) and `kvpilot bench serve` (load against a server).

Both print a human summary, then one line of JSON last (for scripts: `| tail -1`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from pathlib import Path

from kvpilot.bench.shapes import SHAPES
from kvpilot.bench.workload import DEFAULT_LENGTHS, DEFAULT_NUM_REQUESTS, parse_range, random_requests

LENGTHS = f"{DEFAULT_LENGTHS[0]}:{DEFAULT_LENGTHS[1]}"


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=DEFAULT_NUM_REQUESTS, help="requests in the workload")
    parser.add_argument("--input-len", default=LENGTHS, help="prompt tokens, uniform in LOW:HIGH")
    parser.add_argument("--output-len", default=LENGTHS, help="generated tokens (EOS ignored), uniform in LOW:HIGH")
    parser.add_argument("--seed", type=int, default=0, help="seeds the lengths, token ids and arrival times")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvpilot.engine.config.arguments import add_config_arguments

    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    offline = sub.add_parser("offline", help="generation throughput of the engine on a fixed batch (LLM defaults)")
    source = offline.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a model directory (config.json, safetensors, tokenizer)")
    source.add_argument("--shape", choices=sorted(SHAPES), help="random weights of a published model's shape")
    _workload_arguments(offline)
    offline.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    add_config_arguments(offline.add_argument_group("engine (EngineConfig knobs; defaults as LLM())"))

    serve = sub.add_parser("serve", help="Poisson load against an OpenAI-compatible server's /v1/completions")
    serve.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (without /v1)")
    serve.add_argument("--served-model", required=True, help="the model name the server lists in /v1/models")
    serve.add_argument("--request-rate", default="inf",
                       help="comma-separated request rates per second, Poisson arrivals (inf: all at once)")
    serve.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    serve.add_argument("--vocab-size", type=int, default=10000, help="random prompt ids stay below this")
    serve.add_argument("--api-key", default=None, help="sent as a bearer token")
    serve.add_argument("--timeout", type=float, default=600.0, help="seconds per request at most")
    _workload_arguments(serve)


def run(args: argparse.Namespace) -> int:
    try:
        return _offline(args) if args.mode == "offline" else _serve(args)
    except ValueError as exc:
        print(f"kvpilot bench {args.mode}: {exc}", file=sys.stderr)
        return 2


def _offline(args: argparse.Namespace) -> int:
    from kvpilot.bench.offline import offline_result, run_engine, warmup_requests
    from kvpilot.bench.shapes import write_shape
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.config.arguments import config_kwargs
    from kvpilot.engine.llm_engine import LLMEngine

    inputs, outputs = parse_range(args.input_len), parse_range(args.output_len)
    knobs = config_kwargs(args)
    with tempfile.TemporaryDirectory(prefix="kvpilot-bench-") as tmp:
        if args.shape:
            model_dir, knobs["load_format"] = write_shape(args.shape, tmp), "dummy"
        elif not (args.model / "config.json").is_file():
            raise ValueError(f"{args.model} is not a model directory: config.json is missing")
        else:
            model_dir = args.model
        engine = LLMEngine(EngineConfig(model=str(model_dir), show_progress=not args.no_progress, **knobs))
        requests = random_requests(args.num_requests, inputs, outputs, engine.model_config.vocab_size, args.seed)
        progress = not args.no_progress
        try:
            run_engine(engine, warmup_requests(requests), args.temperature, "warmup", progress)
            run = run_engine(engine, requests, args.temperature, "offline", progress)
        finally:
            engine.shutdown()  # tensor-parallel ranks stop (nothing to do at one rank)
    result = offline_result(engine, requests, run, args.shape or str(args.model))
    result["temperature"] = args.temperature
    print(f"{result['requests']} requests, {result['input_tokens']} prompt + {result['output_tokens']} generated "
          f"tokens in {result['total_s']:.2f} s: {result['output_tok_s']:.1f} output tok/s, "
          f"{result['total_tok_s']:.1f} total tok/s (max_num_seqs {result['max_num_seqs']}, "
          f"max_num_batched_tokens {result['max_num_batched_tokens']}, cuda_graphs {result['cuda_graphs']})")
    print(json.dumps(result), flush=True)
    return 0


def _rates(text: str) -> list[float]:
    try:
        rates = [math.inf if part.strip() == "inf" else float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--request-rate {text!r}: write rates per second separated by commas, or inf") from None
    if any(not r > 0 for r in rates):
        raise ValueError(f"--request-rate {text!r}: every rate must be > 0 (or inf)")
    return rates


def _serve(args: argparse.Namespace) -> int:
    from kvpilot.bench.serve import TPOT_SLO_MS, highest_rate_within_slo, run_rate, slo_line

    rates = _rates(args.request_rate)
    requests = random_requests(args.num_requests, parse_range(args.input_len), parse_range(args.output_len),
                               args.vocab_size, args.seed)  # fmt: skip
    summaries = []
    for rate in rates:
        summary = asyncio.run(run_rate(
            args.base_url, args.served_model, requests, rate, seed=args.seed, max_concurrency=args.max_concurrency,
            api_key=args.api_key, progress=not args.no_progress, timeout=args.timeout,
        ))  # fmt: skip
        summaries.append(summary)
        print(f"rate {rate:g}/s: {summary['completed']} ok, {summary['failed']} failed, "
              f"{summary['request_throughput']:.2f} req/s, {summary['output_tok_s']:.1f} output tok/s | "
              f"TTFT p50/p95 {summary['ttft_ms']['p50']:.1f}/{summary['ttft_ms']['p95']:.1f} ms, "
              f"TPOT p50/p95 {summary['tpot_ms']['p50']:.1f}/{summary['tpot_ms']['p95']:.1f} ms, "
              f"ITL p95 {summary['itl_ms']['p95']:.1f} ms", flush=True)
        if summary["first_error"]:
            print(f"  first error: {summary['first_error']}", file=sys.stderr)
    best = highest_rate_within_slo(summaries)
    print(slo_line(summaries))
    record = {"bench": "serve", "base_url": args.base_url, "model": args.served_model,
              "requests": len(requests), "rates": summaries,
              "slo_tpot_p95_ms": TPOT_SLO_MS, "slo_rate": best["request_rate"] if best else None}  # fmt: skip
    print(json.dumps(record), flush=True)
    return 0 if all(not s["failed"] for s in summaries) else 1
