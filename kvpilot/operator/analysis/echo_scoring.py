"""Scoring a probe on any OpenAI-compatible server: `/v1/completions` with echo and logprobs.

kvpilot's engine has `POST /v1/score`; vLLM, SGLang, TGI and others do not, but they all echo a
prompt with its tokens' log-probabilities. The probe is sent as one text, prompt + continuation,
with `echo: true`, `logprobs: 0` (1 where 0 is refused) and `max_tokens: 0` (1 where 0 is
refused: the generated token lies past the echoed text and is left out). The continuation's
tokens are those whose `text_offset` falls inside it, the convention lm-evaluation-harness uses
for these servers. Tokenised as one text, a probe can split differently from /v1/score's two
parts, so both tracks of one analysis are always scored the same way (probes.accuracy_check).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import httpx

COMPLETIONS_PATH = "/v1/completions"
# (max_tokens, logprobs) to try in order: echo-only scoring first, then one generated token.
ATTEMPTS = ((0, 0), (1, 1))


class EchoScoringError(RuntimeError):
    """The server's echo + logprobs answer cannot score the probe; the message says why."""


def continuation_logprob(choice: Mapping[str, Any], prompt: str, continuation: str) -> tuple[float, int]:
    """(sum of log p, tokens) of the continuation's tokens in one echoed choice."""
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("token_logprobs")
    offsets = logprobs.get("text_offset")
    if not isinstance(tokens, list) or not isinstance(offsets, list) or len(tokens) != len(offsets):
        raise EchoScoringError("the completion has no logprobs.token_logprobs and text_offset of equal length "
                               "(does the server support echo with logprobs?)")
    start, end = len(prompt), len(prompt) + len(continuation)
    picked = [lp for lp, offset in zip(tokens, offsets, strict=True) if start <= offset < end]
    if not picked:
        raise EchoScoringError(f"no echoed token starts inside the continuation {continuation[:40]!r} "
                               f"(text offsets {offsets[:8]}...); the server did not echo the prompt")
    if any(lp is None or not math.isfinite(float(lp)) for lp in picked):
        raise EchoScoringError("a continuation token has no finite log-probability in the echo")
    return math.fsum(float(lp) for lp in picked), len(picked)


def echo_score(client: httpx.Client, model: str, prompt: str, continuation: str,
               attempts: tuple[tuple[int, int], ...] = ATTEMPTS) -> tuple[float, int]:
    """Score one probe through /v1/completions, trying each (max_tokens, logprobs) until one is accepted."""
    refused: list[str] = []
    for max_tokens, logprobs in attempts:
        response = client.post(COMPLETIONS_PATH, json={
            "model": model, "prompt": prompt + continuation, "echo": True, "logprobs": logprobs,
            "max_tokens": max_tokens, "temperature": 0.0,
        })
        if response.status_code in (400, 422):  # this server refuses the combination: try the next
            refused.append(f"max_tokens={max_tokens}, logprobs={logprobs}: HTTP {response.status_code} "
                           f"{response.text[:200]}")
            continue
        if response.status_code != 200:
            raise EchoScoringError(f"{COMPLETIONS_PATH} answered HTTP {response.status_code}: {response.text[:300]}")
        choices = response.json().get("choices") or []
        if not choices:
            raise EchoScoringError(f"{COMPLETIONS_PATH} answered without choices")
        return continuation_logprob(choices[0], prompt, continuation)
    raise EchoScoringError(f"{COMPLETIONS_PATH} refused every echo + logprobs request: " + "; ".join(refused))
