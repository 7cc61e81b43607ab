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
    rollout = parser.add_argument_group("rollout (spec.canary)")
    rollout.add_argument("--prometheus-url", default="", metavar="URL",
                         help="Prometheus HTTP API for the canary analysis, e.g. http://prometheus:9090; "
                              "without it every analysis is inconclusive (no promotion)")
    rollout.add_argument("--gateway", default="", metavar="NAME[/NS]",
                         help="Gateway the HTTPRoutes attach to when spec.canary.gateway is not set")
    rollout.add_argument("--gateway-url", default="", metavar="URL",
                         help="score the probe set through this Gateway address with header pins")
    rollout.add_argument("--track-url", action="append", default=[], metavar="NS/NAME/TRACK=URL",
                         help="static engine address of one track for the probe set (local runs, tests)")
    rollout.add_argument("--rollout-tick", type=float, default=10.0, metavar="SECONDS",
                         help="how often each rollout is looked at (default 10; steps last spec.canary.interval)")
    rollout.add_argument("--autoscaling-interval", type=float, default=30.0, metavar="SECONDS",
                         help="how often status.autoscaling is written from the HPAs and the denser-strategy "
                              "proposal checked (default 30; spec.autoscaling, docs/autoscaling.md)")
    rollout.add_argument("--gateway-metrics", default="", metavar="NAME",
                         help="count the 5xx the Gateway answers for each track in the analysis, from this "
                              "implementation's metrics: kvpilot-local (the local fleet's gateway), istio; "
                              "default: none (the gatewayErrorRate check is off)")
    rollout.add_argument("--gateway-requests-query", default="", metavar="PROMQL",
                         help="instead of --gateway-metrics: requests the Gateway answered for a backend, a "
                              "template with $namespace $service $backend $track $window (docs/rollout.md)")
    rollout.add_argument("--gateway-errors-query", default="", metavar="PROMQL",
                         help="... and the 5xx among them (same placeholders; give both queries)")
    rollout.add_argument("--router", choices=("gateway-api", "inference-pool"), default="gateway-api",
                         help="how traffic reaches the tracks: an HTTPRoute to each track's Service (gateway-api), "
                              "or to an InferencePool per track (inference-pool, Gateway API Inference Extension v1)")
    rollout.add_argument("--canary-gpu-check", choices=("require", "warn", "off"), default="require",
                         help="before creating a canary, count free GPUs on matching nodes: require (wait until "
                              "they are free), warn (report and create anyway, e.g. with a node autoscaler), off")
    parser.add_argument("--gpu-product-label", default="nvidia.com/gpu.product", metavar="KEY",
                        help="node label holding spec.resources.gpuProduct when the spec names none: "
                             "nvidia.com/gpu.product (GPU feature discovery), cloud.google.com/gke-accelerator "
                             "(GKE), karpenter.k8s.aws/instance-gpu-name (Karpenter)")
    parser.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                        help="serve the operator's Prometheus metrics on this port (e.g. 9402; 0: off)")
    parser.add_argument("--verbose", action="store_true")


def run(args: argparse.Namespace) -> int:
    import kopf

    from kvpilot.operator import options
    from kvpilot.operator.analysis.gateway import gateway_queries

    if not args.namespace and not args.all_namespaces:
        raise SystemExit("kvpilot operator: pass --namespace NS (repeatable) or --all-namespaces")
    try:
        configured = options.Options(
            prometheus_url=args.prometheus_url.rstrip("/"),
            gateway=options.parse_gateway(args.gateway) if args.gateway else None,
            gateway_url=args.gateway_url.rstrip("/"),
            track_urls=dict(options.parse_track_url(t) for t in args.track_url),
            tick_s=args.rollout_tick,
            autoscaling_interval_s=args.autoscaling_interval,
            router=args.router,
            gpu_product_label=args.gpu_product_label,
            canary_gpu_check=args.canary_gpu_check,
            gateway_queries=gateway_queries(args.gateway_metrics, args.gateway_requests_query,
                                            args.gateway_errors_query),
        )
    except ValueError as exc:
        raise SystemExit(f"kvpilot operator: {exc}") from None
    if args.rollout_tick <= 0:
        raise SystemExit(f"kvpilot operator: --rollout-tick must be > 0 seconds, got {args.rollout_tick}")
    if args.autoscaling_interval <= 0:
        raise SystemExit(f"kvpilot operator: --autoscaling-interval must be > 0 seconds, got {args.autoscaling_interval}")
    options.configure(configured)  # before the handlers are registered: the timers read their intervals
    import kvpilot.operator.handlers  # noqa: F401  (registers the handlers)

    if args.metrics_port:
        from kvpilot.operator.operator_metrics import serve

        serve(args.metrics_port)
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
