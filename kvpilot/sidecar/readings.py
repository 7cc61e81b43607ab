"""Values read from one source at one scrape, and their conversion into metric families.

Every source (the engine's feed, a vLLM or SGLang page, NVML) produces `Readings`: schema name ->
samples. One builder turns them into prometheus_client families using the schema table, so type,
help and unit come from one place whatever the source.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from kvpilot.sidecar.schema import MetricSpec


@dataclass(frozen=True)
class HistogramValue:
    """A cumulative histogram: (upper bound, count <= bound) pairs ending with +Inf, and the sum."""

    buckets: tuple[tuple[float, float], ...]
    sum: float

    @property
    def count(self) -> float:
        return self.buckets[-1][1]

    def check(self) -> None:
        bounds = [b for b, _ in self.buckets]
        if not bounds or bounds[-1] != math.inf:
            raise ValueError(f"histogram buckets must end with +Inf, got bounds {bounds}")
        if any(b2 <= b1 for b1, b2 in pairwise(bounds)):
            raise ValueError(f"histogram bounds must increase, got {bounds}")
        counts = [c for _, c in self.buckets]
        if any(c2 < c1 for c1, c2 in pairwise(counts)):
            raise ValueError(f"histogram counts must be cumulative (non-decreasing), got {counts}")


Value = float | HistogramValue


@dataclass
class Readings:
    """Samples per schema name: label values (in the spec's label order) -> value."""

    samples: dict[str, dict[tuple[str, ...], Value]] = field(default_factory=dict)

    def put(self, name: str, value: Value | None, labels: tuple[str, ...] = ()) -> None:
        if value is None:
            return
        if not isinstance(value, HistogramValue):
            value = float(value)
            if math.isnan(value):
                return
        self.samples.setdefault(name, {})[labels] = value

    def __contains__(self, name: str) -> bool:
        return bool(self.samples.get(name))


def build_family(spec: MetricSpec, samples: dict[tuple[str, ...], Value]) -> Metric:
    labels = list(spec.labels)
    if spec.type == "gauge":
        family: Metric = GaugeMetricFamily(spec.name, spec.help, labels=labels, unit=spec.exposition_unit)
    elif spec.type == "counter":
        family = CounterMetricFamily(spec.name, spec.help, labels=labels, unit=spec.exposition_unit)
    else:
        family = HistogramMetricFamily(spec.name, spec.help, labels=labels, unit=spec.exposition_unit)
    for label_values, value in sorted(samples.items()):
        if len(label_values) != len(labels):
            raise ValueError(f"{spec.name}: labels {labels} but sample has values {label_values}")
        if spec.type == "histogram":
            if not isinstance(value, HistogramValue):
                raise TypeError(f"{spec.name} is a histogram; got a plain value {value!r}")
            value.check()
            buckets = [(floatToGoString(bound), count) for bound, count in value.buckets]
            family.add_metric(list(label_values), buckets, value.sum)  # type: ignore[attr-defined]
        else:
            if isinstance(value, HistogramValue):
                raise TypeError(f"{spec.name} is a {spec.type}; got a histogram")
            family.add_metric(list(label_values), value)  # type: ignore[attr-defined]
    return family


def build_families(readings: Readings, specs: Iterable[MetricSpec]) -> Iterator[Metric]:
    """Families for every spec that has samples, in table order; specs without samples are left out."""
    for spec in specs:
        samples = readings.samples.get(spec.name)
        if samples:
            yield build_family(spec, samples)
