"""Canary analysis behind one small interface (`MetricProvider`), chosen by name with `provider_for`."""

from __future__ import annotations

from kvpilot.operator.analysis import prometheus  # noqa: F401  (registers "prometheus")
from kvpilot.operator.analysis.judge import Figures, judge
from kvpilot.operator.analysis.provider import (
    MetricProvider,
    ProviderUnavailable,
    QueryError,
    provider_for,
    provider_names,
)
from kvpilot.operator.analysis.result import AnalysisResult, Check
from kvpilot.operator.analysis.run import analyse
from kvpilot.operator.analysis.thresholds import Thresholds, thresholds_from_spec

__all__ = ["AnalysisResult", "Check", "Figures", "MetricProvider", "ProviderUnavailable", "QueryError", "Thresholds",
           "analyse", "judge", "provider_for", "provider_names", "thresholds_from_spec"]
