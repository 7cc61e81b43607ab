"""This process's tensor-parallel rank and groups, and the three collectives the parallel layers use.

Unset (the default, and always with tensor_parallel_size=1) every rank query answers rank 0 of 1 and
no collective runs: the single-process engine never touches torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """The ranks of one engine: `group` for tensors on the device (NCCL on CUDA, gloo on CPU) with a
    short timeout, `control` (gloo, no practical timeout: an idle engine waits) for rank 0's commands."""

    rank: int
    world: int
    group: Any
    control: Any


_TP: TPGroup | None = None


def get_tp() -> TPGroup | None:
    return _TP


def set_tp(tp: TPGroup | None) -> None:
    global _TP
    _TP = tp


def tp_rank() -> int:
    return _TP.rank if _TP is not None else 0


def tp_world() -> int:
    return _TP.world if _TP is not None else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum x over the ranks in place (row-parallel outputs, the vocab-parallel embedding)."""
    if _TP is not None and _TP.world > 1:
        dist.all_reduce(x, group=_TP.group)
    return x


def all_reduce_min(value: int) -> int:
    """The smallest of every rank's value (KV blocks: every rank must hold the same block ids)."""
    if _TP is None or _TP.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_TP.control)
    return int(t.item())


def barrier() -> None:
    """Wait for every rank (on the control group: loading weights may take any time), so the device
    group's short collective timeout starts counting only once all ranks are ready."""
    if _TP is not None and _TP.world > 1:
        dist.barrier(group=_TP.control)


def gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Rank 0: every rank's x concatenated along the last dim (vocab-parallel logits); others: x."""
    if _TP is None or _TP.world == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_TP.world)] if _TP.rank == 0 else None
    dist.gather(x, parts, dst=0, group=_TP.group)
    return torch.cat(parts, dim=-1) if parts is not None else x


def broadcast_command(command: Any) -> Any:
    """Rank 0 sends `command` (any picklable object, CPU tensors inside) to every rank; others get it."""
    assert _TP is not None
    box = [command if _TP.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=_TP.control)
    return box[0]


CONTROL_TIMEOUT = timedelta(days=3650)  # an idle engine's ranks wait for rank 0's next command
START_TIMEOUT = timedelta(minutes=10)  # joining the group; after loading weights, every rank meets in barrier()


def init_tp(rank: int, world: int, init_method: str, backend: str, timeout_s: float) -> TPGroup:
    """Join the engine's process group as `rank` and make it this process's TP state."""
    if dist.is_initialized():
        raise RuntimeError(
            "this process already belongs to a torch.distributed group: run one tensor-parallel engine per "
            "process (shut the other down first: LLMEngine.shutdown())"
        )
    # joining waits for the slowest rank to start (import torch, spawn): START_TIMEOUT, not the collectives'
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=START_TIMEOUT)
    ranks = list(range(world))
    control = dist.new_group(ranks, timeout=CONTROL_TIMEOUT, backend="gloo")
    group = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s), backend=backend)
    tp = TPGroup(rank, world, group, control)
    set_tp(tp)
    return tp


def close_tp() -> None:
    """Leave the process group (after the engine's last command)."""
    set_tp(None)
    if dist.is_initialized():
        dist.destroy_process_group()
