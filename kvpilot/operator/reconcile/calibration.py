"""The calibration ConfigMap (spec.strategy.calibration) checked before any pod mounts it.

The text is part of the converted model's weights: the engine fits the GQA grouping or the MLA
factors to it. So the ConfigMap must be immutable, making its reference (name + key) identify the
weights: an edit in place would give a restarted pod other weights than its peers, and a rollback
to the old reference could not restore what ran. A new calibration set is a new ConfigMap.
"""

from __future__ import annotations

from kvpilot.operator.kube import Kube
from kvpilot.operator.spec import CalibrationRef


class CalibrationUnavailable(RuntimeError):
    """The calibration ConfigMap is missing, lacks the key, is empty or is not immutable (yet)."""


def check_calibration(kube: Kube, namespace: str, ref: CalibrationRef | None) -> None:
    """Raise CalibrationUnavailable unless ConfigMap `ref` holds non-empty text under its key and is immutable."""
    if ref is None:
        return
    where = f"ConfigMap {namespace}/{ref.config_map} (spec.strategy.calibration)"
    cm = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{ref.config_map}")
    if cm is None:
        raise CalibrationUnavailable(f"{where} not found: create it with the calibration text under key "
                                     f"{ref.key!r} and immutable: true")
    text = (cm.get("data") or {}).get(ref.key)
    if text is None:
        raise CalibrationUnavailable(f"{where} has no key {ref.key!r} (keys: {sorted(cm.get('data') or {})}); set "
                                     "spec.strategy.calibration.key, or put the text under that key")
    if not text.strip():
        raise CalibrationUnavailable(f"{where} key {ref.key!r} is empty: it needs a few hundred tokens of text "
                                     "like the service's traffic")
    if cm.get("immutable") is not True:
        raise CalibrationUnavailable(
            f"{where} must set immutable: true: its text becomes part of the converted weights, and an edit in "
            "place would give restarted pods other weights than their peers; create a new ConfigMap for a new "
            "calibration set and reference it (a new reference is a new strategy: a rollout)"
        )
