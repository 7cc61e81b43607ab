"""Rank 0's side of a tensor-parallel model call: before it runs a forward pass or computes logits, it
broadcasts the call (token ids, positions, the step's Context; or the hidden rows) to the other ranks,
which run the same call, so every collective inside the model meets its peers."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kvpilot.engine.context import Context, get_context
from kvpilot.engine.parallel.state import broadcast_command


class TensorParallelError(RuntimeError):
    """A rank of a tensor-parallel engine died or stopped answering; the engine cannot serve."""


def context_to(ctx: Context, device: torch.device | str) -> Context:
    """A copy of ctx with its tensors on `device` (CPU to send them; the rank's device to use them)."""
    moved = {
        f.name: getattr(ctx, f.name).to(device)
        for f in dataclasses.fields(ctx)
        if isinstance(getattr(ctx, f.name), torch.Tensor)
    }
    return dataclasses.replace(ctx, **moved, kv_split=None)


class TPDriver:
    """Sends rank 0's model calls to ranks 1..N-1 (parallel/state.broadcast_command)."""

    def __init__(self) -> None:
        self.failure: str | None = None  # set by the watchdog when a rank dies: every later call raises

    def _send(self, command: tuple[Any, ...]) -> None:
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        try:
            broadcast_command(command)
        except RuntimeError as exc:
            raise TensorParallelError(f"a tensor-parallel rank stopped answering: {exc}") from exc

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        self._send(("forward", input_ids.cpu(), positions.cpu(), context_to(get_context(), "cpu")))

    def logits(self, hidden: torch.Tensor) -> None:
        self._send(("logits", hidden.detach().cpu()))

    def stop(self) -> None:
        self._send(("stop",))
