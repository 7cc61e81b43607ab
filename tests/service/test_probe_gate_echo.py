"""The accuracy gate on engines without /v1/score: probes scored by /v1/completions echo + logprobs.

Real engines: one random tiny Llama (4 KV heads), stable as is with its score route, a canary of
mean-pooled GQA (4 -> 2 KV heads) and a stable copy, both with `--no-score-route` (they answer
like an OpenAI-compatible server that has no /v1/score). The gate must reach the verdict the
/v1/score gate reaches (test_probe_gate.py): pooled GQA fails, an unchanged model passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from kvpilot.operator.analysis.probes import (
    ECHO,
    SCORE,
    Endpoint,
    ScoreRouteMissing,
    accuracy_from_scores,
    probes_from_configmap,
    score_both,
    score_track,
)
from kvpilot.operator.analysis.thresholds import Thresholds
from tests.harness.fleet import EngineSpec, Fleet

pytestmark = [pytest.mark.service, pytest.mark.slow]

PROBES = probes_from_configmap(yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "probe-set.yaml")
                                              .read_text()))
LIMIT = Thresholds().max_accuracy_delta


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory, tiny_mha_model: Path) -> Iterator[dict[str, Endpoint]]:
    workdir = tmp_path_factory.mktemp("echo-probes")
    with Fleet(tiny_mha_model, workdir / "fleet") as fleet:
        fleet.start([EngineSpec("team-a", "llm", "stable"),
                     EngineSpec("team-a", "same", "canary", ("--no-score-route",)),
                     EngineSpec("team-a", "gqa", "canary", ("--no-score-route", "--attention", "gqa",
                                                             "--kv-head-groups", "2"))])
        stable, same, gqa = (Endpoint(e.api_url, {}) for e in fleet.engines)
        yield {"stable": stable, "same": same, "gqa": gqa}


def test_the_score_route_is_off(engines: dict[str, Endpoint]) -> None:
    response = httpx.post(engines["gqa"].url + "/v1/score", json={"prompt": "a", "continuation": "b"}, timeout=30)
    assert response.status_code == 404
    with pytest.raises(ScoreRouteMissing):
        score_track(engines["gqa"], PROBES[:1], method=SCORE)


def test_echo_scores_what_the_score_route_scores(engines: dict[str, Endpoint]) -> None:
    by_score = score_track(engines["stable"], PROBES, method=SCORE)
    by_echo = score_track(engines["stable"], PROBES, method=ECHO)
    print(f"stable: /v1/score {by_score:.4f}, echo {by_echo:.4f} nats/token")
    assert -10 < by_echo < 0
    # One text vs two parts can tokenise the boundary differently; the figures stay close.
    assert by_echo == pytest.approx(by_score, abs=0.05)


def test_gate_without_score_route_fails_pooled_gqa_and_passes_the_same_model(engines: dict[str, Endpoint]) -> None:
    canary, stable = score_both(engines["gqa"], engines["stable"], PROBES)  # falls back to echo on both
    failed = accuracy_from_scores(canary, stable, LIMIT, len(PROBES))
    print(failed.message)
    assert failed.ok is False and stable - canary > LIMIT
    canary, stable = score_both(engines["same"], engines["stable"], PROBES)
    passed = accuracy_from_scores(canary, stable, LIMIT, len(PROBES))
    print(passed.message)
    assert passed.ok is True and abs(stable - canary) < 1e-6  # the same weights, scored the same way
