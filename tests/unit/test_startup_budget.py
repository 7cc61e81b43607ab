"""progressDeadlineSeconds covers the engine's whole start, so a slow load is not reported Degraded."""

from __future__ import annotations

import dataclasses

import pytest
from operator_fakes import service

from kvpilot.operator.builders import build_deployment
from kvpilot.operator.builders.startup_budget import WEIGHT_READ_BYTES_PER_S, progress_deadline_seconds
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec
from kvpilot.operator.status.deployment_state import DEGRADED_PHASE, PROGRESSING_PHASE, deployment_state

pytestmark = pytest.mark.unit


def _deployment(weights_bytes: int | None = None) -> dict:
    body = service()
    spec = ServiceSpec.from_dict(body["spec"], "ns")
    plan = preflight(spec, body["spec"]["model"]["config"])
    if weights_bytes is not None:
        plan = dataclasses.replace(plan, weights_bytes=weights_bytes)
    return build_deployment(body, spec, plan)


def _startup_probe_s(deployment: dict) -> int:
    engine = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    probe = engine["startupProbe"]
    return probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]


def test_the_deadline_covers_the_startup_probe() -> None:
    deployment = _deployment()
    deadline = deployment["spec"]["progressDeadlineSeconds"]
    # Kubernetes' default (600 s) would call a pod Degraded while its probe still allowed it 30 min.
    assert deadline > _startup_probe_s(deployment) >= 1800
    assert deadline % 60 == 0


def test_a_70b_checkpoint_gets_its_read_time() -> None:
    weights = 70 * 10**9 * 2 * 3  # bf16 70B x3: a size whose read alone outlasts the probe's 30 min
    deployment = _deployment(weights)
    assert weights / WEIGHT_READ_BYTES_PER_S > _startup_probe_s(deployment)
    assert deployment["spec"]["progressDeadlineSeconds"] >= weights / WEIGHT_READ_BYTES_PER_S + 600


def test_never_below_the_probe_budget() -> None:
    plan = preflight(ServiceSpec.from_dict(service()["spec"]), service()["spec"]["model"]["config"])
    for probe in (60, 1800, 7200):
        assert progress_deadline_seconds(plan, probe) >= probe + 600


def test_a_loading_pod_is_progressing_and_only_the_deadline_makes_it_degraded() -> None:
    deployment = _deployment()
    deployment["metadata"]["generation"] = 1
    deployment["status"] = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 0,
                            "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]}
    assert deployment_state(deployment).phase == PROGRESSING_PHASE
    deployment["status"]["conditions"][0].update(status="False", reason="ProgressDeadlineExceeded",
                                                 message='ReplicaSet "chat-stable-x" has timed out progressing.')
    assert deployment_state(deployment).phase == DEGRADED_PHASE
