"""Run one analysis for a RunAnalysis action: metrics from the provider, plus the accuracy gate."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping
from typing import Any

from kvpilot.operator import operator_metrics as metrics
from kvpilot.operator.analysis import AnalysisResult, Check, analyse, provider_for, thresholds_from_spec
from kvpilot.operator.analysis.judge import inconclusive
from kvpilot.operator.kube import Kube
from kvpilot.operator.options import Options
from kvpilot.operator.rollout import RunAnalysis
from kvpilot.operator.rollout.state import rfc3339
from kvpilot.operator.spec import ServiceSpec

log = logging.getLogger(__name__)
ACCURACY_CHECK = "accuracyDelta"  # = analysis.probes.ACCURACY_CHECK


def run_analysis(kube: Kube, body: Mapping[str, Any], request: RunAnalysis, options: Options,
                 now: datetime.datetime) -> AnalysisResult:
    """Blocking (HTTP to Prometheus and to both tracks): call it off the event loop."""
    started = time.monotonic()
    try:
        result = _analyse(kube, body, request, options, now)
    finally:
        metrics.ANALYSIS_SECONDS.observe(time.monotonic() - started)
    meta = body["metadata"]
    metrics.ANALYSES.labels(meta["namespace"], meta["name"], result.verdict).inc()
    accuracy = result.check(ACCURACY_CHECK)
    if accuracy is not None and accuracy.canary is not None and accuracy.stable is not None:
        metrics.ACCURACY_DELTA.labels(meta["namespace"], meta["name"]).set(accuracy.stable - accuracy.canary)
    return result


def _analyse(kube: Kube, body: Mapping[str, Any], request: RunAnalysis, options: Options,
             now: datetime.datetime) -> AnalysisResult:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    spec = ServiceSpec.from_dict(body.get("spec") or {}, namespace)
    window_s, at = max(1.0, request.window_s), rfc3339(now)
    if spec.canary is None:
        return inconclusive("NoCanary", "spec.canary is gone", window_s, at)
    try:
        thresholds = thresholds_from_spec(spec.canary.analysis)
    except ValueError as exc:
        return inconclusive("InvalidThresholds", str(exc), window_s, at)
    if not options.prometheus_url:
        return inconclusive("NoMetricProvider", "the operator runs without --prometheus-url: no metrics, so no "
                            "promotion; start it with --prometheus-url http://<prometheus>:9090", window_s, at)
    extra: tuple[Check, ...] = ()
    if thresholds.probe_set:
        extra = (_accuracy(kube, namespace, name, thresholds, options, spec.engine.api_key_secret),)
    provider = provider_for(options.provider, url=options.prometheus_url)
    try:
        return analyse(provider, namespace, name, window_s, thresholds, now, extra_checks=extra,
                       gateway=options.gateway_queries)
    finally:
        close = getattr(provider, "close", None)
        if close is not None:
            close()


def _accuracy(kube: Kube, namespace: str, name: str, thresholds: Any, options: Options,
              api_key_secret: Any = None) -> Check:
    """The probe set scored on both tracks (rollout-io's probes module); no verdict without it."""
    try:
        from kvpilot.operator.analysis import probes
    except ImportError:
        return Check(ACCURACY_CHECK, None, None, thresholds.max_accuracy_delta, None,
                     "the probe gate is not available in this build: no accuracy verdict")
    try:
        return probes.accuracy_check(kube, namespace, name, thresholds, probes.track_urls(options), api_key_secret)
    except Exception as exc:  # a probe failure is no data, never a pass
        log.warning("probe set of %s/%s: %s", namespace, name, exc)
        return Check(ACCURACY_CHECK, None, None, thresholds.max_accuracy_delta, None, f"probe set not scored: {exc}")
