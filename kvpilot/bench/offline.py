"""`kvpilot bench offline`: generation throughput of LLMEngine on a fixed batch of random requests.

Every request is added at once and the engine steps until all are done (what `LLM.generate`
does), with a progress bar over finished requests. A short warm-up run first (a few requests of
the same length ranges, 2 output tokens each) keeps Triton compiles out of the timing.
"""

from __future__ import annotations

import time
from typing import Any

from kvpilot.bench.workload import BenchRequest


def warmup_requests(requests: list[BenchRequest], num: int = 4) -> list[BenchRequest]:
    """The first `num` prompts, generating 2 tokens each (prefill and decode kernels both compile)."""
    return [BenchRequest(r.prompt, 2) for r in requests[:num]]


def run_engine(engine: Any, requests: list[BenchRequest], temperature: float, tag: str, progress: bool) -> dict:
    """Add every request, step until done; return token counts and the wall time."""
    from tqdm import tqdm

    from kvpilot.engine.sampling_params import SamplingParams

    for i, req in enumerate(requests):
        params = SamplingParams(max_tokens=req.max_tokens, temperature=temperature, ignore_eos=True, seed=None)
        engine.add_request(f"{tag}-{i}", req.prompt, params)
    output_tokens = steps = 0
    start = time.perf_counter()
    with tqdm(total=len(requests), desc=f"bench {tag}", unit="req", disable=not progress) as bar:
        while engine.has_unfinished_requests():
            outs = engine.step()
            steps += 1
            for out in outs:
                output_tokens += len(out.new_token_ids)
                if out.finished:
                    bar.update(1)
            bar.set_postfix(tok_s=f"{output_tokens / max(time.perf_counter() - start, 1e-9):.0f}", refresh=False)
    _synchronize(engine)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "output_tokens": output_tokens, "steps": steps}


def _synchronize(engine: Any) -> None:
    if engine.runner.is_cuda:
        import torch

        torch.cuda.synchronize(engine.runner.device)


def offline_result(engine: Any, requests: list[BenchRequest], run: dict, model: str) -> dict:
    """The one-line JSON record: workload, engine limits, tokens, time and throughput."""
    config = engine.config
    input_tokens = sum(len(r.prompt) for r in requests)
    expected = sum(r.max_tokens for r in requests)
    if run["output_tokens"] != expected:
        raise RuntimeError(f"the engine generated {run['output_tokens']} tokens, the workload asks {expected}")
    graphs = engine.runner.decode_graphs
    return {
        "bench": "offline",
        "model": model,
        "device": str(engine.runner.device),
        "requests": len(requests),
        "input_tokens": input_tokens,
        "output_tokens": run["output_tokens"],
        "total_s": round(run["seconds"], 6),  # a tiny run lasts milliseconds: 3 digits would skew rates
        "output_tok_s": round(run["output_tokens"] / run["seconds"], 1),
        "tensor_parallel_size": config.tensor_parallel_size,  # throughput per GPU: output_tok_s / this
        "output_tok_s_per_rank": round(run["output_tokens"] / run["seconds"] / config.tensor_parallel_size, 1),
        "total_tok_s": round((input_tokens + run["output_tokens"]) / run["seconds"], 1),
        "steps": run["steps"],
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "cuda_graphs": graphs is not None,
        "graph_replays": graphs.replays_total if graphs is not None else 0,
        "kv_cache_dtype": config.kv_cache_dtype,
        "attention": config.attention,
        "kv_blocks": engine.runner.num_kv_blocks,
    }

