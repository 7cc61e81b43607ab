"""Probe sets read from real ConfigMaps on the local control plane (scoring is in tests/service/test_probe_gate.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from kvpilot.operator.analysis.probes import ProbeSetError, accuracy_check, load_probe_set
from kvpilot.operator.analysis.thresholds import Thresholds
from tests.harness.gateway import kube_client

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "probe-set.yaml"


@pytest.fixture
def env(k8s_cluster):  # type: ignore[no-untyped-def]
    kube = kube_client(k8s_cluster)
    ns = f"probes-{uuid.uuid4().hex[:8]}"
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    try:
        yield kube, ns
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{ns}")
        kube.close()


def _create(kube, ns: str, body: dict) -> None:  # type: ignore[no-untyped-def]
    kube.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=body)


def test_documented_probe_set_loads_from_the_api_server(env) -> None:  # type: ignore[no-untyped-def]
    kube, ns = env
    _create(kube, ns, yaml.safe_load(EXAMPLE.read_text()))
    probes = load_probe_set(kube, ns, "kvpilot-probes")
    assert len(probes) == 8 and probes[0].prompt.startswith("def __init__")


def test_missing_or_malformed_probe_sets_are_clear_errors(env) -> None:  # type: ignore[no-untyped-def]
    kube, ns = env
    with pytest.raises(ProbeSetError, match=f"probe set ConfigMap {ns}/absent .* does not exist"):
        load_probe_set(kube, ns, "absent")
    _create(kube, ns, {"metadata": {"name": "wrong-key"}, "data": {"probes.txt": "hello"}})
    with pytest.raises(ProbeSetError, match=f"ConfigMap {ns}/wrong-key has no data key 'probes.jsonl'"):
        load_probe_set(kube, ns, "wrong-key")
    _create(kube, ns, {"metadata": {"name": "bad-json"}, "data": {"probes.jsonl": "{prompt: a}"}})
    with pytest.raises(ProbeSetError, match="line 1 is not JSON"):
        accuracy_check(kube, ns, "llm", Thresholds(probe_set="bad-json"), urls=None)  # type: ignore[arg-type]
