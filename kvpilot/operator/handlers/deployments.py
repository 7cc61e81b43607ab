"""Owned Deployments' status -> the InferenceService's Ready/Progressing/Degraded and replicas."""

from __future__ import annotations

from typing import Any

import kopf

from kvpilot.operator import constants as c
from kvpilot.operator.handlers.context import context_for
from kvpilot.operator.status_writer import StatusConflict
from kvpilot.operator.watcher import follow_deployment, owner_name

OWNED = {c.LABEL_MANAGED_BY: "kvpilot", c.LABEL_COMPONENT: "engine"}


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
def deployment_event(body: kopf.Body, type: str | None, **_: Any) -> None:
    if type == "DELETED" or owner_name(body) is None:
        return
    owner = {"apiVersion": c.API_VERSION, "kind": c.KIND,
             "metadata": {"name": owner_name(body), "namespace": body["metadata"]["namespace"],
                          "uid": _owner_uid(body)}}
    try:
        follow_deployment(context_for(owner), body)
    except StatusConflict as exc:  # the next event of this Deployment (or the reconcile) catches up
        raise kopf.TemporaryError(str(exc), delay=2) from None


def _owner_uid(body: kopf.Body) -> str:
    return next(r["uid"] for r in body["metadata"]["ownerReferences"] if r.get("kind") == c.KIND)
