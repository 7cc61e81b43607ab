"""The CRD as a contract: names, enums, defaults and the fields the operator reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvpilot.operator import constants as c
from kvpilot.operator.spec import MLA_ROPE_PAIRS, CalibrationRef, ServiceSpec, StrategySpec
from kvpilot.planner.dtypes import KV_CACHE_DTYPES
from kvpilot.planner.strategy import ATTENTIONS

pytestmark = pytest.mark.unit
CRD = Path(__file__).parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml"


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load(CRD.read_text())


def schema(crd: dict) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_names_and_version(crd: dict) -> None:
    assert crd["metadata"]["name"] == f"{c.PLURAL}.{c.GROUP}"
    assert crd["spec"]["names"]["kind"] == c.KIND
    assert "isvc" not in crd["spec"]["names"]["shortNames"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == c.VERSION and version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
    assert [col["name"] for col in version["additionalPrinterColumns"]] == [
        "Phase", "Strategy", "Rollout", "Step", "Canary %", "Canary", "Ready", "Blocked", "Age"]


def test_enums_match_the_planner(crd: dict) -> None:
    strategy = schema(crd)["properties"]["spec"]["properties"]["strategy"]["properties"]
    assert tuple(strategy["attention"]["enum"]) == ATTENTIONS
    assert tuple(strategy["kvCacheDtype"]["enum"]) == KV_CACHE_DTYPES
    assert strategy["eviction"]["enum"] == ["none", "sinks", "ladder"]


def test_every_strategy_field_maps_to_the_operator(crd: dict) -> None:
    strategy = schema(crd)["properties"]["spec"]["properties"]["strategy"]["properties"]
    scalars = [k for k, v in strategy.items() if v["type"] != "object"]
    parsed = ServiceSpec.from_dict({"model": {"uri": "/m"}, "strategy": {k: 1 for k in scalars}}).strategy
    objects = {k for k, v in strategy.items() if v["type"] == "object"}
    assert objects == {"calibration"}
    for field in StrategySpec.__dataclass_fields__:
        if field != "calibration":
            assert getattr(parsed, field) == 1, field
    calibration = strategy["calibration"]["properties"]
    ref = ServiceSpec.from_dict({"model": {"uri": "/m"}, "strategy": {
        "calibration": {"configMap": "text", "key": "k.txt", "tokens": 512}}}).strategy.calibration
    assert ref == CalibrationRef(config_map="text", key="k.txt", tokens=512)
    assert set(calibration) == {"configMap", "key", "tokens"}


def test_calibration_defaults_agree_with_the_operator(crd: dict) -> None:
    for path in (("strategy",), ("canary", "strategy")):
        node = schema(crd)["properties"]["spec"]
        for part in path:
            node = node["properties"][part]
        calibration = node["properties"]["calibration"]
        assert calibration["required"] == ["configMap"]
        assert calibration["properties"]["key"]["default"] == CalibrationRef.key
        assert calibration["properties"]["tokens"]["default"] == CalibrationRef.tokens
        assert tuple(node["properties"]["mlaRopePairs"]["enum"]) == MLA_ROPE_PAIRS
    parsed = ServiceSpec.from_dict({"model": {"uri": "/m"}, "strategy": {"calibration": {"configMap": "c"}}})
    assert parsed.strategy.calibration == CalibrationRef("c", "calibration.txt", 2048)


def test_mla_rope_pairs_has_no_default_in_the_crd(crd: dict) -> None:
    """A default would enter every stored strategy and change the digest a promotion is keyed to."""
    strategy = schema(crd)["properties"]["spec"]["properties"]["strategy"]["properties"]
    assert "default" not in strategy["mlaRopePairs"] and "default" not in strategy["mlaRopeDims"]
    assert "default" not in strategy["calibration"]
    assert StrategySpec().mla_rope_pairs == "auto"


def test_defaults_agree_with_the_operator(crd: dict) -> None:
    strategy = schema(crd)["properties"]["spec"]["properties"]["strategy"]["properties"]
    default = StrategySpec()
    assert strategy["attention"]["default"] == default.attention
    assert strategy["kvCacheDtype"]["default"] == default.kv_cache_dtype
    assert strategy["maxSeqLen"]["default"] == default.max_seq_len
    assert strategy["blockSize"]["default"] == default.block_size
    assert strategy["linearWindow"]["default"] == default.linear_window
    assert strategy["maxNumBatchedTokens"]["default"] == default.max_num_batched_tokens


def test_canary_strategy_has_no_defaults(crd: dict) -> None:
    canary = schema(crd)["properties"]["spec"]["properties"]["canary"]["properties"]["strategy"]["properties"]
    assert all("default" not in v for v in canary.values())


def test_autoscaling_schema_matches_the_operators_parser(crd: dict) -> None:
    from kvpilot.operator.autoscaling.spec import METRICS

    auto = schema(crd)["properties"]["spec"]["properties"]["autoscaling"]
    assert auto["required"] == ["maxReplicas"]
    assert tuple(auto["properties"]["metric"]["enum"]) == tuple(METRICS)
    assert auto["properties"]["denserStrategy"]["enum"] == ["off", "propose", "start"]  # strings, not YAML booleans
    rules = " ".join(r["rule"] for r in auto["x-kubernetes-validations"])
    assert "self.minReplicas <= self.maxReplicas" in rules and "self.target <= 1.0" in rules
