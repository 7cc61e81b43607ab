"""`kvpilot demo --engine-only` (the engine alone) runs end to end and reports real metrics."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.service


def test_demo_serves_and_reports_mission_metrics(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot.cli", "demo", "--engine-only", "--workdir", str(tmp_path),
         "--requests", "6", "--concurrency", "3", "--max-tokens", "6"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "6 succeeded, 0 failed" in out
    # The planner's table: MLA caches fewer bytes per token than native, so more requests fit.
    native = re.search(r"native bf16 .*?\s([\d,]+)\s*$", out, re.MULTILINE)
    mla = re.search(r"mla latent 512 .*?\s([\d,]+)\s*$", out, re.MULTILINE)
    assert native and mla and int(mla[1].replace(",", "")) > int(native[1].replace(",", ""))
    up = re.search(r"kvpilot_engine_up\s+(\d)", out)
    assert up and up[1] == "1"
    hit = re.search(r"prefix cache hit ratio \(tokens\)\s+([\d.]+)", out)
    assert hit and 0.0 < float(hit[1]) <= 1.0, out
    assert (tmp_path / "model" / "config.json").exists()
