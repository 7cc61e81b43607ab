"""Per-step attention metadata, set once by the ModelRunner and read by every attention layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Context:
    """What the attention layers need for one forward pass.

    `is_prefill`: packed varlen chunks (cu_seqlens_q); otherwise one query per sequence.
    `dense`: no KV cache at all (scoring); attention runs causally over the packed tokens.
    """

    is_prefill: bool = False
    dense: bool = False
    slot_mapping: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(context: Context) -> None:
    global _CONTEXT
    _CONTEXT = context


def reset_context() -> None:
    set_context(Context())
