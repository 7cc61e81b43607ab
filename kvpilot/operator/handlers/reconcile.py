"""create / update / resume -> reconcile. Deletion relies on owner references (no finalizer)."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot.operator import constants as c
from kvpilot.operator import operator_metrics as metrics
from kvpilot.operator.handlers.context import context_for
from kvpilot.operator.reconcile.reconciler import InvalidSpec, RetryLater, reconcile
from kvpilot.operator.status.writer import StatusConflict
from kvpilot.planner import CapacityPlan


@kopf.on.resume(c.GROUP, c.VERSION, c.PLURAL)
@kopf.on.create(c.GROUP, c.VERSION, c.PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, field="spec")
def reconcile_service(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    metrics.RECONCILES.labels("reconcile").inc()
    try:
        plan = _reconcile(body)
    except Exception:
        metrics.RECONCILE_ERRORS.labels("reconcile").inc()
        raise
    logger.info("reconciled: %s", plan.reason)


def _reconcile(body: kopf.Body) -> CapacityPlan:
    try:
        return reconcile(context_for(body), body)
    except RetryLater as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from None
    except StatusConflict as exc:
        raise kopf.TemporaryError(str(exc), delay=2) from None
    except InvalidSpec as exc:
        raise kopf.PermanentError(str(exc)) from None
