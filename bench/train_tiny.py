"""Train a small Llama (MHA, so GQA/MLA conversions apply) on Python's own stdlib sources.

Random weights have no outlier channels or sharp attention, so approximations look better on
them than on a trained model; this gives the perplexity study a real (if tiny) trained model.

    python bench/train_tiny.py /tmp/tiny-trained --minutes 3            # CPU, proves it works
    python bench/train_tiny.py /tmp/tiny-trained --minutes 10 --device cuda

Writes an HF-format checkpoint (config.json, model.safetensors, the make-model byte-level BPE
tokenizer) plus heldout.json: the stdlib files kept out of training, for bench/perplexity.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

import torch

from kvpilot.engine.make_model import build_tokenizer, model_config, write_generation_config

HELDOUT_FILES = ("heapq.py", "bisect.py", "fractions.py", "colorsys.py", "graphlib.py")


def stdlib_files() -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) among the top-level modules of this Python's stdlib."""
    root = Path(os.__file__).parent
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    heldout = [p for p in files if p.name in HELDOUT_FILES]
    return [p for p in files if p.name not in HELDOUT_FILES], heldout


def encode_files(tok, files: list[Path]) -> list[int]:
    ids: list[int] = []
    for path in files:
        ids += [*tok.encode(path.read_text(encoding="utf-8", errors="replace")).ids, 1]  # <eos> between files
    return ids


def train(out: Path, minutes: float, device: str, seq_len: int, batch: int, lr: float, seed: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    random.seed(seed)
    cfg = model_config("llama", "small", num_key_value_heads=8, max_position_embeddings=2048)
    cfg["torch_dtype"] = "float32"
    tok = build_tokenizer(cfg["vocab_size"])
    train_files, heldout = stdlib_files()
    data = torch.tensor(encode_files(tok, train_files), dtype=torch.long)
    hf_cfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    model = LlamaForCausalLM(hf_cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    deadline = time.monotonic() + 60 * minutes
    step, losses, start = 0, [], time.monotonic()
    model.train()
    while time.monotonic() < deadline:
        frac = (time.monotonic() - start) / (60 * minutes)
        for group in opt.param_groups:  # linear warm-up over 5% of the time, then cosine decay
            group["lr"] = lr * min(1.0, frac / 0.05) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch,))
        x = torch.stack([data[s : s + seq_len] for s in starts]).to(device)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 20 == 0:
            print(f"step {step} loss {sum(losses[-20:]) / 20:.3f} ({time.monotonic() - start:.0f} s)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(out, safe_serialization=True)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                    "pad_token": "<pad>", "add_bos_token": False, "model_max_length": 2048}, indent=2)
    )  # fmt: skip
    write_generation_config(out)
    summary = {
        "steps": step,
        "tokens_seen": step * batch * seq_len,
        "train_tokens": int(data.numel()),
        "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "seconds": time.monotonic() - start,
        "device": device,
        "heldout_files": [str(p) for p in heldout],
    }
    (out / "heldout.json").write_text(json.dumps(summary, indent=2))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    summary = train(args.out, args.minutes, args.device, args.seq_len, args.batch, args.lr, args.seed)
    print(json.dumps({k: v for k, v in summary.items() if k != "heldout_files"}))


if __name__ == "__main__":
    main()
