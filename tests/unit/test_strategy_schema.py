"""kvpilot/strategy_schema.py is the one strategy vocabulary: the CRD, `kvpilot serve`, the planner and the
operator agree with it, the copies it replaced stay gone, and it needs nothing beyond the standard library."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import kvpilot.strategy_schema as schema
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.server.cli import add_arguments
from kvpilot.operator.builders.engine_args import strategy_flags
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ModelRef, ServiceSpec, StrategySpec
from kvpilot.planner import KVStrategy
from kvpilot.planner.dtypes import kv_dtype_bytes, weight_dtype_bytes
from tests.helpers.model_configs import LLAMA3_8B

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
CRD_TYPES = {int: "integer", float: "number", str: "string", dict: "object"}


@pytest.fixture(scope="module")
def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservices.kvpilot.io.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


@pytest.fixture(scope="module")
def serve() -> dict[str, argparse.Action]:
    """`kvpilot serve`'s flags: option string -> argparse action (the parser the CLI builds)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {option: action for action in parser._actions for option in action.option_strings}


def _strategy_nodes(spec_schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"spec.strategy": spec_schema["strategy"]["properties"],
            "spec.canary.strategy": spec_schema["canary"]["properties"]["strategy"]["properties"]}


def _check_field(node: dict[str, Any], field: schema.StrategyField, where: str) -> None:
    assert node["type"] == CRD_TYPES[field.type], where
    assert node.get("enum") == (None if field.choices is None else list(field.choices)), where
    assert node.get("minimum") == field.minimum and node.get("maximum") == field.maximum, where


def test_every_crd_strategy_field_is_the_schemas(spec_schema: dict[str, Any]) -> None:
    for where, properties in _strategy_nodes(spec_schema).items():
        assert set(properties) == set(schema.CRD_KEYS), where
        for field in schema.STRATEGY_FIELDS:
            _check_field(properties[field.crd], field, f"{where}.{field.crd}")
        calibration = properties["calibration"]
        assert set(calibration["properties"]) == {f.crd for f in schema.CALIBRATION_FIELDS}
        for field in schema.CALIBRATION_FIELDS:
            node = calibration["properties"][field.crd]
            assert node["type"] == CRD_TYPES[field.type], field.crd
            assert node.get("minimum") == field.minimum and node.get("maximum") == field.maximum, field.crd
            assert node.get("default") == field.default, f"{where}.calibration.{field.crd}"


def test_crd_defaults_are_the_schemas_and_the_canary_has_none(spec_schema: dict[str, Any]) -> None:
    stable, canary = _strategy_nodes(spec_schema).values()
    for field in schema.STRATEGY_FIELDS:
        written = field.default if field.crd_default else None
        assert stable[field.crd].get("default") == written, field.crd
        assert "default" not in canary[field.crd], field.crd
    assert "default" not in stable["mlaRopePairs"]  # the promotion digest (operator/spec.py) depends on it


def test_crd_rules_and_rollback_switches_use_the_schemas_names(spec_schema: dict[str, Any]) -> None:
    rules = [r["rule"] for r in spec_schema["strategy"]["x-kubernetes-validations"]]
    names = ", ".join(f"'{a}'" for a in schema.CALIBRATED_ATTENTIONS)
    assert any(f"self.attention in [{names}]" in r for r in rules), rules
    pairs = ", ".join(f"'{p}'" for p in schema.CALIBRATED_ROPE_PAIRS)
    assert any(f"self.mlaRopePairs in [{pairs}]" in r for r in rules), rules
    assert spec_schema["engine"]["properties"]["disable"]["items"]["enum"] == list(schema.ROLLBACK_SWITCHES)


def test_every_flag_exists_in_kvpilot_serve_and_sets_its_engine_config_field(
    serve: dict[str, argparse.Action],
) -> None:
    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    fields = [f for f in (*schema.STRATEGY_FIELDS, *schema.CALIBRATION_FIELDS) if f.flag is not None]
    assert {f.name for f in schema.STRATEGY_FIELDS} <= {f.name for f in fields}  # every strategy field is a flag
    for field in fields:
        assert field.flag in serve, f"{field.name}: kvpilot serve has no {field.flag}"
        assert serve[field.flag].dest == field.engine_field and field.engine_field in engine_fields, field.name
        engine_choices = serve[field.flag].choices
        if field.choices is not None and engine_choices is not None:
            values = [schema.spec_kv_dtype_flag(c) if field.name == "kv_cache_dtype" else c for c in field.choices]
            assert set(values) <= set(engine_choices), field.name
    for switch in schema.ROLLBACK_SWITCHES:
        action = serve[schema.rollback_flag(switch)]
        assert action.dest == "disable_" + switch.replace("-", "_") and action.dest in engine_fields, switch


def test_a_flag_the_operator_leaves_out_defaults_to_the_schemas_value(serve: dict[str, argparse.Action]) -> None:
    passed = set(strategy_flags(StrategySpec()))
    omitted = [f for f in schema.STRATEGY_FIELDS if f.flag not in passed]
    assert {f.name for f in omitted} >= {"eviction", "kv_head_groups", "mla_rope_pairs", "kv_quant_auto_split"}
    for field in omitted:
        assert serve[field.flag].default == field.default, f"{field.flag}: engine {serve[field.flag].default!r}"
    assert serve[schema.flag("tokens")].default == schema.CALIBRATION["tokens"].default


