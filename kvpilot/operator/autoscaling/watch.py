"""status.autoscaling: the HPAs' view, and under sustained KV pressure a denser strategy (denser.py).

Kopf-free (handlers/autoscaling.py runs it on a timer). With denserStrategy `start`, no rollout
running and a probe set named, the proposal becomes spec.canary: the rollout and its accuracy
gate take it from there, as for a canary a person wrote.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kvpilot.operator import constants as c
from kvpilot.operator.autoscaling.denser import propose, under_kv_pressure
from kvpilot.operator.autoscaling.hpa import API_VERSION, KIND, hpa_name
from kvpilot.operator.kube import Kube, object_path
from kvpilot.operator.reconcile.model_config import ModelConfigUnavailable, load_model_config
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.reconcile.tracks import stable_spec
from kvpilot.operator.status.writer import write_status
from kvpilot.planner import PlannerError

Emit = Callable[[str, str, str], None]


def _hpa_view(hpa: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if hpa is None:
        return None
    status = hpa.get("status") or {}
    return {"name": hpa["metadata"]["name"], "currentReplicas": status.get("currentReplicas"),
            "desiredReplicas": status.get("desiredReplicas"), "maxReplicas": hpa["spec"].get("maxReplicas")}


def observe(kube: Kube, body: Mapping[str, Any], emit: Emit, now_s: float | None = None) -> dict[str, Any] | None:
    """Write status.autoscaling for one InferenceService; returns what was written (None: autoscaling off)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = stable_spec(body.get("spec") or {}, body.get("status"), namespace)
    scaling = spec.autoscaling
    if scaling is None:
        return None
    now_s = time.time() if now_s is None else now_s
    hpas = {track: kube.get(object_path(API_VERSION, KIND, namespace, hpa_name(name, track)))
            for track in ("stable", "canary")}
    out: dict[str, Any] = {"metric": scaling.metric, "tracks": {t: v for t, h in hpas.items() if (v := _hpa_view(h))}}
    pressure = under_kv_pressure(hpas["stable"], scaling.metric, scaling.max_replicas, now_s,
                                 scaling.scale_down_window_seconds)
    out["kvPressure"] = pressure
    if pressure and scaling.denser_strategy != "off":
        try:
            config = load_model_config(kube, namespace, spec.model)
            proposal = propose(spec, config, preflight(spec, config), scaling.max_replicas)
        except (ModelConfigUnavailable, PlannerError) as exc:
            out["proposal"] = {"message": f"no proposal: {exc}"}
        else:
            out["proposal"] = proposal.to_status() if proposal else {
                "message": "no denser strategy the planner finds raises the max concurrency per replica by 20 % "
                           "or more; more replicas (maxReplicas) are the remaining answer"}
            if proposal is not None and scaling.denser_strategy == "start":
                out["proposal"]["started"] = _start(kube, body, proposal.strategy, scaling.probe_set, emit)

    def update(_live: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        return {**old, "autoscaling": out}

    result = write_status(kube, namespace, name, update)
    if result is not None:
        before = ((result[0].get("autoscaling") or {}).get("proposal") or {}).get("strategy")
        after = (out.get("proposal") or {}).get("strategy")
        if after and after != before:
            emit("Normal", "DenserStrategyProposed", out["proposal"]["message"])
    return out


def _start(kube: Kube, body: Mapping[str, Any], strategy: Mapping[str, Any], probe_set: str, emit: Emit) -> str:
    """Start the proposal as spec.canary; a string saying what happened (status.autoscaling.proposal.started)."""
    spec = body.get("spec") or {}
    if spec.get("canary"):
        if dict(spec["canary"].get("strategy") or {}) == dict(strategy):  # started by an earlier tick (or a person)
            phase = ((body.get("status") or {}).get("canary") or {}).get("phase") or "starting"
            return f"yes: spec.canary runs it (rollout {phase})"
        return "no: a rollout of another strategy (spec.canary) is already there"
    if not probe_set:
        return "no: spec.autoscaling.probeSet is empty, and a denser strategy is only started with an accuracy gate"
    meta = body["metadata"]
    canary = {"strategy": dict(strategy), "analysis": {"probeSet": probe_set}}
    kube.merge_patch(object_path(c.API_VERSION, c.KIND, meta["namespace"], meta["name"]), {"spec": {"canary": canary}})
    emit("Normal", "DenserStrategyStarted", f"started a canary of {dict(strategy)} judged by probe set {probe_set}")
    return "yes: spec.canary written"
