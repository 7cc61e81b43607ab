"""A request's token sequence and its place in the paged KV cache. Torch-free."""

from __future__ import annotations

import time
from enum import Enum, auto

from kvpilot.engine.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """Prompt plus generated tokens; `num_computed_tokens` of them have K/V in the cache."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r}: the prompt must hold at least one token")
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []  # append-only; to drop entries assign a new list (worker/inputs.BlockTableRows)
        self.block_hashes: list[int] = []
        self.num_evicted_tokens = 0  # full blocks dropped by eviction (kvpilot/engine/strategies/eviction/policy.py)
        self.exact_path = False  # runtime validation moved this sequence off its approximation
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, len={len(self)}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_table}, {self.status.name})"
        )
