"""Owned Deployments' status -> the InferenceService's Ready/Progressing/Degraded and replicas.

The handler is async and runs the (blocking) status write on its own small thread pool, not on
kopf's executor: during a creation burst kopf's executor is full of reconciles, and a
Deployment's status event queued behind them would leave a Ready service reported as
Progressing for minutes. kopf already serialises events per Deployment and keeps only the
latest within its batching window, and the status writer takes turns per InferenceService with
the reconcile, so the two paths never overwrite each other.
"""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from kvpilot.operator import constants as c
from kvpilot.operator.handlers.context import context_for
from kvpilot.operator.status.follow_deployment import follow_deployment, owner_name
from kvpilot.operator.status.writer import StatusConflict

OWNED = {c.LABEL_MANAGED_BY: "kvpilot", c.LABEL_COMPONENT: "engine"}
STATUS_THREADS = 4  # status writes wait on the API server (one PATCH each), not on the CPU

_status_pool = ThreadPoolExecutor(max_workers=STATUS_THREADS, thread_name_prefix="kvpilot-status")


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
async def deployment_event(body: kopf.Body, type: str | None, **_: Any) -> None:
    if type == "DELETED" or owner_name(body) is None:
        return
    deployment = dict(body)  # this event's snapshot; kopf does not change it afterwards
    # The copied context carries kopf's event poster (kopf.event) into the worker thread.
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(_status_pool, context.run, follow_owner, deployment)


def follow_owner(deployment: dict[str, Any]) -> None:
    """Blocking: fold one Deployment's status into its owner's status (one PATCH at most)."""
    owner = {"apiVersion": c.API_VERSION, "kind": c.KIND,
             "metadata": {"name": owner_name(deployment), "namespace": deployment["metadata"]["namespace"],
                          "uid": _owner_uid(deployment)}}
    try:
        follow_deployment(context_for(owner), deployment)
    except StatusConflict as exc:  # the next event of this Deployment (or the reconcile) catches up
        raise kopf.TemporaryError(str(exc), delay=2) from None


def _owner_uid(deployment: dict[str, Any]) -> str:
    return next(r["uid"] for r in deployment["metadata"]["ownerReferences"] if r.get("kind") == c.KIND)
