"""The state pool's tensors: one fp32 `[num_slots, *state_shape]` per layer with a recurrent state.

A layer has a recurrent state when it exposes `state_shape` (MiniMax lightning layers:
[H, Dk, Dv]; Performer-converted softmax layers: [Hkv, m, Dv + 1]) and a `state_pool` attribute.
Each step `attach` resolves every scheduled sequence's slot (hit, or miss: zeroed and rebuilt by
this step's prefill from token 0) and puts the slot ids into the context, prefill chunks first and
decodes last, the order the ModelRunner packs tokens in.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.context import Context
from kvpilot.engine.core.scheduler import SchedulerOutput
from kvpilot.engine.core.state_pool import StatePool

STATE_DTYPE = torch.float32


def stateful_layers(model: nn.Module) -> list[nn.Module]:
    """The model's layers that keep a per-sequence recurrent state, in module order."""
    return [m for m in model.modules() if hasattr(m, "state_shape") and hasattr(m, "state_pool")]


def state_bytes_per_sequence(layers: list[nn.Module]) -> int:
    """fp32 state bytes one sequence holds across all stateful layers."""
    elem = torch.empty((), dtype=STATE_DTYPE).element_size()
    return sum(math.prod(layer.state_shape) * elem for layer in layers)


class LinearState:
    """Allocates each stateful layer's pool tensor and maps sequences to slots each step."""

    def __init__(self, layers: list[nn.Module], num_slots: int, device: torch.device) -> None:
        self.layers = layers
        self.pool = StatePool(num_slots)
        self.device = device
        for layer in layers:
            layer.state_pool = torch.zeros((num_slots, *layer.state_shape), dtype=STATE_DTYPE, device=device)
        self.bytes_total = num_slots * state_bytes_per_sequence(layers)

    def attach(self, ctx: Context, out: SchedulerOutput) -> None:
        """Resolve slots (counting hits and misses), zero the rebuilt ones, set the context's slot ids."""
        prefill = [s for s in out.scheduled if s.num_new_tokens > 1]
        decode = [s for s in out.scheduled if s.num_new_tokens == 1]
        fresh: list[int] = []
        slots: list[list[int]] = [[], []]
        for group, items in enumerate((prefill, decode)):
            for item in items:
                seq = item.seq
                slot, is_fresh = self.pool.resolve(seq.request_id, seq.num_computed_tokens)
                self.pool.advance(seq.request_id, item.num_new_tokens)
                slots[group].append(slot)
                if is_fresh:
                    fresh.append(slot)
        if fresh:
            index = torch.tensor(fresh, dtype=torch.long, device=self.device)
            for layer in self.layers:
                layer.state_pool.index_fill_(0, index, 0.0)
        ctx.linear_exact = [s.seq.exact_path for s in (*prefill, *decode)]
        if prefill:
            ctx.linear_slots = torch.tensor(slots[0], dtype=torch.int32).to(self.device, non_blocking=True)
        if decode:
            ctx.decode_linear_slots = torch.tensor(slots[1], dtype=torch.int32).to(
                self.device, non_blocking=True
            )

    def free(self, request_id: str) -> None:
        """The sequence finished, was aborted or preempted: its slot goes back to the pool."""
        self.pool.free(request_id)

    def stats(self) -> dict[str, int]:
        return {"summary_hits_total": self.pool.hits_total, "summary_misses_total": self.pool.misses_total}

    def reset_stats(self) -> None:
        self.pool.hits_total = 0
        self.pool.misses_total = 0


def build_linear_state(model: nn.Module, config: EngineConfig, device: torch.device) -> LinearState | None:
    """Give every stateful layer (MiniMax lightning, Performer-converted) its pool: one slot per
    schedulable sequence; None when the model has no such layer."""
    layers = stateful_layers(model)
    return LinearState(layers, config.max_num_seqs, device) if layers else None