def test_the_operators_flags_parse_into_the_engine_config_the_spec_asks_for() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for dtype in schema.SPEC_KV_CACHE_DTYPES:
        strategy = StrategySpec(attention="gqa", kv_head_groups=4, kv_cache_dtype=dtype, eviction="sinks",
                                max_seq_len=2048, block_size=32, fallback_reserve=0.2)
        args = parser.parse_args(["--model", "/m", *strategy_flags(strategy)])
        assert args.kv_cache_dtype == schema.canonical_kv_dtype(dtype), dtype  # bf16 -> bfloat16
        for field in schema.STRATEGY_FIELDS:
            if field.name not in ("kv_cache_dtype", "calibration"):
                assert getattr(args, field.engine_field) == getattr(strategy, field.name), field.name


def test_the_spec_and_the_planner_take_the_schemas_defaults() -> None:
    spec, planner = StrategySpec(), KVStrategy()
    for field in schema.STRATEGY_FIELDS:
        if field.name != "calibration":
            assert getattr(spec, field.name) == field.default, field.name
        if field.name in {f.name for f in dataclasses.fields(KVStrategy)}:
            assert getattr(planner, field.name) == field.default, field.name
    assert set(schema.FIELDS) == {f.name for f in dataclasses.fields(StrategySpec)}


def test_planner_engine_and_torch_agree_on_dtype_bytes() -> None:
    import torch

    from kvpilot.engine.worker.kv_cache import INT8_SCALE_BYTES, QUANT_DTYPES
    from kvpilot.engine.worker.memory import DTYPES

    engine = {**DTYPES, **QUANT_DTYPES}
    for d in schema.KV_DTYPES:
        if d.bytes is None:
            assert kv_dtype_bytes(d.short, 3) == 3  # auto: the model's own width
            continue
        assert torch.empty((), dtype=engine[d.name]).element_size() == d.bytes, d.name
        assert schema.kv_dtype(d.short).bytes == d.bytes and d.eight_bit == (d.bytes == 1), d.name
        if d.in_spec:
            assert kv_dtype_bytes(d.short, 0) == d.bytes, d.short
        assert weight_dtype_bytes(d.name) == d.bytes, d.name
    for name, size in schema.DTYPE_BYTES.items():
        if isinstance(getattr(torch, name, None), torch.dtype):
            assert torch.empty((), dtype=getattr(torch, name)).element_size() == size, name
    assert INT8_SCALE_BYTES == schema.KV_SCALE_BYTES == KVStrategy().scale_bytes


@pytest.mark.parametrize("dtype", schema.SPEC_KV_CACHE_DTYPES)
def test_the_operators_plan_and_the_engines_plan_count_the_same_kv_bytes(dtype: str, tmp_path: Path) -> None:
    from kvpilot.engine.server.runtime.capacity_plan import plan_for

    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    operator = preflight(ServiceSpec(model=ModelRef(uri="/m"), strategy=StrategySpec(kv_cache_dtype=dtype)),
                         LLAMA3_8B)
    config = EngineConfig(model=str(tmp_path), kv_cache_dtype=schema.spec_kv_dtype_flag(dtype), max_model_len=4096,
                          max_num_batched_tokens=8192, max_num_seqs=256, dtype="bfloat16")  # CUDA's auto (pods)
    engine = plan_for(config, "cpu", 200 * 2**30, 0.8)
    assert (engine.bytes_per_token, engine.block_bytes) == (operator.bytes_per_token, operator.block_bytes)
    assert (engine.reserve_bytes > 0) == (operator.reserve_bytes > 0) == (dtype in schema.EIGHT_BIT_KV_DTYPES)


def test_the_schema_imports_only_the_standard_library() -> None:
    tree = ast.parse((ROOT / "kvpilot" / "strategy_schema.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names} == set()
    code = ("import sys; import kvpilot.strategy_schema; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kvpilot', 'torch', 'yaml', 'kopf')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['kvpilot', 'kvpilot.strategy_schema']"


# The vocabularies whose copies were removed: a literal equal to one of them outside the schema is a new copy
VOCABULARIES = {
    "ATTENTIONS": set(schema.ATTENTIONS), "EVICTION_MODES": set(schema.EVICTION_MODES),
    "MLA_ROPE_PAIRS": set(schema.MLA_ROPE_PAIRS), "SPEC_KV_CACHE_DTYPES": set(schema.SPEC_KV_CACHE_DTYPES),
    "ENGINE_KV_CACHE_DTYPES": set(schema.ENGINE_KV_CACHE_DTYPES), "EIGHT_BIT_KV_DTYPES": set(schema.EIGHT_BIT_KV_DTYPES),
    "ROLLBACK_SWITCHES": set(schema.ROLLBACK_SWITCHES),
}
USERS = ["kvpilot/planner", "kvpilot/operator", "kvpilot/engine/config"]


def test_no_planner_operator_or_engine_config_module_keeps_its_own_copy() -> None:
    copies = []
    for path in sorted(p for d in USERS for p in (ROOT / d).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            keys = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if not isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict) or not keys:
                continue
            values = {k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            copies += [f"{path.relative_to(ROOT)}:{node.lineno} copies {name}"
                       for name, vocabulary in VOCABULARIES.items() if values == vocabulary and len(values) == len(keys)]
    assert copies == []
