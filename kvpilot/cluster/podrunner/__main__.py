"""`python -m kvpilot.cluster.podrunner --state-dir DIR`: run the pods of opted-in namespaces of
the local cluster in DIR as real processes (`kvpilot cluster up` starts it)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from kvpilot.cluster.podrunner import netns
from kvpilot.cluster.podrunner.runner import PodRunner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvpilot.cluster.podrunner", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True, help="the local cluster's state dir")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between syncs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    why = netns.unavailable()
    if why:
        print(f"kvpilot pod runner: {why}", file=sys.stderr)
        return 1
    from kvpilot.cluster.local import POD_CIDR, LocalCluster

    cluster = LocalCluster.load(args.state_dir)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    PodRunner(cluster.api(), args.state_dir.resolve(), POD_CIDR, interval_s=args.interval).run(lambda: stop["now"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
