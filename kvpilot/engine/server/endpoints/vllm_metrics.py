"""`GET /metrics` on the API port: vLLM's metric names beside the kvpilot_ engine families.

vLLM dashboards, KEDA and prometheus-adapter recipes, and the Gateway API Inference Extension's
endpoint picker scrape the model server's own port with vLLM's names (`vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`, ...). The page is built from the same stats feed the sidecar reads,
with the sidecar's torch-free field table and family builder (kvpilot.sidecar.feed / readings), so
the kvpilot_ families here are the sidecar's, and the vllm: ones are one more table of rows. The
sidecar stays the home of GPU (NVML) figures and of adapters for other engines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from kvpilot.engine.metrics.stats_contract import VLLM_BUCKETS_SECONDS
from kvpilot.sidecar.engine_collector import DEFAULT_MAX_STATS_AGE_SECONDS
from kvpilot.sidecar.feed import FeedError, feed_readings, lookup
from kvpilot.sidecar.readings import HistogramValue, Readings, build_families
from kvpilot.sidecar.schema import ENGINE_DERIVED, MetricSpec

metrics_router = APIRouter()

# vLLM labels every series with the served model and the data-parallel engine index.
LABELS = ("model_name", "engine")
FINISH_REASONS = ("stop", "length", "abort")
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class VllmRow:
    """One vllm: family: its spec (name, type, help) and where its value comes from in the feed."""

    spec: MetricSpec
    read: Callable[[dict[str, Any]], Any]  # feed -> float | HistogramValue | {label value: float} | None


def _gauge(name: str, help: str, read: Callable[[dict[str, Any]], Any]) -> VllmRow:
    return VllmRow(MetricSpec(name, "gauge", "", help, LABELS, group="engine"), read)


def _counter(name: str, help: str, path: str, unit: str = "") -> VllmRow:
    return VllmRow(MetricSpec(name, "counter", unit, help, LABELS, path), lambda feed: _number(lookup(feed, path)))


def _histogram(name: str, help: str, key: str) -> VllmRow:
    return VllmRow(MetricSpec(name, "histogram", "seconds", help, LABELS, f"vllm.{key}"),
                   lambda feed: _hist(lookup(feed, f"vllm.{key}"), VLLM_BUCKETS_SECONDS[key]))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _usage(feed: dict[str, Any]) -> float | None:
    used, total = _number(lookup(feed, "kv.blocks_used")), _number(lookup(feed, "kv.blocks_total"))
    return used / total if used is not None and total else None


def _hist(value: Any, bounds: tuple[float, ...]) -> HistogramValue | None:
    if not isinstance(value, dict) or len(value.get("buckets", ())) != len(bounds) + 1:
        return None
    pairs = tuple(zip((*bounds, float("inf")), map(float, value["buckets"]), strict=True))
    return HistogramValue(pairs, float(value["sum"]))


def _by_reason(feed: dict[str, Any]) -> dict[str, float] | None:
    counts = lookup(feed, "vllm.finished_total")
    if not isinstance(counts, dict):
        return None
    return {reason: float(counts.get(reason, 0)) for reason in (*FINISH_REASONS, *sorted(set(counts) - set(FINISH_REASONS)))}


_USAGE_HELP = "KV-cache usage. 1 means 100 percent usage."

VLLM_TABLE: tuple[VllmRow, ...] = (
    _gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
           lambda feed: _number(lookup(feed, "requests.running"))),
    _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
           lambda feed: _number(lookup(feed, "requests.waiting"))),
    _gauge("vllm:kv_cache_usage_perc", _USAGE_HELP, _usage),
    # The pre-0.9 name, still queried by vLLM production-stack's dashboard.
    _gauge("vllm:gpu_cache_usage_perc", _USAGE_HELP + " DEPRECATED: use vllm:kv_cache_usage_perc.", _usage),
    _counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
             "prefix_cache.queried_tokens_total"),
    _counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
             "prefix_cache.hit_tokens_total"),
    _counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
             "requests.preemptions_total"),
    _counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "requests.prompt_tokens_total"),
    _counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
             "requests.generation_tokens_total"),
    VllmRow(MetricSpec("vllm:request_success_total", "counter", "", "Count of successfully processed requests.",
                       (*LABELS, "finished_reason"), "vllm.finished_total{reason}"), _by_reason),
    _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft_seconds"),
    _histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
               "inter_token_seconds"),
    # The older name of the same observations, still queried by vLLM production-stack's dashboard.
    _histogram("vllm:time_per_output_token_seconds",
               "Histogram of time per output token in seconds. DEPRECATED: use vllm:inter_token_latency_seconds.",
               "inter_token_seconds"),
    _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e_seconds"),
)

CACHE_CONFIG_INFO = MetricSpec("vllm:cache_config_info", "gauge", "", "Information of the LLMEngine CacheConfig",
                               ("block_size", "cache_dtype", "engine", "num_gpu_blocks"), "kv.*")


def vllm_readings(feed: dict[str, Any]) -> Readings:
    """The vllm: families of one stats feed, labelled with the served model name and engine 0."""
    labels = (str(lookup(feed, "engine.model") or ""), "0")
    readings = Readings()
    for row in VLLM_TABLE:
        value = row.read(feed)
        if isinstance(value, dict):
            for reason, count in value.items():
                readings.put(row.spec.name, count, (*labels, reason))
        else:
            readings.put(row.spec.name, value, labels)
    block_size, blocks = lookup(feed, "kv.block_size"), lookup(feed, "kv.blocks_total")
    if isinstance(block_size, int) and isinstance(blocks, int):
        dtype = str(lookup(feed, "engine.kv_cache_dtype") or "auto")
        readings.put(CACHE_CONFIG_INFO.name, 1.0, (str(block_size), dtype, "0", str(blocks)))
    return readings


def page_families(feed: dict[str, Any]) -> Iterator[Metric]:
    """kvpilot_ engine families (the sidecar's table), then the vllm: ones, from one snapshot."""
    yield from build_families(feed_readings(feed), ENGINE_DERIVED)
    yield from build_families(vllm_readings(feed), (*(row.spec for row in VLLM_TABLE), CACHE_CONFIG_INFO))


class _Snapshot:
    """A one-shot collector over families already built (the registry asks collect() once)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def render(feed: dict[str, Any]) -> tuple[bytes, str]:
    """(body, content type) of the page, always in the classic text format (0.0.4).

    Not OpenMetrics even when Prometheus asks for it first: prometheus_client's OpenMetrics
    encoder (0.26) escapes sample names with the label-name character set, so
    `vllm:num_requests_running` would be stored as `vllm_num_requests_running` and every vLLM
    query would miss. The classic format keeps the colon, as a vLLM pod's page does.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(page_families(feed)))
    return generate_latest(registry), TEXT_FORMAT


def _unavailable(message: str) -> PlainTextResponse:
    # A failed scrape is how Prometheus learns the engine has no current figures (up == 0):
    # better than a page of last-known values stored as if fresh.
    return PlainTextResponse(message + "\n", status_code=503, headers={"Retry-After": "5"})


@metrics_router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    runtime = request.app.state.runtime
    feed = await runtime.stats()
    if feed is None:
        return _unavailable(f"no engine figures yet: {runtime.readiness_detail()}")
    age = feed.get("age_seconds")
    if isinstance(age, int | float) and age > DEFAULT_MAX_STATS_AGE_SECONDS:
        return _unavailable(f"the engine's stats snapshot is {age:.1f} s old (its engine thread is busy); "
                            f"figures are served again once it answers")
    try:
        body, content_type = render(feed)
    except (FeedError, TypeError, ValueError) as exc:
        return PlainTextResponse(f"building /metrics failed: {exc}\n", status_code=500)
    return Response(body, media_type=content_type)
