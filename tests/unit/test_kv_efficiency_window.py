"""KV efficiency over an analysis window counts requests that no scrape caught running.

The root cause of the demo's inconclusive 'NoData' analyses: the window figure was built from the
live/allocated gauges at scrape instants, and a lightly loaded engine serving 60 ms requests is
idle at almost every 1 s scrape, so the window read 0/0 although it served enough requests
(measured on the demo's Prometheus: None in every 20 s window, both tracks, up to 105 requests).
The engine now integrates occupancy over time (token-slot-seconds counters) and the query divides
their increases.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.make_model import make_model
from kvpilot.engine.metrics.kv_time import KvOccupancyIntegral
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.operator.analysis.run import queries
from kvpilot.sidecar.feed import feed_readings
from tests.harness.prometheus import PROMTOOL_BINARY

pytestmark = pytest.mark.unit

NS, SVC, TRACK = "team-a", "llm", "canary"


def test_a_request_between_two_samples_is_counted_and_idle_time_is_not() -> None:
    kv = KvOccupancyIntegral(now=0.0)
    kv.idle(0.4)  # idle: nothing accrues
    kv.busy(0.5, lambda: (20, 32))  # a request's first step is measured, whatever the interval
    kv.busy(0.52, lambda: pytest.fail("measured again before the sample interval"))
    kv.busy(0.56, lambda: (30, 32))  # 60 ms after the first sample: due again
    kv.idle(0.6)
    assert kv.totals(0.6) == kv.totals(5.0) == pytest.approx((20 * 0.06 + 30 * 0.04, 32 * 0.1))


def test_totals_count_the_held_occupancy_up_to_now_without_changing_it() -> None:
    kv = KvOccupancyIntegral(now=10.0)
    kv.busy(10.0, lambda: (8, 16))
    assert kv.totals(10.5) == pytest.approx((4.0, 8.0))
    assert kv.totals(11.0) == pytest.approx((8.0, 16.0))
    assert (kv.live_total, kv.allocated_total) == (0.0, 0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    path = make_model(tmp_path_factory.mktemp("kv-window") / "tiny", "llama", "tiny")
    return LLMEngine(EngineConfig(model=str(path), device="cpu", block_size=4, num_kv_blocks=256,
                                  show_progress=False))


def _serve_one(engine: LLMEngine) -> None:
    engine.add_request("r1", list(range(1, 11)), SamplingParams(max_tokens=6, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


@pytest.fixture(scope="module")
def scrapes(engine: LLMEngine) -> tuple[dict[str, Any], dict[str, Any]]:
    """The feed an idle engine serves before and after one short request: what two scrapes see."""
    before = engine.stats()
    _serve_one(engine)
    return before, engine.stats()


def test_the_engine_counts_a_request_no_scrape_saw(scrapes: tuple[dict[str, Any], dict[str, Any]]) -> None:
    before, after = scrapes
    for feed in scrapes:  # what the old gauge-based figure saw: an idle engine both times
        assert feed["kv"]["live_token_slots"] == feed["kv"]["allocated_token_slots"] == 0
    live = after["kv"]["live_token_seconds_total"] - before["kv"]["live_token_seconds_total"]
    allocated = after["kv"]["allocated_token_seconds_total"] - before["kv"]["allocated_token_seconds_total"]
    assert 0 < live <= allocated
    assert after["requests"]["finished_total"] == before["requests"]["finished_total"] + 1


def _series(feed: dict[str, Any], names: set[str]) -> dict[str, float]:
    labels = f'namespace="{NS}",service="{SVC}",track="{TRACK}"'
    out = {}
    for name, samples in feed_readings(feed).samples.items():
        if name in names and () in samples:
            out[f"{name}{{{labels}}}"] = float(samples[()])  # type: ignore[arg-type]
    return out


def test_the_analysis_window_figure_has_data_when_every_scrape_was_idle(
        scrapes: tuple[dict[str, Any], dict[str, Any]], tmp_path: Path) -> None:
    """Prometheus' own evaluator (promtool) runs the analysis' query over 21 scrapes, 1 s apart, of
    that engine: idle at every scrape, the request served between the 10th and the 11th."""
    if not Path(PROMTOOL_BINARY).exists():
        pytest.skip(f"promtool not found at {PROMTOOL_BINARY} (Debian's prometheus package installs it)")
    query = queries(NS, SVC, TRACK, 20)["kv_cache_efficiency"]
    names = set(re.findall(r"kvpilot_[a-z_]+", query))
    before, after = (_series(feed, names) for feed in scrapes)
    assert before.keys() == after.keys() and before, f"the feed exports none of {sorted(names)}"
    input_series = [{"series": s, "values": " ".join([repr(before[s])] * 10 + [repr(after[s])] * 11)}
                    for s in before]
    kv_before, kv_after = scrapes[0]["kv"], scrapes[1]["kv"]
    expected = ((kv_after["live_token_seconds_total"] - kv_before["live_token_seconds_total"])
                / (kv_after["allocated_token_seconds_total"] - kv_before["allocated_token_seconds_total"]))
    test = {"evaluation_interval": "1s",
            "tests": [{"interval": "1s", "input_series": input_series,
                       "promql_expr_test": [{"expr": f"abs({query} - {expected!r}) < bool 1e-9", "eval_time": "20s",
                                             "exp_samples": [{"labels": "{}", "value": 1}]}]}]}
    path = tmp_path / "kv-window.test.yml"
    path.write_text(yaml.safe_dump(test))
    run = subprocess.run([PROMTOOL_BINARY, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"{query} over idle scrapes:\n{run.stdout}\n{run.stderr}"
