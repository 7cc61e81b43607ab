"""prometheus-adapter (sigs.k8s.io/prometheus-adapter) for the local cluster: External metrics for HPAs.

tools/prometheus-adapter/go.mod pins the release; `build()` compiles its `cmd/adapter` from the
published Go module into `${KVPILOT_CACHE_DIR:-~/.cache/kvpilot}/bin/prometheus-adapter-<version>/adapter`,
as kvpilot/cluster/build.py builds the control plane (the adapter prints no version, so the
version-keyed directory is the check). `MetricsAdapter` runs it against a Prometheus and
registers it with the API server as `external.metrics.k8s.io/v1beta1`, so the real HPA
controller in kube-controller-manager reads kvpilot's signals (autoscaling.hpa.adapter_rule()).

The aggregator reaches an extension API server through a Service's endpoints, and the API
refuses loopback endpoint addresses, so the adapter listens on a non-loopback address of this
machine (`host_address()`); the API server must run with the aggregation flags (local.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from kvpilot.cluster import build
from kvpilot.cluster.api import ApiClient, ApiError

MODULE = "sigs.k8s.io/prometheus-adapter"
TOOLS_SUBDIR = "prometheus-adapter"
PACKAGE = f"{MODULE}/cmd/adapter"
NAMESPACE = "kvpilot-metrics"
SERVICE = "prometheus-adapter"
GROUP_VERSION = ("external.metrics.k8s.io", "v1beta1")


def version(tools_dir: Path = build.TOOLS_DIR) -> str:
    return build.module_version((tools_dir / TOOLS_SUBDIR / "go.mod").read_text(), MODULE)


def binary_path(tools_dir: Path = build.TOOLS_DIR) -> Path:
    return build.cache_dir() / "bin" / f"prometheus-adapter-{version(tools_dir)}" / "adapter"


def build_adapter(tools_dir: Path = build.TOOLS_DIR) -> Path:
    """The adapter binary, compiled from the pinned module when it is not cached yet."""
    final = binary_path(tools_dir)
    if os.access(final, os.X_OK):
        return final
    if shutil.which("go", path=build.go_env()["PATH"]) is None:
        raise RuntimeError("`go` not found on PATH or in /usr/local/go/bin; install Go >= 1.26")
    staging = final.parent.with_name(f"{final.parent.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cmd = ["nice", "-n", "10", "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "adapter"), PACKAGE]
    result = subprocess.run(cmd, cwd=tools_dir / TOOLS_SUBDIR, env=build.go_env())
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"building prometheus-adapter failed (exit {result.returncode}): "
                           f"cd {tools_dir / TOOLS_SUBDIR} && {' '.join(cmd)}")
    shutil.rmtree(final.parent, ignore_errors=True)
    staging.rename(final.parent)
    return final


def host_address() -> str:
    """A non-loopback IPv4 address of this machine (the route to a public address leaves through it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.254", 9))  # no packet is sent: connect() on UDP only picks the route
        address = sock.getsockname()[0]
    if address.startswith("127."):
        raise RuntimeError("this machine has no non-loopback IPv4 address for the aggregator to reach the adapter")
    return address


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class MetricsAdapter:
    """One adapter process and its registration; `stop()` removes both."""

    def __init__(self, kubeconfig: Path, prometheus_url: str, rules: list[dict[str, Any]], workdir: Path,
                 relist_s: int = 2) -> None:
        self.kubeconfig, self.prometheus_url, self.rules = kubeconfig, prometheus_url, rules
        self.workdir, self.relist_s = Path(workdir), relist_s
        self.host = host_address()
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "adapter.log"

    def start(self, api: ApiClient, timeout_s: float = 90.0) -> MetricsAdapter:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "adapter.yaml"
        config.write_text(yaml.safe_dump({"externalRules": self.rules}))
        self.port = _free_port(self.host)
        kubeconfig = str(self.kubeconfig)
        argv = [str(build_adapter()), f"--lister-kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", f"--prometheus-url={self.prometheus_url}",
                f"--config={config}", f"--metrics-relist-interval={self.relist_s}s",
                f"--bind-address={self.host}", f"--secure-port={self.port}", f"--cert-dir={self.workdir / 'certs'}",
                "--v=2"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._register(api)
        deadline = time.monotonic() + timeout_s
        path = f"/apis/{GROUP_VERSION[0]}/{GROUP_VERSION[1]}"
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus-adapter exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                api.request("GET", path)
                return self
            except ApiError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} not served within {timeout_s:.0f} s:\n{self.log_tail()}") from None
                time.sleep(0.5)

    def _register(self, api: ApiClient) -> None:
        group, ver = GROUP_VERSION
        objects = [
            ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
            (f"/api/v1/namespaces/{NAMESPACE}/services",
             {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
              "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.port}]}}),
            (f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
             {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": SERVICE}},
              "addressType": "IPv4", "endpoints": [{"addresses": [self.host], "conditions": {"ready": True}}],
              "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]}),
            ("/apis/apiregistration.k8s.io/v1/apiservices",
             {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": f"{ver}.{group}"},
              "spec": {"group": group, "version": ver, "service": {"namespace": NAMESPACE, "name": SERVICE, "port": 443},
                       "insecureSkipTLSVerify": True, "groupPriorityMinimum": 100, "versionPriority": 100}}),
        ]
        for collection, body in objects:
            name = body["metadata"]["name"]
            api.request("PATCH", f"{collection}/{name}?fieldManager=kvpilot-tests&force=true", body,
                        content_type="application/apply-patch+yaml")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, api: ApiClient | None = None) -> None:
        if api is not None:
            group, ver = GROUP_VERSION
            for path in (f"/apis/apiregistration.k8s.io/v1/apiservices/{ver}.{group}", f"/api/v1/namespaces/{NAMESPACE}"):
                with contextlib.suppress(ApiError):
                    api.request("DELETE", path)
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
