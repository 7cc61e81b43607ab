"""A real Prometheus scrapes a real `kvpilot serve`'s API port: vLLM production-stack's queries answer.

The queries are the engine-side panels of vLLM production-stack's Grafana dashboard
(observability/vllm-dashboard.json), written here as that dashboard's PromQL, plus the queue-depth
and KV-usage queries autoscaling recipes put behind an HPA. Each must return data, and the values
agree with the engine's own stats feed read while the engine is idle.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.harness.model_server_protocol import check_page
from tests.harness.prometheus import prometheus  # noqa: F401  (fixture)
from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = [pytest.mark.service, pytest.mark.slow]

REQUESTS = 6

# production-stack's vLLM dashboard, engine-side panels (router-side ones, vllm:current_qps and
# vllm:healthy_pods_total, come from its router, not from a model server).
DASHBOARD = {
    "Average Latency": "avg(vllm:e2e_request_latency_seconds_sum) / avg(vllm:e2e_request_latency_seconds_count)",
    "Request latency distribution": "sum by(le) (vllm:e2e_request_latency_seconds_bucket)",
    "Average ITL": "avg(vllm:time_per_output_token_seconds_sum) / avg(vllm:time_per_output_token_seconds_count)",
    "Request TTFT distribution": "sum by(le) (vllm:time_to_first_token_seconds_bucket)",
    "Number of Running Requests": "vllm:num_requests_running",
    "Number of Pending Requests": "vllm:num_requests_waiting",
    "GPU KV Usage Percentage": "vllm:gpu_cache_usage_perc",
}
# What autoscalers query (production-stack's prometheus-adapter rule; KEDA's Prometheus scaler recipes).
AUTOSCALING = {
    "queue depth": "sum by(model_name) (vllm:num_requests_waiting)",
    "kv usage": "max by(model_name) (vllm:kv_cache_usage_perc)",
    "prefix hit rate": "sum(vllm:prefix_cache_hits_total) / sum(vllm:prefix_cache_queries_total)",
    "p95 ttft": "histogram_quantile(0.95, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
    "p95 itl": "histogram_quantile(0.95, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket[1m])))",
    "successes": "sum by(finished_reason) (vllm:request_success_total)",
    "preemptions": "sum(vllm:num_preemptions_total)",
}


def _load(server: ServerProcess) -> None:
    body = {"model": SERVED_MODEL, "prompt": "the same long prefix for the cache, then", "max_tokens": 8,
            "temperature": 0}
    with ThreadPoolExecutor(REQUESTS) as pool:
        for response in pool.map(lambda _: httpx.post(server.base_url + "/v1/completions", json=body, timeout=120),
                                 range(REQUESTS)):
            assert response.status_code == 200, response.text


def test_production_stack_dashboard_queries_return_the_engines_figures(server: ServerProcess, prometheus):  # noqa: F811
    prom = prometheus({"engine": [f"127.0.0.1:{server.port}"]})
    prom.wait_for("vllm:num_requests_running", bool, timeout=30)  # a scrape before the load: rate() has two points
    _load(server)
    feed = server.wait_stats(lambda f: f["requests"]["running"] == 0 and f["requests"]["waiting"] == 0)
    finished = feed["vllm"]["e2e_seconds"]["count"]
    prom.wait_for("sum(vllm:e2e_request_latency_seconds_count)",
                  lambda r: bool(r) and r[0].value >= finished, timeout=30)
    feed = server.stats()  # idle: the same figures Prometheus stored
    for panel, promql in {**DASHBOARD, **AUTOSCALING}.items():
        assert prom.query(promql), f"{panel}: {promql!r} returned no data; targets {prom.target_health()}"
    e2e = feed["vllm"]["e2e_seconds"]
    assert prom.value(DASHBOARD["Average Latency"]) == pytest.approx(e2e["sum"] / e2e["count"], rel=1e-6)
    itl = feed["vllm"]["inter_token_seconds"]
    assert prom.value(DASHBOARD["Average ITL"]) == pytest.approx(itl["sum"] / itl["count"], rel=1e-6)
    ttft = {float(s.labels["le"]): s.value for s in prom.query(DASHBOARD["Request TTFT distribution"])}
    assert ttft[float("inf")] == feed["vllm"]["ttft_seconds"]["count"] >= REQUESTS
    assert len(ttft) == 23  # vLLM's 22 TTFT bounds and +Inf
    (running,) = prom.query(DASHBOARD["Number of Running Requests"])
    assert running.labels["model_name"] == SERVED_MODEL and running.labels["engine"] == "0"
    assert prom.value(AUTOSCALING["queue depth"]) == 0
    kv = feed["kv"]
    assert prom.value(DASHBOARD["GPU KV Usage Percentage"]) == pytest.approx(kv["blocks_used"] / kv["blocks_total"])
    hits = feed["prefix_cache"]["hit_tokens_total"] / feed["prefix_cache"]["queried_tokens_total"]
    assert prom.value(AUTOSCALING["prefix hit rate"]) == pytest.approx(hits) and hits > 0
    reasons = {s.labels["finished_reason"]: s.value for s in prom.query(AUTOSCALING["successes"])}
    assert reasons == {k: float(v) for k, v in feed["vllm"]["finished_total"].items()}
    # kvpilot's own families are on the same page, under the same scrape.
    assert prom.value("sum(kvpilot_requests_finished_total)") == feed["requests"]["finished_total"]


def test_the_api_port_meets_the_inference_extensions_model_server_protocol(server: ServerProcess):
    """What an InferencePool's endpoint picker scrapes from each pod, with the feed's figures."""
    page = httpx.get(server.base_url + "/metrics", timeout=10)
    assert page.status_code == 200
    figures = check_page(page.text)
    feed = server.stats()
    assert figures["BlockSize"] == feed["kv"]["block_size"] and figures["NumGPUBlocks"] == feed["kv"]["blocks_total"]
    assert figures["TotalQueuedRequests"] == feed["requests"]["waiting"]
