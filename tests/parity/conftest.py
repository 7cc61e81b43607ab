"""Parity-tier fixtures: one torch thread (the CI machine has 2 shared cores), cached checkpoints."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
