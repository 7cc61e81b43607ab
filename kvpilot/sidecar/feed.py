"""The kvpilot engine's JSON stats feed (stats_contract) -> Readings, following the schema table."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kvpilot.engine.metrics import stats_contract as contract
from kvpilot.sidecar.readings import HistogramValue, Readings
from kvpilot.sidecar.schema import ENGINE_DERIVED, MetricSpec


class FeedError(ValueError):
    """The stats feed is not one this sidecar can read."""


_MISSING = object()

# Labelled counters whose documented keys are exported as 0 until the engine counts one, so that
# rate() and increase() have a series from the first scrape.
KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "kvpilot_requests_rejected_total": contract.REJECT_REASONS,
    "kvpilot_requests_failed_total": contract.FAILURE_REASONS,
}


def check_feed(feed: Any) -> dict[str, Any]:
    if not isinstance(feed, dict):
        raise FeedError(f"stats feed must be a JSON object, got {type(feed).__name__}")
    version = feed.get("schema_version")
    if version != contract.SCHEMA_VERSION:
        raise FeedError(
            f"stats feed schema_version is {version!r}; this sidecar reads version "
            f"{contract.SCHEMA_VERSION} (upgrade the sidecar together with the engine)"
        )
    engine = feed.get("engine")
    if not isinstance(engine, dict) or not engine.get("instance_id"):
        raise FeedError("stats feed has no engine.instance_id")
    return feed


def lookup(feed: dict[str, Any], path: str) -> Any:
    node: Any = feed
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


def feed_histogram(hist: dict[str, Any]) -> HistogramValue:
    counts = hist["buckets"]
    bounds = (*contract.LATENCY_BUCKETS_SECONDS, math.inf)
    if len(counts) != len(bounds):
        raise FeedError(f"histogram has {len(counts)} buckets; the contract has {len(bounds)}")
    return HistogramValue(tuple(zip(bounds, map(float, counts), strict=True)), float(hist["sum"]))


def _ratio(num: Any, den: Any) -> float | None:
    if not isinstance(num, int | float) or not isinstance(den, int | float) or den <= 0:
        return None
    return num / den


def _summary_hit_rate(feed: dict[str, Any]) -> float | None:
    hits = lookup(feed, "linear.summary_hits_total")
    misses = lookup(feed, "linear.summary_misses_total")
    if not isinstance(hits, int | float) or not isinstance(misses, int | float):
        return None
    return _ratio(hits, hits + misses)


AGE_METRIC = "kvpilot_engine_stats_age_seconds"


def _label_value(label: str, value: Any) -> str:
    text = str(value or "")
    # A model given as a path must not put the node's filesystem layout into a label.
    return text.rstrip("/").rsplit("/", 1)[-1] if label == "model" else text


def _engine_info(feed: dict[str, Any], readings: Readings, spec: MetricSpec) -> None:
    engine = feed["engine"]
    readings.put(spec.name, 1.0, tuple(_label_value(label, engine.get(label)) for label in spec.labels))


def _scalar(feed: dict[str, Any], readings: Readings, spec: MetricSpec) -> None:
    value = lookup(feed, spec.source)
    if value is _MISSING or value is None:
        return
    if isinstance(value, bool):
        value = float(value)
    if spec.type == "histogram":
        readings.put(spec.name, feed_histogram(value))
    else:
        readings.put(spec.name, value)


def _by_key(feed: dict[str, Any], readings: Readings, spec: MetricSpec) -> None:
    values = lookup(feed, spec.source.split("{")[0])
    if not isinstance(values, dict):
        return
    for key in KNOWN_KEYS.get(spec.name, ()):
        readings.put(spec.name, 0.0, (key,))
    for key, value in values.items():
        readings.put(spec.name, value, (str(key),))


def _by_two_keys(feed: dict[str, Any], readings: Readings, spec: MetricSpec) -> None:
    """A `{a: {b: value}}` field -> one sample per (a, b) (fallbacks by strategy and reason)."""
    values = lookup(feed, spec.source.split("{")[0])
    if not isinstance(values, dict):
        return
    for outer, inner in values.items():
        if not isinstance(inner, dict):
            raise TypeError(f"{outer!r} maps to {type(inner).__name__}, not an object of counts")
        for key, value in inner.items():
            readings.put(spec.name, value, (str(outer), str(key)))


def _gqa(feed: dict[str, Any], readings: Readings, spec: MetricSpec) -> None:
    items = lookup(feed, "gqa_head_utilization")
    if not isinstance(items, list):
        return
    for item in items:
        readings.put(spec.name, item.get("value"), (str(item["layer"]), str(item["kv_head"])))


Extractor = Callable[[dict[str, Any], Readings, MetricSpec], None]

EXTRACTORS: dict[str, Extractor] = {
    "kvpilot_engine_info": _engine_info,
    "kvpilot_gqa_head_utilization": _gqa,
    "kvpilot_fallbacks_total": _by_two_keys,
    "kvpilot_summary_cache_hit_rate": lambda f, r, s: r.put(s.name, _summary_hit_rate(f)),
    "kvpilot_kv_cache_usage_ratio": lambda f, r, s: r.put(
        s.name, _ratio(lookup(f, "kv.blocks_used"), lookup(f, "kv.blocks_total"))
    ),
}


def feed_readings(feed: Any) -> Readings:
    """Every engine-derived family the schema table lists, read from one stats feed."""
    feed = check_feed(feed)
    readings = Readings()
    for spec in ENGINE_DERIVED:
        extractor = EXTRACTORS.get(spec.name) or (_by_key if spec.labels else _scalar)
        try:
            extractor(feed, readings, spec)
        except (KeyError, TypeError, ValueError) as exc:
            raise FeedError(f"stats feed field for {spec.name} ({spec.source}) is malformed: {exc}") from exc
    age = feed.get("age_seconds")
    if isinstance(age, int | float) and not isinstance(age, bool):
        readings.put(AGE_METRIC, float(age))
    return readings


def feed_age(readings: Readings) -> float | None:
    """The snapshot's age the feed stated (None for feeds that state none)."""
    value = readings.samples.get(AGE_METRIC, {}).get(())
    return float(value) if isinstance(value, int | float) else None
