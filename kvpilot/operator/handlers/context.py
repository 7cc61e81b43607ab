"""The reconciler's Context for a kopf handler: shared client, kopf Events, UTC clock."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator import kube
from kvpilot.operator.context import Context


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def context_for(obj: Mapping[str, Any]) -> Context:
    """Events are posted about `obj` (an InferenceService) by kopf's event poster."""
    ref = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": obj["metadata"]}

    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(ref, type=type_, reason=reason, message=message[:1000])

    return Context(kube=kube.shared(), emit=emit, now=utc_now)
