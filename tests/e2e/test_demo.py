"""`kvpilot demo --quick`, the README's main job, end to end: a real control plane, pod runner,
gateway (nginx), Prometheus, operator and engines; it must print every stage, promote the int8
canary, let the accuracy gate roll back the mean-pooled GQA canary, switch all traffic back
within 5 s of `spec.rollback: true` with no failed request, and write a PNG + HTML report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot.cluster.local import LocalCluster
from kvpilot.demo.fleet import STAGES, preflight

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_quick_demo_rolls_out_rolls_back_and_reports(tmp_path: Path) -> None:
    why = preflight() or (", ".join(LocalCluster.missing_binaries()) or None)
    if why:
        pytest.skip(f"the fleet demo cannot run here: {why}")
    result = subprocess.run([sys.executable, "-m", "kvpilot.cli", "demo", "--quick", "--workdir", str(tmp_path)],
                            capture_output=True, text=True, timeout=1500, env={**os.environ, "COLUMNS": "200"})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    for k, title in enumerate(STAGES, 1):
        assert f"[{k}/{len(STAGES)}] {title}" in out, f"stage {k} ({title}) not printed:\n{out[-3000:]}"
    png = tmp_path / "report" / "report.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    assert 'src="report.png"' in (tmp_path / "report" / "report.html").read_text()
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    first, second, *_, third = summary["rollouts"]
    assert first["phase"] == "Promoted", first
    assert second["phase"] == "RolledBack" and ("fail", "AccuracyDeltaBreached") in map(tuple, second["verdicts"])
    assert third["phase"] == "RolledBack", third
    rollback = summary["manual_rollback"]
    assert rollback["failed_since_flag"] == 0 and rollback["requests_since_flag"] > 0
    assert rollback["last_canary_request_after_flag_s"] <= 5.0  # the measured bound
    # Outside the switch, a loaded 2-core machine has dropped a request or two in a thousand (not
    # yet explained; summary.json lists them): at most 1%, and each is shown when the bound fails.
    assert summary["load"]["failed"] <= 0.01 * summary["load"]["requests"], summary["failures"]
    assert "stopped everything the demo started" in out
