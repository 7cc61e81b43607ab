"""The demo's model: `kvpilot make-model`'s tiny Llama, then a short CPU training run on the
repository's docs, so that it has learned something an approximation can lose (the accuracy
gate compares both tracks' log-likelihood of a held-out probe set, examples/demo/probes.jsonl).

A random-weight model would score every text about the same under any strategy, and the
broken canary would pass the gate by luck; a few hundred steps are enough for mean-pooling its
two KV heads into one to cost measurable log-likelihood.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STEPS, SEQ_LEN, BATCH, LR, SEED = 200, 64, 16, 3e-3, 0


def corpus(docs: Path) -> str:
    return "\n\n".join(p.read_text(errors="replace") for p in sorted(docs.rglob("*.md")))


def make_trained_model(out: Path, docs: Path, steps: int = STEPS) -> Path:
    """Write the checkpoint to `out` (skipped when a trained one is already there)."""
    if (out / ".trained").exists():
        return out
    subprocess.run([sys.executable, "-m", "kvpilot.cli", "make-model", str(out), "--family", "llama",
                    "--size", "tiny", "--seed", str(SEED)], check=True, capture_output=True, timeout=300)
    train(out, corpus(docs), steps)
    (out / ".trained").write_text(f"{steps} steps of {BATCH} x {SEQ_LEN} tokens on {docs}\n")
    return out


def train(model_dir: Path, text: str, steps: int) -> float:
    """Next-token training in place (the weight file keeps its tensor names); returns the last loss."""
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend (0.08 s a step on one core)
    ids = torch.tensor(Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text).ids, dtype=torch.long)
    (weights,) = sorted(model_dir.glob("*.safetensors"))
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(model_dir))
    state = load_file(weights)
    model.load_state_dict(state, strict=False)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - SEQ_LEN - 1, (BATCH,))
        batch = torch.stack([ids[s:s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    torch.set_num_threads(threads)
    trained = model.state_dict()
    save_file({k: trained[k].detach().contiguous().to(v.dtype) for k, v in state.items()}, str(weights),
              metadata={"format": "pt"})
    return float(loss.detach())
