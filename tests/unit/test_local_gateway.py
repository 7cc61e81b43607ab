"""The local gateway's pure parts: HTTPRoute checks, the plan, and nginx configuration that
Debian's nginx accepts (`nginx -t`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvpilot.cluster.gateway import CONTROLLER_NAME, GROUP
from kvpilot.cluster.gateway.nginx_conf import percentages, render
from kvpilot.cluster.gateway.plan import build_plan

pytestmark = pytest.mark.unit
CLASSES = [{"metadata": {"name": "kvpilot-local"}, "spec": {"controllerName": CONTROLLER_NAME}}]


def gateway(name: str = "gw", ns: str = "ns", listener_from: str = "Same") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"gatewayClassName": "kvpilot-local", "listeners": [
                {"name": "http", "port": 8080, "protocol": "HTTP",
                 "allowedRoutes": {"namespaces": {"from": listener_from}}}]}}


def route(rules: list, ns: str = "ns", name: str = "r", **spec: object) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "generation": 3, "creationTimestamp": "2026-01-01T00:00:01Z"},
            "spec": {"parentRefs": [{"group": GROUP, "kind": "Gateway", "name": "gw"}], "rules": rules, **spec}}


def backend(name: str, weight: int = 1, **extra: object) -> dict:
    return {"name": name, "port": 8000, "weight": weight, **extra}


def pin(value: str, to: str) -> dict:
    return {"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                         "headers": [{"type": "Exact", "name": "X-Model-Strategy", "value": value}]}],
            "backendRefs": [backend(to)]}


SERVICES = {("ns", n): {"metadata": {"name": n, "namespace": "ns"},
                        "spec": {"ports": [{"name": "http", "port": 8000}]}} for n in ("svc-stable", "svc-canary")}
SLICES = {("ns", n): [{"ports": [{"name": "http", "port": 8000}],
                       "endpoints": [{"addresses": [ip], "conditions": {"ready": True}},
                                     {"addresses": ["198.18.9.9"], "conditions": {"ready": False}}]}]
          for n, ip in (("svc-stable", "198.18.0.2"), ("svc-canary", "198.18.0.3"))}


def plan_for(routes: list, gateways: list | None = None):  # type: ignore[no-untyped-def]
    return build_plan(classes=CLASSES, gateways=gateways or [gateway()], routes=routes, services=SERVICES,
                      slices=SLICES, namespaces={"ns": {}, "other": {}}, previous_addresses={},
                      controller=CONTROLLER_NAME)


KVPILOT_ROUTE = [pin("native-int8", "svc-canary"), pin("native-bf16", "svc-stable"),
                 {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                  "backendRefs": [backend("svc-stable", 95), backend("svc-canary", 5)]}]


def test_kvpilot_route_is_accepted_and_split() -> None:
    plan = plan_for([route(KVPILOT_ROUTE)])
    (parent,) = plan.route_parents["ns/r"]
    assert [(c.type, c.status, c.reason) for c in parent.conditions] == [
        ("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")]
    (listener,) = plan.listeners
    assert listener.address == "127.0.1.1" and listener.port == 8080
    assert [e.header for e in listener.entries] == [("X-Model-Strategy", "native-int8"),
                                                    ("X-Model-Strategy", "native-bf16"), None]
    assert plan.upstreams[("ns", "svc-stable", 8000)].servers == ("198.18.0.2:8000",)  # not-ready one left out
    text = render(plan.listeners, plan.upstreams, Path("/tmp/x"), run_as_root=False)
    assert "split_clients" in text and "95.00% kvp_u_ns_svc_stable_8000;" in text
    assert "* kvp_u_ns_svc_canary_8000;" in text
    assert '"~^[^|]*[|]native-int8$" kvp_u_ns_svc_canary_8000;' in text
    assert 'map "$host|$http_x_model_strategy" $kvp_l0' in text


@pytest.mark.parametrize(("rules", "extra", "needle"), [
    ([{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": [backend("svc-stable")]}],
     {}, "spec.rules[0].matches[0].path PathPrefix '/v1'"),
    ([{"matches": [{"method": "POST"}], "backendRefs": [backend("svc-stable")]}], {}, "matches[0].method"),
    ([{"filters": [{"type": "RequestMirror"}], "backendRefs": [backend("svc-stable")]}], {}, "rules[0].filters"),
    ([{"matches": [{"headers": [{"type": "RegularExpression", "name": "x", "value": "a.*"}]}],
       "backendRefs": [backend("svc-stable")]}], {}, "type 'RegularExpression'"),
    ([{"backendRefs": [backend("svc-stable")]}], {"hostnames": ["10.0.0.1:80"]}, "spec.hostnames[0]"),
])
def test_unsupported_features_reject_the_route(rules: list, extra: dict, needle: str) -> None:
    plan = plan_for([route(rules, **extra)])
    accepted, _ = plan.route_parents["ns/r"][0].conditions
    assert (accepted.status, accepted.reason) == ("False", "UnsupportedValue")
    assert needle in accepted.message
    assert plan.listeners[0].entries == ()


@pytest.mark.parametrize(("ref", "reason"), [
    (backend("missing"), "BackendNotFound"),
    (backend("svc-stable", port=9), "BackendNotFound"),
    (backend("svc-stable", kind="ConfigMap", group=""), "InvalidKind"),
    (backend("svc-stable", namespace="other"), "RefNotPermitted"),
])
def test_unresolved_backends_answer_500(ref: dict, reason: str) -> None:
    plan = plan_for([route([{"backendRefs": [ref, backend("svc-stable")]}])])
    accepted, resolved = plan.route_parents["ns/r"][0].conditions
    assert accepted.status == "True" and (resolved.status, resolved.reason) == ("False", reason)
    text = render(plan.listeners, plan.upstreams, Path("/tmp/x"), run_as_root=False)
    assert "50.00% kvp_error_500_kvp_u_" in text


def test_listener_namespaces_and_section_names() -> None:
    other = route([{"backendRefs": [backend("svc-stable")]}], ns="other")
    other["spec"]["parentRefs"][0]["namespace"] = "ns"
    plan = plan_for([other])
    accepted, _ = plan.route_parents["other/r"][0].conditions
    assert (accepted.status, accepted.reason) == ("False", "NotAllowedByListeners")
    r = route([{"backendRefs": [backend("svc-stable")]}])
    r["spec"]["parentRefs"][0]["sectionName"] = "https"
    accepted, _ = plan_for([r]).route_parents["ns/r"][0].conditions
    assert accepted.reason == "NoMatchingParent"
    foreign = {**r, "spec": {**r["spec"], "parentRefs": [{"name": "someone-elses"}]}}
    assert plan_for([foreign]).route_parents == {}


def test_percentages_sum_to_100_with_two_decimals() -> None:
    assert percentages([95, 5]) == [95.0, 5.0]
    assert percentages([1, 1, 1]) == [33.33, 33.34, 33.33]
    assert sum(percentages([999, 1])) == pytest.approx(100)


@pytest.mark.skipif(shutil.which("/usr/sbin/nginx") is None, reason="nginx not installed (apt-get install nginx-light)")
def test_nginx_accepts_the_rendered_configuration(tmp_path: Path) -> None:
    plan = plan_for([route(KVPILOT_ROUTE), route([{"backendRefs": [backend("missing")]}], name="r2")])
    text = render(plan.listeners, plan.upstreams, tmp_path, run_as_root=False)
    (tmp_path / "nginx.conf").write_text(text)
    (tmp_path / "tmp" / "body").mkdir(parents=True)
    result = subprocess.run(["/usr/sbin/nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + text


def test_pod_runner_plans_kvpilot_containers_like_the_kubelet() -> None:
    from kvpilot.cluster.podrunner.containers import UnsupportedContainer, plan_pod

    pod = {"metadata": {"name": "p", "namespace": "fleet-a"}, "status": {"podIP": "198.18.0.7"},
           "spec": {"containers": [
               {"name": "sidecar", "command": ["kvpilot", "sidecar"], "args": ["--host", "$(POD_IP)", "--x", "$$(KEEP)"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "URL", "value": "http://$(POD_IP):1"}],
                "ports": [{"name": "metrics", "containerPort": 9400}],
                "readinessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}, "periodSeconds": 10,
                                   "timeoutSeconds": 5}}]}}
    (plan,) = plan_pod(pod, python="py")
    assert plan.argv == ("py", "-m", "kvpilot.cli", "sidecar", "--host", "198.18.0.7", "--x", "$(KEEP)")
    assert dict(plan.env) == {"POD_IP": "198.18.0.7", "URL": "http://198.18.0.7:1"}
    assert plan.probe is not None and (plan.probe.port, plan.probe.period_s, plan.probe.timeout_s) == (9400, 2.0, 5)
    pod["spec"]["containers"][0]["command"] = ["python", "serve.py"]
    with pytest.raises(UnsupportedContainer, match="starts only `kvpilot"):
        plan_pod(pod)


@pytest.mark.skipif(shutil.which("/usr/sbin/nginx") is None, reason="nginx not installed (apt-get install nginx-light)")
def test_nginx_accepts_the_render_without_any_listener(tmp_path: Path) -> None:
    """The metrics log names $kvp_target, which only a server defines: no Gateway, no metrics log."""
    text = render([], {}, tmp_path, run_as_root=False)
    assert "kvp_metrics" not in text
    (tmp_path / "nginx.conf").write_text(text)
    (tmp_path / "tmp" / "body").mkdir(parents=True)
    result = subprocess.run(["/usr/sbin/nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + text


def _answer_conf(prefix: Path, port: int, body: str) -> str:
    return (f"worker_processes 1; pid {prefix / 'nginx.pid'}; error_log {prefix / 'error.log'} warn;\n"
            "events { worker_connections 64; }\n"
            f"http {{ access_log off; client_body_temp_path {prefix / 'tmp' / 'body'};\n"
            f"  proxy_temp_path {prefix / 'tmp' / 'proxy'}; keepalive_timeout 0;\n"
            f"  server {{ listen 127.0.0.1:{port}; location / {{ return 200 '{body}'; }} }} }}\n")


@pytest.mark.skipif(shutil.which("/usr/sbin/nginx") is None, reason="nginx not installed (apt-get install nginx-light)")
def test_a_reload_has_taken_effect_when_apply_returns(tmp_path: Path) -> None:
    """The controller writes route status right after apply(): every connection from then on must
    meet the new configuration, not an old worker that has not yet closed its listening socket."""
    import urllib.request

    from kvpilot.cluster.gateway.nginx_process import NginxProcess, children
    from kvpilot.cluster.processes import free_ports

    (port,) = free_ports(1)
    nginx = NginxProcess(tmp_path)
    try:
        nginx.apply(_answer_conf(tmp_path, port, "v0"))
        for i in range(1, 6):
            nginx.apply(_answer_conf(tmp_path, port, f"v{i}"))
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
                assert resp.read().decode() == f"v{i}", f"reload {i}: an old worker answered"
        assert nginx.reloads == 5
        assert nginx.pid is not None and children(nginx.pid)
    finally:
        nginx.stop()
