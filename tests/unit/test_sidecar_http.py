"""The sidecar's HTTP server on a loopback port: /metrics content negotiation, /healthz, 404s, CLI."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from kvpilot.sidecar import cli
from kvpilot.sidecar.engine_collector import EngineCollector
from kvpilot.sidecar.http_app import SidecarServer, make_registry, serve_in_thread
from kvpilot.sidecar.sources import KvpilotFeedSource
from tests.harness.stats_feed import make_feed

pytestmark = pytest.mark.unit


@pytest.fixture
def sidecar() -> Iterator[tuple[str, dict]]:
    state = {"feed": make_feed()}

    def engine(request: httpx.Request) -> httpx.Response:
        if state["feed"] is None:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, content=json.dumps(state["feed"]).encode())

    collector = EngineCollector(KvpilotFeedSource("http://127.0.0.1:8001"),
                                client=httpx.Client(transport=httpx.MockTransport(engine)))
    server = SidecarServer(("127.0.0.1", 0), make_registry(collector, None), collector)
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_in_text_format_by_default(sidecar):
    url, _ = sidecar
    response = httpx.get(f"{url}/metrics", trust_env=False)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in parse_text(response.text)}
    assert {"kvpilot_kv_cache_efficiency", "kvpilot_engine_up", "kvpilot_ttft_seconds"} <= names


def test_metrics_in_openmetrics_when_asked(sidecar):
    url, _ = sidecar
    response = httpx.get(f"{url}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"},
                         trust_env=False)
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in parse_openmetrics(response.text)}
    assert families["kvpilot_memory_kv_pool_bytes"].unit == "bytes"


def test_healthz_reports_the_last_scrape_and_stays_200_when_the_engine_is_down(sidecar):
    url, state = sidecar
    assert httpx.get(f"{url}/healthz", trust_env=False).json()["engine_up"] is None  # no scrape yet
    httpx.get(f"{url}/metrics", trust_env=False)
    assert httpx.get(f"{url}/healthz", trust_env=False).json()["engine_up"] is True
    state["feed"] = None
    assert "kvpilot_engine_up 0.0" in httpx.get(f"{url}/metrics", trust_env=False).text
    health = httpx.get(f"{url}/healthz", trust_env=False)
    assert health.status_code == 200 and health.json()["engine_up"] is False


def test_unknown_path_is_404_naming_the_served_paths(sidecar):
    url, _ = sidecar
    response = httpx.get(f"{url}/stats", trust_env=False)
    assert response.status_code == 404 and "/metrics" in response.text


def test_cli_defaults_and_refusals():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.engine_url, args.port, args.host, args.engine_kind, args.scrape_timeout) == (
        "http://127.0.0.1:8001", 9400, "127.0.0.1", "kvpilot", 2.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine-kind", "tgi"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--scrape-timeout", "0"])
    bad = parser.parse_args(["--engine-url", "127.0.0.1:8001"])
    assert cli.run(bad) == 2
