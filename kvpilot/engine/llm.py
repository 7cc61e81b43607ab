"""Offline API: LLM(model_dir, **engine_kwargs).generate(prompts, params)."""

from __future__ import annotations

from typing import Any

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams


class LLM:
    """Batch generation on top of LLMEngine."""

    def __init__(self, model: str, **engine_kwargs: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=str(model), **engine_kwargs))
        self.tokenizer = self.engine.tokenizer

    def shutdown(self) -> None:
        """Stop the tensor-parallel ranks (tensor_parallel_size > 1); nothing to do at one rank."""
        self.engine.shutdown()

    def generate(
        self,
        prompts: list[str] | list[list[int]] | str,
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[dict[str, Any]]:
        """Generate for every prompt (text or token ids); returns [{text, token_ids, finish_reason}] in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = params if params is not None else SamplingParams()
        param_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(param_list) != len(prompts):
            raise ValueError(
                f"got {len(param_list)} SamplingParams for {len(prompts)} prompts; pass one or one each"
            )
        ids = [f"offline-{i}" for i in range(len(prompts))]
        results: dict[str, dict[str, Any]] = {}
        for rid, prompt, p in zip(ids, prompts, param_list, strict=True):
            tokens = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            self.engine.add_request(rid, tokens, p)
            results[rid] = {"text": "", "token_ids": [], "finish_reason": None}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                result = results[out.request_id]
                result["token_ids"] += out.new_token_ids
                result["text"] = out.text
                result["finish_reason"] = out.finish_reason
        return [results[rid] for rid in ids]
