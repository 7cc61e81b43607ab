"""`kvpilot demo`: the main job on one machine.

Default: the fleet demo (kvpilot.demo.fleet): a local control plane with fake GPU nodes,
Prometheus, the gateway stand-in, the operator and real engines; load through the Gateway, a
canary promoted, a broken canary rolled back by the accuracy gate, a one-flag manual rollback,
and a report. `--engine-only`: the earlier demo, one engine and its sidecar (kvpilot.demo.engine_only).
"""

from __future__ import annotations

import argparse

from kvpilot.demo import engine_only


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-only", action="store_true",
                        help="the engine-only demo: one `kvpilot serve` + sidecar, no cluster (no root needed)")
    engine_only.add_arguments(parser)
    fleet = parser.add_argument_group("fleet demo")
    fleet.add_argument("--quick", action="store_true", help="short steps and intervals (fits in CI)")
    fleet.add_argument("--keep-workdir", action="store_true", help="leave logs and the report's data behind")


def run(args: argparse.Namespace) -> int:
    if args.engine_only:
        return engine_only.run(args)
    from kvpilot.demo import fleet

    return fleet.run(args)
