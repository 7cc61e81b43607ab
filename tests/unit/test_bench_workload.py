"""`kvpilot bench`'s workload (lengths, ids, arrivals, percentiles) and the device-sized batch defaults."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest

from kvpilot.bench.serve import RequestResult, highest_rate_within_slo, rate_summary, slo_line
from kvpilot.bench.shapes import SHAPES, write_shape
from kvpilot.bench.workload import parse_range, percentile, poisson_arrivals, random_requests
from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.batch import GIB, batch_limits, fill_batch_defaults

pytestmark = pytest.mark.unit


def test_requests_follow_the_ranges_and_the_seed() -> None:
    reqs = random_requests(256, (100, 1024), (100, 1024), vocab_size=128256, seed=0)
    assert len(reqs) == 256
    assert all(100 <= len(r.prompt) <= 1024 and 100 <= r.max_tokens <= 1024 for r in reqs)
    assert all(3 <= t < 10000 for r in reqs for t in r.prompt)
    assert 450 < statistics.mean(len(r.prompt) for r in reqs) < 675  # uniform: mean 562
    assert reqs == random_requests(256, (100, 1024), (100, 1024), vocab_size=128256, seed=0)
    assert reqs != random_requests(256, (100, 1024), (100, 1024), vocab_size=128256, seed=1)
    small = random_requests(50, (4, 4), (1, 1), vocab_size=20)
    assert all(t < 20 for r in small for t in r.prompt)


def test_range_and_count_errors_say_what_is_allowed() -> None:
    assert parse_range("100:1024") == (100, 1024) and parse_range("7") == (7, 7)
    for bad in ("a:b", "0:5", "9:3"):
        with pytest.raises(ValueError, match="LOW"):
            parse_range(bad)
    with pytest.raises(ValueError, match=">= 1"):
        random_requests(0, (1, 2), (1, 2), 100)


def test_poisson_arrivals_have_the_rate() -> None:
    times = poisson_arrivals(4000, 8.0, seed=3)
    assert times[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(times))
    assert 7.4 < (len(times) - 1) / times[-1] < 8.6
    assert poisson_arrivals(5, math.inf) == [0.0] * 5
    with pytest.raises(ValueError, match="> 0"):
        poisson_arrivals(5, 0.0)


@pytest.mark.parametrize("q", [0, 37.5, 50, 95, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    values = [5.0, 1.0, 9.0, 3.5, 2.0, 8.0, 7.25]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_rate_summary_and_the_slo_rate() -> None:
    ok = RequestResult(ttft=0.1, latency=1.1, itl=[0.01] * 99, output_tokens=101)
    assert ok.tpot == pytest.approx(0.01)
    summary = rate_summary(4.0, [ok, RequestResult(error="HTTP 500: boom")], duration=2.0)
    assert summary["completed"] == 1 and summary["failed"] == 1 and summary["first_error"] == "HTTP 500: boom"
    assert summary["tpot_ms"]["p95"] == pytest.approx(10.0) and summary["output_tok_s"] == 50.5
    fast = rate_summary(2.0, [ok], 1.0)
    slow = rate_summary(8.0, [RequestResult(ttft=0.1, latency=7.1, output_tokens=101)], 1.0)  # 70 ms TPOT
    assert highest_rate_within_slo([fast, slow, summary]) is fast  # 4/s failed a request, 8/s is too slow
    assert highest_rate_within_slo([slow]) is None
    at_once = rate_summary(float("inf"), [ok], 1.0)
    assert highest_rate_within_slo([fast, at_once]) is at_once  # all at once is more load than any rate
    assert slo_line([at_once]) == "highest rate with P95 TPOT < 50 ms: inf (all at once) (TTFT p95 100.0 ms)"
    slow_at_once = rate_summary(float("inf"), [RequestResult(ttft=0.1, latency=7.1, output_tokens=101)], 1.0)
    assert slo_line([slow_at_once, summary]) == \
        "highest rate with P95 TPOT < 50 ms: none of the 2 tested (inf: P95 TPOT 70.0 ms; 4/s: 1 failed)"  # fmt: skip


def test_batch_defaults_follow_the_device() -> None:
    assert batch_limits("cpu", 0) == (64, 2048)
    assert batch_limits("cuda", 141 * GIB) == (256, 16384)
    assert batch_limits("cuda", 40 * GIB) == (256, 8192)
    assert batch_limits("cuda", 16 * GIB) == (128, 4096)
    config = EngineConfig(model="m")
    assert config.max_num_seqs is None and config.max_num_batched_tokens is None
    fill_batch_defaults(config, "cuda", 141 * GIB)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (256, 16384)
    mine = EngineConfig(model="m", max_num_seqs=8, enable_chunked_prefill=False, max_model_len=4096)
    fill_batch_defaults(mine, "cpu", 0)
    assert (mine.max_num_seqs, mine.max_num_batched_tokens) == (8, 4096)  # a whole prompt fits one step
    with pytest.raises(ValueError, match="load_format"):
        EngineConfig(model="m", load_format="pt")


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_named_shapes_are_valid_model_configs(name: str, tmp_path) -> None:
    config = ModelConfig.from_dir(write_shape(name, tmp_path))
    assert config.num_hidden_layers == SHAPES[name]["num_hidden_layers"]
    assert config.vocab_size == SHAPES[name]["vocab_size"]
    with pytest.raises(ValueError, match="llama-3-8b"):
        write_shape("llama-70b", tmp_path / "x")
