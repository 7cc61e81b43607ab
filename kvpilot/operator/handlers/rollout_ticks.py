"""What makes the rollout tick: a timer per InferenceService drives steps and analyses; spec edits
and the rollback/promote/abort annotations act at once. The tick itself is kvpilot.operator.rollout.controller."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from kvpilot.operator import constants as c
from kvpilot.operator import operator_metrics as metrics
from kvpilot.operator import options
from kvpilot.operator.handlers.context import context_for
from kvpilot.operator.kube import KubeError
from kvpilot.operator.rollout import phases
from kvpilot.operator.rollout.apply import ActionFailed
from kvpilot.operator.rollout.controller import tick
from kvpilot.operator.rollout.gpu_check import GpusUnavailable
from kvpilot.operator.rollout.state import parse_time
from kvpilot.operator.routing import RouterUnavailable
from kvpilot.operator.spec import canary_hash, parse_duration
from kvpilot.operator.status.writer import StatusConflict


def needs_ticks(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    """A canary spec not yet acted on, or a rollout in flight (others cost the timer nothing)."""
    canary = (status or {}).get("canary") or {}
    if spec.get("canary"):
        return canary.get("specHash") != canary_hash(spec["canary"]) or canary.get("phase") in phases.ACTIVE
    return canary.get("phase") in phases.ACTIVE


def run_tick(handler: str, body: kopf.Body, logger: logging.Logger) -> None:
    metrics.RECONCILES.labels(handler).inc()
    meta = body["metadata"]
    try:
        status = tick(context_for(body), meta["namespace"], meta["name"], options.current())
    except GpusUnavailable as exc:  # a canary waiting for GPUs (condition CanaryGPUs): the next tick retries,
        logger.info(f"rollout: {exc}")  # no error Event every few seconds while it waits
        return
    except (KubeError, RouterUnavailable, StatusConflict, ActionFailed) as exc:
        metrics.RECONCILE_ERRORS.labels(handler).inc()
        raise kopf.TemporaryError(f"rollout: {exc}", delay=2) from None
    except Exception:
        metrics.RECONCILE_ERRORS.labels(handler).inc()
        raise
    if status is not None:
        logger.debug("rollout %s: step %s at %s%%", status.phase, status.step, status.weight)


def waiting_out_a_step(body: Mapping[str, Any], now: datetime.datetime) -> bool:
    """A step whose window has not elapsed and nothing else to do: the tick would change nothing.

    Read from kopf's copy of the object, so most ticks cost no API request at all; spec edits and
    the annotations have their own handlers, and anything unexpected falls through to a real tick.
    """
    spec, status = body.get("spec") or {}, body.get("status") or {}
    canary, raw = status.get("canary") or {}, spec.get("canary")
    if not raw or canary.get("phase") != phases.PROGRESSING or not canary.get("stepStartedAt"):
        return False
    if raw.get("paused") or spec.get("rollback") or canary.get("specHash") != canary_hash(raw):
        return False
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if annotations.get(options.ANNOTATION_ROLLBACK, "").lower() == "true" or canary["specHash"] in (
            annotations.get(options.ANNOTATION_PROMOTE), annotations.get(options.ANNOTATION_ABORT)):
        return False
    try:
        elapsed = (now - parse_time(canary["stepStartedAt"])).total_seconds()
        return elapsed < parse_duration(str(raw.get("interval", "5m")))
    except ValueError:
        return False


@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=options.current().tick_s, when=needs_ticks)
def rollout_timer(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    if waiting_out_a_step(body, datetime.datetime.now(datetime.UTC)):
        synthetic_load(body, logger)  # spec.canary.analysis.syntheticLoad: fill the step's window
        return
    run_tick("rollout_timer", body, logger)


@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL, field="spec")
def rollout_spec_changed(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    run_tick("rollout_spec", body, logger)


def annotation_pending(meta: kopf.Meta, status: kopf.Status, **_: Any) -> bool:
    """A rollback/promote/abort annotation the rollout has not acted on yet.

    kopf leaves every `kvpilot.io/*` annotation out of its diffs (the prefix holds its own
    storage), so field-change handlers never see these; an event handler with this filter does,
    and stops matching once the rollout moved on (RolledBack, Promoting, ...).
    """
    annotations = meta.get("annotations") or {}
    canary = (status or {}).get("canary") or {}
    phase, spec_hash = canary.get("phase"), canary.get("specHash")
    if annotations.get(options.ANNOTATION_ROLLBACK, "").lower() == "true" and (
            phase == phases.PROMOTED or phase in phases.ACTIVE - {phases.ROLLING_BACK}):
        return True
    steerable = phases.ACTIVE - {phases.PROMOTING, phases.ROLLING_BACK}
    return bool(spec_hash) and phase in steerable and spec_hash in (
        annotations.get(options.ANNOTATION_PROMOTE), annotations.get(options.ANNOTATION_ABORT))


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL, when=annotation_pending)
def rollout_annotation(body: kopf.Body, type: str | None, logger: logging.Logger, **_: Any) -> None:
    if type != "DELETED":
        run_tick("rollout_annotation", body, logger)


def synthetic_load(body: kopf.Body, logger: logging.Logger) -> None:
    """Low-traffic services: the probe set's prompts to both tracks during a step (analysis/synthetic_load.py)."""
    from kvpilot.operator.analysis.probes import ProbeSetError, ScoringError, track_urls
    from kvpilot.operator.analysis.synthetic_load import SyntheticLoadError, during_step

    try:
        sent = during_step(context_for(body).kube, body, track_urls(options.current()), options.current().tick_s)
    except (SyntheticLoadError, ProbeSetError, ScoringError, KubeError) as exc:
        logger.warning("synthetic load not sent: %s", exc)
        return
    failed = {track: sum(1 for code in codes if code != 200) for track, codes in sent.items()}
    if any(failed.values()):
        logger.warning("synthetic load: requests not answered 200 per track: %s", failed)
