"""The demo's report: both tracks' latency, error rate, KV efficiency and the canary weight over
time, drawn from Prometheus with the same PromQL the dashboards and the rollout analysis use
(kvpilot/promql.py), as a PNG (matplotlib) and an HTML page that embeds it."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

TRACKS = ("stable", "canary")
COLOURS = {"stable": "#1f77b4", "canary": "#d62728", "weight": "#2ca02c"}


@dataclass(frozen=True)
class Panel:
    """One chart: a title, a unit and, per series label, the PromQL that draws it."""

    title: str
    unit: str
    queries: dict[str, str]


@dataclass(frozen=True)
class Marker:
    """A vertical line on every chart: a stage of the demo (seconds since the start)."""

    at_s: float
    label: str


def panels(namespace: str, service: str, window: str = "30s") -> list[Panel]:
    from kvpilot import promql

    def per_track(build) -> dict[str, str]:  # type: ignore[no-untyped-def]
        return {t: build(promql.matchers(namespace, service, t)) for t in TRACKS}

    rollout = f'namespace="{namespace}",service="{service}"'
    return [
        Panel("end-to-end latency p95", "s", per_track(lambda m: promql.e2e_p95(m, window))),
        Panel("error rate", "share of requests", per_track(lambda m: promql.error_rate(m, window))),
        Panel("KV cache efficiency", "live / allocated", per_track(lambda m: promql.kv_cache_efficiency_over(m, window))),
        Panel("canary weight", "% of unpinned requests", {"weight": f"max(kvpilot_rollout_weight{{{rollout}}})"}),
    ]


def query_range(prometheus_url: str, promql_text: str, start: float, end: float, step_s: float) -> list[tuple[float, float]]:
    """(unix time, value) points; NaN/Inf (no traffic in the window) are dropped."""
    response = httpx.get(f"{prometheus_url}/api/v1/query_range", timeout=30,
                         params={"query": promql_text, "start": start, "end": end, "step": step_s})
    response.raise_for_status()
    body = response.json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {promql_text!r}: {body}")
    points: list[tuple[float, float]] = []
    for series in body["data"]["result"]:
        for t, v in series["values"]:
            value = float(v)
            if math.isfinite(value):
                points.append((float(t), value))
    return sorted(points)


def collect(prometheus_url: str, charts: Sequence[Panel], start: float, end: float,
            step_s: float = 2.0) -> dict[str, dict[str, list[tuple[float, float]]]]:
    return {p.title: {label: query_range(prometheus_url, q, start, end, step_s) for label, q in p.queries.items()}
            for p in charts}


def draw_png(data: dict[str, dict[str, list[tuple[float, float]]]], charts: Sequence[Panel], start: float,
             markers: Sequence[Marker], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(charts), 1, figsize=(11, 2.6 * len(charts)), sharex=True)
    for ax, panel in zip(axes, charts, strict=True):
        for label, points in data[panel.title].items():
            if points:
                ax.plot([t - start for t, _ in points], [v for _, v in points], label=label,
                        color=COLOURS.get(label), linewidth=1.6, drawstyle="steps-post" if label == "weight" else None)
        for m in markers:
            ax.axvline(m.at_s, color="#888888", linestyle=":", linewidth=1)
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.set_ylabel(panel.unit, fontsize=8)
        ax.grid(alpha=0.3)
        if any(data[panel.title].values()):
            ax.legend(fontsize=8, loc="upper right")
    top = axes[0]
    for m in markers:
        top.annotate(m.label, (m.at_s, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                     va="top", ha="right", color="#555555")
    axes[-1].set_xlabel("seconds since the demo's load started")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_html(path: Path, png: Path, title: str, rows: Sequence[tuple[str, str]]) -> Path:
    """A self-contained page: the PNG (relative link) and a table of what happened."""
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    path.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}th{{text-align:left;padding-right:1em}}
td,th{{border-bottom:1px solid #ddd;padding:.3em}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>Both tracks of the InferenceService, from the same PromQL as the dashboards (kvpilot/promql.py);
dotted lines mark the demo's stages.</p>
<img src="{html.escape(png.name)}" alt="latency, error rate, KV efficiency and canary weight over time" width="100%">
<table>{table}</table>
</body></html>
""")
    return path
