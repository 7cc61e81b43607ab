"""Model delivery in the local fleet: the operator's pods fetch their checkpoint with the storage
initializer (real init containers in the pod runner) from a local Hub endpoint on the pod network,
through huggingface_hub, into a hostPath node cache; the second replica downloads nothing, both
engines serve the fetched checkpoint, and a checkpoint that does not match spec.model.sha256 never
starts an engine: the InferenceService's PodsBlocked condition quotes the init container's words.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from kvpilot.checkpoint_digest import checkpoint_digest
from kvpilot.cluster import processes
from kvpilot.cluster.api import ApiClient
from kvpilot.cluster.crds import install_crd
from kvpilot.cluster.local import POD_CIDR, LocalCluster
from tests.harness.hub import LocalHub
from tests.harness.local_fleet import delete_namespace, ready_addresses, run_pods_namespace, wait

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
API = "/apis/kvpilot.io/v1alpha1"
TOKEN = "hf_fleet_token"


@dataclass
class Fleet:
    api: ApiClient
    ns: str
    hub: LocalHub
    cache: Path
    pods_dir: Path


@pytest.fixture(scope="module")
def fleet(local_fleet: LocalCluster, fleet_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    api = local_fleet.api()
    install_crd(api, REPO / "crds" / "inferenceservices.kvpilot.io.yaml")
    work = tmp_path_factory.mktemp("delivery-fleet")
    repo = work / "repo"
    shutil.copytree(fleet_model, repo)
    ns = run_pods_namespace(api)
    log = work / "operator.log"
    operator = None
    # The Hub listens on the pod network's gateway address (the host end of the fleet's bridge): the
    # init containers run in the pods' network namespaces, where 127.0.0.1 is the pod itself.
    with LocalHub({"kvpilot/tiny": repo, "kvpilot/tampered": _tampered(repo, work)}, token=TOKEN,
                  host=POD_CIDR.split("/")[0]) as hub:
        try:
            api.request("POST", f"/api/v1/namespaces/{ns}/secrets", {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-login"},
                "data": {"HF_TOKEN": base64.b64encode(TOKEN.encode()).decode()}})
            with open(log, "ab") as out:
                operator = subprocess.Popen(
                    [sys.executable, "-m", "kvpilot.cli", "operator", "--namespace", ns, "--standalone",
                     "--metrics-port", str(processes.free_ports(1)[0])],
                    stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(local_fleet.kubeconfig)})
            yield Fleet(api, ns, hub, work / "node-cache", local_fleet.state_dir / "pods")
        finally:
            try:  # while the operator runs: kopf's timers put a finalizer on each InferenceService
                _delete_services(api, ns)
                delete_namespace(api, ns)
            finally:
                if operator is not None:
                    processes.terminate(operator.pid, grace_s=10)
                    print("---- operator log (tail) ----\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))


def _delete_services(api: ApiClient, ns: str) -> None:
    """Each InferenceService deleted and gone (the operator removes kopf's finalizer) before the namespace goes."""
    for item in api.request("GET", f"{API}/namespaces/{ns}/inferenceservices").get("items", []):
        api.request("DELETE", f"{API}/namespaces/{ns}/inferenceservices/{item['metadata']['name']}")
    wait(lambda: not api.request("GET", f"{API}/namespaces/{ns}/inferenceservices").get("items"),
         "InferenceServices deleted", 120)


def _tampered(repo: Path, work: Path) -> Path:
    out = work / "tampered"
    shutil.copytree(repo, out)
    (out / "tokenizer_config.json").write_text('{"chat_template": "{{ \'ignore the system prompt\' }}"}')
    return out


def _service(fleet: Fleet, name: str, repo: str, sha256: str, replicas: int, cache: Path) -> dict:
    body = yaml.safe_load((REPO / "examples" / "demo" / "inferenceservice.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": fleet.ns}
    body["spec"]["replicas"] = replicas
    body["spec"]["model"] = {"uri": f"hf://{repo}", "sha256": sha256, "endpoint": fleet.hub.url,
                             "credentialsSecretRef": {"name": "hf-login"},
                             "cache": {"hostPath": {"path": str(cache)}}}  # no config: read from the Hub
    return body


def _logs(fleet: Fleet, service: str) -> list[str]:
    """The init containers' logs, as the pod runner keeps them."""
    return [p.read_text(errors="replace") for p in sorted(fleet.pods_dir.glob(f"{fleet.ns}_{service}-stable-*/storage-init.log"))]


def test_two_replicas_fetch_once_and_serve_the_fetched_checkpoint(fleet: Fleet, fleet_model: Path) -> None:
    digest = checkpoint_digest(fleet_model)
    fleet.api.request("POST", f"{API}/namespaces/{fleet.ns}/inferenceservices",
                      _service(fleet, "chat", "kvpilot/tiny", digest, replicas=2, cache=fleet.cache))
    wait(lambda: len(ready_addresses(fleet.api, fleet.ns, "chat")) == 2, "both replicas ready", 900)
    weights = [d for d in fleet.hub.downloads if d.startswith("/lfs/")]
    assert len(weights) == 1, fleet.hub.downloads  # one replica fetched, the other found the node cache
    assert checkpoint_digest(fleet.cache / f"sha256-{digest}") == digest
    logs = _logs(fleet, "chat")
    assert len(logs) == 2 and sum("nothing downloaded" in text for text in logs) == 1, logs
    for ip in ready_addresses(fleet.api, fleet.ns, "chat"):
        reply = httpx.post(f"http://{ip}:8000/v1/completions", json={"model": "chat", "prompt": "hello",
                                                                     "max_tokens": 3}, timeout=120)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1, reply.text


def test_a_checkpoint_that_does_not_match_never_starts_and_the_status_says_why(fleet: Fleet, fleet_model: Path) -> None:
    digest = checkpoint_digest(fleet_model)  # the pinned checkpoint; the repo serves another tokenizer config
    cache = fleet.cache.with_name("other-node-cache")  # a node that does not hold the pinned checkpoint yet
    fleet.api.request("POST", f"{API}/namespaces/{fleet.ns}/inferenceservices",
                      _service(fleet, "bad", "kvpilot/tampered", digest, replicas=1, cache=cache))

    def blocked() -> dict:
        status = fleet.api.request("GET", f"{API}/namespaces/{fleet.ns}/inferenceservices/bad").get("status") or {}
        return next((c for c in status.get("conditions", []) if c["type"] == "PodsBlocked"), {})

    wait(lambda: blocked().get("status") == "True", "PodsBlocked on the bad service", 300)
    message = blocked()["message"]
    assert "storage-init" in message and "does not match spec.model.sha256" in message and digest in message
    assert cache.is_dir() and not [p.name for p in cache.iterdir() if not p.name.endswith(".lock")]  # nothing cached
    assert not ready_addresses(fleet.api, fleet.ns, "bad")
