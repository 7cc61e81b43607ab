"""The causal-LM shell every family shares: the decoder stack and the lm_head, tied when configured."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.layers.parallel import lm_head
from kvpilot.engine.models.layers import DecoderStack


class CausalLM(nn.Module):
    """Packed-token causal LM: forward gives hidden states, compute_logits the vocabulary scores.

    Families pass their decoder layers; `model.*` and `lm_head.*` carry HF's parameter names.
    """

    def __init__(self, config: ModelConfig, layers: Iterable[nn.Module]) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config.vocab_size, config.hidden_size, config.rms_norm_eps, layers)
        self.lm_head = lm_head(config.hidden_size, config.vocab_size)  # vocab-parallel under TP
        self.tp_driver: Any = None  # rank 0 of a tensor-parallel engine: sends each call to the other ranks
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the output projection when the config ties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.tp_driver is not None:  # rank 0 of a tensor-parallel engine (parallel/driver.py)
            return self.tp_driver.forward(self.model, input_ids, positions)
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.tp_driver is not None:
            return self.tp_driver.logits(self.lm_head, hidden)
        return self.lm_head(hidden)
