"""The sidecar's exposition, parsed back with prometheus_client's parsers, equals the schema table.

The engine is reached over real httpx with a transport that plays the engine (serves a feed, fails,
restarts), so the collector's HTTP handling, freshness and down behaviour are what is tested.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from kvpilot.engine.metrics import stats_contract as contract
from kvpilot.sidecar.engine_collector import EngineCollector
from kvpilot.sidecar.http_app import make_registry
from kvpilot.sidecar.nvml_collector import NvmlCollector
from kvpilot.sidecar.schema import BY_NAME, ENGINE_DERIVED, HEALTH, SCHEMA
from kvpilot.sidecar.sources import KvpilotFeedSource
from tests.harness.stats_feed import make_feed

pytestmark = pytest.mark.unit


class PlayedEngine:
    """What the engine answers next: a feed dict, raw bytes, an HTTP status, or an exception."""

    def __init__(self, feed: dict[str, Any]) -> None:
        self.answer: dict[str, Any] | bytes | int | Exception = feed
        self.requests: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url))
        if isinstance(self.answer, Exception):
            raise self.answer
        if isinstance(self.answer, int):
            return httpx.Response(self.answer, text="engine failing")
        if isinstance(self.answer, bytes):
            return httpx.Response(200, content=self.answer)
        return httpx.Response(200, content=json.dumps(self.answer).encode())


def make_collector(engine: Callable[[httpx.Request], httpx.Response]) -> EngineCollector:
    client = httpx.Client(transport=httpx.MockTransport(engine))
    return EngineCollector(KvpilotFeedSource("http://127.0.0.1:8001"), client=client)


def registry_for(collector: EngineCollector) -> CollectorRegistry:
    return make_registry(collector, None)


def families(registry: CollectorRegistry) -> dict[str, Any]:
    return {f.name: f for f in parse_text(generate_latest(registry).decode())}


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in parse_text(generate_latest(registry).decode()) for s in f.samples}


def test_schema_table_follows_prometheus_conventions():
    names = [spec.name for spec in SCHEMA]
    assert len(names) == len(set(names))
    assert names[:5] == ["kvpilot_kv_cache_efficiency", "kvpilot_summary_cache_hit_rate",
                         "kvpilot_summary_cache_hits_total", "kvpilot_summary_cache_misses_total",
                         "kvpilot_gqa_head_utilization"]
    for spec in SCHEMA:
        assert spec.name.startswith("kvpilot_"), spec.name
        assert spec.help and spec.source, spec.name
        assert spec.name.endswith("_total") == (spec.type == "counter"), spec.name
        if spec.unit in ("bytes", "seconds"):
            assert spec.family_name.endswith("_" + spec.unit), spec.name
        for bad in ("_ms", "_milliseconds", "_percent", "_perc", "_kb", "_mb", "_gb"):
            assert bad + "_" not in spec.name + "_", spec.name
        assert not set(spec.labels) & {"request_id", "prompt", "le", "quantile"}, spec.name
    histograms = {s.name for s in SCHEMA if s.type == "histogram"}
    assert histograms == {"kvpilot_ttft_seconds", "kvpilot_tpot_seconds", "kvpilot_e2e_latency_seconds"}


def test_text_exposition_names_and_types_equal_the_table():
    registry = registry_for(make_collector(PlayedEngine(make_feed())))
    exposed = families(registry)
    expected = {spec.family_name for spec in HEALTH + ENGINE_DERIVED}
    assert set(exposed) == expected
    for name, family in exposed.items():
        spec = next(s for s in SCHEMA if s.family_name == name)
        assert family.type == spec.type, name
        assert family.documentation == spec.help, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(spec.labels), (name, sample.labels)


def test_openmetrics_exposition_units_equal_the_table():
    registry = registry_for(make_collector(PlayedEngine(make_feed())))
    exposed = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
    assert exposed
    for name, family in exposed.items():
        spec = next(s for s in SCHEMA if s.family_name == name)
        assert family.unit == spec.exposition_unit, name
        assert family.type == spec.type, name
    assert exposed["kvpilot_memory_weights_bytes"].unit == "bytes"
    assert exposed["kvpilot_ttft_seconds"].unit == "seconds"


def test_values_are_the_feed_values():
    registry = registry_for(make_collector(PlayedEngine(make_feed())))
    got = samples(registry)
    assert got[("kvpilot_kv_cache_efficiency", ())] == pytest.approx(600 / 640)
    assert got[("kvpilot_summary_cache_hit_rate", ())] == pytest.approx(0.995)
    assert got[("kvpilot_summary_cache_hits_total", ())] == 995
    assert got[("kvpilot_gqa_head_utilization", (("kv_head", "1"), ("layer", "3")))] == 0.125
    assert got[("kvpilot_requests_rejected_total", (("reason", "too_long"),))] == 4
    assert got[("kvpilot_fallbacks_total", (("reason", "low_cosine"), ("strategy", "kv_int8")))] == 2
    assert got[("kvpilot_memory_kv_used_bytes", ())] == 2_621_440
    assert got[("kvpilot_engine_up", ())] == 1
    assert got[("kvpilot_engine_restarts_total", ())] == 0
    assert got[("kvpilot_engine_scrape_duration_seconds", ())] >= 0


def test_histogram_buckets_are_cumulative_and_consistent_with_count_and_sum():
    registry = registry_for(make_collector(PlayedEngine(make_feed())))
    for name in ("kvpilot_ttft_seconds", "kvpilot_tpot_seconds", "kvpilot_e2e_latency_seconds"):
        family = families(registry)[name]
        buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name == name + "_bucket"]
        assert [b for b, _ in buckets] == [*contract.LATENCY_BUCKETS_SECONDS, math.inf]
        counts = [c for _, c in buckets]
        assert counts == sorted(counts)
        count = next(s.value for s in family.samples if s.name == name + "_count")
        total = next(s.value for s in family.samples if s.name == name + "_sum")
        assert counts[-1] == count
        assert total >= 0
    ttft = families(registry)["kvpilot_ttft_seconds"]
    assert next(s.value for s in ttft.samples if s.name.endswith("_count")) == 6


def test_each_scrape_reads_the_engine_afresh():
    engine = PlayedEngine(make_feed())
    registry = registry_for(make_collector(engine))
    assert samples(registry)[("kvpilot_requests_running", ())] == 3
    engine.answer = make_feed(requests={"running": 9})
    assert samples(registry)[("kvpilot_requests_running", ())] == 9
    assert engine.requests == ["http://127.0.0.1:8001/stats"] * 2


@pytest.mark.parametrize("failure", [httpx.ConnectError("connection refused"),
                                     httpx.ReadTimeout("timed out"), 503, b"<html>",
                                     json.dumps({"schema_version": 99}).encode()])
def test_engine_down_serves_only_health_families(failure):
    engine = PlayedEngine(make_feed())
    registry = registry_for(make_collector(engine))
    assert samples(registry)[("kvpilot_engine_up", ())] == 1
    engine.answer = failure
    exposed = families(registry)
    assert set(exposed) == {"kvpilot_engine_up", "kvpilot_engine_restarts", "kvpilot_engine_scrape_duration_seconds"}
    got = samples(registry)
    assert got[("kvpilot_engine_up", ())] == 0
    assert got[("kvpilot_engine_restarts_total", ())] == 0


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_without_nvml_gpu_available_is_0_and_stays_when_the_engine_is_down():
    engine = PlayedEngine(make_feed())
    engine.answer = httpx.ConnectError("refused")
    registry = make_registry(make_collector(engine), NvmlCollector())
    exposed = families(registry)
    assert {"kvpilot_gpu_available", "kvpilot_engine_up"} <= set(exposed)
    assert not any(name.startswith("kvpilot_gpu_") and name != "kvpilot_gpu_available" for name in exposed)
    assert samples(registry)[("kvpilot_gpu_available", ())] == 0


def test_restart_is_a_new_instance_id_and_a_blip_is_not():
    engine = PlayedEngine(make_feed("first"))
    collector = make_collector(engine)
    registry = registry_for(collector)

    def restarts() -> float:
        return samples(registry)[("kvpilot_engine_restarts_total", ())]

    assert restarts() == 0
    engine.answer = httpx.ConnectError("refused")
    assert restarts() == 0
    engine.answer = make_feed("first")  # same process answered again: a slow or lost scrape
    assert restarts() == 0
    engine.answer = make_feed("second")  # new process without a down scrape in between
    assert restarts() == 1
    engine.answer = 502
    assert restarts() == 1
    engine.answer = make_feed("third")  # down, then a new process
    assert restarts() == 2
    assert restarts() == 2


def test_feed_paths_in_the_table_exist_in_the_contract_shape():
    feed = make_feed()
    for spec in ENGINE_DERIVED:
        if spec.source.startswith("derived") or spec.name in ("kvpilot_engine_info",):
            continue
        node: Any = feed
        for key in spec.source.split("{")[0].replace("[].value", "").split("."):
            assert key in node, (spec.name, spec.source)
            node = node[key]


def test_by_name_lookup_covers_the_table():
    assert set(BY_NAME) == {s.name for s in SCHEMA}


def test_a_stale_snapshot_is_never_served_as_fresh():
    # Finding 3: a busy engine thread made the feed serve its last snapshot as if current.
    engine = PlayedEngine(make_feed(age_seconds=0.4))
    collector = make_collector(engine)
    collector.max_age_s = 5.0
    fresh = samples(registry_for(collector))
    assert fresh[("kvpilot_engine_stats_age_seconds", ())] == 0.4
    assert fresh[("kvpilot_requests_running", ())] == 3
    engine.answer = make_feed(age_seconds=12.5)
    stale = samples(registry_for(collector))
    assert stale[("kvpilot_engine_up", ())] == 1.0  # the engine answered: it is up, only busy
    assert stale[("kvpilot_engine_stats_age_seconds", ())] == 12.5
    assert {name for name, _ in stale} == {spec.name for spec in HEALTH}  # no engine family
    engine.answer = make_feed(age_seconds=0.1)
    assert samples(registry_for(collector))[("kvpilot_requests_running", ())] == 3


def test_model_label_never_holds_a_file_path():
    engine = PlayedEngine(make_feed(engine={"model": "/var/lib/models/team-a/llama-7b/"}))
    got = samples(registry_for(make_collector(engine)))
    info = next(labels for name, labels in got if name == "kvpilot_engine_info")
    assert dict(info)["model"] == "llama-7b"
