"""The loop: read Gateways, HTTPRoutes, Services and EndpointSlices, render nginx, write status.

It polls (every `interval_s`, 0.25 s by default) instead of keeping watches open: the API server is
local, the reads are a handful of list calls, and a poll bounds the delay from an HTTPRoute patch
to the nginx reload by one interval.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvpilot.cluster.api import ApiClient, ApiError
from kvpilot.cluster.gateway import CONTROLLER_NAME, GATEWAY_CLASS, GROUP
from kvpilot.cluster.gateway import status as st
from kvpilot.cluster.gateway.metrics import BackendCounters
from kvpilot.cluster.gateway.nginx_conf import METRICS_LOG, backend_targets, render
from kvpilot.cluster.gateway.nginx_process import NginxProcess
from kvpilot.cluster.gateway.plan import Plan, build_plan, key

log = logging.getLogger("kvpilot.gateway")
GW_API = f"/apis/{GROUP}/v1"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GatewayController:
    """Serves every Gateway whose GatewayClass names `controller`, through one nginx."""

    def __init__(self, api: ApiClient, prefix: Path, controller: str = CONTROLLER_NAME,
                 interval_s: float = 0.25) -> None:
        self.api, self.prefix, self.controller, self.interval_s = api, prefix, controller, interval_s
        self.nginx = NginxProcess(prefix)
        self.counters = BackendCounters(prefix / METRICS_LOG, reopen=self.nginx.reopen_logs)
        self.addresses: dict[str, str] = {}
        self.rendered: str | None = None
        self._warned: set[str] = set()
        self._class_ready = False

    def ensure_class(self) -> None:
        """Create the GatewayClass `kvpilot-local` (if the Gateway API CRDs are installed) and accept it."""
        if self._class_ready:
            return
        try:
            if not self.api.exists(f"{GW_API}/gatewayclasses/{GATEWAY_CLASS}"):
                self.api.request("POST", f"{GW_API}/gatewayclasses", {
                    "apiVersion": f"{GROUP}/v1", "kind": "GatewayClass", "metadata": {"name": GATEWAY_CLASS},
                    "spec": {"controllerName": self.controller, "description": "kvpilot local gateway (nginx)"}})
            self._class_ready = True
        except ApiError as exc:
            if exc.status != 404:
                raise
            if "class" not in self._warned:
                self._warned.add("class")
                log.warning("the Gateway API CRDs are not installed yet; waiting for them")

    def _list(self, path: str) -> list[dict[str, Any]]:
        try:
            return list(self.api.request("GET", path).get("items", []))
        except ApiError as exc:
            if exc.status == 404:
                if path not in self._warned:
                    self._warned.add(path)
                    log.warning("%s is not served (Gateway API CRDs not installed?); waiting", path)
                return []
            raise

    def snapshot(self) -> dict[str, Any]:
        routes = self._list(f"{GW_API}/httproutes")
        namespaces = {r["metadata"]["namespace"] for r in routes}
        services: dict[tuple[str, str], dict] = {}
        slices: dict[tuple[str, str], list[dict]] = {}
        for ns in sorted(namespaces):
            for svc in self._list(f"/api/v1/namespaces/{ns}/services"):
                services[(ns, svc["metadata"]["name"])] = svc
            for sl in self._list(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"):
                owner = sl["metadata"].get("labels", {}).get("kubernetes.io/service-name")
                if owner:
                    slices.setdefault((ns, owner), []).append(sl)
        return {
            "classes": self._list(f"{GW_API}/gatewayclasses"),
            "gateways": self._list(f"{GW_API}/gateways"),
            "routes": routes, "services": services, "slices": slices,
            "namespaces": {n["metadata"]["name"]: n["metadata"].get("labels", {})
                           for n in self._list("/api/v1/namespaces")},
        }

    def sync_once(self) -> Plan:
        snap = self.snapshot()
        plan = build_plan(classes=snap["classes"], gateways=snap["gateways"], routes=snap["routes"],
                          services=snap["services"], slices=snap["slices"], namespaces=snap["namespaces"],
                          previous_addresses=self.addresses, controller=self.controller)
        self.addresses = plan.addresses
        text = render(plan.listeners, plan.upstreams, self.prefix, run_as_root=os.geteuid() == 0)
        self.counters.set_targets(backend_targets(plan.listeners))
        self.counters.read()
        if text != self.rendered:
            error = self.nginx.check(text)
            if error:
                log.error("rendered nginx configuration is invalid, keeping the previous one: %s", error)
            else:
                self.nginx.apply(text)
                self.rendered = text
                log.info("nginx configuration applied (%d listener(s), reload %d)", len(plan.listeners),
                         self.nginx.reloads)
        self._write_status(snap, plan)
        return plan

    def _write_status(self, snap: dict[str, Any], plan: Plan) -> None:
        now = _now()
        for cls in snap["classes"]:
            if cls.get("spec", {}).get("controllerName") != self.controller:
                continue
            want = {"conditions": st.conditions(
                [st.Condition("Accepted", "True", "Accepted", "kvpilot local gateway (nginx)")],
                int(cls["metadata"].get("generation", 0)), (cls.get("status") or {}).get("conditions") or [], now)}
            self._patch_status(f"{GW_API}/gatewayclasses/{cls['metadata']['name']}", cls, want)
        for gw in snap["gateways"]:
            gkey = key(gw)
            if gkey not in plan.addresses:
                continue
            want = st.gateway_status(gw, plan.addresses[gkey], plan.gateway_conditions[gkey],
                                     plan.listener_status[gkey], now)
            ns, name = gkey.split("/", 1)
            self._patch_status(f"{GW_API}/namespaces/{ns}/gateways/{name}", gw, want)
        for route in snap["routes"]:
            parents = plan.route_parents.get(key(route), [])
            mine = [p for p in (route.get("status") or {}).get("parents") or []
                    if p.get("controllerName") == self.controller]
            if not parents and not mine:
                continue
            want = st.route_status(route, parents, self.controller, now)
            ns, name = key(route).split("/", 1)
            self._patch_status(f"{GW_API}/namespaces/{ns}/httproutes/{name}", route, want)

    def _patch_status(self, path: str, obj: dict[str, Any], want: dict[str, Any]) -> None:
        current = obj.get("status") or {}
        if st.same({k: current.get(k) for k in want}, want):
            return
        try:
            self.api.request("PATCH", f"{path}/status", {"status": want},
                             content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("status of %s not written: %s", path, exc)

    def run(self, should_stop: Callable[[], bool]) -> None:
        try:
            while not should_stop():
                began = time.monotonic()
                try:
                    self.ensure_class()
                    self.sync_once()
                except (ApiError, OSError) as exc:
                    log.warning("sync failed, retrying: %s", exc)
                time.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))
        finally:
            self.nginx.stop()
