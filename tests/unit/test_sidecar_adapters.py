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

pytestmark = pytest.mark.unit


def _hist(name: str, labels: str, bounds: list[str], counts: list[int], total: float) -> str:
    lines = [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(bounds, counts, strict=True)]
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {counts[-1]}"]
    return "\n".join(lines)


# vLLM 0.10-style page with two data-parallel engines, the deprecated cache gauge still present,
# and both the old and new per-token latency histograms.
VLLM_LABELS = ['model_name="llama",engine="0"', 'model_name="llama",engine="1"']
VLLM_PAGE = "\n".join([
    "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
    "# TYPE process_start_time_seconds gauge",
    "process_start_time_seconds 1.7e+09",
    "# HELP vllm:num_requests_running Number of requests in model execution batches.",
    "# TYPE vllm:num_requests_running gauge",
    f"vllm:num_requests_running{{{VLLM_LABELS[0]}}} 3.0",
    f"vllm:num_requests_running{{{VLLM_LABELS[1]}}} 4.0",
    "# TYPE vllm:num_requests_waiting gauge",
    f"vllm:num_requests_waiting{{{VLLM_LABELS[0]}}} 1.0",
    f"vllm:num_requests_waiting{{{VLLM_LABELS[1]}}} 0.0",
    "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
    "# TYPE vllm:gpu_cache_usage_perc gauge",
    f"vllm:gpu_cache_usage_perc{{{VLLM_LABELS[0]}}} 0.99",
    f"vllm:gpu_cache_usage_perc{{{VLLM_LABELS[1]}}} 0.99",
    "# TYPE vllm:kv_cache_usage_perc gauge",
    f"vllm:kv_cache_usage_perc{{{VLLM_LABELS[0]}}} 0.25",
    f"vllm:kv_cache_usage_perc{{{VLLM_LABELS[1]}}} 0.75",
    "# TYPE vllm:prefix_cache_queries counter",
    f"vllm:prefix_cache_queries_total{{{VLLM_LABELS[0]}}} 1000.0",
    f"vllm:prefix_cache_queries_total{{{VLLM_LABELS[1]}}} 500.0",
    "# TYPE vllm:prefix_cache_hits counter",
    f"vllm:prefix_cache_hits_total{{{VLLM_LABELS[0]}}} 300.0",
    f"vllm:prefix_cache_hits_total{{{VLLM_LABELS[1]}}} 100.0",
    "# TYPE vllm:num_preemptions counter",
    f"vllm:num_preemptions_total{{{VLLM_LABELS[0]}}} 2.0",
    f"vllm:num_preemptions_total{{{VLLM_LABELS[1]}}} 5.0",
    "# TYPE vllm:prompt_tokens counter",
    f"vllm:prompt_tokens_total{{{VLLM_LABELS[0]}}} 4096.0",
    "# TYPE vllm:generation_tokens counter",
    f"vllm:generation_tokens_total{{{VLLM_LABELS[0]}}} 8192.0",
    "# TYPE vllm:request_success counter",
    f'vllm:request_success_total{{{VLLM_LABELS[0]},finished_reason="stop"}} 10.0',
    f'vllm:request_success_total{{{VLLM_LABELS[0]},finished_reason="length"}} 4.0',
    f'vllm:request_success_total{{{VLLM_LABELS[0]},finished_reason="abort"}} 1.0',
    "# TYPE vllm:time_to_first_token_seconds histogram",
    _hist("vllm:time_to_first_token_seconds", VLLM_LABELS[0], ["0.001", "0.1", "1.0", "+Inf"], [0, 5, 8, 9], 3.5),
    _hist("vllm:time_to_first_token_seconds", VLLM_LABELS[1], ["0.001", "0.1", "1.0", "+Inf"], [1, 2, 3, 3], 0.9),
    "# TYPE vllm:time_per_output_token_seconds histogram",
    _hist("vllm:time_per_output_token_seconds", VLLM_LABELS[0], ["0.01", "+Inf"], [99, 99], 0.5),
    "# TYPE vllm:inter_token_latency_seconds histogram",
    _hist("vllm:inter_token_latency_seconds", VLLM_LABELS[0], ["0.01", "0.025", "+Inf"], [7, 9, 10], 0.2),
    "# TYPE vllm:e2e_request_latency_seconds histogram",
    _hist("vllm:e2e_request_latency_seconds", VLLM_LABELS[0], ["0.3", "0.5", "+Inf"], [1, 2, 15], 40.0),
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",'
    'num_cpu_blocks="None",num_gpu_blocks="27000",enable_prefix_caching="True"} 1.0',
    "",
])

SGLANG_LABELS = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
SGLANG_PAGE = "\n".join([
    "# TYPE process_start_time_seconds gauge",
    "process_start_time_seconds 1.71e+09",
    "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
    "# TYPE sglang:prompt_tokens_total counter",
    f"sglang:prompt_tokens_total{{{SGLANG_LABELS}}} 8.128902e+06",
    "# TYPE sglang:generation_tokens_total counter",
    f"sglang:generation_tokens_total{{{SGLANG_LABELS}}} 7.557572e+06",
    "# TYPE sglang:cached_tokens_total counter",
    f'sglang:cached_tokens_total{{{SGLANG_LABELS},cache_source="device"}} 1000.0',
    f'sglang:cached_tokens_total{{{SGLANG_LABELS},cache_source="host"}} 24.0',
    "# TYPE sglang:token_usage gauge",
    f"sglang:token_usage{{{SGLANG_LABELS}}} 0.28",
    "# TYPE sglang:cache_hit_rate gauge",
    f"sglang:cache_hit_rate{{{SGLANG_LABELS}}} 0.0075",
    "# TYPE sglang:num_running_reqs gauge",
    f"sglang:num_running_reqs{{{SGLANG_LABELS}}} 12.0",
    "# TYPE sglang:num_queue_reqs gauge",
    f"sglang:num_queue_reqs{{{SGLANG_LABELS}}} 7.0",
    "# TYPE sglang:num_requests_total counter",
    f"sglang:num_requests_total{{{SGLANG_LABELS}}} 90.0",
    "# TYPE sglang:num_aborted_requests_total counter",
    f"sglang:num_aborted_requests_total{{{SGLANG_LABELS}}} 3.0",
    "# TYPE sglang:num_retracted_requests_total counter",
    f"sglang:num_retracted_requests_total{{{SGLANG_LABELS}}} 2.0",
    "# TYPE sglang:time_to_first_token_seconds histogram",
    _hist("sglang:time_to_first_token_seconds", SGLANG_LABELS, ["0.1", "0.2", "0.4", "+Inf"], [10, 60, 80, 90], 20.0),
    "# TYPE sglang:inter_token_latency_seconds histogram",
    _hist("sglang:inter_token_latency_seconds", SGLANG_LABELS, ["0.002", "0.004", "+Inf"], [5, 50, 51], 0.2),
    "# TYPE sglang:e2e_request_latency_seconds histogram",
    _hist("sglang:e2e_request_latency_seconds", SGLANG_LABELS, ["0.1", "1", "+Inf"], [0, 40, 90], 300.0),
    "",
])


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
        _hist("vllm:time_per_output_token_seconds", 'model_name="m"', ["0.01", "+Inf"], [3, 4], 0.1),
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
        _hist("vllm:e2e_request_latency_seconds", 'engine="0"', ["1", "+Inf"], [1, 1], 0.5),
        _hist("vllm:e2e_request_latency_seconds", 'engine="1"', ["2", "+Inf"], [1, 1], 0.5),
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
