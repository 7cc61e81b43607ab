"""Train a small Llama (MHA, so GQA/MLA conversions apply) on Python's own stdlib sources.

Random weights have no outlier channels or sharp attention, so approximations look better on
them than on a trained model; this gives the perplexity study a real (if tiny) trained model.

    python bench/train_tiny.py /tmp/tiny-trained --minutes 3            # CPU, proves it works
    python bench/train_tiny.py /tmp/tiny-trained --minutes 10 --device cuda
    python bench/train_tiny.py /tmp/medium --device cuda --size medium --corpus all --steps 3000 \
        --batch 32 --seq-len 1024 --lr 1.5e-3 --bf16-weights          # the bigger GPU-trained model

`--size medium` is 8 layers of hidden 512 (8 heads = 8 KV heads of 64, 25 M parameters); `--corpus all`
trains on every stdlib module below the top level too (about 5x the tokens), so a few minutes on a GPU
do not overfit; `--steps` makes a run repeatable (the default stops at `--minutes`); on CUDA the
matmuls run under bf16 autocast. `--bf16-weights` rounds the trained weights to bf16 values (saved in
fp32): the same model then travels as a bf16 copy (`--export-bf16 DIR`) and scores identically anywhere.

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
# the bigger model of the quality table (docs/strategies.md): MHA, so every conversion applies
MEDIUM = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
          "num_key_value_heads": 8, "head_dim": 64, "initializer_range": 0.02}  # fmt: skip


def stdlib_files(corpus: str = "top") -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) among this Python's stdlib modules: the top-level ones
    (`corpus` 'top'), or every module in its packages too ('all': no site-packages, no test suites)."""
    root = Path(os.__file__).parent
    if corpus == "top":
        files = sorted(p for p in root.glob("*.py") if p.is_file())
    else:
        skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
        files = sorted(p for p in root.rglob("*.py") if p.is_file() and not skip & set(p.relative_to(root).parts))
    heldout = [p for p in files if p.parent == root and p.name in HELDOUT_FILES]
    return [p for p in files if p not in heldout], heldout


def encode_files(tok, files: list[Path]) -> list[int]:
    ids: list[int] = []
    for path in files:
        ids += [*tok.encode(path.read_text(encoding="utf-8", errors="replace")).ids, 1]  # <eos> between files
    return ids


def train(out: Path, minutes: float, device: str, seq_len: int, batch: int, lr: float, seed: int,
          size: str = "small", corpus: str = "top", steps: int | None = None, bf16_weights: bool = False) -> dict:  # fmt: skip
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    random.seed(seed)
    dims = MEDIUM if size == "medium" else {"num_key_value_heads": 8}
    cfg = model_config("llama", "small", max_position_embeddings=2048, **dims)
    cfg["torch_dtype"] = "float32"
    tok = build_tokenizer(cfg["vocab_size"])
    train_files, heldout = stdlib_files(corpus)
    data = torch.tensor(encode_files(tok, train_files), dtype=torch.long)
    held = torch.tensor(encode_files(tok, heldout), dtype=torch.long)
    held = held[: (held.numel() // seq_len) * seq_len].view(-1, seq_len)[:8].to(device)  # held-out loss windows
    hf_cfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    model = LlamaForCausalLM(hf_cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    deadline = time.monotonic() + 60 * minutes
    step, losses, start = 0, [], time.monotonic()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=str(device).startswith("cuda"))
    model.train()
    while (step < steps) if steps else (time.monotonic() < deadline):
        frac = step / steps if steps else (time.monotonic() - start) / (60 * minutes)
        for group in opt.param_groups:  # linear warm-up over 5% of the run, then cosine decay
            group["lr"] = lr * min(1.0, frac / 0.05) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch,))
        x = torch.stack([data[s : s + seq_len] for s in starts]).to(device)
        with autocast:
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 200 == 0:  # held-out loss: where training stops helping (the corpus is small)
            model.eval()
            with torch.no_grad(), autocast:
                held_loss = float(model(input_ids=held, labels=held).loss)
            model.train()
            print(f"step {step} held-out loss {held_loss:.3f}", flush=True)
        if step % 20 == 0:
            print(f"step {step} loss {sum(losses[-20:]) / 20:.3f} ({time.monotonic() - start:.0f} s)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu")
    if bf16_weights:  # bf16 values in fp32 tensors: a bf16 copy of the checkpoint is the same model
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    model.save_pretrained(out, safe_serialization=True)
    (out / "heldout").mkdir(exist_ok=True)  # the held-out texts travel with the checkpoint
    for path in heldout:
        (out / "heldout" / path.name).write_bytes(path.read_bytes())
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
        "size": size,
        "corpus": corpus,
        "heldout_files": [f"heldout/{p.name}" for p in heldout],  # relative: to the checkpoint
    }
    (out / "heldout.json").write_text(json.dumps(summary, indent=2))
    return summary


def export_bf16(src: Path, dst: Path) -> None:
    """A bf16 copy of an fp32 checkpoint (half the bytes; equal to it when trained with --bf16-weights):
    the weights as bf16, config.json's torch_dtype left float32 so the engine computes as it did."""
    import shutil

    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_dir():
            shutil.copytree(path, dst / path.name, dirs_exist_ok=True)
        elif path.suffix == ".safetensors":
            save_file({k: v.to(torch.bfloat16) for k, v in load_file(path).items()}, dst / path.name,
                      metadata={"format": "pt"})  # fmt: skip
        elif path.is_file():
            shutil.copy2(path, dst / path.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=("small", "medium"), default="small",
                        help="small: 4 layers of hidden 256 (heads of 32); medium: 8 layers of hidden 512 (heads of 64)")
    parser.add_argument("--corpus", choices=("top", "all"), default="top",
                        help="top: the stdlib's top-level modules; all: its packages' modules too")
    parser.add_argument("--steps", type=int, help="train this many steps (repeatable) instead of --minutes")
    parser.add_argument("--bf16-weights", action="store_true", help="round the trained weights to bf16 values")
    parser.add_argument("--export-bf16", type=Path, help="also write a bf16 copy of the checkpoint here")
    args = parser.parse_args()
    summary = train(args.out, args.minutes, args.device, args.seq_len, args.batch, args.lr, args.seed,
                    args.size, args.corpus, args.steps, args.bf16_weights)
    if args.export_bf16:
        export_bf16(args.out, args.export_bf16)
    print(json.dumps({k: v for k, v in summary.items() if k != "heldout_files"}))


if __name__ == "__main__":
    main()
