"""spec.canary as typed values, the two tracks' configurations, and the canary's children."""

from __future__ import annotations

import json

import pytest

from kvpilot.operator.builders import (
    build_deployment,
    build_lineage_configmap,
    build_track_service,
    read_lineage,
)
from kvpilot.operator.builders.engine_args import engine_args
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.reconcile.tracks import canary_spec, make_override, stable_spec
from kvpilot.operator.spec import CanarySpec, ServiceSpec, canary_hash, parse_duration
from tests.unit.operator_fakes import LLAMA3_8B, SHA, service

pytestmark = pytest.mark.unit
CANARY = {"strategy": {"kvCacheDtype": "int8"}, "steps": [1, 5, 100], "interval": "2s",
          "analysis": {"failureLimit": 3, "maxTtftP95Ratio": 1.5}}


def test_canary_spec_parses_steps_interval_gateway_and_failure_limit() -> None:
    spec = ServiceSpec.from_dict({**service(canary={**CANARY, "gateway": {"name": "gw"}})["spec"]}, "ns")
    assert spec.canary is not None
    assert (spec.canary.steps, spec.canary.interval_s, spec.canary.failure_limit) == ((1, 5, 100), 2.0, 3)
    assert (spec.canary.gateway.name, spec.canary.gateway.namespace) == ("gw", "ns")
    assert ServiceSpec.from_dict(service()["spec"]).canary is None


def test_pausing_is_not_a_new_canary_but_any_other_edit_is() -> None:
    assert canary_hash(CANARY) == canary_hash({**CANARY, "paused": True})
    assert canary_hash(CANARY) != canary_hash({**CANARY, "steps": [1, 100]})
    assert canary_hash(CANARY) != canary_hash({**CANARY, "strategy": {"kvCacheDtype": "fp8"}})


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2), ("5m", 300), ("1h30m", 5400), ("500ms", 0.5)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_steps_or_interval_are_reported_not_raised() -> None:
    assert "rise strictly" in CanarySpec.from_dict({"steps": [5, 1]}).error
    with pytest.raises(ValueError, match="digits with ms, s, m or h"):
        parse_duration("5 minutes")


def test_canary_track_is_stable_plus_overrides() -> None:
    body = service(canary=CANARY)
    canary = canary_spec(body["spec"], None)
    assert canary.strategy.kv_cache_dtype == "int8" and canary.strategy.attention == "gqa"
    assert canary.model.sha256 == SHA


def test_a_new_checkpoint_never_inherits_the_stable_digest() -> None:
    body = service(canary={"model": {"uri": "pvc://models/llama-3-8b-v2"}})
    canary = canary_spec(body["spec"], None)
    assert canary.model.uri == "pvc://models/llama-3-8b-v2" and canary.model.sha256 == ""
    assert canary.model.config == LLAMA3_8B  # same architecture: the stable config.json is kept
    digest = "cd" * 32
    body = service(canary={"model": {"uri": "pvc://models/v2", "sha256": digest}})
    spec = canary_spec(body["spec"], None)
    plan = preflight(spec, LLAMA3_8B)
    args = engine_args(spec, plan)
    assert args[args.index("--model-sha256") + 1] == digest


def test_both_tracks_serve_the_service_name_whatever_the_checkpoint_directory() -> None:
    """A canary with a new checkpoint (another directory) must answer the model name clients send
    to stable: without --served-model-name each engine served its directory's name, so the e2e
    tier's new-checkpoint canary answered 404 to every request naming the stable model."""
    body = service(canary={"model": {"uri": "pvc://models/llama-3-8b-v2"}})
    names = []
    for track, spec in (("stable", stable_spec(body["spec"], None)), ("canary", canary_spec(body["spec"], None))):
        dep = build_deployment(body, spec, preflight(spec, LLAMA3_8B), track=track)
        args = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")["args"]
        names.append(args[args.index("--served-model-name") + 1])
        assert args[args.index("--model") + 1].endswith("llama-3-8b-v2" if track == "canary" else "llama-3-8b")
    assert names == [body["metadata"]["name"]] * 2


def test_stable_follows_a_promotion_until_the_user_edits_model_or_strategy() -> None:
    body = service(canary=CANARY)
    canary = canary_spec(body["spec"], None)
    status = {"stable": {"override": make_override(body["spec"], canary.model_dict, canary.strategy_dict, "promotion")}}
    assert stable_spec(body["spec"], status).strategy.kv_cache_dtype == "int8"
    assert canary_spec(body["spec"], status).strategy.kv_cache_dtype == "int8"
    edited = {**body["spec"], "strategy": {**body["spec"]["strategy"], "kvCacheDtype": "fp8"}}
    assert stable_spec(edited, status).strategy.kv_cache_dtype == "fp8"


def test_canary_children_select_the_canary_track() -> None:
    body = service(canary=CANARY)
    spec = canary_spec(body["spec"], None)
    plan = preflight(spec, LLAMA3_8B)
    dep = build_deployment(body, spec, plan, track="canary")
    svc = build_track_service(body, "canary")
    assert dep["metadata"]["name"] == svc["metadata"]["name"] == "chat-canary"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"] == {
        "kvpilot.io/service": "chat", "kvpilot.io/track": "canary"}
    assert "int8" in dep["spec"]["template"]["metadata"]["labels"]["kvpilot.io/strategy"]


def test_lineage_records_both_tracks_and_what_a_rollback_restores() -> None:
    body = service(canary=CANARY)
    stable = stable_spec(body["spec"], None)
    canary = canary_spec(body["spec"], None)
    first = build_lineage_configmap(body, stable, preflight(stable, LLAMA3_8B), None)
    both = build_lineage_configmap(body, canary, preflight(canary, LLAMA3_8B), first, track="canary")
    lineage = read_lineage(both)
    assert json.loads(both["data"]["stable"]) == json.loads(first["data"]["stable"])
    assert lineage["canary"]["current"]["spec"]["strategy"]["kvCacheDtype"] == "int8"
    assert lineage["stable"]["current"]["sha256"] == SHA
    assert lineage["stable"]["current"]["spec"]["model"]["uri"] == body["spec"]["model"]["uri"]
    restamped = build_lineage_configmap(body, stable, preflight(stable, LLAMA3_8B), both)
    assert read_lineage(restamped)["canary"] == lineage["canary"]
