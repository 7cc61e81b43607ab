"""The calibration ConfigMap in the engine's pod: one key, read-only, and the flags that read it."""

from __future__ import annotations

from typing import Any

from kvpilot.operator.spec import CalibrationRef, StrategySpec
from kvpilot.strategy_schema import flag

CALIBRATION_DIR = "/etc/kvpilot/calibration"
VOLUME = "calibration"


def calibration_file(ref: CalibrationRef) -> str:
    return f"{CALIBRATION_DIR}/{ref.key}"


def calibration_volume(ref: CalibrationRef) -> dict[str, Any]:
    """Only the one key, world-readable (calibration text is no secret; the pod's uid is fixed anyway)."""
    return {"name": VOLUME, "configMap": {"name": ref.config_map, "items": [{"key": ref.key, "path": ref.key}],
                                          "defaultMode": 0o444}}


def calibration_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": CALIBRATION_DIR, "readOnly": True}


def conversion_flags(strategy: StrategySpec) -> list[str]:
    """`kvpilot serve` flags of a calibrated conversion and of the MLA conversion's partial RoPE."""
    flags: list[str] = []
    ref = strategy.active_calibration
    if ref is not None:
        flags += [flag("calibration"), calibration_file(ref), flag("tokens"), str(ref.tokens)]
    if strategy.active_mla_rope_dims is not None:
        flags += [flag("mla_rope_dims"), str(strategy.active_mla_rope_dims), flag("mla_rope_pairs"),
                  strategy.mla_rope_pairs]
    return flags
