"""Mapping another engine's Prometheus page onto kvpilot's schema.

An adapter is data: a table of `Mapping` rows (kvpilot name <- that engine's metric names). The
page is parsed with prometheus_client's text parser, so any valid exposition (with or without
TYPE lines, several label sets per series) is read the same way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from kvpilot.sidecar.readings import HistogramValue, Readings
from kvpilot.sidecar.schema import spec as schema_spec

Combine = Literal["sum", "mean", "histogram", "label"]
LabelSet = tuple[tuple[str, str], ...]


class AdapterError(ValueError):
    """The page could not be read as a Prometheus exposition."""


@dataclass(frozen=True)
class Mapping:
    """One kvpilot family and where it comes from on the other engine's page."""

    target: str  # kvpilot schema name (counters with `_total`)
    sources: tuple[str, ...]  # that engine's sample names (histograms: base name); first present wins
    combine: Combine = "sum"  # how several series (per model, per DP engine) become one value
    label: str = ""  # combine="label": the value is this label's value (info-style gauges)
    exclude: LabelSet = ()  # samples carrying any of these label values are skipped
    only: LabelSet = ()  # when set, only samples carrying all of these label values count
    note: str = ""


@dataclass(frozen=True)
class Adapter:
    """The mapping table for one engine kind."""

    kind: str
    mappings: tuple[Mapping, ...]
    reference: str  # where the names come from
    identity_sample: str = "process_start_time_seconds"  # changes when the engine restarts


class Page:
    """Samples of one parsed exposition, indexed by sample name."""

    def __init__(self, text: str) -> None:
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    self.samples[sample.name].append((dict(sample.labels), float(sample.value)))
        except ValueError as exc:
            raise AdapterError(f"not a Prometheus text exposition: {exc}") from exc

    def has(self, name: str, combine: Combine) -> bool:
        return bool(self.samples.get(name + "_bucket" if combine == "histogram" else name))

    def values(self, name: str, exclude: LabelSet = (), only: LabelSet = ()) -> list[tuple[dict[str, str], float]]:
        return [(dict(labels), v) for labels, v in self.samples.get(name, ())
                if not any(labels.get(k) == val for k, val in exclude)
                and all(labels.get(k) == val for k, val in only)]

    def histogram(self, base: str, exclude: LabelSet = ()) -> HistogramValue | None:
        series: dict[LabelSet, dict[float, float]] = defaultdict(dict)
        for labels, value in self.values(base + "_bucket", exclude):
            le = labels.pop("le", None)
            if le is None:
                continue
            series[tuple(sorted(labels.items()))][float(le)] = value
        sums: dict[LabelSet, float] = {tuple(sorted(labels.items())): value
                                       for labels, value in self.values(base + "_sum", exclude)}
        if not series:
            return None
        bounds = {tuple(sorted(b)) for b in series.values()}
        if len(bounds) != 1:
            raise AdapterError(f"{base}: series have different bucket bounds {sorted(bounds)}; cannot add them")
        (bound_list,) = bounds
        if not bound_list or bound_list[-1] != math.inf:
            raise AdapterError(f"{base}: buckets lack the +Inf bucket")
        buckets = tuple((b, sum(s[b] for s in series.values())) for b in bound_list)
        return HistogramValue(buckets, sum(sums.get(key, 0.0) for key in series))


def _combine(page: Page, mapping: Mapping, name: str) -> float | HistogramValue | None:
    if mapping.combine == "histogram":
        return page.histogram(name, mapping.exclude)
    values = page.values(name, mapping.exclude, mapping.only)
    if not values:
        return None
    if mapping.combine == "label":
        raw = [labels.get(mapping.label) for labels, _ in values]
        numbers = [float(v) for v in raw if v not in (None, "", "None")]
        return numbers[0] if numbers else None
    total = sum(v for _, v in values)
    return total / len(values) if mapping.combine == "mean" else total


def read_page(adapter: Adapter, text: str) -> tuple[str | None, Readings]:
    """(engine identity, readings) from one page of that engine's /metrics."""
    page = Page(text)
    readings = Readings()
    for mapping in adapter.mappings:
        target = schema_spec(mapping.target)
        name = next((s for s in mapping.sources if page.has(s, mapping.combine)), None)
        if name is None:
            continue
        value = _combine(page, mapping, name)
        if target.type == "histogram" and not isinstance(value, HistogramValue | None):
            raise AdapterError(f"{mapping.target} needs a histogram source; {name} is not one")
        readings.put(target.name, value)
    identity = page.values(adapter.identity_sample)
    return (repr(identity[0][1]) if identity else None), readings
