"""gpu tier: every engine a test builds sizes its KV pool from the GPU memory still free, so the
engines of earlier tests (held in reference cycles) must be collected and their pools returned
before the next test starts."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _release_gpu_memory() -> Iterator[None]:
    yield
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
