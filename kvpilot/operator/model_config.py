"""The model's config.json for the preflight: inline in the spec, or from a ConfigMap."""

from __future__ import annotations

import json
from typing import Any

from kvpilot.operator.kube import Kube
from kvpilot.operator.spec import ModelRef


class ModelConfigUnavailable(RuntimeError):
    """The config cannot be read (yet): a missing ConfigMap or key, or JSON that does not parse."""


def load_model_config(kube: Kube, namespace: str, model: ModelRef) -> dict[str, Any]:
    if model.config is not None:
        return dict(model.config)
    if not model.config_map:
        raise ModelConfigUnavailable("spec.model needs config (inline config.json) or configMapRef")
    cm = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{model.config_map}")
    if cm is None:
        raise ModelConfigUnavailable(f"ConfigMap {namespace}/{model.config_map} (spec.model.configMapRef) not found")
    raw = (cm.get("data") or {}).get(model.config_map_key)
    if raw is None:
        raise ModelConfigUnavailable(
            f"ConfigMap {model.config_map} has no key {model.config_map_key!r}; keys: {sorted(cm.get('data') or {})}"
        )
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ModelConfigUnavailable(f"ConfigMap {model.config_map}/{model.config_map_key} is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ModelConfigUnavailable(f"ConfigMap {model.config_map}/{model.config_map_key} is not a JSON object")
    return parsed
