"""Per-request sampling parameters, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpilot.engine.structured.spec import StructuredSpec

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
    ignore_eos: bool = False  # with structured: the grammar holds until its EOS, then the output runs free
    logprobs: int | None = None  # None: none; k >= 0: each sampled token's log p and the k most likely
    presence_penalty: float = 0.0  # OpenAI: minus this once a token has been generated
    frequency_penalty: float = 0.0  # OpenAI: minus this per time a token has been generated
    repetition_penalty: float = 1.0  # HF/vLLM: divide positive, multiply negative logits of seen tokens
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop_token_ids cannot be sampled before this many tokens
    structured: StructuredSpec | None = None  # the output follows this grammar (engine/structured/)

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
            all(-2.0 <= v <= 2.0 for v in (self.presence_penalty, self.frequency_penalty)),
            f"presence_penalty and frequency_penalty must be in [-2, 2], got {self.presence_penalty}, "
            f"{self.frequency_penalty}",
        )
        _check(0.0 < self.repetition_penalty <= 2.0, f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        _check(
            all(k >= 0 and -100.0 <= v <= 100.0 for k, v in self.logit_bias.items()),
            "logit_bias maps token ids >= 0 to values in [-100, 100]",
        )
        _check(
            isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
            f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}",
        )
        _check(
            self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
            f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}",
        )

        _check(
            self.structured is None or isinstance(self.structured, StructuredSpec),
            f"structured must be a StructuredSpec or None, got {type(self.structured).__name__}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"invalid sampling parameter: {message}")
