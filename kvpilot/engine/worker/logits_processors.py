"""What changes the logits before sampling, batched over the rows that ask for it: OpenAI's
presence / frequency penalties and logit_bias, the repetition penalty (HF / vLLM semantics), and
min_tokens (EOS and stop token ids masked until that many tokens were generated)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch


def needs_processing(params: Any) -> bool:
    return bool(
        params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0
        or params.logit_bias or params.min_tokens
    )  # fmt: skip


def apply_logits_processors(logits: torch.Tensor, seqs: Seq[Any], eos_token_ids: Seq[int]) -> torch.Tensor:
    """A new [B, V] fp32 tensor: each row processed by its sequence's SamplingParams; rows that ask
    for nothing are unchanged. `seqs[i]` has .params, .token_ids, .num_prompt_tokens, .num_completion_tokens."""
    rows = [i for i, s in enumerate(seqs) if needs_processing(s.params)]
    if not rows:
        return logits
    out = logits.clone()
    device, vocab = logits.device, logits.shape[-1]
    index = torch.tensor(rows, device=device)
    sub = out[index]
    params = [seqs[i].params for i in rows]
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        counts = torch.zeros_like(sub)
        for k, i in enumerate(rows):
            completion = seqs[i].token_ids[seqs[i].num_prompt_tokens :]
            if completion:
                ids = torch.tensor(completion, device=device)
                counts[k].scatter_add_(0, ids, torch.ones(len(completion), device=device))
        presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
        frequency = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
        sub = sub - frequency * counts - presence * (counts > 0).float()
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = torch.zeros_like(sub, dtype=torch.bool)
        for k, i in enumerate(rows):
            seen[k, torch.tensor(seqs[i].token_ids, device=device)] = True
        penalty = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        sub = torch.where(seen, penalised, sub)
    for k, p in enumerate(params):
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=device)
            sub[k, ids] += torch.tensor(list(p.logit_bias.values()), device=device, dtype=sub.dtype)
        if p.min_tokens and seqs[rows[k]].num_completion_tokens < p.min_tokens:
            banned = [t for t in (*([] if p.ignore_eos else eos_token_ids), *p.stop_token_ids) if 0 <= t < vocab]
            if banned:
                sub[k, torch.tensor(banned, device=device)] = float("-inf")
    out[index] = sub
    return out
