"""`gpu_memory_utilization` is an engine's share of the GPU (weights, activation peak and KV cache together,
vLLM's meaning), bounded by what is free when it starts: worker/memory.cuda_kv_blocks over what the CUDA
driver reports (its calls replaced here by a fake device; the arithmetic is what is tested)."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.worker import memory

GIB = 2**30


class FakeGpu:
    """One device of `total` bytes: processes hold memory, mem_get_info and memory_reserved report it."""

    def __init__(self, total: int) -> None:
        self.total, self.held = total, {}

    def install(self, monkeypatch: pytest.MonkeyPatch, me: str) -> None:
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (self.total - sum(self.held.values()),
                                                                            self.total))  # fmt: skip
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: self.held.get(me, 0))


def start_engine(gpu: FakeGpu, monkeypatch, name: str, utilization: float, weights: int, peak: int) -> int:
    """An engine loads its weights, sizes its pool and allocates it; returns its KV blocks (1 MiB each)."""
    gpu.held[name] = weights
    gpu.install(monkeypatch, name)
    blocks = memory.cuda_kv_blocks(torch.device("cuda"), utilization, peak, 2**20)
    gpu.held[name] += blocks * 2**20
    return blocks


def test_two_engines_at_045_share_one_gpu(monkeypatch) -> None:
    gpu = FakeGpu(80 * GIB)
    first = start_engine(gpu, monkeypatch, "a", 0.45, 10 * GIB, 2 * GIB)
    second = start_engine(gpu, monkeypatch, "b", 0.45, 10 * GIB, 2 * GIB)
    assert first == second == int((0.45 * 80 - 10 - 2) * 1024)  # each: its share less weights and peak
    assert sum(gpu.held.values()) <= 0.9 * 80 * GIB


def test_a_share_never_takes_what_another_process_holds(monkeypatch) -> None:
    gpu = FakeGpu(80 * GIB)
    gpu.held["other"] = 50 * GIB
    blocks = start_engine(gpu, monkeypatch, "a", 0.9, 10 * GIB, 2 * GIB)
    assert blocks == (80 - 50 - 10 - 2) * 1024  # bounded by the free memory, not by 0.9 of the device


@pytest.mark.parametrize(("utilization", "other", "words"), [(0.1, 0, "its share (0.1 of 80.0 GiB)"),
                                                             (0.9, 69, "only 1.00 GiB of the GPU is free")])  # fmt: skip
def test_no_room_says_which_limit_and_what_to_change(monkeypatch, utilization: float, other: int, words: str) -> None:
    gpu = FakeGpu(80 * GIB)
    gpu.held["other"] = other * GIB
    with pytest.raises(RuntimeError, match="no GPU memory left for the KV cache") as err:
        start_engine(gpu, monkeypatch, "a", utilization, 10 * GIB, 2 * GIB)
    assert words in str(err.value) and "raise gpu_memory_utilization" in str(err.value)
