"""spec.autoscaling: every --autoscaling-interval (30 s), status.autoscaling from the HPAs, and the
denser-strategy proposal."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kvpilot.operator import constants as c
from kvpilot.operator import options
from kvpilot.operator.autoscaling.watch import observe
from kvpilot.operator.handlers.context import context_for
from kvpilot.operator.kube import KubeError


def autoscaling_on(spec: kopf.Spec, **_: Any) -> bool:
    raw = spec.get("autoscaling") or {}
    return bool(raw) and raw.get("enabled") is not False


# options.configure() runs before the handlers are imported (cli.py): the interval is the flag's
@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=options.current().autoscaling_interval_s, when=autoscaling_on)
def autoscaling_timer(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    ctx = context_for(body)
    try:
        observe(ctx.kube, body, ctx.emit)
    except KubeError as exc:
        raise kopf.TemporaryError(f"status.autoscaling not written: {exc}",
                                  delay=options.current().autoscaling_interval_s) from None
