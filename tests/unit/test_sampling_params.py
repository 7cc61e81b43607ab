"""SamplingParams validation: bad values are refused with the allowed range in the message."""

from __future__ import annotations

import pytest

from kvpilot.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_k": 0}, "top_k must be -1 (disabled) or an integer >= 1"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer in [0, 2**63)"),
        ({"stop_token_ids": [-3]}, "stop_token_ids must be non-negative"),
        ({"stop": [""]}, "stop must be non-empty strings"),
    ],
)
def test_invalid_values_are_refused(kwargs, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert fragment in str(info.value)
    assert "got" in str(info.value)


def test_defaults_and_normalisation() -> None:
    p = SamplingParams(temperature=0, stop="END", stop_token_ids=(7,))
    assert p.greedy and p.stop == ["END"] and p.stop_token_ids == [7]
    assert not SamplingParams().greedy
