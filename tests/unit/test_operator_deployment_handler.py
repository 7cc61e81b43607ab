"""The Deployment-status handler runs on its own threads, so a full reconcile pool cannot delay it."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
import pytest

from kvpilot.operator import constants as c
from kvpilot.operator.handlers import deployments
from kvpilot.operator.status.writer import StatusConflict

pytestmark = pytest.mark.unit

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="unset")


def deployment(owner: str | None = "chat") -> dict[str, Any]:
    refs = [] if owner is None else [{"apiVersion": c.API_VERSION, "kind": c.KIND, "name": owner,
                                      "uid": "u-1", "controller": True}]
    return {"metadata": {"name": f"{owner}-stable", "namespace": "ns", "ownerReferences": refs},
            "status": {"replicas": 1, "readyReplicas": 1}}


@pytest.fixture
def followed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str, str]]:
    """Records (owner, deployment, thread name, context mark) for each follow_deployment call."""
    calls: list[tuple[str, str, str, str]] = []
    monkeypatch.setattr(deployments, "context_for", lambda owner: owner)

    def follow(owner: dict[str, Any], dep: dict[str, Any]) -> None:
        calls.append((owner["metadata"]["name"], dep["metadata"]["name"], threading.current_thread().name,
                      MARK.get()))

    monkeypatch.setattr(deployments, "follow_deployment", follow)
    return calls


def test_status_event_overtakes_a_saturated_reconcile_pool(followed: list) -> None:
    """kopf runs sync handlers on the loop's executor; here that pool is blocked the whole time."""
    release = threading.Event()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        busy_pool = ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(busy_pool)
        blocker = loop.run_in_executor(None, release.wait)  # a reconcile that takes its time
        MARK.set("kopf-context")
        try:
            await asyncio.wait_for(deployments.deployment_event(body=deployment(), type="MODIFIED"), timeout=5)
            assert not blocker.done()
        finally:
            release.set()
            await blocker

    asyncio.run(scenario())
    assert followed == [("chat", "chat-stable", followed[0][2], "kopf-context")]
    assert followed[0][2].startswith("kvpilot-status")


@pytest.mark.parametrize(("body", "type_"), [(deployment(), "DELETED"), (deployment(owner=None), "ADDED")])
def test_deleted_or_unowned_deployments_are_ignored(followed: list, body: dict, type_: str) -> None:
    asyncio.run(deployments.deployment_event(body=body, type=type_))
    assert followed == []


def test_a_status_conflict_asks_kopf_to_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deployments, "context_for", lambda owner: owner)

    def conflict(owner: dict[str, Any], dep: dict[str, Any]) -> None:
        raise StatusConflict("status of ns/chat: still conflicting after 5 attempts")

    monkeypatch.setattr(deployments, "follow_deployment", conflict)
    with pytest.raises(kopf.TemporaryError, match="still conflicting"):
        asyncio.run(deployments.deployment_event(body=deployment(), type="MODIFIED"))
