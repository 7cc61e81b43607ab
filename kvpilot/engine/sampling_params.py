"""Per-request sampling parameters, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # most likely alternatives returned per token


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 means greedy."""

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: each sampled token's log p and the k most likely


    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        _check(self.temperature >= 0.0, f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _check(self.temperature <= 100.0, f"temperature must be <= 100, got {self.temperature}")
        _check(
            isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 1),
            f"top_k must be -1 (disabled) or an integer >= 1, got {self.top_k!r}",
        )
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(
            isinstance(self.max_tokens, int) and self.max_tokens >= 1,
            f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
        )
        _check(
            self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
            f"seed must be an integer in [0, 2**63) or None, got {self.seed!r}",
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}",
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            f"stop must be non-empty strings, got {self.stop!r}",
        )

        _check(
            self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
            f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"invalid sampling parameter: {message}")
