"""Test-only fault flags of `kvpilot serve` against a real server and a real sidecar: injected
latency shows in TTFT and TPOT, injected errors are 500s counted as failed requests."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpilot.checkpoint_digest import checkpoint_digest
from tests.service.conftest import DEFAULT_FLAGS, SERVED_MODEL, ServerProcess, free_port

pytestmark = pytest.mark.service

LATENCY_MS = 60
REQUESTS = 24
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def faulty(start_server: Callable[..., ServerProcess], tiny_model: Path) -> ServerProcess:
    # Pinned to its own digest: a matching --model-sha256 starts as usual.
    return start_server(
        *DEFAULT_FLAGS, "--fault-latency-ms", str(LATENCY_MS), "--fault-error-rate", "0.5", "--fault-seed", "3",
        "--model-sha256", checkpoint_digest(tiny_model),
    )  # fmt: skip


@pytest.fixture(scope="module")
def sidecar(faulty: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("sidecar") / "sidecar.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvpilot.cli", "sidecar", "--engine-url",
             f"http://127.0.0.1:{faulty.stats_port}", "--host", "127.0.0.1", "--port", str(port), "--no-gpu"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(300):
            try:
                if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"sidecar exited:\n{log.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _samples(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = httpx.get(url, timeout=10, trust_env=False).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_error_rate_answers_500_and_counts_failed_requests(faulty: ServerProcess, sidecar: str) -> None:
    before = faulty.stats()["requests"]
    statuses = []
    for i in range(REQUESTS):
        response = httpx.post(
            faulty.base_url + "/v1/completions",
            json={"model": SERVED_MODEL, "prompt": f"request {i}", "max_tokens": MAX_TOKENS, "ignore_eos": True},
            timeout=60,
        )
        statuses.append(response.status_code)
        if response.status_code == 500:
            error = response.json()["error"]
            assert error["code"] == "injected_fault" and "--fault-error-rate 0.5" in error["message"]
    failed = statuses.count(500)
    assert set(statuses) == {200, 500}, statuses
    assert 0 < failed < REQUESTS
    after = faulty.wait_stats(lambda s: s["requests"]["finished_total"] - before["finished_total"] == REQUESTS - failed)
    assert after["requests"]["failed_total"]["fault"] - before["failed_total"]["fault"] == failed
    assert after["requests"]["failed_total"]["engine_error"] == before["failed_total"]["engine_error"]
    exported = _samples(sidecar, "kvpilot_requests_failed_total")
    assert exported[(("reason", "fault"),)] == after["requests"]["failed_total"]["fault"]
    assert exported[(("reason", "internal"),)] == 0  # every documented reason has a series


def test_latency_fault_raises_ttft_and_tpot(faulty: ServerProcess) -> None:
    # The sleep happens before every engine step, so each token waits at least LATENCY_MS: a lower
    # bound that holds however busy the machine is.
    before = faulty.stats()["latency"]
    served = 0
    while served < 3:
        response = httpx.post(
            faulty.base_url + "/v1/completions",
            json={"model": SERVED_MODEL, "prompt": "slow", "max_tokens": MAX_TOKENS, "ignore_eos": True},
            timeout=60,
        )
        served += response.status_code == 200
    after = faulty.stats()["latency"]
    for key in ("ttft_seconds", "tpot_seconds"):
        count = after[key]["count"] - before[key]["count"]
        mean = (after[key]["sum"] - before[key]["sum"]) / count
        assert count >= 3 and mean >= LATENCY_MS / 1000, (key, count, mean)


def test_fault_flags_are_refused_out_of_range(tiny_model: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot.cli", "serve", "--model", str(tiny_model), "--fault-error-rate", "1.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--fault-error-rate must be a share between 0 and 1, got 1.5" in result.stderr
