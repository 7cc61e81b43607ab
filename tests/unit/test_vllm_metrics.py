"""The API port's /metrics: vLLM's names, labels and bucket bounds beside the kvpilot_ families.

The page is checked three ways: parsed as an exposition (names, types, labels, bounds as
vllm/v1/metrics/loggers.py defines them), read back by the sidecar's own vLLM adapter (written
from vLLM's reference independently of this page) to the same figures the kvpilot feed gives, and
the engine's counters observe what vLLM observes (every inter-token gap, finish reasons).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpilot.engine.metrics import stats_contract as contract
from kvpilot.engine.metrics.stats import EngineStats
from kvpilot.engine.server.endpoints.vllm_metrics import render, vllm_readings
from kvpilot.sidecar.adapters import ADAPTERS, read_page
from kvpilot.sidecar.feed import feed_readings
from tests.harness.stats_feed import make_feed

pytestmark = pytest.mark.unit

# vLLM's bounds, written out here rather than read from the contract: the test must fail if they drift.
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
             20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
            40.0, 80.0]
VLLM_E2E = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
            480.0, 960.0, 1920.0, 7680.0]


def _families(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_page_serves_vllm_names_types_and_model_label_beside_kvpilot_ones():
    body, content_type = render(make_feed())
    assert content_type.startswith("text/plain")
    families = _families(body.decode())
    expected = {
        "vllm:num_requests_running": ("gauge", 3.0), "vllm:num_requests_waiting": ("gauge", 2.0),
        "vllm:kv_cache_usage_perc": ("gauge", 40 / 200), "vllm:gpu_cache_usage_perc": ("gauge", 40 / 200),
        "vllm:prefix_cache_queries": ("counter", 1000.0), "vllm:prefix_cache_hits": ("counter", 250.0),
        "vllm:num_preemptions": ("counter", 6.0), "vllm:prompt_tokens": ("counter", 2048.0),
        "vllm:generation_tokens": ("counter", 4096.0),
    }  # fmt: skip
    for name, (kind, value) in expected.items():
        family = families[name]
        assert family.type == kind, name
        (sample,) = family.samples
        assert sample.labels == {"model_name": "tiny-llama", "engine": "0"}, name
        assert sample.value == pytest.approx(value), name
    success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples}
    assert success == {"stop": 12.0, "length": 5.0, "abort": 1.0}
    assert "kvpilot_kv_cache_efficiency" in families and "kvpilot_requests_running" in families


@pytest.mark.parametrize(("name", "bounds"), [
    ("vllm:time_to_first_token_seconds", VLLM_TTFT),
    ("vllm:inter_token_latency_seconds", VLLM_ITL),
    ("vllm:time_per_output_token_seconds", VLLM_ITL),
    ("vllm:e2e_request_latency_seconds", VLLM_E2E),
])  # fmt: skip
def test_histograms_keep_vllms_bucket_bounds(name, bounds):
    families = _families(render(make_feed())[0].decode())
    family = families[name]
    assert family.type == "histogram"
    les = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
    assert les == [*bounds, math.inf]
    assert all(s.labels["model_name"] == "tiny-llama" for s in family.samples)


def test_sidecars_vllm_adapter_reads_the_page_back_to_the_feeds_figures():
    feed = make_feed()
    page = render(feed)[0].decode()
    _, from_page = read_page(ADAPTERS["vllm"], page)
    direct = feed_readings(feed)
    for name in ("kvpilot_requests_running", "kvpilot_requests_waiting", "kvpilot_kv_cache_usage_ratio",
                 "kvpilot_prefix_cache_queried_tokens_total", "kvpilot_prefix_cache_hit_tokens_total",
                 "kvpilot_preemptions_total", "kvpilot_prompt_tokens_total", "kvpilot_generation_tokens_total",
                 "kvpilot_kv_blocks_capacity", "kvpilot_kv_block_size_tokens"):
        assert from_page.samples[name] == direct.samples[name], name
    assert from_page.samples["kvpilot_requests_finished_total"][()] == 17.0
    assert from_page.samples["kvpilot_requests_aborted_total"][()] == 1.0
    ttft = from_page.samples["kvpilot_ttft_seconds"][()]
    assert (ttft.count, ttft.sum) == (6.0, pytest.approx(0.004 + 0.02 + 0.02 + 0.3 + 2.5 + 100.0))


def test_colon_names_survive_what_prometheus_asks_for():
    # Prometheus asks for OpenMetrics first; prometheus_client's OpenMetrics encoder would rewrite
    # `vllm:` to `vllm_` in sample lines, so the page stays in the classic text format.
    body, content_type = render(make_feed())
    assert content_type.startswith("text/plain; version=0.0.4")
    samples = [line for line in body.decode().splitlines() if line.startswith("vllm")]
    assert samples and all(line.startswith("vllm:") for line in samples)


def test_a_feed_without_the_vllm_section_serves_what_it_can():
    feed = make_feed()
    del feed["vllm"]
    names = set(vllm_readings(feed).samples)
    assert "vllm:num_requests_running" in names
    assert not names & {"vllm:time_to_first_token_seconds", "vllm:request_success_total"}


def _seq(arrival: float) -> SimpleNamespace:
    return SimpleNamespace(arrival_time=arrival, first_token_time=None, last_token_time=None,
                           finish_reason=None, num_completion_tokens=0)


def test_engine_observes_every_token_gap_and_each_finish_reason():
    stats = EngineStats()
    seq = _seq(10.0)
    for step, now in enumerate((10.5, 10.52, 10.6, 11.6), start=1):
        seq.num_completion_tokens = step
        stats.on_token(seq, now)
    seq.finish_reason = "length"
    stats.on_finish(seq, 11.6)
    aborted = _seq(20.0)
    aborted.finish_reason = "abort"
    stats.on_finish(aborted, 21.0)
    feed = stats.vllm
    itl = feed["inter_token_seconds"].to_feed()
    assert itl["count"] == 3 and itl["sum"] == pytest.approx(0.02 + 0.08 + 1.0)
    assert feed["ttft_seconds"].to_feed()["count"] == 1
    assert feed["e2e_seconds"].to_feed()["sum"] == pytest.approx(1.6)
    assert stats.finished_by_reason == {"stop": 0, "length": 1, "abort": 1}
    assert stats.tpot.count == 1  # kvpilot's own per-request mean is unchanged
    assert len(feed["ttft_seconds"].to_feed()["buckets"]) == len(contract.VLLM_BUCKETS_SECONDS["ttft_seconds"]) + 1


def test_metrics_needs_no_api_key_while_the_api_does():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from kvpilot.engine.server.http.auth import ApiKeyMiddleware

    ok = lambda request: PlainTextResponse("ok")  # noqa: E731
    app = Starlette(routes=[Route("/metrics", ok), Route("/v1/models", ok)])
    client = TestClient(ApiKeyMiddleware(app, key="k", strategy="native"))
    assert client.get("/metrics").status_code == 200  # Prometheus and the endpoint picker send no key
    assert client.get("/v1/models").status_code == 401
