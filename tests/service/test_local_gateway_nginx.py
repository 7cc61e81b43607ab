"""The local gateway's nginx, live: hostnames and multi-header matches route by Gateway API
precedence, and the per-backend status counts the canary analysis reads are right.

A real nginx (Debian's) serves the rendered configuration in front of three tiny HTTP backends on
loopback; each answers with its own name, so the test sees which Service a request reached.
"""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvpilot.cluster import processes
from kvpilot.cluster.gateway import CONTROLLER_NAME, GROUP
from kvpilot.cluster.gateway.metrics import BackendCounters
from kvpilot.cluster.gateway.nginx_conf import METRICS_LOG, backend_targets, render
from kvpilot.cluster.gateway.nginx_process import NginxProcess
from kvpilot.cluster.gateway.plan import build_plan

pytestmark = [pytest.mark.service,
              pytest.mark.skipif(shutil.which("/usr/sbin/nginx") is None, reason="nginx not installed "
                                 "(apt-get install nginx-light)")]
MODEL = "X-Gateway-Model-Name"
PIN = "X-Model-Strategy"
NAMES = ("chat", "chat-canary", "code", "down")  # "down" has no ready endpoint


class _Named(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def backends() -> Iterator[dict[str, int]]:
    servers = {}
    for name in NAMES[:-1]:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Named)
        server.name = name  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers[name] = server
    yield {n: s.server_address[1] for n, s in servers.items()}
    for s in servers.values():
        s.shutdown()


def _rule(to: str, *headers: tuple[str, str]) -> dict:
    match = {"path": {"type": "PathPrefix", "value": "/"}}
    if headers:
        match["headers"] = [{"type": "Exact", "name": n, "value": v} for n, v in headers]
    return {"matches": [match], "backendRefs": [{"name": to, "port": 8000, "weight": 1}]}


def _route(name: str, rules: list, created: str, **spec: object) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "generation": 1, "creationTimestamp": created},
            "spec": {"parentRefs": [{"group": GROUP, "kind": "Gateway", "name": "gw"}], "rules": rules, **spec}}


ROUTES = [
    # chat, as the operator writes it with spec.route.modelHeader: the model header on every rule
    _route("chat", [_rule("chat-canary", (MODEL, "chat"), (PIN, "canary")), _rule("chat", (MODEL, "chat"))],
           "2026-01-01T00:00:00Z"),
    _route("code", [_rule("code", (MODEL, "code"))], "2026-01-01T00:00:01Z"),
    # by hostname: the exact one beats the wildcard, the wildcard beats routes without hostnames
    _route("by-host", [_rule("chat")], "2026-01-01T00:00:02Z", hostnames=["chat.example.com"]),
    _route("by-wildcard", [_rule("code")], "2026-01-01T00:00:03Z", hostnames=["*.example.com"]),
    _route("down", [_rule("down")], "2026-01-01T00:00:04Z", hostnames=["down.test"]),
]


@pytest.fixture(scope="module")
def gateway(backends: dict[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, BackendCounters]]:
    port = processes.free_ports(1)[0]
    gw = {"metadata": {"name": "gw", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
          "spec": {"gatewayClassName": "kvpilot-local", "addresses": [{"type": "IPAddress", "value": "127.0.0.1"}],
                   "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]}}
    services = {("ns", n): {"metadata": {"name": n, "namespace": "ns"},
                            "spec": {"ports": [{"name": "http", "port": 8000}]}} for n in NAMES}
    slices = {("ns", n): [{"ports": [{"name": "http", "port": p}],
                           "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}]
              for n, p in backends.items()}
    plan = build_plan(classes=[{"metadata": {"name": "kvpilot-local"}, "spec": {"controllerName": CONTROLLER_NAME}}],
                      gateways=[gw], routes=ROUTES, services=services, slices=slices, namespaces={"ns": {}},
                      previous_addresses={}, controller=CONTROLLER_NAME)
    assert all(c.status == "True" for ps in plan.route_parents.values() for p in ps for c in p.conditions[:1])
    prefix = tmp_path_factory.mktemp("gateway")
    nginx = NginxProcess(prefix)
    nginx.apply(render(plan.listeners, plan.upstreams, prefix, run_as_root=os.geteuid() == 0))
    counters = BackendCounters(prefix / METRICS_LOG, reopen=nginx.reopen_logs)
    counters.set_targets(backend_targets(plan.listeners))
    try:
        yield f"http://127.0.0.1:{port}", counters
    finally:
        nginx.stop()


def _get(url: str, host: str = "gw.local", **headers: str) -> tuple[int, str]:
    response = httpx.get(f"{url}/v1/models", headers={"Host": host, **headers}, timeout=5, trust_env=False)
    return response.status_code, response.text


def test_model_header_selects_the_service_and_pins_need_it_too(gateway: tuple[str, BackendCounters]) -> None:
    url, _ = gateway
    assert _get(url, **{MODEL: "chat"}) == (200, "chat")
    assert _get(url, **{MODEL: "code"}) == (200, "code")
    assert _get(url, **{MODEL: "chat", PIN: "canary"}) == (200, "chat-canary")
    assert _get(url, **{MODEL: "code", PIN: "canary"}) == (200, "code")  # chat's pin is not code's
    assert _get(url, **{PIN: "canary"})[0] == 404  # no model: no service on a shared gateway
    assert _get(url, **{MODEL: "other"})[0] == 404


def test_hostnames_by_precedence(gateway: tuple[str, BackendCounters]) -> None:
    url, _ = gateway
    assert _get(url, "chat.example.com") == (200, "chat")
    assert _get(url, "CHAT.example.com:8443") == (200, "chat")  # case and port do not matter
    assert _get(url, "api.example.com") == (200, "code")
    assert _get(url, "a.b.example.com") == (200, "code")
    assert _get(url, "example.com")[0] == 404  # the wildcard needs a label in front
    assert _get(url, "chat.example.com", **{MODEL: "code"}) == (200, "chat")  # the hostname ranks first


def test_per_backend_status_counts(gateway: tuple[str, BackendCounters]) -> None:
    url, counters = gateway
    counters.read()
    before = dict(counters.counts)
    assert before[("ns", "down", "503")] == 0  # every backend's 5xx series exists before its first error
    for _ in range(3):
        assert _get(url, "down.test")[0] == 503
    for _ in range(2):
        assert _get(url, **{MODEL: "code"})[0] == 200
    assert _get(url, **{MODEL: "nobody"})[0] == 404
    processes.wait_until(lambda: counters.read() or counters.counts.get(("", "", "404"), 0) > before.get(("", "", "404"), 0),
                         "the metrics log", 10)
    counters.read()
    delta = {k: v - before.get(k, 0) for k, v in counters.counts.items() if v != before.get(k, 0)}
    assert delta == {("ns", "down", "503"): 3, ("ns", "code", "200"): 2, ("", "", "404"): 1}
    registry = CollectorRegistry()
    registry.register(counters)
    text = generate_latest(registry).decode()
    assert 'kvpilot_gateway_requests_total{code="503",namespace="ns",service="down"}' in text
