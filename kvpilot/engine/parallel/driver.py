"""Rank 0's side of a tensor-parallel model call: before it runs a forward pass or computes logits, it
broadcasts the call (token ids, positions, the step's Context; or the hidden rows) to the other ranks,
which run the same call, so every collective inside the model meets its peers.

A call that fails on rank 0 part-way (a collective timed out, a peer's socket closed, anything raised
mid-pass) leaves the ranks out of step: the next collectives would pair with the wrong ones. So the
driver fails closed: it records the failure, tells `on_fatal`, and every later call raises at once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpilot.engine.context import Context, StopForward, get_context
from kvpilot.engine.parallel.state import broadcast_command

log = logging.getLogger("kvpilot.engine.tensor_parallel")


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
    """Sends rank 0's model calls to ranks 1..N-1 (parallel/state.broadcast_command) and runs them."""

    def __init__(
        self, on_fatal: Callable[[str], None] | None = None, stop_ranks: Callable[[], None] | None = None
    ) -> None:
        self.failure: str | None = None  # once set, every call raises TensorParallelError
        self.on_fatal = on_fatal
        self.stop_ranks = stop_ranks  # kills the other ranks: out of step, they can only wait or misread
        self._lock = threading.Lock()
        self.sending_since: float | None = None  # a call not yet taken by every rank (the watchdog reads it)

    def fail(self, message: str) -> None:
        """Fail closed (once): log the reason, refuse every later call, tell `on_fatal`."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = message
        log.error(message)
        if self.on_fatal is not None:
            self.on_fatal(message)
        if self.stop_ranks is not None:
            self.stop_ranks()

    def forward(
        self, model: Callable[..., torch.Tensor], input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        self._send(("forward", input_ids.cpu(), positions.cpu(), context_to(get_context(), "cpu")))
        return self._run("forward pass", model, input_ids, positions)

    def logits(self, lm_head: Callable[..., torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
        self._send(("logits", hidden.detach().cpu()))
        return self._run("logits", lm_head, hidden)

    def stop(self) -> None:
        """Tell the ranks to exit (a shutdown: a failure here is not the engine failing)."""
        if self.failure is None:
            broadcast_command(("stop",))

    def _send(self, command: tuple[Any, ...]) -> None:
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        self.sending_since = time.monotonic()
        try:
            broadcast_command(command)
        except Exception as exc:
            self.fail(f"tensor parallel: rank 0 could not send a {command[0]!r} call to the other ranks ({exc}); "
                      "failing closed")  # fmt: skip
            raise TensorParallelError(self.failure) from exc
        finally:
            self.sending_since = None

    def _run(self, what: str, fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        try:
            return fn(*args)
        except StopForward:  # runtime validation's early stop: the other ranks stop at the same layer
            raise
        except BaseException as exc:
            self.fail(f"tensor parallel: rank 0's {what} failed part-way ({type(exc).__name__}: {exc}); the ranks "
                      "are out of step, failing closed")  # fmt: skip
            raise TensorParallelError(self.failure) from exc
