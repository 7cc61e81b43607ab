"""`python -m kvpilot.cluster.gateway --state-dir DIR`: run the local gateway for the cluster in DIR
(`kvpilot cluster up` starts it; it stops nginx when it gets SIGTERM)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from kvpilot.cluster.gateway.controller import GatewayController
from kvpilot.cluster.gateway.nginx_process import nginx_missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpilot.cluster.gateway", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True, help="the local cluster's state dir")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between syncs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = nginx_missing()
    if missing:
        print(f"kvpilot gateway: {missing}", file=sys.stderr)
        return 1
    from kvpilot.cluster.local import LocalCluster

    cluster = LocalCluster.load(args.state_dir)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    prefix = args.state_dir / "gateway"
    prefix.mkdir(parents=True, exist_ok=True)
    GatewayController(cluster.api(), prefix.resolve(), interval_s=args.interval).run(lambda: stop["now"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
