"""The operator under test: `kvpilot operator` as a child process, kubectl, an InferenceService
manifest, and `operator_env`, the per-module namespace + operator every cluster test module shares."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.harness.cluster import k8s_api_client, unique_namespace, wait_for
from tests.helpers.model_configs import LLAMA3_8B

REPO = Path(__file__).resolve().parents[2]
KUBECTL = "/usr/bin/kubectl"


def manifest(name: str, namespace: str, config: dict = LLAMA3_8B, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": "file:///models/llama-3-8b", "sha256": "ab" * 32, "config": config},
            "strategy": {"attention": "gqa", "kvHeadGroups": 4, "kvCacheDtype": "bf16", "maxSeqLen": 8192},
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H200"},
            "replicas": 2,
            "engine": {"image": "kvpilot:test"},
        },
    }
    body["spec"].update(spec)
    return body


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([KUBECTL, f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                                capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def apply(self, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess:
        return self("apply", "-f", "-", stdin=yaml.safe_dump(obj), check=check)

    def install_crd(self) -> None:
        """The InferenceService CRD from crds/, applied and Established (idempotent)."""
        self("apply", "-f", str(REPO / "crds" / "inferenceservices.kvpilot.io.yaml"))
        # `kubectl wait` fails at once ("conditions accessor error") while a new CRD has no status yet
        wait_for(lambda: self("wait", "--for=condition=Established", "--timeout=60s",
                              "crd/inferenceservices.kvpilot.io", check=False).returncode == 0,
                 "the InferenceService CRD Established", 90)

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self("get", *args, "-o", "json").stdout)


class OperatorProcess:
    """`kvpilot operator` as a child process; its log is kept for assertions and failures."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        self.kubeconfig, self.namespace, self.log = kubeconfig, namespace, log
        self.proc: subprocess.Popen | None = None

    def command(self, liveness: str) -> list[str]:
        return [sys.executable, "-m", "kvpilot.cli", "operator", "--namespace", self.namespace, "--standalone",
                "--liveness", liveness]

    def start(self) -> None:
        port = _free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(self.command(f"http://127.0.0.1:{port}/healthz"),
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        wait_for(lambda: _http_ok(f"http://127.0.0.1:{port}/healthz") or self._died(), "operator liveness", 90)
        assert self.proc.poll() is None, self.text()[-3000:]

    def _died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL, as a node failure or an OOM kill ends the operator: no finalizer or handler runs."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def reconciled(self, name: str) -> int:
        return len(re.findall(rf"\[{self.namespace}/{name}\] reconciled:", self.text()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def operator_env(
    k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory, prefix: str, namespace_labels: dict[str, str] | None = None,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The CRD installed, a fresh namespace (labelled as asked) and an operator watching it; on exit
    the operator stops, its log tail is printed and the namespace is deleted, also on failure."""
    from kubernetes import client

    kubectl = Kubectl(k8s_cluster.kubeconfig)
    kubectl.install_crd()
    api_client = k8s_api_client(k8s_cluster)
    core = client.CoreV1Api(api_client)
    namespace = unique_namespace(core, prefix)
    try:
        if namespace_labels:
            core.patch_namespace(namespace, {"metadata": {"labels": namespace_labels}})
        operator = OperatorProcess(k8s_cluster.kubeconfig, namespace, tmp_path_factory.mktemp("operator") / "operator.log")
        operator.start()
        try:
            yield {"kubectl": kubectl, "ns": namespace, "core": core, "apps": client.AppsV1Api(api_client),
                   "custom": client.CustomObjectsApi(api_client), "operator": operator,
                   "nodes": k8s_cluster.node_names}  # fmt: skip
        finally:
            operator.stop()
            print("---- operator log (tail) ----\n" + operator.text()[-4000:])
    finally:
        core.delete_namespace(namespace)


def probe_configmap(namespace: str, stable_url: str, model: str = "tiny-llama") -> dict[str, Any]:
    """Prompts with the stable engine's own greedy continuations as references (what it is sure of)."""
    lines = []
    with httpx.Client(timeout=60, trust_env=False) as client:
        for prompt in ("The quick brown fox", "Once upon a time", "1 2 3 4 5", "In the beginning", "Hello world"):
            out = client.post(f"{stable_url}/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}).json()
            lines.append(json.dumps({"prompt": prompt, "continuation": out["choices"][0]["text"]}))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probes", "namespace": namespace},
            "data": {"probes.jsonl": "\n".join(lines) + "\n"}}

