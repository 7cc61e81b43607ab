"""CPU cost of one sidecar scrape: read a stats feed (in-process transport) and render /metrics.

    PYTHONPATH=. python bench/bench_sidecar_scrape.py [--layers 32 --kv-heads 8 --scrapes 300]

The feed carries a gqa_head_utilization entry per (layer, kv_head), the only family whose size
grows with the model; network time to the engine is not included (the exporter's own
`kvpilot_engine_scrape_duration_seconds` reports that in production).
"""

from __future__ import annotations

import argparse
import json
import time

import httpx
from prometheus_client import generate_latest

from kvpilot.sidecar.engine_collector import EngineCollector
from kvpilot.sidecar.http_app import make_registry
from kvpilot.sidecar.sources import KvpilotFeedSource
from tests.harness.stats_feed import make_feed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    feed = make_feed()
    feed["gqa_head_utilization"] = [{"layer": layer, "kv_head": head, "value": 0.5}
                                    for layer in range(args.layers) for head in range(args.kv_heads)]
    body = json.dumps(feed).encode()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    collector = EngineCollector(KvpilotFeedSource("http://127.0.0.1:8001"), client=httpx.Client(transport=transport))
    registry = make_registry(collector, None)
    for _ in range(20):
        generate_latest(registry)
    start = time.perf_counter()
    for _ in range(args.scrapes):
        out = generate_latest(registry)
    per_scrape = (time.perf_counter() - start) / args.scrapes
    print(f"{per_scrape * 1e3:.2f} ms per scrape; exposition {len(out)} bytes, {len(out.splitlines())} lines "
          f"({args.layers} layers x {args.kv_heads} KV heads)")


if __name__ == "__main__":
    main()
