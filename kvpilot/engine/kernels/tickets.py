"""Per-device ticket counters for kernels whose last program to finish a unit of work reduces it
(gemv_norm, the folded paged-decode reduction): int32 zeros that each kernel resets after use, so a
launch, and a CUDA graph replay of it, always finds them at 0. Kernels on one stream run one after
another, so they share the counters."""

from __future__ import annotations

import torch

MIN_SLOTS = 4096
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def ticket_counters(device: torch.device, slots: int) -> torch.Tensor | None:
    """At least `slots` zeroed counters on `device`; None when more are needed inside a CUDA graph
    capture (the zero fill would be a graph node and the old buffer may be captured already): the
    caller then takes its unfused path. DecodeGraphs.capture runs each bucket eagerly first."""
    found = _COUNTERS.get(device)
    if found is not None and found.numel() >= slots:
        return found
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    size = max(MIN_SLOTS, 1 << max(0, slots - 1).bit_length())
    found = _COUNTERS[device] = torch.zeros(size, dtype=torch.int32, device=device)
    return found
