"""The sidecar's HTTP server: /metrics (text or OpenMetrics, by Accept header) and /healthz."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from kvpilot.sidecar.engine_collector import EngineCollector
from kvpilot.sidecar.nvml_collector import NvmlCollector

log = logging.getLogger("kvpilot.sidecar")


def make_registry(engine: EngineCollector, gpu: NvmlCollector | None) -> CollectorRegistry:
    """A registry holding only the sidecar's collectors (no process/platform defaults)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(engine)
    if gpu is not None:
        registry.register(gpu)
    return registry


class SidecarServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, engine: EngineCollector) -> None:
        self.registry = registry
        self.engine = engine
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: SidecarServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(self.server.registry)
            except Exception:
                log.exception("building /metrics failed")
                self._send(500, b"metrics collection failed; see the sidecar log\n", "text/plain")
                return
            self._send(200, body, content_type)
        elif path == "/healthz":
            # The sidecar is healthy while it serves; the engine's state is a metric, not our health.
            body = json.dumps({"status": "ok", "engine_up": self.server.engine.watch.up,
                               "engine_url": self.server.engine.source.url}).encode()
            self._send(200, body, "application/json")
        else:
            self._send(404, b"not found: the sidecar serves /metrics and /healthz\n", "text/plain")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def serve_in_thread(server: SidecarServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="kvpilot-sidecar-http", daemon=True)
    thread.start()
    return thread
