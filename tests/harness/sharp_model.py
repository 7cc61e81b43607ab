"""A tiny random Llama made confident, so that damage to its attention or weights shows in probe scores."""

from __future__ import annotations

import shutil
from pathlib import Path


def sharpen(src: Path, dst: Path) -> Path:
    """Copy `src` to `dst` with larger logits (lm_head x 20) and sharper attention (q, k, v x 3).

    A random checkpoint's next-token distribution is nearly flat: merging its two KV heads by
    mean-pooling changes the log-likelihood of any text by noise (measured: -6.06 pooled vs -6.11
    stable, nats per token). Sharpened, the stable engine is sure of its own greedy continuations
    and the pooled-GQA canary measurably worse (-52.1 vs -49.7), while int8 KV scores the same as bf16.
    """
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    for key in tensors:
        if key == "lm_head.weight":
            tensors[key] = tensors[key] * 20
        elif key.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            tensors[key] = tensors[key] * 3
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst
