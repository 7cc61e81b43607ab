"""`python -m kvpilot.cluster.gateway --state-dir DIR`: run the local gateway for the cluster in DIR
(`kvpilot cluster up` starts it; it stops nginx when it gets SIGTERM)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from kvpilot.cluster import processes
from kvpilot.cluster.gateway.controller import GatewayController
from kvpilot.cluster.gateway.nginx_process import nginx_missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpilot.cluster.gateway", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True, help="the local cluster's state dir")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between syncs")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="serve kvpilot_gateway_requests_total on 127.0.0.1:PORT (0: a free port); the "
                             "address goes to the local Prometheus (<state dir>/prometheus/gateway.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = nginx_missing()
    if missing:
        print(f"kvpilot gateway: {missing}", file=sys.stderr)
        return 1
    from kvpilot.cluster.local import LocalCluster
    from kvpilot.cluster.prometheus import write_targets

    cluster = LocalCluster.load(args.state_dir)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    prefix = args.state_dir / "gateway"
    prefix.mkdir(parents=True, exist_ok=True)
    controller = GatewayController(cluster.api(), prefix.resolve(), interval_s=args.interval)
    port = args.metrics_port or processes.free_ports(1)[0]
    registry = CollectorRegistry()
    registry.register(controller.counters)
    start_http_server(port, addr="127.0.0.1", registry=registry)
    write_targets(args.state_dir, "gateway.json", [{"targets": [f"127.0.0.1:{port}"],
                                                    "labels": {"component": "gateway"}}])
    try:
        controller.run(lambda: stop["now"])
    finally:
        write_targets(args.state_dir, "gateway.json", [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
