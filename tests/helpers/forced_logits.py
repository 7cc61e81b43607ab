"""Teacher-forced logits through the engine's paged path (prefill, then one decode step per token).

`LLMEngine.score` runs dense attention with no KV cache, so it cannot show what a KV strategy
(int8/fp8 cache, a pool switch) does. This feeds given continuations through the real scheduler,
KV cache and decode kernels and records the logits before each forced token: two engines fed the
same tokens can then be compared position by position (logit cosine, top-1 agreement, log p).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams


@contextlib.contextmanager
def _forcing(engine: LLMEngine, forced: dict[str, list[int]], out: dict[str, list[torch.Tensor]]) -> Iterator[None]:
    runner = engine.runner
    original = runner._sample

    def sample(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        tokens = []
        for row, seq in zip(logits, seqs, strict=True):
            out[seq.request_id].append(row.detach().float().cpu())
            tokens.append(forced[seq.request_id][seq.num_completion_tokens])
        return torch.tensor(tokens, device=logits.device)

    runner._sample = sample  # type: ignore[method-assign]
    try:
        yield
    finally:
        runner._sample = original  # type: ignore[method-assign]


def teacher_forced_logits(
    engine: LLMEngine, prompts: list[list[int]], continuations: list[list[int]]
) -> list[torch.Tensor]:
    """For each prompt, fp32 logits [len(continuation), vocab]: row i predicts continuation[i] given
    prompt + continuation[:i], all requests batched together as the engine schedules them."""
    if len(prompts) != len(continuations) or any(not c for c in continuations):
        raise ValueError("one non-empty continuation per prompt is needed")
    forced = {f"forced-{i}": list(c) for i, c in enumerate(continuations)}
    out: dict[str, list[torch.Tensor]] = {rid: [] for rid in forced}
    with _forcing(engine, forced, out):
        for (rid, cont), prompt in zip(forced.items(), prompts, strict=True):
            engine.add_request(rid, prompt, SamplingParams(max_tokens=len(cont), temperature=0.0, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    return [torch.stack(out[rid]) for rid in forced]


def compare_logits(exact: list[torch.Tensor], approx: list[torch.Tensor]) -> dict[str, float]:
    """Mean and minimum per-position logit cosine, and top-1 agreement, over all positions."""
    if [t.shape for t in exact] != [t.shape for t in approx]:
        raise ValueError("compare logits of the same requests and positions")
    a, b = torch.cat(exact), torch.cat(approx)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean()
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()), "top1": float(top1),
            "positions": int(a.shape[0])}
