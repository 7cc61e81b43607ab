"""syntheticLoad settings: the rate per tick, and clear refusals."""

from __future__ import annotations

import pytest

from kvpilot.operator.analysis.synthetic_load import SyntheticLoad, SyntheticLoadError

pytestmark = pytest.mark.unit


def test_absent_is_off_and_the_rate_is_spread_over_ticks():
    assert SyntheticLoad.from_analysis({}) is None
    load = SyntheticLoad.from_analysis({"probeSet": "p", "syntheticLoad": {"requestsPerMinute": 30}})
    assert (load.per_tick(10.0), load.per_tick(1.0), load.max_tokens) == (5, 1, 8)


@pytest.mark.parametrize(("raw", "message"), [
    ({"probeSet": "p", "syntheticLoad": {"requestsPerMinute": 0}}, "must be 1-600, got 0"),
    ({"probeSet": "p", "syntheticLoad": {"requestsPerMinute": 5, "maxTokens": 0}}, "maxTokens must be 1-256"),
    ({"syntheticLoad": {"requestsPerMinute": 5}}, "set spec.canary.analysis.probeSet"),
])  # fmt: skip
def test_bad_settings_are_refused(raw, message):
    with pytest.raises(SyntheticLoadError, match=message):
        SyntheticLoad.from_analysis(raw)
