"""Summarise bench/serve_vs_offline.sh's OUT_DIR: HTTP vs offline throughput, client vs engine latency.

Engine-side TTFT/TPOT come from the stats feed's histograms (the difference over the timed run):
their mean, and the median interpolated within the bucket that holds it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kvpilot.engine.metrics.stats_contract import LATENCY_BUCKETS_SECONDS


def histogram_delta(before: dict[str, Any], after: dict[str, Any], key: str) -> dict[str, Any]:
    b, a = before["latency"][key], after["latency"][key]
    return {
        "buckets": [x - y for x, y in zip(a["buckets"], b["buckets"], strict=True)],
        "sum": a["sum"] - b["sum"],
        "count": a["count"] - b["count"],
    }


def histogram_median_ms(hist: dict[str, Any]) -> float | None:
    if not hist["count"]:
        return None
    half, low = hist["count"] / 2, 0.0
    previous = 0
    bounds = [*LATENCY_BUCKETS_SECONDS, float("inf")]
    for bound, cumulative in zip(bounds, hist["buckets"], strict=True):
        if cumulative >= half:
            if bound == float("inf"):
                return low * 1000
            inside = (half - previous) / max(1, cumulative - previous)
            return (low + inside * (bound - low)) * 1000
        low, previous = bound, cumulative
    return None


def thread_cpu(out: Path) -> dict[str, float]:
    """CPU seconds of the server's main (event loop) thread and of all its other threads, timed run only."""
    pid = (out / "server.pid").read_text().strip()
    ticks = os.sysconf("SC_CLK_TCK")

    def read(name: str) -> dict[str, int]:
        return {tid: int(t) for tid, t in (line.split() for line in (out / name).read_text().splitlines())}

    before, after = read("threads_before.txt"), read("threads.txt")
    delta = {tid: after[tid] - before.get(tid, 0) for tid in after}
    main = delta.pop(pid, 0) / ticks
    return {"event_loop_thread": main, "other_threads": sum(delta.values()) / ticks}


def report(out: Path) -> dict[str, Any]:
    offline = json.loads((out / "offline.json").read_text())
    serve = json.loads((out / "serve.json").read_text())
    before, after = json.loads((out / "stats_before.json").read_text()), json.loads((out / "stats.json").read_text())
    rows = []
    for rate in serve["rates"]:
        rows.append({"request_rate": rate["request_rate"], "http_output_tok_s": rate["output_tok_s"],
                     "completed": rate.get("completed"), "failed": rate.get("failed"),
                     "first_error": rate.get("first_error"), "stream_chunks": rate.get("stream_chunks"),
                     "client_ttft_ms": rate["ttft_ms"], "client_tpot_ms": rate["tpot_ms"]})  # fmt: skip
    engine = {}
    for key in ("ttft_seconds", "tpot_seconds"):
        hist = histogram_delta(before, after, key)
        engine[key] = {
            "mean_ms": hist["sum"] / hist["count"] * 1000 if hist["count"] else None,
            "p50_ms": histogram_median_ms(hist),
        }
    detok = {k: after.get("detokenizer", {}).get(k, 0) - before.get("detokenizer", {}).get(k, 0)
             for k in ("decoded_tokens_total", "output_tokens_total")}  # fmt: skip
    result: dict[str, Any] = {"offline_output_tok_s": offline["output_tok_s"], "serve": rows, "engine": engine, "detokenizer": detok}
    if (out / "offline_cpu.json").is_file():
        result["offline_cpu_s"] = json.loads((out / "offline_cpu.json").read_text().strip().splitlines()[-1])
    if (out / "threads.txt").is_file():
        result["server_cpu_s"] = thread_cpu(out)
    if len(rows) == 1:
        result["http_over_offline"] = rows[0]["http_output_tok_s"] / offline["output_tok_s"]
    return result


if __name__ == "__main__":
    summary = report(Path(sys.argv[1]))
    (Path(sys.argv[1]) / "report.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
