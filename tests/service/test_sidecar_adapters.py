"""`kvpilot sidecar --engine-kind vllm|sglang` as a process, scraped by a real Prometheus.

The foreign engine is a loopback HTTP server serving a /metrics page written from vLLM's and
SGLang's documented names (tests/harness/engine_pages.py); PromQL on the kvpilot names must give
what that page says, and a different process start time counts as a restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.harness.engine_pages import SGLANG_PAGE, VLLM_PAGE
from tests.harness.prometheus import free_port, prometheus  # noqa: F401  (fixture)

pytestmark = [pytest.mark.service]


class PageServer(ThreadingHTTPServer):
    daemon_threads = True
    page = ""


class _Handler(BaseHTTPRequestHandler):
    server: PageServer

    def do_GET(self) -> None:
        body = self.server.page.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign_engine() -> Iterator[PageServer]:
    server = PageServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def start_sidecar(kind: str, engine_port: int, port: int, log_path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kvpilot.cli", "sidecar", "--engine-kind", kind, "--engine-url",
             f"http://127.0.0.1:{engine_port}", "--host", "127.0.0.1", "--port", str(port),
             "--scrape-timeout", "0.8", "--no-gpu"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    raise TimeoutError(f"sidecar did not start:\n{log_path.read_text()}")


@pytest.mark.parametrize(("kind", "page", "usage", "running", "p50_ttft", "p95_ttft"), [
    # vLLM page: TTFT buckets of both engines added: (0.001,1) (0.1,7) (1.0,11) (+Inf,12).
    # P50: rank 6 in (0.001, 0.1] -> 0.001 + 0.099 * 5/6. P95: rank 11.4 is in +Inf -> 1.0.
    ("vllm", VLLM_PAGE, 0.5, 7, 0.001 + 0.099 * 5 / 6, 1.0),
    # SGLang page: (0.1,10) (0.2,60) (0.4,80) (+Inf,90). P50: rank 45 in (0.1, 0.2] -> 0.1 + 0.1 * 35/50.
    ("sglang", SGLANG_PAGE, 0.28, 12, 0.1 + 0.1 * 35 / 50, 0.4),
])
def test_foreign_engine_through_the_sidecar_into_prometheus(kind, page, usage, running, p50_ttft, p95_ttft,
                                                            foreign_engine, prometheus, tmp_path):  # noqa: F811
    foreign_engine.page = page
    port = free_port()
    sidecar = start_sidecar(kind, foreign_engine.server_address[1], port, tmp_path / "sidecar.log")
    try:
        prom = prometheus({"sidecar": [f"127.0.0.1:{port}"]})
        prom.wait_for("kvpilot_engine_up", lambda r: bool(r) and r[0].value == 1, timeout=20)
        assert prom.value("kvpilot_kv_cache_usage_ratio") == pytest.approx(usage)
        assert prom.value("kvpilot_requests_running") == running
        assert prom.value("histogram_quantile(0.95, sum by (le) (kvpilot_ttft_seconds_bucket))") == p95_ttft
        p50 = prom.value("histogram_quantile(0.5, sum by (le) (kvpilot_ttft_seconds_bucket))")
        assert p50 == pytest.approx(p50_ttft, rel=1e-12)
        assert prom.query("kvpilot_kv_cache_efficiency") == []  # no source on that engine
        assert prom.value("kvpilot_engine_restarts_total") == 0

        foreign_engine.page = page.replace("process_start_time_seconds 1.7", "process_start_time_seconds 1.9")
        prom.wait_for("kvpilot_engine_restarts_total", lambda r: bool(r) and r[0].value == 1, timeout=10)

        foreign_engine.shutdown()
        foreign_engine.server_close()
        prom.wait_for("kvpilot_engine_up", lambda r: bool(r) and r[0].value == 0, timeout=10)
        assert prom.query("kvpilot_requests_running") == []
    finally:
        os.kill(sidecar.pid, signal.SIGTERM)
        sidecar.wait(timeout=10)
