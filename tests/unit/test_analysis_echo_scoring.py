"""Echo + logprobs scoring: the continuation's tokens are picked by text offset, the rest refused clearly."""

from __future__ import annotations

import pytest

from kvpilot.operator.analysis.echo_scoring import EchoScoringError, continuation_logprob

pytestmark = pytest.mark.unit


def _choice(tokens, logprobs, offsets):
    return {"text": "".join(tokens), "logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                                                   "text_offset": offsets, "top_logprobs": None}}


def test_only_tokens_inside_the_continuation_count():
    # "if x" + " == 1" echoed, then one generated token (max_tokens 1) past the echo: left out
    choice = _choice(["if", " x", " ==", " 1", ":"], [None, -2.0, -0.5, -0.25, -9.0], [0, 2, 4, 7, 9])
    assert continuation_logprob(choice, "if x", " == 1") == (-0.75, 2)


def test_a_server_without_logprobs_is_named():
    with pytest.raises(EchoScoringError, match="support echo with logprobs"):
        continuation_logprob({"text": "x", "logprobs": None}, "a", "b")


def test_no_echo_is_named():
    choice = _choice([" y"], [-1.0], [0])  # offsets restart at 0: the prompt was not echoed
    with pytest.raises(EchoScoringError, match="did not echo the prompt"):
        continuation_logprob(choice, "prompt", " y")


def test_a_missing_logprob_inside_the_continuation_is_refused():
    choice = _choice(["a", "b"], [None, None], [0, 1])
    with pytest.raises(EchoScoringError, match="no finite log-probability"):
        continuation_logprob(choice, "a", "b")
