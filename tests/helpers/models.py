"""Tiny random checkpoints for tests: built with HF transformers (for parity) or with make-model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpilot.engine.make_model import make_model, model_config, write_generation_config, write_tokenizer

__all__ = ["build_hf_checkpoint", "build_make_model_checkpoint", "hf_greedy"]


def build_hf_checkpoint(out_dir: Path, family: str, seed: int = 0, **overrides: Any) -> Path:
    """Instantiate the family's HF model from make-model's tiny config, randomise it, save_pretrained.

    HF initialises norms to ones and biases to zeros; both are perturbed so they are tested too.
    """
    import torch
    import transformers

    config_dict = model_config(family, "tiny", **overrides)
    config_dict.pop("architectures")
    model_type = config_dict.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **config_dict)
    config.architectures = [model_config(family)["architectures"][0]]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    write_tokenizer(out_dir, config.vocab_size)
    write_generation_config(out_dir)
    return out_dir


def build_make_model_checkpoint(out_dir: Path, family: str, size: str = "tiny", seed: int = 0) -> Path:
    return make_model(out_dir, family, size, seed)


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """HF transformers' greedy continuation of each prompt (one at a time: no padding effects), fp32."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    outs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=2,
            )
            outs.append(gen[0, len(prompt) :].tolist())
    return outs
