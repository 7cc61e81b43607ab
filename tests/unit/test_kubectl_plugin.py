"""`kubectl kvpilot rollout ...`: the view shows steps, analyses with figures and the lineage; each
command writes exactly the patch the operator acts on."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from kvpilot.kubectl_plugin import PluginError, patch_for, render

pytestmark = pytest.mark.unit

OBJ = {
    "metadata": {"name": "chat", "namespace": "ns"},
    "spec": {"canary": {"steps": [1, 5, 100], "analysis": {"failureLimit": 3}}},
    "status": {
        "strategy": "gqa4-bf16", "ready": "2/2",
        "canary": {"phase": "Progressing", "specHash": "abc123", "step": 1, "weight": 5, "failures": 1,
                   "strategy": "gqa4-int8", "reason": "StepStarted", "message": "step 1: 5% of traffic",
                   "analyses": [{"step": 0, "weight": 1, "verdict": "fail", "reason": "ErrorRateHigh",
                                 "checks": [{"name": "error_rate", "canary": 0.25, "stable": 0.0,
                                             "threshold": 0.01, "ok": False}]}]},
    },
}
LINEAGE = {"data": {
    "stable": json.dumps({"current": {"strategy": "gqa4-bf16", "uri": "pvc://m/v1", "sha256": "ab" * 32},
                          "previous": None}),
    "canary": json.dumps({"current": {"strategy": "gqa4-int8", "uri": "pvc://m/v1", "sha256": "ab" * 32}}),
}}


def text_of(renderable: object) -> str:
    console = Console(record=True, width=160)
    console.print(renderable)
    return console.export_text()


def test_view_shows_the_step_the_analysis_figures_and_the_lineage() -> None:
    text = text_of(render(OBJ, LINEAGE))
    assert "1% -> [5%] -> 100%" in text and "now 5% to canary" in text
    assert "error_rate: 0.25 / 0, limit 0.01 FAIL" in text
    assert "1 of 3 allowed" in text
    assert "gqa4-int8" in text and "pvc://m/v1" in text and "abababababab..." in text


def test_promote_and_abort_name_the_running_rollout() -> None:
    assert patch_for("promote", OBJ) == {"metadata": {"annotations": {"kvpilot.io/promote": "abc123"}}}
    assert patch_for("abort", OBJ) == {"metadata": {"annotations": {"kvpilot.io/abort": "abc123"}}}
    done = {**OBJ, "status": {"canary": {"phase": "Promoted", "specHash": "abc123"}}}
    with pytest.raises(PluginError, match="no rollout in progress"):
        patch_for("promote", done)


def test_rollback_is_the_annotation_and_resume_unpauses() -> None:
    assert patch_for("rollback", OBJ) == {"metadata": {"annotations": {"kvpilot.io/rollback": "true"}}}
    assert patch_for("rollback", OBJ, clear=True) == {"metadata": {"annotations": {"kvpilot.io/rollback": None}}}
    assert patch_for("resume", OBJ) == {"spec": {"canary": {"paused": False}}}
    with pytest.raises(PluginError, match=r"no spec\.canary"):
        patch_for("resume", {"metadata": {"name": "x"}, "spec": {}})


def test_no_kubeconfig_is_a_clear_error_not_a_traceback(tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from kvpilot.kubectl_plugin import main

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert main(["rollout", "status", "svc", "-n", "default"]) == 1
    out = capsys.readouterr().out
    assert "no usable kubeconfig" in out and "--kubeconfig" in out and "Traceback" not in out


def test_unreachable_api_server_is_named(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from kvpilot.kubectl_plugin import main

    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}],
    }))
    assert main(["rollout", "promote", "svc", "--kubeconfig", str(config)]) == 1
    out = capsys.readouterr().out
    assert "cannot reach the API server" in out and "Traceback" not in out
