"""vLLM and SGLang /metrics pages -> kvpilot's schema, on pages written from their documented names.

Names follow vllm/v1/metrics/loggers.py (0.9+, V1 engine) and sglang/srt/metrics/collector.py.
"""

from __future__ import annotations

import math

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from kvpilot.sidecar.adapters import ADAPTERS, AdapterError, read_page
from kvpilot.sidecar.engine_collector import EngineCollector
from kvpilot.sidecar.http_app import make_registry
from kvpilot.sidecar.readings import HistogramValue
from kvpilot.sidecar.schema import BY_NAME, ENGINE_DERIVED
from kvpilot.sidecar.sources import PrometheusPageSource
from tests.harness.engine_pages import SGLANG_PAGE, VLLM_PAGE, histogram_lines

pytestmark = pytest.mark.unit


def test_vllm_page_maps_onto_the_schema():
    identity, readings = read_page(ADAPTERS["vllm"], VLLM_PAGE)
    r = {name: values[()] for name, values in readings.samples.items()}
    assert identity is not None
    assert r["kvpilot_kv_cache_usage_ratio"] == pytest.approx(0.5)  # new name wins, averaged over engines
    assert r["kvpilot_requests_running"] == 7 and r["kvpilot_requests_waiting"] == 1
    assert r["kvpilot_prefix_cache_queried_tokens_total"] == 1500
    assert r["kvpilot_prefix_cache_hit_tokens_total"] == 400
    assert r["kvpilot_preemptions_total"] == 7
    assert r["kvpilot_prompt_tokens_total"] == 4096 and r["kvpilot_generation_tokens_total"] == 8192
    assert r["kvpilot_requests_finished_total"] == 14 and r["kvpilot_requests_aborted_total"] == 1
    assert r["kvpilot_kv_blocks_capacity"] == 27000 and r["kvpilot_kv_block_size_tokens"] == 16
    ttft = r["kvpilot_ttft_seconds"]
    assert isinstance(ttft, HistogramValue)
    assert ttft.buckets == ((0.001, 1), (0.1, 7), (1.0, 11), (math.inf, 12))  # both engines added
    assert ttft.sum == pytest.approx(4.4)
    tpot = r["kvpilot_tpot_seconds"]
    assert tpot.buckets == ((0.01, 7), (0.025, 9), (math.inf, 10))  # inter_token_latency, not the old name
    assert r["kvpilot_e2e_latency_seconds"].count == 15


def test_vllm_before_0_9_is_read_through_the_old_cache_names():
    old_page = "\n".join([
        "# TYPE vllm:gpu_cache_usage_perc gauge",
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.4',
        "# TYPE vllm:gpu_prefix_cache_queries counter",
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 10',
        "# TYPE vllm:time_per_output_token_seconds histogram",
        histogram_lines("vllm:time_per_output_token_seconds", 'model_name="m"', ["0.01", "+Inf"], [3, 4], 0.1),
        "",
    ])
    identity, readings = read_page(ADAPTERS["vllm"], old_page)
    assert identity is None
    assert readings.samples["kvpilot_kv_cache_usage_ratio"] == {(): 0.4}
    assert readings.samples["kvpilot_prefix_cache_queried_tokens_total"] == {(): 10}
    assert readings.samples["kvpilot_tpot_seconds"][()].count == 4


def test_sglang_page_maps_onto_the_schema():
    identity, readings = read_page(ADAPTERS["sglang"], SGLANG_PAGE)
    r = {name: values[()] for name, values in readings.samples.items()}
    assert identity is not None
    assert r["kvpilot_kv_cache_usage_ratio"] == pytest.approx(0.28)
    assert r["kvpilot_requests_running"] == 12 and r["kvpilot_requests_waiting"] == 7
    assert r["kvpilot_prefix_cache_hit_tokens_total"] == 1024  # device + host
    assert r["kvpilot_prefix_cache_queried_tokens_total"] == 8_128_902
    assert r["kvpilot_preemptions_total"] == 2
    assert r["kvpilot_requests_finished_total"] == 90 and r["kvpilot_requests_aborted_total"] == 3
    assert r["kvpilot_ttft_seconds"].buckets == ((0.1, 10), (0.2, 60), (0.4, 80), (math.inf, 90))
    assert r["kvpilot_tpot_seconds"].count == 51
    assert r["kvpilot_e2e_latency_seconds"].sum == 300.0


def test_mapping_tables_only_name_schema_metrics_of_matching_kind():
    for adapter in ADAPTERS.values():
        targets = [m.target for m in adapter.mappings]
        assert len(targets) == len(set(targets)), adapter.kind
        for mapping in adapter.mappings:
            spec = BY_NAME[mapping.target]
            assert spec in ENGINE_DERIVED and not spec.labels, mapping.target
            assert (mapping.combine == "histogram") == (spec.type == "histogram"), mapping.target
            for source in mapping.sources:
                assert source.startswith(adapter.kind + ":"), source


def test_mismatched_histogram_bounds_are_refused_not_added():
    page = "\n".join([
        "# TYPE vllm:e2e_request_latency_seconds histogram",
        histogram_lines("vllm:e2e_request_latency_seconds", 'engine="0"', ["1", "+Inf"], [1, 1], 0.5),
        histogram_lines("vllm:e2e_request_latency_seconds", 'engine="1"', ["2", "+Inf"], [1, 1], 0.5),
        "",
    ])
    with pytest.raises(AdapterError, match="different bucket bounds"):
        read_page(ADAPTERS["vllm"], page)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_adapter_exposition_uses_kvpilot_names_and_counts_restarts(kind):
    pages = {"vllm": VLLM_PAGE, "sglang": SGLANG_PAGE}
    page = {"text": pages[kind]}

    def engine(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(200, text=page["text"])

    collector = EngineCollector(PrometheusPageSource("http://10.0.0.7:8000", ADAPTERS[kind]),
                                client=httpx.Client(transport=httpx.MockTransport(engine)))
    registry = make_registry(collector, None)
    families = {f.name: f for f in parse_text(generate_latest(registry).decode())}
    assert all(name.startswith("kvpilot_") for name in families)
    assert families["kvpilot_ttft_seconds"].type == "histogram"
    assert families["kvpilot_requests_running"].samples[0].value in (7, 12)
    page["text"] = page["text"].replace("process_start_time_seconds 1.7", "process_start_time_seconds 1.8")
    list(registry.collect())
    assert collector.watch.restarts == 1
