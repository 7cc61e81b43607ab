"""`kvpilot operator`: run the InferenceService operator (kopf) against the current kubeconfig.

Several replicas are safe with peering: each runs with its own `--priority`; only the
highest-priority live operator handles objects, the others pause until it disappears.
The peering CRDs are in crds/kopf-peering.yaml; create a `KopfPeering` named like `--peering`
in each watched namespace (or a `ClusterKopfPeering` for `--all-namespaces`).
"""

from __future__ import annotations

import argparse
import logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="namespace to watch (repeatable; glob patterns allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", metavar="NAME", help="peering object name (see crds/kopf-peering.yaml)")
    peering.add_argument("--standalone", action="store_true", help="no peering: the only operator")
    parser.add_argument("--priority", type=int, default=0, help="peering priority; the highest live one works")
    parser.add_argument("--liveness", metavar="URL", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--verbose", action="store_true")


def run(args: argparse.Namespace) -> int:
    import kopf

    import kvpilot.operator.handlers  # noqa: F401  (registers the handlers)

    if not args.namespace and not args.all_namespaces:
        raise SystemExit("kvpilot operator: pass --namespace NS (repeatable) or --all-namespaces")
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN, log_prefix=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        standalone=args.standalone or not args.peering,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
    )
    return 0
