"""The accuracy gate on real engines: the documented probe set scored with POST /v1/score.

One random tiny Llama with 4 KV heads (so mean-pooling has heads to merge); stable serves it
as is, one canary with an int8 KV cache, one with mean-pooled GQA (4 -> 2 KV heads). Measured
here: int8 leaves the probes' log-likelihood unchanged (/v1/score runs the dense path, where
the KV dtype does not enter), pooled GQA lowers it by ~0.11 nats/token, over the default 0.05.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvpilot.operator.analysis.probes import (
    Endpoint,
    ScoringError,
    StaticUrls,
    accuracy_from_scores,
    probes_from_configmap,
    score_track,
)
from kvpilot.operator.analysis.thresholds import Thresholds
from tests.harness.fleet import EngineSpec, Fleet
from tests.harness.prometheus import free_port

pytestmark = [pytest.mark.service, pytest.mark.slow]

PROBES = probes_from_configmap(yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "probe-set.yaml")
                                              .read_text()))
LIMIT = Thresholds().max_accuracy_delta


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, tiny_mha_model: Path) -> Iterator[dict[str, str]]:
    workdir = tmp_path_factory.mktemp("probes")
    with Fleet(tiny_mha_model, workdir / "fleet") as fleet:
        fleet.start([EngineSpec("team-a", "llm", "stable"),
                     EngineSpec("team-a", "llm", "canary", ("--kv-cache-dtype", "int8")),
                     EngineSpec("team-a", "gqa", "canary", ("--attention", "gqa", "--kv-head-groups", "2"))])
        stable, int8, gqa = (e.api_url for e in fleet.engines)
        yield {"stable": stable, "int8": int8, "gqa": gqa}


def _score(url: str) -> float:
    return score_track(Endpoint(url, {}), PROBES)


def test_int8_canary_passes_the_gate(engines: dict[str, str]) -> None:
    stable, canary = _score(engines["stable"]), _score(engines["int8"])
    check = accuracy_from_scores(canary, stable, LIMIT, len(PROBES))
    print(check.message)
    assert -10 < stable < 0  # a real mean log-likelihood per token (vocab 384: uniform is -5.95)
    assert check.ok is True and abs(stable - canary) < 0.01


def test_mean_pooled_gqa_canary_fails_the_gate(engines: dict[str, str]) -> None:
    urls = StaticUrls({("team-a", "llm", "stable"): engines["stable"], ("team-a", "gqa", "canary"): engines["gqa"]})
    stable = score_track(urls.endpoint(None, "team-a", "llm", "stable"), PROBES)
    canary = score_track(urls.endpoint(None, "team-a", "gqa", "canary"), PROBES)
    check = accuracy_from_scores(canary, stable, LIMIT, len(PROBES))
    print(check.message)
    assert check.ok is False and stable - canary > LIMIT
    assert "delta" in check.message and "> 0.05" in check.message


def test_unreachable_track_is_a_scoring_error() -> None:
    with pytest.raises(ScoringError, match="could not score the probe set: ConnectError"):
        score_track(Endpoint(f"http://127.0.0.1:{free_port()}", {}), PROBES, timeout_s=2)


def test_probe_longer_than_the_context_is_reported(engines: dict[str, str]) -> None:
    long = probes_from_configmap({"metadata": {}, "data": {"probes.jsonl": '{"prompt": "%s", "continuation": "x"}'
                                                           % ("word " * 400)}})
    with pytest.raises(ScoringError, match=r"answered HTTP 400.*maximum context length"):
        score_track(Endpoint(engines["stable"], {}), long)
