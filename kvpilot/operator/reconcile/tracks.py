"""Which configuration each track runs: the stable track's effective spec and the canary's (pure).

The stable track follows spec.model/spec.strategy, except after a promotion or a rollback after
one: then status.stable.override holds the configuration it runs, keyed to the digest of
spec.model + spec.strategy at that moment. When the user edits those fields afterwards, the
override no longer matches and the stable track follows the spec again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpilot.operator.spec import ServiceSpec, track_digest


def spec_dicts(raw_spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return dict(raw_spec.get("model") or {}), dict(raw_spec.get("strategy") or {})


def valid_override(raw_spec: Mapping[str, Any], status: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """status.stable.override when it still applies to this spec, else None."""
    override = ((status or {}).get("stable") or {}).get("override")
    if not override or override.get("specDigest") != track_digest(*spec_dicts(raw_spec)):
        return None
    return dict(override)


def make_override(raw_spec: Mapping[str, Any], model: Mapping[str, Any], strategy: Mapping[str, Any],
                  reason: str) -> dict[str, Any]:
    """The status.stable.override that makes the stable track run (model, strategy)."""
    return {"model": dict(model), "strategy": dict(strategy), "reason": reason,
            "specDigest": track_digest(*spec_dicts(raw_spec))}


def stable_dicts(raw_spec: Mapping[str, Any], status: Mapping[str, Any] | None) -> tuple[dict, dict]:
    override = valid_override(raw_spec, status)
    if override is not None:
        return dict(override["model"]), dict(override["strategy"])
    return spec_dicts(raw_spec)


def stable_spec(raw_spec: Mapping[str, Any], status: Mapping[str, Any] | None, namespace: str = "") -> ServiceSpec:
    model, strategy = stable_dicts(raw_spec, status)
    return ServiceSpec.from_dict({**raw_spec, "model": model, "strategy": strategy}, namespace)


def canary_dicts(raw_spec: Mapping[str, Any], status: Mapping[str, Any] | None) -> tuple[dict, dict] | None:
    """The canary track's (model, strategy): spec.canary's overrides on the stable track's."""
    spec = ServiceSpec.from_dict(raw_spec)
    if spec.canary is None:
        return None
    return spec.canary.track_dicts(*stable_dicts(raw_spec, status))


def canary_spec(raw_spec: Mapping[str, Any], status: Mapping[str, Any] | None,
                namespace: str = "") -> ServiceSpec | None:
    dicts = canary_dicts(raw_spec, status)
    if dicts is None:
        return None
    return ServiceSpec.from_dict({**raw_spec, "model": dicts[0], "strategy": dicts[1]}, namespace)
