"""GPU tier: async scheduling on CUDA (pinned readback, tokens fed back on the device, graphs replayed)
gives the synchronous engine's outputs; the same workload as tests/parity/test_async_scheduling.py."""

from __future__ import annotations

import pytest

from kvpilot.engine.make_model import make_model
from tests.parity.test_async_scheduling import run, with_stops, workload

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_async_scheduling_matches_sync_on_cuda(tmp_path, kv: str) -> None:
    checkpoint = str(make_model(tmp_path / "m", "llama"))
    knobs = {"dtype": "float32", "kv_cache_dtype": kv, "num_kv_blocks": 12, "fallback_reserve": 0.0}
    first, _ = run(checkpoint, "off", workload(), "cuda", **knobs)
    requests = with_stops(workload(), first)
    sync, _ = run(checkpoint, "off", requests, "cuda", **knobs)
    overlapped, engine = run(checkpoint, "on", requests, "cuda", **knobs)
    assert engine.async_scheduling and engine.runner.decode_graphs is not None
    assert overlapped == sync
    assert engine.scheduler.num_preemptions > 0 and engine.block_manager.num_used_blocks == 0
