"""`kvpilot cluster up|down|env|status|build`: a local control plane with fake GPU nodes."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kvpilot.cluster import build

DEFAULT_STATE_DIR = build.REPO_ROOT / ".cache" / "cluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start etcd, kube-apiserver, controller-manager, scheduler, kwok")
    up.add_argument("--nodes", type=int, default=2, help="number of fake GPU nodes (default 2)")
    up.add_argument("--gpus-per-node", type=int, default=8)
    up.add_argument("--gpu-product", default="NVIDIA-H200")
    up.add_argument("--gpu-memory-mib", type=int, default=143771)
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    up.add_argument("--gateway-api", action=argparse.BooleanOptionalAction, default=True,
                    help="install the Gateway API standard-channel CRDs pinned in tools/gateway-api/go.mod "
                         "(default on)")
    up.add_argument("--gateway", action=argparse.BooleanOptionalAction, default=True,
                    help="start the local gateway stand-in (nginx serving HTTPRoutes; docs/dev/local-fleet.md)")
    up.add_argument("--pod-runner", action=argparse.BooleanOptionalAction, default=True,
                    help="run pods of namespaces named fleet-* as real processes "
                         "(needs root; skipped with a warning otherwise)")
    for name, text in (("down", "stop every process `up` started and delete its files"),
                       ("env", "print `export KUBECONFIG=...` for the running cluster"),
                       ("status", "print the recorded processes and whether each still runs")):
        sub.add_parser(name, help=text)
    b = sub.add_parser("build", help="build (or reuse) the control-plane binaries from tools/")
    b.add_argument("components", nargs="*", help=f"subset of {[c.name for c in build.COMPONENTS]}")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    for p in sub.choices.values():
        p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                       help=f"where certificates, data, logs and PIDs live (default {DEFAULT_STATE_DIR})")


def _fetch_gateway_api() -> int:
    from kvpilot.cluster import gateway_api

    try:
        files = gateway_api.fetch()
    except RuntimeError as exc:
        print(f"Gateway API CRDs: {exc}", file=sys.stderr)
        return 1
    print(f"Gateway API {gateway_api.version()} standard channel: {len(files)} files in {gateway_api.crd_dir()}",
          flush=True)
    return 0


def _start_fleet(cluster, gateway: bool, pod_runner: bool) -> None:  # type: ignore[no-untyped-def]
    from kvpilot.cluster.gateway.nginx_process import nginx_missing
    from kvpilot.cluster.podrunner.netns import unavailable

    for flag, why in (("gateway", nginx_missing() if gateway else None),
                      ("pod-runner", unavailable() if pod_runner else None)):
        if why:
            print(f"kvpilot cluster up: not starting the {flag}: {why}", file=sys.stderr)
    cluster.start_fleet(gateway=gateway and not nginx_missing(), pod_runner=pod_runner and not unavailable())


def run(args: argparse.Namespace) -> int:
    if args.action == "build":
        rc = build.build_all(args.components or None, force=args.force)
        if rc == 0 and not args.components:
            rc = _fetch_gateway_api()
        return rc
    from kvpilot.cluster.local import LocalCluster
    from kvpilot.cluster.nodes import GpuNodeSpec

    if args.action == "up":
        if args.nodes < 0:
            print(f"--nodes must be >= 0, got {args.nodes}", file=sys.stderr)
            return 2
        spec = GpuNodeSpec(gpus=args.gpus_per_node, gpu_product=args.gpu_product,
                           gpu_memory_mib=args.gpu_memory_mib)
        cluster = LocalCluster(args.state_dir, nodes=args.nodes, node_spec=spec, start_timeout_s=args.timeout)
        try:
            cluster.start()  # stops what it started if it fails; refuses a state dir in use
        except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
            print(f"kvpilot cluster up: {exc}", file=sys.stderr)
            return 1  # no stop(): with a state dir in use it would delete a running cluster's files
        try:
            if args.gateway_api:
                from kvpilot.cluster import gateway_api

                crds = gateway_api.install(cluster.api())
                print(f"Gateway API {gateway_api.version()} standard channel: {len(crds)} CRDs installed",
                      file=sys.stderr)
            _start_fleet(cluster, args.gateway, args.pod_runner)
        except (RuntimeError, TimeoutError) as exc:
            cluster.stop()
            print(f"kvpilot cluster up: {exc}", file=sys.stderr)
            return 1
        print(f"cluster ready in {cluster.started_in_s:.1f} s: {cluster.server}, "
              f"{args.nodes} fake GPU node(s) ({', '.join(cluster.node_names)})", file=sys.stderr)
        print(f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
        return 0
    try:
        cluster = LocalCluster.load(args.state_dir)
    except FileNotFoundError as exc:
        print(f"kvpilot cluster {args.action}: {exc}", file=sys.stderr)
        return 0 if args.action == "down" else 1
    if args.action == "down":
        cluster.stop()
        print(f"stopped the cluster in {args.state_dir}", file=sys.stderr)
    elif args.action == "env":
        print(f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
    else:
        print(f"server {cluster.server}")
        for name, alive in cluster.running().items():
            print(f"{name:24} pid {cluster.pids[name]:>7}  {'running' if alive else 'NOT running'}")
    return 0
