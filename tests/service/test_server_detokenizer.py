"""Issue 18: the detokeniser's work per streamed token stays flat over a 2,000-token completion
(a real `kvpilot serve`; work counted in decoded token ids from the stats feed, not wall time)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from kvpilot.engine.server.wire.detokenizer import CONTEXT, MAX_WINDOW
from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

TOKENS = 2000


def _work(server: ServerProcess) -> tuple[int, int]:
    feed = server.stats()["detokenizer"]
    return feed["decoded_tokens_total"], feed["output_tokens_total"]


def test_detokeniser_work_per_token_is_flat_over_2000_tokens(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server("--max-model-len", "2048", "--max-num-seqs", "2", "--cpu-memory-budget", "16MiB")
    body = {"model": SERVED_MODEL, "prompt": "go", "max_tokens": TOKENS, "ignore_eos": True, "stream": True}
    decoded0, out0 = _work(server)
    samples: list[tuple[int, int]] = []
    text, finish = [], None
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            text.append(choice["text"])
            finish = choice["finish_reason"] or finish
            if len(text) % 250 == 0:
                samples.append(_work(server))
    samples.append(_work(server))
    assert finish == "length"
    points = [(d - decoded0, o - out0) for d, o in samples]
    assert points[-1][1] == TOKENS
    # Work per token in each slice of the stream: flat (the old detokeniser's grew linearly,
    # ~1,000 decoded ids per token by the middle of the stream).
    rates = [
        (d1 - d0) / (o1 - o0) for (d0, o0), (d1, o1) in zip([(0, 0), *points], points, strict=False) if o1 - o0 >= 100
    ]
    assert len(rates) >= 4, points
    assert max(rates) <= MAX_WINDOW + 1 + CONTEXT, rates
    assert max(rates[len(rates) // 2 :]) <= 1.25 * max(rates[: len(rates) // 2]) + 1, rates
