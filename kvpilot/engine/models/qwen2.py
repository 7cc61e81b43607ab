"""Qwen2: the Llama architecture with biases on the q/k/v projections."""

from __future__ import annotations

from kvpilot.engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
