"""`kvpilot bench offline` and `kvpilot bench serve` on the tiny CPU model (smoke: counts, not timings)."""

from __future__ import annotations

import json
import math

import pytest

from kvpilot.cli import main
from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_bench_offline_generates_exactly_the_workload(tiny_model, capsys) -> None:
    code = main(["bench", "offline", "--model", str(tiny_model), "--num-requests", "6", "--input-len", "3:20",
                 "--output-len", "2:9", "--no-progress", "--max-num-seqs", "4"])  # fmt: skip
    record = last_json(capsys.readouterr().out)
    assert code == 0
    assert record["requests"] == 6 and record["max_num_seqs"] == 4 and record["cuda_graphs"] is False
    assert 6 * 2 <= record["output_tokens"] <= 6 * 9 and 6 * 3 <= record["input_tokens"] <= 6 * 20
    assert record["output_tok_s"] == pytest.approx(record["output_tokens"] / record["total_s"], rel=0.01)


def test_bench_offline_refuses_a_directory_without_a_model(tmp_path, capsys) -> None:
    assert main(["bench", "offline", "--model", str(tmp_path), "--no-progress"]) == 2
    assert "config.json is missing" in capsys.readouterr().err


def test_bench_serve_measures_every_request(server: ServerProcess, capsys) -> None:
    code = main(["bench", "serve", "--base-url", server.base_url, "--served-model", SERVED_MODEL,
                 "--request-rate", "50,inf", "--num-requests", "5", "--input-len", "4:30", "--output-len", "3:8",
                 "--vocab-size", "384", "--no-progress"])  # fmt: skip
    out = capsys.readouterr()
    record = last_json(out.out)
    assert code == 0
    assert [r["request_rate"] for r in record["rates"]] == [50.0, "inf"]
    for rate in record["rates"]:
        assert rate["completed"] == 5 and rate["failed"] == 0
        assert 5 * 3 <= rate["output_tok_s"] * rate["duration_s"] <= 5 * 8 + 0.5
        assert 0 < rate["ttft_ms"]["p50"] <= rate["latency_ms"]["p50"]
        assert rate["tpot_ms"]["p95"] > 0
        # the server merges deltas a busy client has not read yet, so a loaded machine may see one chunk each
        assert rate["completed"] <= rate["stream_chunks"] <= round(rate["output_tok_s"] * rate["duration_s"])
        gaps = rate["stream_chunks"] - rate["completed"]
        assert (rate["itl_ms"]["p50"] > 0) if gaps else math.isnan(rate["itl_ms"]["p50"])
    assert record["slo_rate"] in (None, 50.0, "inf")
    assert "none tested" not in out.out and "highest rate with P95 TPOT < 50 ms: " in out.out


def test_bench_serve_counts_refused_requests(server: ServerProcess, capsys) -> None:
    code = main(["bench", "serve", "--base-url", server.base_url, "--served-model", "no-such-model",
                 "--num-requests", "2", "--input-len", "4", "--output-len", "2", "--no-progress"])  # fmt: skip
    out = capsys.readouterr()
    record = last_json(out.out)
    assert code == 1 and record["rates"][0]["failed"] == 2 and record["slo_rate"] is None
    # one rate was tested (the default, inf): the last line says so and why it missed the bound
    assert "highest rate with P95 TPOT < 50 ms: none of the 1 tested (inf: 2 failed)" in out.out
    assert "HTTP 404" in record["rates"][0]["first_error"] or "HTTP 400" in record["rates"][0]["first_error"]
