"""Operator settings: where kopf keeps its memory, how it posts events and watches."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot.operator import constants as c


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Annotations, not status: the CRD's structural schema would prune an unknown status.kopf.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration"
    )
    # Only warnings and errors from kopf's own log become Events; the operator's decisions are
    # posted explicitly (kopf.event ignores this level), so a handler's "succeeded" line never
    # costs an Event write.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    # Reconciles are synchronous and wait on the API server, not the CPU: more threads, more
    # overlap. Deployment status events do not use this pool (see handlers/deployments.py).
    settings.execution.max_workers = 20
