"""`kvpilot sidecar`: export the engine's stats and NVML GPU metrics for Prometheus."""

from __future__ import annotations

import argparse
import logging
import signal

from kvpilot.sidecar.engine_collector import DEFAULT_MAX_STATS_AGE_SECONDS, EngineCollector
from kvpilot.sidecar.http_app import SidecarServer, make_registry
from kvpilot.sidecar.nvml_collector import NvmlCollector
from kvpilot.sidecar.sources import ENGINE_KINDS, make_source

log = logging.getLogger("kvpilot.sidecar")


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {value}")
    return number


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-url", default="http://127.0.0.1:8001",
                        help="engine base URL; kvpilot: its stats feed (/stats), vllm/sglang: its /metrics")
    parser.add_argument("--engine-kind", choices=ENGINE_KINDS, default="kvpilot",
                        help="which engine serves at --engine-url (default: kvpilot)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to serve /metrics on: loopback by default; in a pod, its own IP "
                        "(the operator passes --host $(POD_IP) from the downward API), never 0.0.0.0 "
                        "unless every interface may be scraped")
    parser.add_argument("--port", type=int, default=9400, help="port to serve /metrics on")
    parser.add_argument("--scrape-timeout", type=_positive, default=2.0,
                        help="seconds to wait for the engine at each scrape before exporting engine_up 0")
    parser.add_argument("--max-stats-age", type=_positive, default=DEFAULT_MAX_STATS_AGE_SECONDS,
                        help="seconds a stats snapshot may be old before the engine's figures are withheld "
                        f"(kvpilot_engine_stats_age_seconds says its age; default {DEFAULT_MAX_STATS_AGE_SECONDS:g})")
    parser.add_argument("--no-gpu", action="store_true", help="do not read NVML (no GPU families)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        source = make_source(args.engine_url, args.engine_kind)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    engine = EngineCollector(source, timeout_s=args.scrape_timeout, max_age_s=args.max_stats_age)
    gpu = None if args.no_gpu else NvmlCollector()
    server = SidecarServer((args.host, args.port), make_registry(engine, gpu), engine)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    log.info("sidecar serving http://%s:%d/metrics for %s engine at %s",
             args.host, server.server_address[1], args.engine_kind, source.url)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    return 0
