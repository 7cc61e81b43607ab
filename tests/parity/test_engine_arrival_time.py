"""A request's arrival time can come from the server (the engine core's API process stamps it, as vLLM's
frontend does): TTFT and end-to-end latency then count the wait before the engine took the request."""

from __future__ import annotations

import time

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.parity


def test_arrival_time_from_the_server_counts_in_ttft(tmp_path) -> None:
    engine = LLMEngine(EngineConfig(model=str(make_model(tmp_path / "m", "llama")), device="cpu", show_progress=False))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request("queued", [5, 6, 7], params, arrival_time=time.monotonic() - 5.0)
    engine.add_request("fresh", [5, 6, 7], params)
    engine.add_request("future", [5, 6, 7], params, arrival_time=time.monotonic() + 60.0)  # never later than now
    while engine.has_unfinished_requests():
        engine.step()
    ttft = engine.stats()["latency"]["ttft_seconds"]
    assert ttft["count"] == 3
    # the queued request's 5 s count; a stamp from the future is clamped to now (else the sum would fall by 60 s)
    assert 5.0 <= ttft["sum"] < 5.0 + 3 * 10.0
