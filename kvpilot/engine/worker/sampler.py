"""On-device sampling: greedy, temperature, top-k, top-p, and per-request seeds."""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    generators: list[torch.Generator | None],
    all_greedy: bool | None = None,
    filters: tuple[bool, bool] | None = None,
) -> torch.Tensor:
    """Pick one token per row of logits [B, V] (fp32). temperature 0 = greedy; top_k <= 0 = off.

    Sampling uses the exponential race (argmax of p / Exp(1) noise), which equals drawing from
    p; rows with a seed draw their noise from their own generator, so they are reproducible.
    `all_greedy` and `filters` (whether any row has a top-k / a top-p to apply) are what the
    caller knows on the host; given, they save reading them back from the device mid-step.
    """
    greedy = logits.argmax(dim=-1)
    if all_greedy if all_greedy is not None else bool((temperatures == 0).all()):
        return greedy
    temps = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    scaled = logits / temps[:, None]
    probs = torch.softmax(filter_top_k_top_p(scaled, top_ks, top_ps, filters), dim=-1)
    noise = torch.empty_like(probs)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        noise[shared] = torch.empty((len(shared), probs.shape[1]), device=probs.device).exponential_()
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    sampled = (probs / noise.clamp_min(1e-20)).argmax(dim=-1)
    return torch.where(temperatures > 0, sampled, greedy)


def filter_top_k_top_p(
    logits: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, filters: tuple[bool, bool] | None = None
) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf (the best token always stays).

    `filters`: (any row has 0 < top_k < vocab, any row has top_p < 1), when the caller knows them.
    """
    vocab = logits.shape[-1]
    ks = torch.where((top_ks <= 0) | (top_ks > vocab), torch.full_like(top_ks, vocab), top_ks)
    if filters is None:
        filters = (bool((ks < vocab).any()), bool((top_ps < 1.0).any()))
    needs_k, needs_p = filters
    if not (needs_k or needs_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= ks[:, None]
    if needs_p:
        probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
        drop |= before >= top_ps[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
