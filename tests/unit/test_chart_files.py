"""The chart's copies of crds/ and dashboards/, its version, and examples/ against the planner."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

import kvpilot
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kvpilot"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def _files(folder: Path, pattern: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob(pattern))} if folder.is_dir() else {}


def test_chart_crds_are_the_repositorys_crds() -> None:
    repo, chart = _files(REPO / "crds", "*.yaml"), _files(CHART / "crds", "*.yaml")
    assert repo, "crds/ is empty"
    stale = sorted(n for n in repo.keys() | chart.keys() if repo.get(n) != chart.get(n))
    assert not stale, f"charts/kvpilot/crds differs from crds/ in {stale}: run `make chart-crds`"


def test_chart_dashboards_are_the_repositorys_dashboards() -> None:
    repo, chart = _files(REPO / "dashboards", "*.json"), _files(CHART / "dashboards", "*.json")
    stale = sorted(n for n in repo.keys() | chart.keys() if repo.get(n) != chart.get(n))
    assert not stale, f"charts/kvpilot/dashboards differs from dashboards/ in {stale}: run `make chart-dashboards`"


def test_chart_version_and_default_image_tag_follow_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version == kvpilot.__version__
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == ""  # the template falls back to appVersion


def _inference_services() -> list[Path]:
    return [p for p in EXAMPLES if yaml.safe_load(p.read_text())["kind"] == "InferenceService"]


def test_there_is_an_example_per_strategy() -> None:
    strategies = set()
    for path in _inference_services():
        s = yaml.safe_load(path.read_text())["spec"]["strategy"]
        strategies.add((s.get("attention", "native"), s.get("kvCacheDtype", "auto"), s.get("eviction", "none")))
    attentions = {a for a, _, _ in strategies}
    dtypes = {d for _, d, _ in strategies}
    assert {"native", "gqa", "mla", "linear"} <= attentions and {"bf16", "int8", "fp8"} <= dtypes
    assert any(e != "none" for _, _, e in strategies)
    assert any("kv_lora_rank" in yaml.safe_load(p.read_text())["spec"]["model"]["config"] for p in _inference_services())
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in EXAMPLES}
    assert "ConfigMap" in kinds


@pytest.mark.parametrize("path", _inference_services(), ids=lambda p: p.stem)
def test_example_plans_as_its_comment_says(path: Path) -> None:
    """Each example's header quotes the planner's figures; they must stay true."""
    body = yaml.safe_load(path.read_text())
    spec = ServiceSpec.from_dict(body["spec"])
    plan = preflight(spec, body["spec"]["model"]["config"])
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    if path.stem.startswith("oversized"):
        assert not plan.feasible
        assert re.search(r"weights [\d.]+ GiB \+ CUDA context", plan.reason) and plan.reason.split(";")[0] in header
    else:
        assert plan.feasible, plan.reason
        assert f"{plan.max_concurrency} concurrent" in header, (plan.max_concurrency, header)


def test_the_probe_set_example_parses_with_the_operators_reader() -> None:
    probes = pytest.importorskip("kvpilot.operator.analysis.probes", reason="the accuracy gate comes with the rollout")
    body = yaml.safe_load((REPO / "examples" / "probe-set.yaml").read_text())
    parsed = probes.parse_probes(body["data"][probes.DATA_KEY])
    assert len(parsed) == 8 and all(p.prompt and p.continuation for p in parsed)
