"""The engine as the server uses it: LLMEngine in-process, or the engine core process's client.

Torch-free at import (the types are only named for checkers), so the API process of
`--engine-core process` never loads torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from kvpilot.engine.server.runtime.oom import LoadShedding

if TYPE_CHECKING:
    from kvpilot.engine.config import EngineConfig, ModelConfig
    from kvpilot.engine.llm_engine import RequestOutput
    from kvpilot.engine.sampling_params import SamplingParams
    from kvpilot.engine.tokenizer import Tokenizer


class EngineHandle(LoadShedding, Protocol):
    """What the server's runtime and endpoints call on the engine (LLMEngine's public methods)."""

    config: EngineConfig
    model_config: ModelConfig
    tokenizer: Tokenizer
    max_model_len: int

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None: ...

    def abort_request(self, request_id: str) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def score(self, prompt_token_ids: list[int], continuation_token_ids: list[int]) -> list[float]: ...

    def score_tokens(
        self, prompt_token_ids: list[int], continuation_token_ids: list[int], top: int = 0
    ) -> tuple[list[float], list[Any]]: ...

    def stats(self) -> dict[str, Any]: ...

    def reset_stats(self) -> None: ...

    def record_rejection(self, reason: str) -> None: ...

    def shutdown(self) -> None: ...
