"""`kvpilot make-model`: write a small random HF-format checkpoint plus a byte-level BPE tokenizer.

Works without transformers: tensors are written with safetensors under HF parameter names, so
the directory also loads in transformers (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from kvpilot.engine.make_model.tokenizer_files import (  # noqa: F401 (re-exported)
    BOS_ID,
    CHAT_TEMPLATE,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    build_tokenizer,
    training_text,
    write_generation_config,
    write_tokenizer,
)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
                 "deepseek_v2": "DeepseekV2ForCausalLM"}  # fmt: skip
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 384, "shards": 1},
    "small": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 2, "vocab_size": 1024, "shards": 2},
}  # fmt: skip


def model_config(family: str, size: str = "tiny", **overrides: Any) -> dict[str, Any]:
    """The config.json of a random checkpoint; overrides replace any field (e.g. num_key_value_heads)."""
    if family not in ARCHITECTURES:
        raise ValueError(f"family {family!r} is not supported; choose one of {sorted(ARCHITECTURES)}")
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not supported; choose one of {sorted(SIZES)}")
    dims = {k: v for k, v in SIZES[size].items() if k != "shards"}
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": family,
        **dims,
        "head_dim": dims["hidden_size"] // dims["num_attention_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": family == "qwen2",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "initializer_range": 0.1,
        "torch_dtype": "float32" if size == "tiny" else "bfloat16",
        "use_cache": True,
    }
    if family == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    if family == "mistral":
        config.update(sliding_window=None)
    if family == "qwen2":
        config.update(
            use_sliding_window=False, sliding_window=None, max_window_layers=dims["num_hidden_layers"]
        )
    if family == "deepseek_v2":  # MLA + MoE fields (deepseek.py)
        from kvpilot.engine.make_model.deepseek import deepseek_fields

        config.update(deepseek_fields(size, dims["num_attention_heads"]))
    config.update(overrides)
    default_head_dim = (
        config.get("qk_rope_head_dim") or config["hidden_size"] // config["num_attention_heads"]
    )
    config["head_dim"] = overrides.get("head_dim", default_head_dim)
    return config


def random_weights(config: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Random tensors under HF names, scaled so logits are well spread (greedy ties are unlikely)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    hq, hkv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def linear(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=gen) / math.sqrt(in_f)

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(hidden, generator=gen)

    # Tied embeddings double as the output projection: scale them like one.
    embed_std = 1 / math.sqrt(hidden) if config.get("tie_word_embeddings") else 1.0
    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": embed_std * torch.randn(config["vocab_size"], hidden, generator=gen)
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        if config["model_type"] == "deepseek_v2":
            from kvpilot.engine.make_model.deepseek import deepseek_layer_weights

            lora_norm = lambda n: 1.0 + 0.1 * torch.randn(n, generator=gen)  # noqa: E731
            w.update(deepseek_layer_weights(config, i, linear, lora_norm))
            w[p + "post_attention_layernorm.weight"] = norm()
            continue
        w[p + "self_attn.q_proj.weight"] = linear(hq * d, hidden)
        w[p + "self_attn.k_proj.weight"] = linear(hkv * d, hidden)
        w[p + "self_attn.v_proj.weight"] = linear(hkv * d, hidden)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, hq * d)
        if config["model_type"] == "qwen2":
            for name, n in (("q", hq), ("k", hkv), ("v", hkv)):
                w[p + f"self_attn.{name}_proj.bias"] = 0.1 * torch.randn(n * d, generator=gen)
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.down_proj.weight"] = linear(hidden, inter)
    w["model.norm.weight"] = norm()
    if not config.get("tie_word_embeddings"):
        w["lm_head.weight"] = linear(config["vocab_size"], hidden)
    dtype = getattr(torch, config.get("torch_dtype", "float32"))
    return {k: v.to(dtype).contiguous() for k, v in w.items()}


def write_weights(out_dir: Path, weights: dict[str, Any], shards: int = 1) -> list[str]:
    """Write model.safetensors, or `shards` files plus model.safetensors.index.json; return file names."""
    from safetensors.torch import save_file

    names = list(weights)
    if shards <= 1:
        save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    per = math.ceil(len(names) / shards)
    files, weight_map = [], {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[s * per : (s + 1) * per]}
        save_file(part, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
        files.append(fname)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return files


def make_model(
    out_dir: str | Path, family: str = "llama", size: str = "tiny", seed: int = 0, **overrides: Any
) -> Path:
    """Write a complete random checkpoint directory and return its path."""
    config = model_config(family, size, **overrides)
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    write_weights(root, random_weights(config, seed), SIZES[size]["shards"])
    write_tokenizer(root, config["vocab_size"], config["max_position_embeddings"])
    write_generation_config(root)
    return root


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvpilot.bench.shapes import SHAPES

    parser.add_argument("dir", help="output directory (created if missing)")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default=None,
        help="a published model's shape instead of --family/--size: config.json and a tokenizer over its whole "
        "vocabulary, no weights (load it with --load-format dummy: random weights drawn on the device)",
    )  # fmt: skip
    parser.add_argument("--family", choices=sorted(ARCHITECTURES), default="llama")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kv-heads", type=int, default=None, help="num_key_value_heads (default: the size's)"
    )


def run(args: argparse.Namespace) -> int:
    if args.shape:
        from kvpilot.bench.shapes import write_shape

        if args.kv_heads is not None:
            raise SystemExit("--kv-heads applies to --size checkpoints; a --shape keeps its published heads")
        root = write_shape(args.shape, args.dir)
        files = sorted(p.name for p in root.iterdir())
        print(f"wrote the {args.shape} shape to {root}: {', '.join(files)} (no weights: serve or bench it with "
              "--load-format dummy)")
        return 0
    overrides = {} if args.kv_heads is None else {"num_key_value_heads": args.kv_heads}
    heads = SIZES[args.size]["num_attention_heads"]
    if args.kv_heads is not None and (args.kv_heads < 1 or heads % args.kv_heads):
        raise SystemExit(
            f"--kv-heads must divide the {heads} attention heads of size {args.size!r}, got {args.kv_heads}"
        )
    root = make_model(args.dir, args.family, args.size, args.seed, **overrides)
    files = sorted(p.name for p in root.iterdir())
    print(f"wrote a random {args.size} {args.family} checkpoint to {root}: {', '.join(files)}")
    return 0
