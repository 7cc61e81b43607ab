"""Calibration tokens (`conversion_calibration`: a text file) and the attention inputs they produce.

The GQA and MLA conversions use a few hundred tokens of representative text to see the keys and
values a layer actually produces (head grouping by key similarity, activation-aware factorisation),
instead of treating every weight direction alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvpilot.engine.context import dense_context
from kvpilot.engine.tokenizer import Tokenizer

MIN_TOKENS = 16


def calibration_tokens(config: Any) -> list[int] | None:
    """The first `calibration_tokens` tokens of the `conversion_calibration` file, or None (unset)."""
    path = config.conversion_calibration
    if path is None:
        return None
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"conversion_calibration {path!r} is not a file; give a UTF-8 text file of representative text")
    ids = Tokenizer(config.model).encode(file.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)
    ids = ids[: config.calibration_tokens]
    if len(ids) < MIN_TOKENS:
        raise ValueError(
            f"conversion_calibration {path!r} has {len(ids)} tokens; give at least {MIN_TOKENS} (a few hundred is best)"
        )
    return ids


class _Stop(Exception):
    """Ends a calibration pass once the wanted layers' inputs are captured."""


@torch.inference_mode()
def attention_inputs(model: torch.nn.Module, ids: list[int], layers: list[int], device: torch.device
                     ) -> dict[int, torch.Tensor]:  # fmt: skip
    """Each listed decoder layer's self-attention input [T, hidden] on the tokens, one dense causal pass
    that stops after the last listed layer."""
    store: dict[int, torch.Tensor] = {}
    last = max(layers)
    handles = []
    for index in layers:
        def hook(_module, args, index=index):
            store[index] = args[1].detach().float()
            if index == last:
                raise _Stop

        handles.append(model.model.layers[index].self_attn.register_forward_pre_hook(hook))
    tokens = torch.tensor(ids, dtype=torch.long, device=device)
    try:
        with dense_context():
            model(tokens, torch.arange(len(ids), device=device))
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return store
