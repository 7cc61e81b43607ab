"""The latent decode kernel's launch choices: heads per program, split count and pipeline stages.

They are pure functions of the shapes and the device's properties; a fake H200 (132 SMs, 227 KiB of
shared memory a block) stands in for the device, whose measurements chose them (docs/benchmarks.md,
"MLA decode speed on the H200 (session 9)")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvpilot.engine.kernels.mla_decode.kernel import mla_block_h, mla_num_splits, mla_num_stages

pytestmark = pytest.mark.kernels

H200 = SimpleNamespace(multi_processor_count=132, shared_memory_per_block_optin=232448)
CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_h200(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: H200)


def test_heads_per_program() -> None:
    assert mla_block_h(32, 256) == 32  # Llama-3-8B converted at r = 256: each tile read once for 32 heads
    assert mla_block_h(128, 256) == 32
    assert mla_block_h(16, 256) == 16  # DeepSeek-V2-Lite: 16 heads
    assert mla_block_h(128, 512) == 16  # r = 512: a [32, 512] fp32 accumulator would spill


def test_split_count_keeps_the_work_in_flight(fake_h200) -> None:
    # 16 heads a program: about 4 programs per SM; 32 heads: about 2 (the sweep's best at both shapes)
    assert mla_num_splits(64 * 2, CUDA, block_h=16) == 4
    assert mla_num_splits(64, CUDA, block_h=32) == 4
    assert mla_num_splits(32, CUDA, block_h=32) == 8
    assert mla_num_splits(4096, CUDA, block_h=32) == 1
    assert mla_num_splits(8, torch.device("cpu")) == 1


def test_stages_fit_shared_memory(fake_h200) -> None:
    bf16 = 2
    assert mla_num_stages(64 * (512 + 64) * bf16, CUDA) == 3  # DeepSeek rows: 221 of 227 KiB, as measured
    assert mla_num_stages(64 * (256 + 128) * bf16, CUDA) == 3  # r = 256, R = 16 per KV head
    assert mla_num_stages(64 * (256 + 512) * bf16, CUDA) == 2  # R = 64 per KV head: 3 x 96 KiB would not fit
    assert mla_num_stages(64 * (1024 + 1024) * bf16, CUDA) == 1
    assert mla_num_stages(1 << 20, torch.device("cpu")) is None  # the interpreter: Triton's default
