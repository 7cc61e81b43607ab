"""Admission control: a request is accepted only if it fits the model and the queue has room.

The queue is counted in the server, in sequences (a request of n = 4 holds four places): sequences
admitted and not yet finished beyond the engine's `max_num_seqs` are the ones waiting. Every
rejection is counted in the engine's stats feed.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpilot.engine.server.http.errors import APIError

QUEUE_RETRY_AFTER_SECONDS = 1
NOT_READY_RETRY_AFTER_SECONDS = 5


class Admission:
    """Counts in-flight requests and turns away those that cannot be served."""

    def __init__(
        self,
        *,
        max_model_len: int,
        max_num_seqs: int,
        max_queue: int,
        record_rejection: Callable[[str], None],
        max_scores: int = 4,
        max_token_chars: int | None = None,
    ) -> None:
        if max_model_len < 2 or max_num_seqs < 1 or max_queue < 0:
            raise ValueError(
                f"admission needs max_model_len >= 2, max_num_seqs >= 1, max_queue >= 0; got "
                f"{max_model_len}, {max_num_seqs}, {max_queue}"
            )
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_queue = max_queue
        self.max_scores = max_scores
        # Each token covers at most max_token_chars characters, so a prompt longer than this many
        # characters cannot fit in max_model_len tokens: refused before it is tokenised.
        self.max_prompt_chars = max_model_len * max_token_chars if max_token_chars else None
        self.max_token_chars = max_token_chars
        self.in_flight = 0
        self.scores_in_flight = 0
        self._record = record_rejection

    @property
    def waiting(self) -> int:
        return max(0, self.in_flight - self.max_num_seqs)

    def reject(self, reason: str, error: APIError) -> APIError:
        self._record(reason)
        return error

    def max_tokens_for(self, num_prompt_tokens: int, requested: int | None, default: int | None) -> int:
        """The max_tokens to use, or a 400 naming both numbers and the limit."""
        if num_prompt_tokens < 1:
            raise self.reject(
                "invalid", APIError(400, "the prompt is empty: send at least one token", param="prompt")
            )
        room = self.max_model_len - num_prompt_tokens
        if requested is None:
            if room < 1:
                raise self.reject("too_long", self._too_long(num_prompt_tokens, None))
            return room if default is None else min(default, room)
        if num_prompt_tokens + requested > self.max_model_len:
            raise self.reject("too_long", self._too_long(num_prompt_tokens, requested))
        return requested

    def _too_long(self, num_prompt_tokens: int, requested: int | None) -> APIError:
        if requested is None:
            message = (
                f"the prompt has {num_prompt_tokens} tokens, which leaves no room to generate within this "
                f"model's maximum context length of {self.max_model_len} tokens; shorten the prompt"
            )
        else:
            message = (
                f"the prompt has {num_prompt_tokens} tokens and max_tokens asks for {requested}: "
                f"{num_prompt_tokens + requested} tokens exceed this model's maximum context length of "
                f"{self.max_model_len} tokens; shorten the prompt or lower max_tokens to at most "
                f"{max(0, self.max_model_len - num_prompt_tokens)}"
            )
        return APIError(400, message, param="max_tokens", code="context_length_exceeded")

    def check_prompt_chars(self, chars: int, param: str) -> None:
        """A 400 for a prompt too long to fit whatever it tokenises to, before tokenising it."""
        if self.max_prompt_chars is None or chars <= self.max_prompt_chars:
            return
        raise self.reject(
            "too_long",
            APIError(
                400,
                f"the prompt has {chars} characters: this model's maximum context length of {self.max_model_len} "
                f"tokens holds at most {self.max_prompt_chars} characters (its longest token is "
                f"{self.max_token_chars} characters); shorten the prompt",
                param=param,
                code="context_length_exceeded",
            ),
        )

    def acquire_score(self) -> None:
        """Take one of the `max_scores` scoring places, or raise a 429 with Retry-After."""
        if self.scores_in_flight >= self.max_scores:
            raise self.reject(
                "queue_full",
                APIError(
                    429,
                    f"the server is scoring {self.scores_in_flight} requests, its limit (--max-concurrent-scores "
                    f"{self.max_scores}); retry after {QUEUE_RETRY_AFTER_SECONDS} s",
                    code="queue_full",
                    headers={"Retry-After": str(QUEUE_RETRY_AFTER_SECONDS)},
                ),
            )
        self.scores_in_flight += 1

    def release_score(self) -> None:
        self.scores_in_flight = max(0, self.scores_in_flight - 1)

    @property
    def capacity(self) -> int:
        """Sequences in flight at most: running plus queued."""
        return self.max_num_seqs + self.max_queue

    def acquire(self, sequences: int = 1, param: str | None = None) -> None:
        """Take `sequences` places in the engine or its queue (one per sequence: n and best_of samples
        and each prompt of a batch count), or raise a 429 with Retry-After; a 400 when they could
        never fit."""
        if sequences > self.capacity:
            raise self.reject(
                "invalid",
                APIError(
                    400,
                    f"this request needs {sequences} sequences at once; this server holds at most {self.capacity} "
                    f"({self.max_num_seqs} running, {self.max_queue} queued): lower n or best_of, or split the batch",
                    param=param,
                    code="too_many_sequences",
                ),
            )
        if self.in_flight + sequences > self.capacity:
            raise self.reject(
                "queue_full",
                APIError(
                    429,
                    f"the server is at capacity: {self.in_flight} sequences in flight "
                    f"({self.max_num_seqs} running, {self.max_queue} queued at most)"
                    + (f", and this request needs {sequences}" if sequences > 1 else "")
                    + f"; retry after {QUEUE_RETRY_AFTER_SECONDS} s",
                    code="queue_full",
                    headers={"Retry-After": str(QUEUE_RETRY_AFTER_SECONDS)},
                ),
            )
        self.in_flight += sequences

    def release(self, sequences: int = 1) -> None:
        self.in_flight = max(0, self.in_flight - sequences)

    def take(self, sequences: int, *, scores: bool = False, param: str | None = None) -> Places:
        """The places one request holds until it ends: its sequences, and a scoring place when it runs
        forward passes of its own (echo with logprobs scores the prompt like /v1/score)."""
        self.acquire(sequences, param)
        if scores:
            try:
                self.acquire_score()
            except APIError:
                self.release(sequences)
                raise
        return Places(self, sequences, scores)


class Places:
    """Admission places held by one request; release() gives them back once (any later call is a no-op)."""

    def __init__(self, admission: Admission, sequences: int, scores: bool) -> None:
        self._admission = admission
        self.sequences = sequences
        self.scores = scores
        self._held = True

    def release(self, *_: object) -> None:
        if not self._held:
            return
        self._held = False
        self._admission.release(self.sequences)
        if self.scores:
            self._admission.release_score()


def not_ready_error(detail: str) -> APIError:
    return APIError(
        503,
        f"the engine is not ready: {detail}; retry after {NOT_READY_RETRY_AFTER_SECONDS} s",
        code="not_ready",
        headers={"Retry-After": str(NOT_READY_RETRY_AFTER_SECONDS)},
    )
