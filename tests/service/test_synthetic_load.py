"""Synthetic load on real engines: each tick sends the probe set's prompts to both tracks, counted by them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from kvpilot.operator.analysis.probes import StaticUrls
from kvpilot.operator.analysis.synthetic_load import during_step
from tests.harness.fleet import EngineSpec, Fleet
from tests.unit.operator_fakes import FakeKube, service

pytestmark = [pytest.mark.service, pytest.mark.slow]

PROBE_SET = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "probe-set.yaml").read_text())


def _finished(stats_port: int) -> int:
    return int(httpx.get(f"http://127.0.0.1:{stats_port}/stats", timeout=10).json()["requests"]["finished_total"])


def test_a_tick_sends_its_share_of_the_rate_to_each_track(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    made = subprocess.run([sys.executable, "-m", "kvpilot.cli", "make-model", str(model), "--family", "llama",
                           "--size", "tiny"], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    with Fleet(model, tmp_path / "fleet", served_model_name="chat") as fleet:
        stable, canary = fleet.start([EngineSpec("ns", "chat", "stable"), EngineSpec("ns", "chat", "canary")])
        kube = FakeKube()
        kube.add({**PROBE_SET, "metadata": {**PROBE_SET["metadata"], "namespace": "ns"}})
        body = service("chat", canary={"strategy": {"kvCacheDtype": "int8"}, "analysis": {
            "probeSet": "kvpilot-probes", "syntheticLoad": {"requestsPerMinute": 30, "maxTokens": 4}}})
        urls = StaticUrls({("ns", "chat", "stable"): stable.api_url, ("ns", "chat", "canary"): canary.api_url})
        before = {e.spec.track: _finished(e.stats_port) for e in (stable, canary)}
        sent = during_step(kube, body, urls, tick_s=10.0)
        assert sent == {"canary": [200] * 5, "stable": [200] * 5}
        after = {e.spec.track: _finished(e.stats_port) for e in (stable, canary)}
        assert {t: after[t] - before[t] for t in after} == {"stable": 5, "canary": 5}
        assert during_step(kube, service("chat"), urls, tick_s=10.0) == {}  # not configured: nothing sent
