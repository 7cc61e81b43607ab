"""Per-step attention metadata, set once by the ModelRunner and read by every attention layer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Context:
    """What the attention layers need for one forward pass.

    Tokens are packed prefill chunks first (`num_prefill_tokens` of them, described by
    block_tables / cu_seqlens_q / context_lens), then single-token decodes (described by
    decode_block_tables / decode_context_lens). `slot_mapping` covers every token.
    `dense`: no KV cache at all (scoring); attention runs causally over the packed tokens.
    """

    dense: bool = False
    slot_mapping: torch.Tensor | None = None
    num_prefill_tokens: int = 0
    block_tables: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
    # the longest prefill chunk of the step (a host int, from the scheduler): sizes the prefill kernel's grid, whose
    # programs past a chunk's end would otherwise be launched to exit at once (T / tile of them per sequence)
    max_seqlen_q: int | None = None
    decode_block_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    kv_split: Any = None  # strategies/kv_quant/layer.KVSplit: the step's tokens by KV pool, set by the first layer
    # sequences of the step in a two-pool cache's exact pool (block ids below the approximate pool's first: the
    # fallback reserve, or auto switching's 16-bit pool), counted on the host from the block tables
    # (worker/model_runner.py). 0: every block is approximate and the layers rebase block ids on the device, no
    # host copy (what CUDA graphs capture); None: not counted, the layers split the step by pool on the host.
    exact_pool_seqs: int | None = None
    # state-pool slot per prefill chunk / per decode, for layers with a recurrent state (worker/state_cache.py)
    linear_slots: torch.Tensor | None = None
    decode_linear_slots: torch.Tensor | None = None
    linear_exact: list[bool] | None = None  # per sequence (prefill then decode): runtime validation's fallback
    # a decode step over the CUDA-graph static buffers (worker/cuda_graphs.StaticInputs): captured, replayed, or its
    # padded eager twin; host-side one-off work (fp8 scale calibration) must not run inside it
    graph_static: bool = False
    # a dense pass that stops once this attention layer has run (runtime validation's exact side); the other
    # tensor-parallel ranks stop at the same layer, so their collectives stay matched (worker/tp_worker.py)
    capture_layer: int | None = None

    @property
    def is_prefill(self) -> bool:
        return self.num_prefill_tokens > 0


class StopForward(Exception):
    """Raised by a forward hook to end a pass early (at `Context.capture_layer`); every rank stops there."""


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(context: Context) -> None:
    global _CONTEXT
    _CONTEXT = context


def reset_context() -> None:
    set_context(Context())


@contextmanager
def dense_context(capture_layer: int | None = None) -> Iterator[None]:
    """Within the block, attention runs densely (no KV cache): profiling, scoring, validation's exact side."""
    set_context(Context(dense=True, capture_layer=capture_layer))
    try:
        yield
    finally:
        reset_context()
