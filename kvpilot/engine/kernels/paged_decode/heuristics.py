"""Launch configuration for paged decode: tile size, warps, stages and the number of context splits."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Split the context while batch x kv heads x splits stays within about PROGRAMS_PER_SM programs
# per SM (memory-bound kernel: enough programs in flight to hide latency, but overshooting adds a
# ragged last wave; on the H200, 256 programs x 2 splits beat x 3, and 512 x 1 beat x 2), and never
# give a split fewer than MIN_TOKENS_PER_SPLIT tokens: on short contexts the partial outputs and
# the reduction cost more than they save. Measurements: docs/benchmarks.md.
PROGRAMS_PER_SM = 4
MIN_TOKENS_PER_SPLIT = 512
MAX_SPLITS = 32
CPU_NUM_SMS = 4
# The split reduction folded into the split kernel (its last program per (seq, kv head) combines):
# off until measured on the H200 (bench/bench_decode_attention.py --fold, stage gemv of
# bench/device_issue30.sh); tests/kernels and tests/gpu run both.
FOLD_REDUCE = False


@dataclass(frozen=True)
class DecodeConfig:
    """How one paged decode call is launched."""

    num_splits: int
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    fold_reduce: bool = False  # the last split program combines the partials (no reduce launch)


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, num_sms: int) -> int:
    """1 on short contexts or when batch x kv heads already fill the GPU; more splits otherwise."""
    programs = max(1, batch * num_kv_heads)
    by_occupancy = PROGRAMS_PER_SM * num_sms // programs
    by_length = max(1, max_context // MIN_TOKENS_PER_SPLIT)
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


@functools.lru_cache(maxsize=16)
def _cuda_num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_NUM_SMS
    return _cuda_num_sms(device.index if device.index is not None else torch.cuda.current_device())


def decode_config(batch: int, num_kv_heads: int, head_dim: int, max_context: int, device: torch.device) -> DecodeConfig:
    """The default launch for these sizes; `max_context` is an upper bound (block table width x block size)."""
    return DecodeConfig(
        num_splits=choose_num_splits(batch, num_kv_heads, max_context, num_sms(device)),
        block_n=64 if head_dim <= 128 else 32,
        fold_reduce=FOLD_REDUCE,
    )
