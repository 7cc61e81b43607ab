"""A launched step whose sampled tokens are still on their way to the host (async scheduling).

The runner launches step N+1 before the host reads step N's tokens: each sampling row's token stays
on the device and is copied into the next step's input ids there (`feed`), and the host copy is
made without blocking into one of two pinned buffers (steps N and N+1 may both be outstanding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvpilot.engine.core.scheduler import SchedulerOutput

PLACEHOLDER = -1  # the token id a sequence holds, on the host, for a token not read back yet


@dataclass
class PendingStep:
    """Step `scheduled` is running; `sampled[k]` is the token of the k-th sampling chunk."""

    scheduled: SchedulerOutput
    sample_rows: list[tuple[int, int]]  # (scheduled index, packed row), as ModelRunner.run samples them
    sampled: torch.Tensor | None  # [len(sample_rows)] int64 on the device
    host: torch.Tensor | None = None  # its host copy (pinned on CUDA), complete once `copied` is
    copied: torch.cuda.Event | None = None
    row_of: dict[str, int] = field(default_factory=dict)  # request id -> index into sampled

    def tokens(self) -> list[int | None]:
        """One entry per scheduled chunk (None where it does not sample); waits for the copy."""
        out: list[int | None] = [None] * len(self.scheduled.scheduled)
        if self.host is None:
            return out
        if self.copied is not None:
            self.copied.synchronize()
        for (index, _), token in zip(self.sample_rows, self.host.tolist(), strict=True):
            out[index] = int(token)
        return out


class HostReadback:
    """Two pinned int64 buffers used in turn for the sampled tokens' device-to-host copies."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._turn = 0

    def start(self, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        if self.device.type != "cuda":
            return sampled.clone(), None
        self._turn ^= 1
        buffer = self._buffers[self._turn]
        if buffer is None or buffer.numel() < sampled.numel():
            buffer = torch.empty(max(256, 2 * sampled.numel()), dtype=torch.int64, pin_memory=True)
            self._buffers[self._turn] = buffer
        host = buffer[: sampled.numel()]
        host.copy_(sampled, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event
